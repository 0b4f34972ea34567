"""Finding a workflow or a dataset by its id or by a unique prefix of it, as git does.

Every place that takes an id (the API, hence the CLI and the web UI) resolves it
here. The visibility filter (an owner, sharing scopes) is part of the store's
query, so a prefix is matched against what the requester may see and nothing
else: a prefix of another user's workflow alone is simply not found, and two of
them do not make it ambiguous.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from pingo import errors
from pingo.store.protocol import DatasetRecord, Store, WorkflowRecord

#: The shortest prefix accepted; shorter ones must be whole ids.
MIN_PREFIX = 8
#: The characters of workflow ids (`wf-<base36>-<hex>`) and dataset ids (sha256 hex).
_PREFIX = re.compile(rf"[0-9a-z-]{{{MIN_PREFIX},128}}\Z")
#: Above every character: `[prefix, prefix + _TOP)` holds every id that starts with `prefix`.
_TOP = "\U0010ffff"
#: Candidates named in an ambiguity error (they are all visible to the requester).
_SHOWN = 5


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """The id range `[low, high)` of every id that starts with `prefix` (for range queries)."""
    return prefix, prefix + _TOP


def is_prefix(ref: str) -> bool:
    """Whether `ref` may be looked up as a prefix (long enough, only id characters)."""
    return _PREFIX.match(ref) is not None


async def workflow(store: Store, ref: str, *, owner: str | None) -> WorkflowRecord:
    """The workflow whose id is `ref` or starts with it, among `owner`'s (all when None).

    Raises `NotFound` when none matches and `AmbiguousId` when several do.
    """
    record = await store.get_workflow(ref)
    if record is not None and (owner is None or record.owner == owner):
        return record
    ids = (
        await store.find_workflow_ids(ref, owner=owner, limit=_SHOWN + 1) if is_prefix(ref) else []
    )
    found = await store.get_workflow(_unique(ids, ref, "workflow"))
    if found is None:
        # Deleted between the two reads (never happens today: workflows are kept).
        raise errors.NotFound(f"no workflow {ref!r}")
    return found


async def dataset(store: Store, ref: str, *, scopes: Collection[str] | None) -> DatasetRecord:
    """The dataset whose id is `ref` or starts with it, among those in `scopes` (all when None).

    Raises `NotFound` when none matches and `AmbiguousId` when several do.
    """
    record = await store.get_dataset(ref)
    if record is not None and (scopes is None or record.scope in scopes):
        return record
    ids = (
        await store.find_dataset_ids(ref, scopes=scopes, limit=_SHOWN + 1) if is_prefix(ref) else []
    )
    found = await store.get_dataset(_unique(ids, ref, "dataset"))
    if found is None:
        raise errors.NotFound(f"no dataset {ref!r}")
    return found


def _unique(ids: list[str], ref: str, kind: str) -> str:
    if not ids:
        raise errors.NotFound(f"no {kind} {ref!r}")
    if len(ids) > 1:
        shown = ", ".join(ids[:_SHOWN]) + (", …" if len(ids) > _SHOWN else "")
        raise errors.AmbiguousId(
            f"{ref!r} starts the ids of several {kind}s ({shown}); give more characters"
        )
    return ids[0]

"""Provenance dataset ids.

A dataset's id is the sha256 of the canonical JSON of its identity document:
the producing action's type and type-specific fields, the dataset ids of its
parents (sorted), for an action with parents its `inputs` (each parent's action id →
its dataset id), the sharing scope, and, for an unmanaged action, its `outputPath`.

`inputs` is there because a command sees its inputs under its parents' action ids:
`{input:<parentId>}`, `PINGO_INPUT_<parentId>`, the keys of `PINGO_INPUTS` and the
order of `{inputs}` all follow them. Two workflows that numbered the same parents the
other way round run different commands, and must not share a dataset (a red-team
review stored one user's merge with its inputs swapped under another's id). The
action's own id, names, `metadata`, `forceComputation`, `timeoutSeconds` and
`maxAttempts` say nothing about *what* is computed and are left out, so two actions
anywhere that compute the same thing in the same scope share one dataset.

Except an action whose output is not a function of its inputs (`isDeterministic`
false: it reads the clock or the network): its identity holds a `run`, random at each
parse, so its dataset is never reused or shared, and neither are its descendants'
(their `inputs` differ). Another user's earlier answer is never handed to it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx

from pingo import heap
from pingo.workflows import language
from pingo.workflows.definition import ActionDefinition, WorkflowDefinition

#: The scope of a server where everyone shares datasets (`Settings.sharing_scope == "server"`).
SERVER_SCOPE = "server"

_encode = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


#: `_encode` of an action type's name: a handful of them, each encoded once.
_encoded_name = functools.lru_cache(maxsize=256)(_encode)


def user_scope(user: str) -> str:
    """The scope of `user` when each user is their own scope."""
    return f"user:{user}"


def canonical_json(document: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the text that is hashed."""
    return _encode(document)


def identity(
    action: ActionDefinition,
    parent_dataset_ids: Iterable[str] | Mapping[int, str],
    scope: str,
) -> dict[str, Any]:
    """The identity document of an action's output (stored as `DatasetRecord.definition`).

    `parent_dataset_ids` are the dataset ids of `action.parents`, in that order
    (or a mapping parent action id → dataset id).
    """
    if isinstance(parent_dataset_ids, Mapping):
        by_parent = {p: parent_dataset_ids[p] for p in action.parents}
    else:
        listed = list(parent_dataset_ids)
        if len(listed) != len(action.parents):
            raise ValueError(
                f"action {action.id} has {len(action.parents)} parents, "
                f"got {len(listed)} parent dataset ids"
            )
        by_parent = dict(zip(action.parents, listed, strict=True))
    document: dict[str, Any] = {
        "type": action.type,
        "spec": dict(action.spec),
        "parents": sorted(by_parent.values()),
        "scope": scope,
    }
    if by_parent:
        # What the command sees its inputs as (module docstring). Absent for an action
        # without parents, so a root's id is the same as before inputs were recorded.
        document["inputs"] = _inputs(by_parent)
    if not action.is_managed:
        # The user's own path is part of what the action produces.
        document["isManaged"] = False
        document["outputPath"] = action.output_path
    if action.run is not None:
        document["run"] = action.run
    return document


def _inputs(by_parent: Mapping[int, str]) -> dict[str, str]:
    """Each parent's action id (as JSON keys are text) → its dataset id."""
    return {str(parent): dataset_id for parent, dataset_id in by_parent.items()}


def hash_identity(document: Mapping[str, Any]) -> str:
    """The 64-hex sha256 of an identity document."""
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def dataset_ids(definition: WorkflowDefinition, scope: str) -> dict[int, str]:
    """Action id → dataset id of its output, for every action of `definition`."""
    if not scope:
        raise ValueError("the sharing scope must not be empty")
    order = definition.graph.graph.get(language.TOPOLOGICAL_ORDER)
    if order is None:  # a definition not made by `language.parse`
        order = tuple(nx.topological_sort(definition.graph))
    actions = definition.actions
    scope_text = _encode(scope)
    ids: dict[int, str] = {}
    with heap.full_collections_deferred():
        for aid in order:
            action = actions[aid]
            ids[aid] = _hash_fast(action, [ids[p] for p in action.parents], scope_text)
    return ids


def _hash_fast(action: ActionDefinition, parent_ids: list[str], scope_text: str) -> str:
    """`hash_identity(identity(...))` without building the document twice.

    The canonical text is assembled with its keys in sorted order (inputs, isManaged,
    outputPath, parents, run, scope, spec, type); a test holds it equal to the slow path.
    """
    spec_text = _encode(dict(action.spec))
    # `_inputs` as the encoder writes it, keys in text order ("10" before "9"): both the
    # keys (action ids) and the values (dataset ids, hex digits) need no escaping.
    pairs = sorted(zip(map(str, action.parents), parent_ids, strict=True))
    inputs = '"inputs":{' + ",".join(f'"{p}":"{d}"' for p, d in pairs) + "}," if pairs else ""
    unmanaged = (
        ""
        if action.is_managed
        else f'"isManaged":false,"outputPath":{_encode(action.output_path)},'
    )
    # Dataset ids are hex digits: their JSON list needs no escaping.
    parents_text = '["' + '","'.join(sorted(parent_ids)) + '"]' if parent_ids else "[]"
    run = "" if action.run is None else f'"run":{_encode(action.run)},'
    text = (
        f'{{{inputs}{unmanaged}"parents":{parents_text},{run}"scope":{scope_text},'
        f'"spec":{spec_text},"type":{_encoded_name(action.type)}}}'
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

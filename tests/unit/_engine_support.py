"""Shared pieces of the planner, callback and dataset tests: stores, documents, executor moves."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pingo import states
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.store import open_store, protocol

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState

BACKENDS = ["memory", "sqlite", "mongomock"]


class ManualClock:
    """A clock tests move by hand (stores and services read time only through it)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def open_backend(backend: str, tmp_path: Path, clock: ManualClock) -> AsyncIterator[Any]:
    if backend == "mongomock":
        # The Mongo backend in-process (the wire server runs in the contract suite).
        import mongomock_motor

        from pingo.store.mongo import MongoStore

        mock = MongoStore(
            mongomock_motor.AsyncMongoMockClient(),  # type: ignore[arg-type]
            f"pingo_test_{uuid.uuid4().hex[:12]}",
            clock=clock,
        )
        async with mock as store:
            yield store
        return
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'pingo.db'}"
    else:
        url = "memory://"
    async with open_store(url, clock=clock) as store:
        yield store


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path / "home",
        "data_root": str(tmp_path / "data"),
        "retry_backoff_s": 1.0,
        "lease_s": 30.0,
        "root_actions": "everyone",  # CI runs as root (tests/conftest.py)
    }
    values.update(overrides)
    return Settings(**values)


def make_storage(settings: Settings) -> DatasetStorage:
    return DatasetStorage(settings.data_root)


def workflow(
    parents: Mapping[int, Iterable[int]],
    *,
    name: str = "wf",
    tag: str = "",
    end: int | None = None,
    on_failure: str | None = None,
    extra: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A command-line workflow: action id → its parents. `tag` changes every action's identity."""
    actions = []
    for aid in sorted(parents):
        action: dict[str, Any] = {
            "id": aid,
            "name": f"a{aid}",
            "type": "command-line",
            "command": ["step", str(aid), tag],
        }
        ps = sorted(parents[aid])
        if ps:
            action["parentActions"] = [{"id": p} for p in ps]
        action.update((extra or {}).get(aid, {}))
        actions.append(action)
    doc: dict[str, Any] = {
        "name": name,
        "startActionId": min(parents),
        "endActionId": end if end is not None else max(parents),
        "actions": actions,
    }
    if on_failure is not None:
        doc["onFailure"] = on_failure
    return doc


CHAIN = {1: [], 2: [1], 3: [2]}
DIAMOND = {1: [], 2: [1], 3: [1], 4: [2, 3]}

#: Allowed dataset edges (see pingo.states) from TO_LEAF to reach each state.
PATHS_FROM_TO_LEAF: Mapping[states.DatasetState, tuple[states.DatasetState, ...]] = {
    D.TO_LEAF: (),
    D.LEAF: (D.LEAF,),
    D.DELETED: (D.DELETED,),
    D.TO_STORE: (D.DELETED, D.TO_STORE),
    D.TO_DELETE: (D.DELETED, D.TO_DELETE),
    D.STORED: (D.DELETED, D.STORED),
    D.STORED_TO_DELETE: (D.LEAF, D.STORED_TO_DELETE),
    D.PROCESSING: (D.LEAF, D.STORED_TO_DELETE, D.PROCESSING),
    D.DELETING: (D.LEAF, D.STORED_TO_DELETE, D.PROCESSING, D.DELETING),
}


async def walk_dataset(
    store: protocol.Store, dataset_id: str, path: Iterable[states.DatasetState]
) -> protocol.DatasetRecord:
    """Move a dataset along allowed edges, as the components would."""
    record = await store.get_dataset(dataset_id)
    assert record is not None
    for new in path:
        assert states.is_allowed(record.state, new), (record.state, new)
        moved = await store.transition_dataset(dataset_id, {record.state}, new)
        assert moved is not None
        record = moved
    return record


async def store_all(store: protocol.Store, workflow_id: str) -> None:
    """Mark every dataset a workflow computes as stored (as if it had run)."""
    for action in await store.list_actions(workflow_id):
        if action.reused:
            continue
        record = await store.get_dataset(action.dataset_id)
        assert record is not None
        target = {D.TO_STORE: D.STORED, D.TO_LEAF: D.LEAF, D.TO_DELETE: D.STORED_TO_DELETE}
        if record.state in target:
            await store.transition_dataset(record.id, {record.state}, target[record.state])


async def start_attempt(
    store: protocol.Store, workflow_id: str, action_id: int, node: str = "node-a"
) -> protocol.ActionRecord:
    """What a scraper and a submitter do: READY → PROCESSING → SUBMITTED (attempts + 1)."""
    action = await store.get_action(workflow_id, action_id)
    assert action is not None
    assert action.state is A.READY, action.state
    processing = await store.transition_action(
        workflow_id,
        action_id,
        {A.READY},
        A.PROCESSING,
        protocol.ActionChanges(owner=node, lease_expires_at=store.clock() + timedelta(seconds=30)),
    )
    assert processing is not None
    submitted = await store.transition_action(
        workflow_id,
        action_id,
        {A.PROCESSING},
        A.SUBMITTED,
        protocol.ActionChanges(attempts=processing.attempts + 1, started_at=store.clock()),
        if_owner=node,
    )
    assert submitted is not None
    return submitted


def write_output(
    storage: DatasetStorage, action: protocol.ActionRecord, content: bytes = b"out"
) -> Path:
    """What the work does: write a file into the attempt's staging path."""
    path = Path(
        storage.staging_path(
            action.dataset_id, action.workflow_id, action.action_id, action.attempts
        )
    )
    path.write_bytes(content)
    return path


def content(path: str | Path) -> bytes:
    """The bytes of a dataset file (sync: keeps blocking I/O out of the async tests)."""
    return Path(path).read_bytes()


def is_dir(path: str | Path) -> bool:
    return Path(path).is_dir()


def exists(path: str | Path) -> bool:
    return Path(path).exists()

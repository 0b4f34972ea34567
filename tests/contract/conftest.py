"""The contract suite's fixtures: one `store` per backend, a settable clock, record factories.

Every test in this folder runs against every backend:

- `memory`: `MemoryStore`;
- `sqlite`: a real file under `tmp_path`;
- `mongomock`: `MongoStore` on mongomock-motor (in-process);
- `wire`: `MongoStore` over the network, on a real `mongod` when
  `PINGO_TEST_MONGODB_URI` is set, else on `nx-27017` started once per session.

Times are whole milliseconds so that any backend may store them at that precision.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store import open_store
from pingo.store.protocol import (
    ActionRecord,
    DatasetPlan,
    StateEntry,
    Store,
    UserRecord,
    WorkflowPlan,
    WorkflowRecord,
    claim_key,
)
from pingo.workflows import planner
from tests.unit._engine_support import make_settings

BACKENDS = ("memory", "sqlite", "mongomock", "wire")
#: Backends that several OS processes can share.
SHARED_BACKENDS = ("sqlite", "wire")

START = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told (by whole milliseconds)."""

    def __init__(self, start: datetime = START) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(milliseconds=round(seconds * 1000))
        return self.now


def with_database(url: str, database: str) -> str:
    """`url` with its path set to `/database` (keeping hosts and options)."""
    scheme, rest = url.split("://", 1)
    hosts, _, query = rest.partition("?")
    hosts = hosts.split("/", 1)[0]
    return f"{scheme}://{hosts}/{database}" + (f"?{query}" if query else "")


@dataclass
class Backend:
    """How to open (another handle on) the store under test."""

    name: str
    #: A URL other processes can open, for the shared backends.
    url: str | None


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name: str = request.param
    if name == "sqlite":
        return Backend(name, f"sqlite:///{tmp_path / 'pingo.db'}")
    if name == "wire":
        base: str = request.getfixturevalue("wire_url")
        return Backend(name, with_database(base, f"pingo_test_{uuid.uuid4().hex[:12]}"))
    return Backend(name, None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_store(backend: Backend, clock: Callable[[], datetime]) -> Store:
    """A new, unopened handle on the backend's store."""
    if backend.name == "memory":
        return open_store("memory://", clock=clock)
    if backend.name == "mongomock":
        import mongomock_motor

        from pingo.store.mongo import MongoStore

        mock = MongoStore(
            mongomock_motor.AsyncMongoMockClient(),  # type: ignore[arg-type]
            f"pingo_test_{uuid.uuid4().hex[:12]}",
            clock=clock,
        )
        return cast(Store, mock)
    assert backend.url is not None
    return open_store(backend.url, clock=clock)


@pytest.fixture
async def store(backend: Backend, clock: FakeClock) -> AsyncIterator[Store]:
    async with make_store(backend, clock) as opened:
        yield opened


# ---------------------------------------------------------------------------- factories

_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}-{next(_ids)}"


@dataclass
class Factory:
    """Builds records and plans with unique ids; times come from the test clock."""

    clock: FakeClock
    owner: str = "alice"
    created: list[str] = field(default_factory=list)

    def workflow(self, **overrides: Any) -> WorkflowRecord:
        values: dict[str, Any] = {
            "id": unique("wf"),
            "name": "example",
            "owner": self.owner,
            "state": WorkflowState.RUNNING,
            "document": {"name": "example", "actions": [{"id": 0, "tags": ["a", "b"]}]},
            "scope": "server",
            "on_failure": "abort",
            "end_dataset_id": None,
            "created_at": self.clock(),
        }
        values.update(overrides)
        return WorkflowRecord(**values)

    def action(self, workflow_id: str, action_id: int, **overrides: Any) -> ActionRecord:
        values: dict[str, Any] = {
            "workflow_id": workflow_id,
            "action_id": action_id,
            "name": f"action-{action_id}",
            "type": "command-line",
            "state": ActionState.READY,
            "dataset_id": unique("ds"),
            "reused": False,
            "reason": "absent",
            "definition": {"id": action_id, "command": ["echo", str(action_id)]},
            "inputs": {},
            "waiting_on": (),
            "children": (),
            "callback_id": unique("cb"),
            "created_at": self.clock(),
            "updated_at": self.clock(),
        }
        values.update(overrides)
        # What the store opens a history with, so that a stored record equals its plan.
        values.setdefault("history", (StateEntry(values["state"], values["created_at"]),))
        return ActionRecord(**values)

    def dataset(self, action: ActionRecord, **overrides: Any) -> DatasetPlan:
        values: dict[str, Any] = {
            "id": action.dataset_id,
            "state": DatasetState.TO_STORE,
            "path": f"/data/{action.dataset_id}",
            "scope": "server",
            "action_type": action.type,
            "definition": {"type": action.type, "spec": {"command": ["echo"]}},
            "parents": tuple(action.inputs.values()),
            "producer_workflow_id": action.workflow_id,
            "producer_action_id": action.action_id,
            "is_managed": True,
        }
        values.update(overrides)
        return DatasetPlan(**values)

    def plan(
        self,
        parents: Mapping[int, Sequence[int]] | None = None,
        *,
        actions: Mapping[int, Mapping[str, Any]] | None = None,
        datasets: bool = True,
        extra_datasets: Sequence[DatasetPlan] = (),
        **workflow_overrides: Any,
    ) -> WorkflowPlan:
        """A workflow of actions with the given parents (default: the chain 0 → 1 → 2).

        Actions without parents are READY, the others WAITING on all their parents;
        each computes a new TO_STORE dataset (TO_LEAF for leaves) unless `datasets`
        is false. `actions` overrides fields per action id.
        """
        graph = {0: (), 1: (0,), 2: (1,)} if parents is None else parents
        workflow = self.workflow(**workflow_overrides)
        children: dict[int, list[int]] = {a: [] for a in graph}
        for child, ps in graph.items():
            for p in ps:
                children[p].append(child)
        dataset_ids = {a: unique("ds") for a in graph}
        records = []
        for action_id in sorted(graph):
            ps = tuple(sorted(graph[action_id]))
            fields: dict[str, Any] = {
                "state": ActionState.WAITING if ps else ActionState.READY,
                "dataset_id": dataset_ids[action_id],
                "inputs": {p: dataset_ids[p] for p in ps},
                "waiting_on": ps,
                "children": tuple(sorted(children[action_id])),
            }
            fields.update((actions or {}).get(action_id, {}))
            records.append(self.action(workflow.id, action_id, **fields))
        plans: list[DatasetPlan] = []
        if datasets:
            for record in records:
                leaf = not children[record.action_id]
                state = DatasetState.TO_LEAF if leaf else DatasetState.TO_STORE
                plans.append(self.dataset(record, state=state))
        return WorkflowPlan(workflow, tuple(records), (*plans, *extra_datasets))

    def ready_plan(self, count: int, **workflow_overrides: Any) -> WorkflowPlan:
        """A workflow of `count` independent READY actions and no datasets."""
        return self.plan({i: () for i in range(count)}, datasets=False, **workflow_overrides)

    def user(self, **overrides: Any) -> UserRecord:
        name = unique("user")
        values: dict[str, Any] = {
            "name": name,
            "token_hash": uuid.uuid4().hex * 2,
            "is_admin": False,
            "created_at": self.clock(),
        }
        values.update(overrides)
        return UserRecord(**values)


@pytest.fixture
def make(clock: FakeClock) -> Factory:
    return Factory(clock)


async def seed_dataset(store: Store, make: Factory, state: DatasetState, **overrides: Any) -> str:
    """Create a dataset (through a one-action workflow) and move it to `state`."""
    plan = make.plan({0: ()}, actions={0: {"state": ActionState.FINISHED}})
    dataset = replace(plan.datasets[0], **overrides)
    await store.create_workflow(replace(plan, datasets=(replace(dataset, state=state),)))
    return dataset.id


__all__ = [
    "BACKENDS",
    "SHARED_BACKENDS",
    "Backend",
    "Factory",
    "FakeClock",
    "claim_key",
    "make_store",
    "seed_dataset",
]


# The engine over a contract store: the planner and the outcome service, as a node wires
# them (for the contract tests that run whole workflows: sharing, history).


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def storage(settings: Settings) -> DatasetStorage:
    return DatasetStorage(settings.data_root)


@pytest.fixture
def outcomes(store: Store, storage: DatasetStorage, settings: Settings) -> OutcomeService:
    return OutcomeService(store, storage, settings)


@pytest.fixture
def manager(
    store: Store, storage: DatasetStorage, settings: Settings, outcomes: OutcomeService
) -> planner.WorkflowManager:
    return planner.WorkflowManager(store, storage, settings, outcomes=outcomes)

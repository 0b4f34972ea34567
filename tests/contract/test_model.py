"""Random operation sequences, checked against the in-memory store as the model.

The same seeded sequence of calls runs on the backend under test and on a
`MemoryStore` sharing its clock; every answer must match (lists whose order
the protocol leaves open, such as ties in "oldest first", are compared as
sets). This catches the divergences that example-based tests do not think of:
a version not bumped, a field not cleared, a guard applied differently.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pingo import states
from pingo.states import ActionState, DatasetState
from pingo.store.memory import MemoryStore
from pingo.store.protocol import (
    ActionChanges,
    ActionRecord,
    DatasetChanges,
    DatasetRecord,
    Store,
    claim_key,
)
from tests.contract.conftest import Factory, FakeClock

A = ActionState
D = DatasetState
STEPS = 250


def _key(value: Any) -> Any:
    if isinstance(value, ActionRecord):
        return value.key
    if isinstance(value, DatasetRecord):
        return value.id
    return repr(value)


def _unordered(value: Any) -> Any:
    """Lists whose order the protocol leaves open, as sorted lists."""
    if isinstance(value, list):
        return sorted(value, key=_key)
    return value


@dataclass
class World:
    rng: random.Random
    workflows: list[str]
    actions: list[tuple[str, int]]
    children: dict[tuple[str, int], tuple[int, ...]]
    datasets: list[str]

    def action(self) -> tuple[str, int]:
        return self.rng.choice(self.actions)

    def dataset(self) -> str:
        return self.rng.choice(self.datasets)

    def some(self, values: list[Any], most: int = 3) -> set[Any]:
        return set(self.rng.sample(values, self.rng.randint(1, most)))


Op = Callable[[Store], Awaitable[Any]]


async def _operation(world: World, clock: FakeClock, model: MemoryStore) -> tuple[str, Op | None]:
    """A random call (or a clock tick, returned as None), often one that can succeed."""
    rng = world.rng
    nodes = ["node-a", "node-b"]
    kind = rng.choice(
        [
            "tick",
            "claim",
            "claim",
            "transition",
            "transition",
            "guarded",
            "release",
            "release",
            "finish",
            "renew",
            "in_states",
            "count",
            "dataset",
            "add_claim",
            "remove_claim",
            "use",
            "pin",
            "deletable",
            "bytes",
            "kill_all",
        ]
    )
    if kind == "tick":
        clock.advance(rng.choice([0.5, 1, 5, 31]))
        return kind, None
    if kind == "claim":
        node, limit = rng.choice(nodes), rng.randint(1, 4)
        return kind, lambda s: s.claim_actions(node, limit, lease_s=30)
    if kind == "transition":
        wid, aid = world.action()
        current = await model.get_action(wid, aid)
        assert current is not None
        expected = world.some(list(A), 3)
        if rng.random() < 0.75:
            expected.add(current.state)
        successors = [b for a, b in states.ACTION_TRANSITIONS if a is current.state]
        new = rng.choice(successors if successors and rng.random() < 0.75 else list(A))
        changes = rng.choice(
            [
                ActionChanges(),
                ActionChanges(attempts=rng.randint(0, 3), owner=None, lease_expires_at=None),
                ActionChanges(error="boom", finished_at=clock.now, runtime_s=1.5),
                ActionChanges(external_id="ext-1", started_at=clock.now, not_before=clock.now),
            ]
        )
        return kind, lambda s: s.transition_action(wid, aid, expected, new, changes)
    if kind == "guarded":
        wid, aid = world.action()
        held = await model.get_action(wid, aid)
        assert held is not None
        owner = held.owner if rng.random() < 0.6 else rng.choice([None, *nodes])
        attempt = held.attempts if rng.random() < 0.6 else rng.choice([None, 0, 1])
        expected = world.some([A.PROCESSING, A.SUBMITTED, A.RUNNING], 3)
        new = rng.choice([A.SUBMITTED, A.RUNNING, A.READY])
        return kind, lambda s: s.transition_action(
            wid,
            aid,
            expected,
            new,
            ActionChanges(attempts=1),
            if_owner=owner,
            if_attempt=attempt,
        )
    if kind == "release":
        key = world.action()
        children = world.children[key]
        return kind, lambda s: s.release_parent(key[0], key[1], children)
    if kind == "finish":
        wid, aid = world.action()
        current = await model.get_action(wid, aid)
        assert current is not None
        expected = world.some(list(A), 3)
        if rng.random() < 0.75:
            expected.add(current.state)
        attempt = current.attempts if rng.random() < 0.7 else rng.choice([None, 0, 1])
        changes = ActionChanges(finished_at=clock.now, runtime_s=1.5, error=None)
        return kind, lambda s: s.finish_action(wid, aid, expected, changes, if_attempt=attempt)
    if kind == "renew":
        keys = [world.action() for _ in range(3)]
        node = rng.choice(nodes)
        return kind, lambda s: s.renew_leases(node, keys, lease_s=30)
    if kind == "in_states":
        wanted = world.some(list(A), 3)
        expired = rng.random() < 0.5
        return kind, lambda s: s.list_actions_in_states(wanted, lease_expired=expired)
    if kind == "count":
        wid = rng.choice(world.workflows)
        return kind, lambda s: s.count_actions(wid)
    if kind == "dataset":
        did = world.dataset()
        expected_ds = world.some(list(D), 4)
        new_ds = rng.choice(list(D))
        unclaimed = rng.random() < 0.3
        ds_changes = rng.choice(
            [DatasetChanges(), DatasetChanges(size_bytes=rng.randint(0, 100), stored_at=clock.now)]
        )
        return kind, lambda s: s.transition_dataset(
            did, expected_ds, new_ds, ds_changes, if_unclaimed=unclaimed
        )
    if kind == "add_claim":
        did, claim = world.dataset(), claim_key(rng.choice(world.workflows), rng.randint(0, 3))
        allowed = world.some(list(D), 5)
        return kind, lambda s: s.add_dataset_claim(did, claim, allowed)
    if kind == "remove_claim":
        did, claim = world.dataset(), claim_key(rng.choice(world.workflows), rng.randint(0, 3))
        return kind, lambda s: s.remove_dataset_claim(did, claim)
    if kind == "use":
        dids = [world.dataset() for _ in range(rng.randint(0, 3))]
        return kind, lambda s: s.record_dataset_uses(dids)
    if kind == "pin":
        did, pinned = world.dataset(), rng.random() < 0.5
        return kind, lambda s: s.set_dataset_pinned(did, pinned)
    if kind == "deletable":
        return kind, lambda s: s.list_deletable_datasets(stale_s=10)
    if kind == "bytes":
        return kind, lambda s: s.bytes_by_state()
    wid = rng.choice(world.workflows)
    return kind, lambda s: s.transition_actions(wid, {A.WAITING, A.READY}, A.KILLED)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_backend_behaves_like_the_model(
    store: Store, make: Factory, clock: FakeClock, seed: int
) -> None:
    model = MemoryStore(clock=clock)
    rng = random.Random(seed)
    world = World(rng, [], [], {}, [])
    for shape in ({0: (), 1: (0,), 2: (0,), 3: (1, 2)}, {0: (), 1: (), 2: (0, 1)}):
        clock.advance(1)
        plan = make.plan(shape)
        for target in (store, model):
            await target.create_workflow(plan)
        world.workflows.append(plan.workflow.id)
        for action in plan.actions:
            world.actions.append(action.key)
            world.children[action.key] = action.children
        world.datasets.extend(d.id for d in plan.datasets)

    for step in range(STEPS):
        kind, op = await _operation(world, clock, model)
        if op is None:
            continue
        expected = await op(model)
        actual = await op(store)
        assert _unordered(actual) == _unordered(expected), (step, kind)

    for wid in world.workflows:
        assert await store.list_actions(wid) == await model.list_actions(wid)
    assert await store.get_datasets(world.datasets) == await model.get_datasets(world.datasets)

"""Per-user limits in the store: overrides, RUNNING counts, and claims within in-flight caps."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from pingo import limits
from pingo.config import Settings
from pingo.states import ActionState as A
from pingo.states import DatasetState as D
from pingo.states import WorkflowState as W
from pingo.store.protocol import NO_LIMITS, DatasetChanges, Store, UserLimits, WorkflowPlan
from tests.contract.conftest import SHARED_BACKENDS, Backend, Factory, FakeClock, make_store


async def test_user_limits_round_trip(store: Store, make: Factory) -> None:
    plain = await store.create_user(make.user(name="plain"))
    assert plain.limits == NO_LIMITS
    own = UserLimits(
        max_workflows=3,
        max_in_flight_actions=7,
        submissions_per_minute=2**31 - 1,
        max_storage_bytes=2**53 - 1,
    )
    capped = await store.create_user(make.user(name="capped", limits=own))
    assert await store.get_user("capped") == capped
    assert await store.get_user_by_token_hash(capped.token_hash) == capped

    changed = await store.set_user_limits("plain", UserLimits(max_workflows=1))
    assert changed is not None
    assert changed.limits == UserLimits(max_workflows=1)
    assert changed.token_hash == plain.token_hash and changed.is_admin is plain.is_admin
    assert await store.get_user("plain") == changed
    reset = await store.set_user_limits("capped", NO_LIMITS)
    assert reset is not None and reset.limits == NO_LIMITS
    assert [u.limits for u in await store.list_users()] == [NO_LIMITS, UserLimits(max_workflows=1)]
    assert await store.set_user_limits("nobody", own) is None
    assert await store.get_user("nobody") is None


async def test_count_running_workflows_per_owner(store: Store, make: Factory) -> None:
    for owner, state in (
        ("alice", W.RUNNING),
        ("alice", W.RUNNING),
        ("alice", W.SUCCEEDED),
        ("alice", W.KILLED),
        ("bob", W.RUNNING),
    ):
        await store.create_workflow(make.plan(datasets=False, owner=owner, state=state))
    assert await store.count_running_workflows("alice") == 2
    assert await store.count_running_workflows("bob") == 1
    assert await store.count_running_workflows("carol") == 0


async def test_bytes_produced_by_counts_an_owners_stored_and_leaf_datasets(
    store: Store, make: Factory
) -> None:
    """What a storage quota counts: sizes of datasets whose files are on disk, by the owner
    of the workflow that produced each, until the deletor removed them; one still
    computing, or DELETED, not."""
    sizes = {
        ("alice", D.STORED): 100,
        ("alice", D.LEAF): 20,
        ("alice", D.STORED_TO_DELETE): 4000,
        ("alice", D.DELETED): 50_000,
        ("alice", D.TO_STORE): None,
        ("bob", D.STORED): 3,
        ("bob", D.LEAF): 2**40,
    }
    for (owner, state), size in sizes.items():
        plan = make.plan({0: ()}, actions={0: {"state": A.FINISHED}}, owner=owner)
        dataset = replace(plan.datasets[0], state=state)
        await store.create_workflow(replace(plan, datasets=(dataset,)))
        if size is not None:
            changed = await store.transition_dataset(
                dataset.id, {state}, state, DatasetChanges(size_bytes=size)
            )
            assert changed is not None
    assert await store.bytes_produced_by("alice") == 4120
    assert await store.bytes_produced_by("bob") == 2**40 + 3
    assert await store.bytes_produced_by("carol") == 0
    # Marked for deletion, it counts until its files are gone.
    [stored] = [d for d in (await store.list_datasets(state=D.STORED)).items if d.size_bytes == 100]
    for old, new in ((D.STORED, D.STORED_TO_DELETE), (D.STORED_TO_DELETE, D.PROCESSING)):
        assert await store.transition_dataset(stored.id, {old}, new) is not None
        assert await store.bytes_produced_by("alice") == 4120
    for old, new in ((D.PROCESSING, D.DELETING), (D.DELETING, D.DELETED)):
        assert await store.transition_dataset(stored.id, {old}, new) is not None
    assert await store.bytes_produced_by("alice") == 4020


class _Counted:
    """The store, with its reads of what a quota needs counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads: list[str] = []

    async def list_users(self) -> Any:
        self.reads.append("users")
        return await self.store.list_users()

    async def get_workflow(self, workflow_id: str) -> Any:
        self.reads.append("workflow")
        return await self.store.get_workflow(workflow_id)

    async def bytes_produced_by(self, owner: str) -> int:
        self.reads.append("bytes")
        return await self.store.bytes_produced_by(owner)


async def test_the_spawn_gate_reads_nothing_per_spawn_without_a_quota_and_caches_verdicts(
    store: Store, make: Factory
) -> None:
    clock = FakeSeconds()
    counted = _Counted(store)
    quotas = limits.StorageQuotas(counted, Settings(), clock=clock)  # type: ignore[arg-type]
    await store.create_user(make.user(name="alice"))
    plan = make.plan({0: ()}, actions={0: {"state": A.FINISHED}}, owner="alice")
    await store.create_workflow(plan)
    await store.transition_dataset(
        plan.datasets[0].id, {D.TO_LEAF}, D.LEAF, DatasetChanges(size_bytes=10)
    )
    workflow_id = plan.workflow.id
    # No quota anywhere: one listing of the users for a while, nothing per spawn.
    for _ in range(50):
        assert await quotas.refusal(workflow_id) is None
    assert counted.reads == ["users"]
    # An admin gives alice a quota she is past: seen once the listing is refreshed.
    await store.set_user_limits("alice", UserLimits(max_storage_bytes=10))
    assert await quotas.refusal(workflow_id) is None
    clock.now += quotas.refresh_s
    refusal = await quotas.refusal(workflow_id)
    assert refusal is not None and "10 bytes" in refusal
    # The verdict is remembered for a second: no sum per spawn meanwhile.
    counted.reads.clear()
    for _ in range(20):
        assert await quotas.refusal(workflow_id) == refusal
    assert "bytes" not in counted.reads
    clock.now += quotas.verdict_s
    assert await quotas.refusal(workflow_id) == refusal
    assert counted.reads.count("bytes") == 1
    # A quota above what she stored lets her actions start again.
    await store.set_user_limits("alice", UserLimits(max_storage_bytes=11))
    clock.now += quotas.refresh_s
    assert await quotas.refusal(workflow_id) is None


class FakeSeconds:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _ready(store: Store, make: Factory, owner: str, count: int) -> WorkflowPlan:
    plan = make.ready_plan(count, owner=owner)
    await store.create_workflow(plan)
    return plan


def _owners(claimed: list[object], plans: dict[str, WorkflowPlan]) -> dict[str, int]:
    by_workflow = {p.workflow.id: owner for owner, p in plans.items()}
    counts: dict[str, int] = {}
    for action in claimed:
        owner = by_workflow[action.workflow_id]  # type: ignore[attr-defined]
        counts[owner] = counts.get(owner, 0) + 1
    return counts


async def test_claim_stops_at_the_server_wide_in_flight_cap(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plans = {"alice": await _ready(store, make, "alice", 5)}
    clock.advance(1)
    plans["bob"] = await _ready(store, make, "bob", 3)
    clock.advance(1)

    claimed = await store.claim_actions("node-a", 10, lease_s=30, max_in_flight=2)
    assert _owners(claimed, plans) == {"alice": 2, "bob": 2}
    # Oldest first within each owner; the rest stays READY.
    alice_wf = plans["alice"].workflow.id
    assert sorted(a.action_id for a in claimed if a.workflow_id == alice_wf) == [0, 1]
    # Another node sees the same counts: nothing more until something finishes.
    assert await store.claim_actions("node-b", 10, lease_s=30, max_in_flight=2) == []
    counts = await store.count_actions(alice_wf)
    assert counts == {A.PROCESSING: 2, A.READY: 3}

    done = next(a for a in claimed if a.workflow_id == alice_wf)
    assert await store.transition_action(*done.key, {A.PROCESSING}, A.FINISHED) is not None
    more = await store.claim_actions("node-b", 10, lease_s=30, max_in_flight=2)
    assert _owners(more, plans) == {"alice": 1}
    # Without a cap, everything left is claimable.
    rest = await store.claim_actions("node-b", 10, lease_s=30)
    assert _owners(rest, plans) == {"alice": 2, "bob": 1}


async def test_an_owner_with_nothing_in_flight_goes_before_anyones_backlog(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    """Oldest first alone, Bob's one action would wait for all of Alice's older ones:
    an owner with nothing in flight gets their oldest action ahead of any backlog."""
    for name in ("alice", "bob", "carol"):
        await store.create_user(make.user(name=name))
    plans = {"alice": await _ready(store, make, "alice", 6)}
    clock.advance(1)
    plans["bob"] = await _ready(store, make, "bob", 2)
    clock.advance(1)

    def claim(limit: int) -> Any:
        return store.claim_actions("node-a", limit, lease_s=30, max_in_flight=100)

    assert _owners(await claim(1), plans) == {"alice": 1}  # both idle: the older first
    assert _owners(await claim(1), plans) == {"bob": 1}  # Alice has one in flight
    assert _owners(await claim(1), plans) == {"alice": 1}  # both busy: oldest first
    clock.advance(1)
    plans["carol"] = await _ready(store, make, "carol", 3)
    clock.advance(1)
    # A batch: the idle owner's oldest first, then everyone's in age order.
    batch = await claim(3)
    carol = plans["carol"].workflow.id
    assert [a.workflow_id == carol for a in batch] == [True, False, False]
    assert _owners(batch, plans) == {"carol": 1, "alice": 2}
    # Without any cap, no counts are read: oldest first.
    rest = await store.claim_actions("node-a", 3, lease_s=30)
    assert _owners(rest, plans) == {"alice": 2, "bob": 1}


async def test_submitted_and_running_actions_count_as_in_flight(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plans = {"alice": await _ready(store, make, "alice", 4)}
    clock.advance(1)
    first = await store.claim_actions("node-a", 2, lease_s=30)
    wid = plans["alice"].workflow.id
    await store.transition_action(wid, first[0].action_id, {A.PROCESSING}, A.SUBMITTED)
    await store.transition_action(wid, first[1].action_id, {A.PROCESSING}, A.RUNNING)
    assert await store.claim_actions("node-a", 10, lease_s=30, max_in_flight=2) == []
    assert len(await store.claim_actions("node-a", 10, lease_s=30, max_in_flight=3)) == 1


async def test_a_users_own_cap_beats_the_default(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    await store.create_user(make.user(name="alice", limits=UserLimits(max_in_flight_actions=3)))
    await store.create_user(make.user(name="bob", limits=UserLimits(max_in_flight_actions=1)))
    plans = {"alice": await _ready(store, make, "alice", 6)}
    clock.advance(1)
    plans["bob"] = await _ready(store, make, "bob", 4)
    clock.advance(1)
    plans["carol"] = await _ready(store, make, "carol", 4)
    clock.advance(1)

    # No default: only the users with their own cap are held back.
    claimed = await store.claim_actions("node-a", 100, lease_s=30)
    assert _owners(claimed, plans) == {"alice": 3, "bob": 1, "carol": 4}
    # A default does not loosen an own cap (bob: 1 < 5).
    more = await store.claim_actions("node-a", 100, lease_s=30, max_in_flight=5)
    assert more == []


async def test_a_full_users_backlog_does_not_hide_other_users_work(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # Alice's 150 READY actions are all older than bob's one: a claim must page past them.
    plans = {"alice": await _ready(store, make, "alice", 150)}
    clock.advance(1)
    plans["bob"] = await _ready(store, make, "bob", 1)
    clock.advance(1)

    first = await store.claim_actions("node-a", 4, lease_s=30, max_in_flight=2)
    assert _owners(first, plans) == {"alice": 2, "bob": 1}
    assert await store.claim_actions("node-a", 4, lease_s=30, max_in_flight=2) == []


async def test_expired_leases_are_reclaimed_within_a_full_cap(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    await _ready(store, make, "alice", 3)
    clock.advance(1)
    first = await store.claim_actions("node-a", 10, lease_s=5, max_in_flight=2)
    assert len(first) == 2
    clock.advance(10)
    # The lost node's two claims are in flight already: taking them over adds nothing.
    again = await store.claim_actions("node-b", 10, lease_s=30, max_in_flight=2)
    assert sorted(a.key for a in again) == sorted(a.key for a in first)
    assert all(a.owner == "node-b" for a in again)
    assert all(a.lease_expires_at == clock.now + timedelta(seconds=30) for a in again)


async def test_the_cap_holds_across_nodes_sharing_the_store(
    store: Store, make: Factory, clock: FakeClock, backend: Backend
) -> None:
    if backend.name not in SHARED_BACKENDS:
        pytest.skip("only a shared store has several nodes")
    await _ready(store, make, "alice", 40)
    clock.advance(1)
    async with make_store(backend, clock) as other:
        # Two nodes, each with its own handle: the in-flight count lives in the store.
        assert len(await store.claim_actions("node-a", 3, lease_s=30, max_in_flight=5)) == 3
        assert len(await other.claim_actions("node-b", 3, lease_s=30, max_in_flight=5)) == 2
        assert await store.claim_actions("node-a", 3, lease_s=30, max_in_flight=5) == []
        if backend.name == "sqlite":
            # Counting and claiming are one transaction: racing nodes cannot overshoot.
            claims = await asyncio.gather(
                *(
                    handle.claim_actions(f"node-{i}", 4, lease_s=30, max_in_flight=9)
                    for i, handle in enumerate([store, other] * 4)
                )
            )
            assert sum(len(c) for c in claims) == 4

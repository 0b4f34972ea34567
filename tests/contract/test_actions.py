"""Actions: lookups, compare-and-set with guards, claims and leases, releasing parents."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from datetime import timedelta

import pytest

from pingo import errors, states
from pingo.states import ActionState
from pingo.store.protocol import ActionChanges, StateEntry, Store
from tests.contract.conftest import Factory, FakeClock

A = ActionState


async def test_list_and_count_actions(store: Store, make: Factory) -> None:
    plan = make.plan({0: (), 1: (0,), 2: (0,), 3: (1, 2), 4: ()})
    await store.create_workflow(plan)
    await store.create_workflow(make.plan())  # another workflow's actions stay out

    listed = await store.list_actions(plan.workflow.id)
    assert [a.action_id for a in listed] == [0, 1, 2, 3, 4]
    assert listed[3].waiting_on == (1, 2)
    assert listed[0].children == (1, 2)
    assert await store.count_actions(plan.workflow.id) == {A.READY: 2, A.WAITING: 3}


async def test_list_actions_a_page_at_a_time(store: Store, make: Factory) -> None:
    plan = make.plan({0: (), 1: (0,), 2: (0,), 3: (1, 2), 4: ()})
    await store.create_workflow(plan)
    await store.create_workflow(make.plan())  # another workflow's actions stay out
    wid = plan.workflow.id

    pages: list[list[int]] = []
    after: int | None = None
    while True:
        page = await store.list_actions(wid, after=after, limit=2)
        pages.append([a.action_id for a in page])
        if len(page) < 2:
            break
        after = page[-1].action_id
    assert pages == [[0, 1], [2, 3], [4]]
    # The records are the ones the whole listing gives.
    assert await store.list_actions(wid, after=1, limit=2) == (await store.list_actions(wid))[2:4]
    assert [a.action_id for a in await store.list_actions(wid, after=2)] == [3, 4]
    assert [a.action_id for a in await store.list_actions(wid, limit=1)] == [0]
    assert await store.list_actions(wid, after=4, limit=10) == []
    assert await store.list_actions(wid, limit=0) == []


async def test_twin_datasets_are_those_two_computing_actions_share(
    store: Store, make: Factory
) -> None:
    planned = make.plan({0: (), 1: (0,), 2: (0,), 3: (0,), 4: (0,)})
    a = planned.actions
    twin, once = a[1].dataset_id, a[3].dataset_id
    # 1 and 2 compute one dataset (twins); 3 and 4 name one, but 3 reuses it.
    actions = (
        *a[:2],
        replace(a[2], dataset_id=twin),
        replace(a[3], reused=True, reason="stored"),
        replace(a[4], dataset_id=once),
    )
    dropped = {a[2].dataset_id, a[4].dataset_id}
    datasets = tuple(d for d in planned.datasets if d.id not in dropped)
    plan = replace(planned, actions=actions, datasets=datasets)
    await store.create_workflow(plan)
    other = make.plan()
    await store.create_workflow(other)

    assert await store.twin_datasets(plan.workflow.id) == {twin}
    assert await store.twin_datasets(other.workflow.id) == frozenset()
    assert await store.twin_datasets("missing") == frozenset()


async def test_has_actions_in_agrees_with_the_counts(store: Store, make: Factory) -> None:
    plan = make.plan({0: (), 1: (0,), 2: ()})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    assert await store.has_actions_in(wid, {A.WAITING, A.RUNNING})
    assert not await store.has_actions_in(wid, {A.RUNNING, A.FAILED})
    assert not await store.has_actions_in(wid, set())
    assert not await store.has_actions_in("wf-missing", {A.READY})
    for action_id in (0, 2):
        assert await store.transition_action(wid, action_id, {A.READY}, A.KILLED)
    assert not await store.has_actions_in(wid, {A.READY})
    assert await store.has_actions_in(wid, {A.KILLED})


async def test_transition_action_success_sets_changes(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    wid = plan.workflow.id
    original = plan.actions[0]
    now = clock.advance(2)
    lease = now + timedelta(seconds=30)

    moved = await store.transition_action(
        wid,
        0,
        {A.READY},
        A.PROCESSING,
        ActionChanges(owner="node-a", lease_expires_at=lease, attempts=1),
    )
    assert moved == replace(
        original,
        state=A.PROCESSING,
        owner="node-a",
        lease_expires_at=lease,
        attempts=1,
        updated_at=now,
        version=original.version + 1,
        history=(*original.history, StateEntry(A.PROCESSING, now)),
    )
    assert await store.get_action(wid, 0) == moved

    # None is a value: it clears the field; KEEP (the default) leaves it.
    cleared = await store.transition_action(
        wid, 0, {A.PROCESSING}, A.READY, ActionChanges(owner=None, lease_expires_at=None)
    )
    assert cleared is not None
    assert (cleared.owner, cleared.lease_expires_at, cleared.attempts) == (None, None, 1)


async def test_lost_transition_returns_none_and_changes_nothing(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    wid = plan.workflow.id
    clock.advance(1)

    assert (
        await store.transition_action(
            wid, 1, {A.READY}, A.PROCESSING, ActionChanges(owner="x", error="no")
        )
        is None
    )
    assert await store.get_action(wid, 1) == plan.actions[1]
    assert await store.transition_action(wid, 99, {A.READY}, A.PROCESSING) is None
    assert await store.transition_action("missing", 0, {A.READY}, A.PROCESSING) is None
    assert await store.transition_action(wid, 0, set(), A.PROCESSING) is None
    assert await store.get_action(wid, 0) == plan.actions[0]


async def test_a_lost_compare_and_set_is_logged_alike_by_every_backend(
    store: Store, make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    wid = plan.workflow.id
    with caplog.at_level(logging.DEBUG, logger="pingo.store"):
        assert await store.transition_action(wid, 1, {A.READY}, A.PROCESSING) is None
    lost = [r for r in caplog.records if getattr(r, "event", None) == "cas_lost"]
    assert [r.getMessage() for r in lost] == [
        f"action {wid}/1 not moved to PROCESSING: lost the compare-and-set"
    ]
    assert (getattr(lost[0], "workflow_id", None), getattr(lost[0], "action_id", None)) == (wid, 1)


async def test_owner_and_attempt_guards(store: Store, make: Factory) -> None:
    plan = make.plan(actions={0: {"state": A.SUBMITTED, "owner": "node-a", "attempts": 2}})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    active = {A.SUBMITTED, A.RUNNING}

    assert await store.transition_action(wid, 0, active, A.RUNNING, if_owner="node-b") is None
    assert await store.transition_action(wid, 0, active, A.RUNNING, if_attempt=1) is None
    assert (
        await store.transition_action(wid, 0, active, A.RUNNING, if_owner="node-a", if_attempt=1)
        is None
    )
    assert await store.get_action(wid, 0) == plan.actions[0]

    running = await store.transition_action(
        wid, 0, active, A.RUNNING, if_owner="node-a", if_attempt=2
    )
    assert running is not None and running.state is A.RUNNING
    # The same callback again: the expected states no longer match, nothing changes.
    assert await store.transition_action(wid, 0, {A.SUBMITTED}, A.RUNNING, if_attempt=2) is None
    assert await store.get_action(wid, 0) == running


async def test_transition_actions_moves_each_matching_action(store: Store, make: Factory) -> None:
    plan = make.plan(
        {0: (), 1: (0,), 2: (), 3: (2,)},
        actions={2: {"state": A.RUNNING}},
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id
    await store.create_workflow(make.plan())

    killed = await store.transition_actions(
        wid, {A.WAITING, A.READY}, A.KILLED, ActionChanges(error="killed by alice")
    )
    assert [a.action_id for a in killed] == [0, 1, 3]
    assert all(a.state is A.KILLED and a.error == "killed by alice" for a in killed)
    assert await store.count_actions(wid) == {A.KILLED: 3, A.RUNNING: 1}
    assert await store.transition_actions(wid, {A.WAITING, A.READY}, A.KILLED) == []


async def test_claim_actions_oldest_first_with_lease(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plans = []
    for _ in range(3):
        clock.advance(1)
        plan = make.plan({0: (), 1: ()}, datasets=False)
        await store.create_workflow(plan)
        plans.append(plan)
    now = clock.advance(1)

    claimed = await store.claim_actions("node-a", 4, lease_s=30)

    expected_keys = [(p.workflow.id, i) for p in plans for i in (0, 1)][:4]
    assert sorted(a.key for a in claimed) == sorted(expected_keys)
    assert [a.key[0] for a in claimed] == [k[0] for k in expected_keys]
    for action in claimed:
        assert action.state is A.PROCESSING
        assert action.owner == "node-a"
        assert action.lease_expires_at == now + timedelta(seconds=30)
        assert action.updated_at == now
        assert await store.get_action(*action.key) == action
    rest = await store.claim_actions("node-b", 10, lease_s=30)
    assert sorted(a.key for a in rest) == [(plans[2].workflow.id, 0), (plans[2].workflow.id, 1)]
    assert await store.claim_actions("node-b", 10, lease_s=30) == []
    assert await store.claim_actions("node-b", 0, lease_s=30) == []


async def test_claim_by_quotas_takes_each_type_up_to_its_quota(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    types = {0: "spark", 1: "command-line", 2: "spark", 3: "command-line", 4: "spark"}
    types |= {5: "mapreduce-v2", 6: "command-line"}
    plan = make.plan(
        {i: () for i in types},
        datasets=False,
        actions={
            i: {"type": t, "updated_at": clock.now + timedelta(seconds=i)} for i, t in types.items()
        },
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id
    clock.advance(10)

    # Nothing for a type with no room, nothing of a type not named.
    assert await store.claim_actions("node-a", 10, lease_s=30, quotas={}) == []
    assert await store.claim_actions("node-a", 10, lease_s=30, quotas={"spark": 0}) == []
    first = await store.claim_actions(
        "node-a", 10, lease_s=30, quotas={"spark": 2, "command-line": 1, "hive": 3}
    )
    assert sorted(a.action_id for a in first) == [0, 1, 2]
    # `limit` still bounds the whole claim, oldest first across types.
    second = await store.claim_actions(
        "node-b", 2, lease_s=30, quotas={"spark": 5, "command-line": 5, "mapreduce-v2": 5}
    )
    assert sorted(a.action_id for a in second) == [3, 4]
    assert all(a.owner == "node-b" and a.state is A.PROCESSING for a in second)
    # The rest stays READY for whoever has room (and no quotas means any type).
    assert await store.count_actions(wid) == {A.PROCESSING: 5, A.READY: 2}
    rest = await store.claim_actions("node-c", 10, lease_s=30)
    assert sorted(a.action_id for a in rest) == [5, 6]


async def test_claim_by_quotas_reclaims_expired_leases_of_its_types_only(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan(
        {0: (), 1: ()}, datasets=False, actions={0: {"type": "spark"}, 1: {"type": "command-line"}}
    )
    await store.create_workflow(plan)
    assert len(await store.claim_actions("node-a", 10, lease_s=5)) == 2
    clock.advance(5)

    taken = await store.claim_actions("node-b", 10, lease_s=5, quotas={"spark": 1})
    assert [(a.action_id, a.owner) for a in taken] == [(0, "node-b")]
    (other,) = await store.claim_actions("node-c", 10, lease_s=5, quotas={"command-line": 3})
    assert (other.action_id, other.owner) == (1, "node-c")


async def test_claim_respects_not_before_and_skips_other_states(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    later = clock.now + timedelta(seconds=10)
    plan = make.plan(
        {0: (), 1: (), 2: (), 3: ()},
        datasets=False,
        actions={
            0: {"not_before": later},
            1: {"state": A.SUBMITTED},
            2: {"state": A.WAITING},
            3: {"state": A.FINISHED},
        },
    )
    await store.create_workflow(plan)

    assert await store.claim_actions("node-a", 10, lease_s=5) == []
    clock.advance(10)
    claimed = await store.claim_actions("node-a", 10, lease_s=5)
    assert [a.key for a in claimed] == [(plan.workflow.id, 0)]


async def test_expired_lease_lets_another_node_reclaim(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.ready_plan(1)
    await store.create_workflow(plan)
    key = (plan.workflow.id, 0)

    (first,) = await store.claim_actions("node-a", 10, lease_s=10)
    clock.advance(9.999)
    assert await store.claim_actions("node-b", 10, lease_s=10) == []
    clock.advance(0.001)  # the lease expires at its expiry instant
    (second,) = await store.claim_actions("node-b", 10, lease_s=10)
    assert second.key == key
    assert second.owner == "node-b"
    assert second.version > first.version

    # node-a lost it: it can neither renew nor move it on as the owner.
    assert await store.renew_leases("node-a", [key], lease_s=10) == 0
    assert (
        await store.transition_action(*key, {A.PROCESSING}, A.SUBMITTED, if_owner="node-a") is None
    )
    submitted = await store.transition_action(
        *key, {A.PROCESSING}, A.SUBMITTED, ActionChanges(attempts=1), if_owner="node-b"
    )
    assert submitted is not None and submitted.attempts == 1


async def test_renew_leases(store: Store, make: Factory, clock: FakeClock) -> None:
    plan = make.ready_plan(4)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    claimed = await store.claim_actions("node-a", 3, lease_s=10)
    keys = [a.key for a in claimed]
    await store.transition_action(*keys[0], {A.PROCESSING}, A.SUBMITTED)
    await store.transition_action(*keys[1], {A.PROCESSING}, A.FINISHED)
    unclaimed = next(k for k in [(wid, i) for i in range(4)] if k not in keys)
    now = clock.advance(5)

    held = await store.renew_leases("node-a", [*keys, unclaimed, ("missing", 0)], lease_s=10)

    assert held == 2  # PROCESSING and SUBMITTED; not FINISHED, not someone else's
    for key in (keys[0], keys[2]):
        record = await store.get_action(*key)
        assert record is not None and record.lease_expires_at == now + timedelta(seconds=10)
    finished = await store.get_action(*keys[1])
    assert finished is not None and finished.lease_expires_at != now + timedelta(seconds=10)
    assert await store.renew_leases("node-b", keys, lease_s=10) == 0
    assert await store.renew_leases("node-a", [], lease_s=10) == 0
    # Expired but not reclaimed: still held. A key given twice counts once.
    clock.advance(60)
    assert await store.renew_leases("node-a", [keys[0], keys[0], keys[2]], lease_s=10) == 2


async def test_list_actions_in_states(store: Store, make: Factory, clock: FakeClock) -> None:
    plan = make.ready_plan(4)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    clock.advance(1)
    await store.transition_action(
        wid, 2, {A.READY}, A.SUBMITTED, ActionChanges(lease_expires_at=clock.now)
    )
    clock.advance(1)
    await store.transition_action(
        wid,
        0,
        {A.READY},
        A.RUNNING,
        ActionChanges(lease_expires_at=clock.now + timedelta(seconds=60)),
    )
    clock.advance(1)
    await store.transition_action(wid, 1, {A.READY}, A.RUNNING)  # no lease: never expires

    active = await store.list_actions_in_states({A.SUBMITTED, A.RUNNING})
    assert [a.action_id for a in active] == [2, 0, 1]  # oldest update first
    assert [a.action_id for a in await store.list_actions_in_states({A.READY})] == [3]
    expired = await store.list_actions_in_states({A.SUBMITTED, A.RUNNING}, lease_expired=True)
    assert [a.action_id for a in expired] == [2]
    assert len(await store.list_actions_in_states({A.SUBMITTED, A.RUNNING}, limit=2)) == 2
    assert await store.list_actions_in_states(set()) == []


async def test_release_parent_flips_child_when_nothing_is_left(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan({0: (), 1: (), 2: (0, 1), 3: (0,)})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    now = clock.advance(1)

    ready = await store.release_parent(wid, 0, (2, 3))
    assert [a.action_id for a in ready] == [3]
    assert ready[0].state is A.READY and ready[0].waiting_on == ()
    assert ready[0].updated_at == now
    assert await store.get_action(wid, 3) == ready[0]
    two = await store.get_action(wid, 2)
    assert two is not None and (two.state, two.waiting_on) == (A.WAITING, (1,))

    # Releasing twice changes nothing the second time.
    assert await store.release_parent(wid, 0, (2, 3)) == []
    assert await store.get_action(wid, 2) == two

    ready = await store.release_parent(wid, 1, (2,))
    assert [a.action_id for a in ready] == [2]
    assert await store.release_parent(wid, 1, (2,)) == []
    assert await store.count_actions(wid) == {A.READY: 4}
    assert await store.release_parent(wid, 1, ()) == []


async def test_release_parent_does_not_revive_a_killed_child(store: Store, make: Factory) -> None:
    plan = make.plan({0: (), 1: (0,)})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    await store.transition_action(wid, 1, {A.WAITING}, A.KILLED)

    assert await store.release_parent(wid, 0, (1,)) == []
    killed = await store.get_action(wid, 1)
    assert killed is not None and killed.state is A.KILLED


async def test_every_transition_is_idempotent(store: Store, make: Factory) -> None:
    """The same request twice: the second loses the compare-and-set, the state stays."""
    plan = make.ready_plan(1)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    path = [A.PROCESSING, A.SUBMITTED, A.RUNNING, A.FINISHED]
    current = A.READY
    for new in path:
        assert states.is_allowed(current, new)
        expected = {current}
        first = await store.transition_action(wid, 0, expected, new)
        assert first is not None and first.state is new
        assert await store.transition_action(wid, 0, expected, new) is None
        assert await store.get_action(wid, 0) == first
        current = new


async def test_release_parent_of_a_wide_fan_out(store: Store, make: Factory) -> None:
    """More children than one statement binds (SQLite) or one batch holds."""
    width = 510
    plan = make.plan({0: (), **{i: (0,) for i in range(1, width + 1)}}, datasets=False)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    children = tuple(range(1, width + 1))

    ready = await store.release_parent(wid, 0, children)

    assert [a.action_id for a in ready] == list(children)
    assert await store.count_actions(wid) == {A.READY: width + 1}
    assert await store.release_parent(wid, 0, children) == []


async def test_watch_ready_pushes_ready_actions_or_says_it_cannot(
    store: Store, make: Factory
) -> None:
    # SQLite, memory and a MongoDB without replica set (nx-27017) cannot push:
    # they say so at once, and nodes poll. A replica set pushes every READY write.
    pushed = asyncio.Event()
    watching = asyncio.ensure_future(store.watch_ready(pushed.set))
    await asyncio.wait({watching}, timeout=1.0)
    if watching.done():
        with pytest.raises(errors.Unsupported):
            watching.result()
        return
    try:
        async with asyncio.timeout(20):
            while not pushed.is_set():  # the stream may open after the first write
                await store.create_workflow(make.ready_plan(1))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pushed.wait(), timeout=0.5)
    finally:
        watching.cancel()

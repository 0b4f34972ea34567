"""Each action's recorded state history, on every backend, through the real planner and
outcome service: a full run, a retry, a kill, a reuse, a shared computation; and the
store rules under them (a write that keeps the state adds nothing, the cap).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pingo import states
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store.protocol import HISTORY_LIMIT, ActionChanges, ActionRecord, StateEntry, Store
from pingo.workflows import planner
from tests.contract.conftest import Factory, FakeClock
from tests.unit._engine_support import workflow, write_output

A = states.ActionState
W = states.WorkflowState

CHAIN = workflow({1: [], 2: [1]})
LEASE_S = 30.0


async def get(store: Store, workflow_id: str, action_id: int) -> ActionRecord:
    action = await store.get_action(workflow_id, action_id)
    assert action is not None
    return action


def steps(action: ActionRecord) -> list[tuple[A, datetime]]:
    return [(entry.state, entry.at) for entry in action.history]


async def submit(store: Store, clock: FakeClock, workflow_id: str, action_id: int) -> ActionRecord:
    """A scraper's claim, then a submitter's PROCESSING → SUBMITTED, a second apart."""
    clock.advance(1)
    claimed = await store.claim_actions("node-a", 10, LEASE_S)
    assert [a.key for a in claimed] == [(workflow_id, action_id)]
    clock.advance(1)
    submitted = await store.transition_action(
        workflow_id,
        action_id,
        {A.PROCESSING},
        A.SUBMITTED,
        ActionChanges(attempts=claimed[0].attempts + 1, started_at=clock()),
        if_owner="node-a",
    )
    assert submitted is not None
    return submitted


async def run(
    store: Store,
    clock: FakeClock,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    workflow_id: str,
    action_id: int,
) -> None:
    """Claim, submit, start and succeed one action, a second between each step."""
    action = await submit(store, clock, workflow_id, action_id)
    clock.advance(1)
    await outcomes.running(action.callback_id, action.attempts)
    clock.advance(1)
    write_output(storage, action)
    await outcomes.success(action.callback_id, action.attempts)


async def test_a_full_run_records_every_state_at_the_store_clock(
    store: Store,
    clock: FakeClock,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    t0 = clock()
    record = await manager.submit(CHAIN, owner="ann")
    await run(store, clock, storage, outcomes, record.id, 1)
    first = await get(store, record.id, 1)
    second = await get(store, record.id, 2)
    assert steps(first) == [
        (A.READY, t0),
        (A.PROCESSING, t0 + timedelta(seconds=1)),
        (A.SUBMITTED, t0 + timedelta(seconds=2)),
        (A.RUNNING, t0 + timedelta(seconds=3)),
        (A.FINISHED, t0 + timedelta(seconds=4)),
    ]
    # Released by its parent's success, in the same store call.
    assert steps(second) == [(A.WAITING, t0), (A.READY, t0 + timedelta(seconds=4))]
    await run(store, clock, storage, outcomes, record.id, 2)
    finished = await get(store, record.id, 2)
    assert [s for s, _ in steps(finished)] == [
        A.WAITING, A.READY, A.PROCESSING, A.SUBMITTED, A.RUNNING, A.FINISHED,
    ]  # fmt: skip
    assert finished.history[-1].at == finished.finished_at
    assert (await store.get_workflow(record.id)).state is W.SUCCEEDED  # type: ignore[union-attr]


async def test_a_retry_passes_through_the_same_states_again(
    store: Store,
    clock: FakeClock,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow({1: []}), owner="ann")
    action = await submit(store, clock, record.id, 1)
    clock.advance(1)
    await outcomes.failed(action.callback_id, action.attempts, "flaky")
    retried_at = clock()
    clock.advance(60)  # past the backoff
    await run(store, clock, storage, outcomes, record.id, 1)
    done = await get(store, record.id, 1)
    assert [s for s, _ in steps(done)] == [
        A.READY, A.PROCESSING, A.SUBMITTED,
        A.READY, A.PROCESSING, A.SUBMITTED, A.RUNNING, A.FINISHED,
    ]  # fmt: skip
    assert done.history[3] == StateEntry(A.READY, retried_at)
    times = [at for _, at in steps(done)]
    assert times == sorted(times)
    assert done.attempts == 2


async def test_a_kill_records_the_end_of_running_and_waiting_actions(
    store: Store,
    clock: FakeClock,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    t0 = clock()
    record = await manager.submit(CHAIN, owner="ann")
    await submit(store, clock, record.id, 1)
    clock.advance(5)
    killed_at = clock()
    await outcomes.kill_workflow(record.id)
    running = await get(store, record.id, 1)
    waiting = await get(store, record.id, 2)
    assert [s for s, _ in steps(running)] == [A.READY, A.PROCESSING, A.SUBMITTED, A.KILLED]
    assert running.history[-1] == StateEntry(A.KILLED, killed_at)
    assert steps(waiting) == [(A.WAITING, t0), (A.KILLED, killed_at)]


async def test_a_reused_action_is_finished_from_its_creation(
    store: Store,
    clock: FakeClock,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(CHAIN, owner="ann")
    await run(store, clock, storage, outcomes, first.id, 1)
    await run(store, clock, storage, outcomes, first.id, 2)
    clock.advance(10)
    planned_at = clock()
    again = await manager.submit(CHAIN, owner="ann")
    end = await get(store, again.id, 2)
    assert end.reused and end.attempts == 0
    assert steps(end) == [(A.FINISHED, planned_at)]


async def test_a_shared_computation_finishes_the_consumer_without_running_it(
    store: Store,
    clock: FakeClock,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    t0 = clock()
    producer = await manager.submit(workflow({1: []}), owner="ann")
    consumer = await manager.submit(CHAIN, owner="bob")
    attached = await get(store, consumer.id, 1)
    assert attached.is_attached
    await run(store, clock, storage, outcomes, producer.id, 1)
    produced = await get(store, producer.id, 1)
    shared = await get(store, consumer.id, 1)
    assert shared.state is A.FINISHED and shared.attempts == 0
    assert steps(shared) == [(A.WAITING, t0), (A.FINISHED, produced.history[-1].at)]
    reader = await get(store, consumer.id, 2)
    assert [s for s, _ in steps(reader)] == [A.WAITING, A.READY]


# ------------------------------------------------------------------------ store rules


async def test_the_store_opens_the_history_of_a_plan_given_none(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    created_at = clock()
    plan = make.plan({0: (), 1: (0,)}, actions={0: {"history": ()}, 1: {"history": ()}})
    clock.advance(3)  # the planner's time of creation, not the store's later clock
    await store.create_workflow(plan)
    assert steps(await get(store, plan.workflow.id, 0)) == [(A.READY, created_at)]
    assert steps(await get(store, plan.workflow.id, 1)) == [(A.WAITING, created_at)]


async def test_a_write_that_keeps_the_state_adds_nothing(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan({0: ()})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    clock.advance(1)
    [claimed] = await store.claim_actions("node-a", 1, LEASE_S)
    assert len(claimed.history) == 2
    # The lease lapses and another node reclaims it: still PROCESSING, nothing entered.
    clock.advance(LEASE_S + 1)
    [reclaimed] = await store.claim_actions("node-b", 1, LEASE_S)
    assert reclaimed.owner == "node-b"
    assert reclaimed.history == claimed.history
    # Both kinds of expected set: one that holds the new state with others, one without.
    clock.advance(1)
    again = await store.transition_action(wid, 0, {A.READY, A.PROCESSING}, A.PROCESSING)
    assert again is not None and again.history == claimed.history
    submitted_at = clock.advance(1)
    submitted = await store.transition_action(wid, 0, {A.PROCESSING}, A.SUBMITTED)
    assert submitted is not None
    assert submitted.history == (*claimed.history, StateEntry(A.SUBMITTED, submitted_at))
    clock.advance(1)
    named = await store.transition_action(
        wid, 0, {A.SUBMITTED}, A.SUBMITTED, ActionChanges(external_id="pid-7")
    )
    assert named is not None and named.history == submitted.history
    assert await store.renew_leases("node-b", [(wid, 0)], LEASE_S) == 1
    assert (await get(store, wid, 0)).history == submitted.history


async def test_the_history_keeps_the_latest_entries_up_to_its_limit(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan({0: ()})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    moves = HISTORY_LIMIT  # twice as many entries as kept, plus the opening one
    for _ in range(moves):
        clock.advance(1)
        assert await store.transition_action(wid, 0, {A.READY}, A.PROCESSING) is not None
        clock.advance(1)
        assert await store.transition_action(wid, 0, {A.PROCESSING}, A.READY) is not None
    action = await get(store, wid, 0)
    assert len(action.history) == HISTORY_LIMIT
    assert action.history[-1] == StateEntry(A.READY, clock())
    assert action.history[0].state is A.PROCESSING  # the oldest went first
    times = [at for _, at in steps(action)]
    assert times == sorted(times) and len(set(times)) == HISTORY_LIMIT


async def test_a_claim_keeps_the_history_within_its_limit(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan({0: (), 1: ()})
    await store.create_workflow(plan)
    wid = plan.workflow.id
    for _ in range(HISTORY_LIMIT // 2):  # action 0's history fills up; action 1's stays short
        clock.advance(1)
        assert await store.transition_action(wid, 0, {A.READY}, A.PROCESSING) is not None
        clock.advance(1)
        assert await store.transition_action(wid, 0, {A.PROCESSING}, A.READY) is not None
    assert len((await get(store, wid, 0)).history) == HISTORY_LIMIT
    clock.advance(1)
    claimed = {a.action_id: a for a in await store.claim_actions("node-a", 10, lease_s=30)}
    assert sorted(claimed) == [0, 1]
    for action_id, length in ((0, HISTORY_LIMIT), (1, 2)):
        stored = await get(store, wid, action_id)
        assert stored.history == claimed[action_id].history
        assert len(stored.history) == length
        assert stored.history[-1] == StateEntry(A.PROCESSING, clock())

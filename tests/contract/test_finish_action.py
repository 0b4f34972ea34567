"""finish_action: the compare-and-set to FINISHED, then the claims and the children, in one call."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from pingo.states import ActionState, DatasetState
from pingo.store.protocol import (
    ActionChanges,
    DatasetChanges,
    DatasetMove,
    NewEvent,
    StateEntry,
    Store,
    WorkflowPlan,
    claim_key,
)
from tests.contract.conftest import Backend, Factory, FakeClock

A = ActionState
EXECUTING = {A.SUBMITTED, A.RUNNING}
#: Another workflow's claim, which finishing must leave alone.
FOREIGN = "wf-other/7"


def _plan(make: Factory) -> WorkflowPlan:
    """Action 2 RUNNING (attempt 1) reads 0 and 1 (finished); 3 waits on 2; 4 on 2 and 5.

    Action 2's claims are on the datasets of 0 and 1 (plus a foreign claim on 0's);
    action 4 claims 5's dataset.
    """
    plan = make.plan(
        {0: (), 1: (), 5: (), 2: (0, 1), 3: (2,), 4: (2, 5)},
        actions={
            0: {"state": A.FINISHED},
            1: {"state": A.FINISHED},
            2: {"state": A.RUNNING, "attempts": 1, "owner": "node-a", "waiting_on": ()},
        },
    )
    wid = plan.workflow.id
    by_id = {a.action_id: a for a in plan.actions}
    claims = {
        by_id[0].dataset_id: (claim_key(wid, 2), FOREIGN),
        by_id[1].dataset_id: (claim_key(wid, 2),),
        by_id[5].dataset_id: (claim_key(wid, 4),),
    }
    datasets = tuple(replace(d, claims=claims.get(d.id, ())) for d in plan.datasets)
    return replace(plan, datasets=datasets)


async def _snapshot(store: Store, plan: WorkflowPlan) -> tuple[object, object]:
    actions = await store.list_actions(plan.workflow.id)
    datasets = await store.get_datasets([d.id for d in plan.datasets])
    return actions, datasets


async def test_finish_action_finishes_drops_claims_and_releases_children(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = _plan(make)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    by_id = {a.action_id: a for a in plan.actions}
    now = clock.advance(3)
    changes = ActionChanges(finished_at=now, runtime_s=2.5, error=None, lease_expires_at=None)

    outcome = await store.finish_action(wid, 2, EXECUTING, changes, if_attempt=1)

    assert outcome is not None
    finished, ready, attached = outcome
    assert attached == []
    assert finished == replace(
        by_id[2],
        state=A.FINISHED,
        finished_at=now,
        runtime_s=2.5,
        error=None,
        lease_expires_at=None,
        updated_at=now,
        version=by_id[2].version + 1,
        history=(*by_id[2].history, StateEntry(A.FINISHED, now)),
    )
    assert await store.get_action(wid, 2) == finished
    # Its only-waiting child is READY; the one that also waits on 5 keeps waiting.
    assert [a.action_id for a in ready] == [3]
    assert (ready[0].state, ready[0].waiting_on, ready[0].updated_at) == (A.READY, (), now)
    assert await store.get_action(wid, 3) == ready[0]
    four = await store.get_action(wid, 4)
    assert four is not None and (four.state, four.waiting_on) == (A.WAITING, (5,))
    # Its claims are gone from both inputs; the others' claims stay.
    datasets = await store.get_datasets([d.id for d in plan.datasets])
    assert datasets[by_id[0].dataset_id].claims == (FOREIGN,)
    assert datasets[by_id[1].dataset_id].claims == ()
    assert datasets[by_id[5].dataset_id].claims == (claim_key(wid, 4),)
    assert await store.count_actions(wid) == {A.FINISHED: 3, A.READY: 2, A.WAITING: 1}


async def test_a_lost_finish_changes_nothing(store: Store, make: Factory, clock: FakeClock) -> None:
    plan = _plan(make)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    before = await _snapshot(store, plan)
    clock.advance(1)
    changes = ActionChanges(finished_at=clock.now, error=None)

    # A stale attempt, a state not expected, no expected state, no such action.
    assert await store.finish_action(wid, 2, EXECUTING, changes, if_attempt=2) is None
    assert await store.finish_action(wid, 2, {A.SUBMITTED}, changes, if_attempt=1) is None
    assert await store.finish_action(wid, 2, set(), changes) is None
    assert await store.finish_action(wid, 99, EXECUTING, changes) is None
    assert await store.finish_action("missing", 2, EXECUTING, changes) is None

    assert await _snapshot(store, plan) == before


def _stored_move(plan: WorkflowPlan, expected: DatasetState) -> DatasetMove:
    """Action 2's dataset to STORED from `expected`, with its event."""
    two = next(a for a in plan.actions if a.action_id == 2)
    event = NewEvent("dataset.stored", "alice", plan.workflow.id, two.dataset_id, {"size": 5})
    changes = DatasetChanges(size_bytes=5)
    return DatasetMove(two.dataset_id, frozenset({expected}), DatasetState.STORED, changes, event)


async def test_finish_action_stores_its_dataset_in_the_same_call(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = _plan(make)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    move = _stored_move(plan, DatasetState.TO_STORE)
    now = clock.advance(3)
    changes = ActionChanges(finished_at=now, runtime_s=2.5, error=None, lease_expires_at=None)

    outcome = await store.finish_action(wid, 2, EXECUTING, changes, if_attempt=1, stored=move)

    assert outcome is not None and outcome.action.state is A.FINISHED
    assert [a.action_id for a in outcome.released] == [3]
    dataset = await store.get_dataset(move.dataset_id)
    assert dataset is not None
    assert (dataset.state, dataset.size_bytes, dataset.updated_at) == (
        DatasetState.STORED,
        5,
        now,
    )
    [event] = await store.list_events(dataset_id=move.dataset_id)
    assert (event.kind, event.owner, event.payload) == ("dataset.stored", "alice", {"size": 5})


async def _finish_storing(
    store: Store, make: Factory, clock: FakeClock, *, dataset_from: DatasetState, attempt: int
) -> tuple[WorkflowPlan, tuple[object, object], DatasetMove, object]:
    """Finish action 2 of a new `_plan` (attempt `attempt`) storing its dataset from
    `dataset_from`: the plan, the snapshot before, the move and what the finish returned."""
    plan = _plan(make)
    await store.create_workflow(plan)
    before = await _snapshot(store, plan)
    clock.advance(1)
    changes = ActionChanges(finished_at=clock.now, error=None)
    move = _stored_move(plan, dataset_from)
    outcome = await store.finish_action(
        plan.workflow.id, 2, EXECUTING, changes, if_attempt=attempt, stored=move
    )
    return plan, before, move, outcome


async def test_a_finish_whose_dataset_moved_on_changes_nothing(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan, before, move, lost = await _finish_storing(
        store, make, clock, dataset_from=DatasetState.DELETED, attempt=1
    )

    assert lost is None
    assert await _snapshot(store, plan) == before
    assert await store.list_events(dataset_id=move.dataset_id) == []


async def test_a_lost_finish_takes_its_dataset_move_back(
    store: Store, make: Factory, clock: FakeClock, backend: Backend
) -> None:
    plan, before, move, stale = await _finish_storing(
        store, make, clock, dataset_from=DatasetState.TO_STORE, attempt=2
    )

    assert stale is None
    actions, datasets = await _snapshot(store, plan)
    assert actions == before[0]
    events = await store.list_events(dataset_id=move.dataset_id)
    if backend.name in ("mongomock", "wire"):
        # No transaction across documents: the dataset's move stays, as two calls leave it.
        assert [e.kind for e in events] == ["dataset.stored"]
    else:
        assert datasets == before[1]
        assert events == []


async def test_finishing_twice_changes_nothing_the_second_time(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = _plan(make)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    clock.advance(1)
    assert await store.finish_action(wid, 2, EXECUTING, if_attempt=1) is not None
    after = await _snapshot(store, plan)
    clock.advance(1)

    assert await store.finish_action(wid, 2, EXECUTING, if_attempt=1) is None
    assert await _snapshot(store, plan) == after


async def test_finish_flips_a_child_only_when_its_last_parent_finishes(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan(
        {0: (), 1: (), 2: (0, 1), 3: (0,)},
        actions={0: {"state": A.SUBMITTED, "attempts": 1}, 1: {"state": A.RUNNING}},
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id
    await store.transition_action(wid, 3, {A.WAITING}, A.KILLED)
    clock.advance(1)

    first = await store.finish_action(wid, 0, EXECUTING, if_attempt=1)
    # 2 still waits on 1; a KILLED child is never revived.
    assert first is not None and first[1] == []
    two = await store.get_action(wid, 2)
    assert two is not None and (two.state, two.waiting_on) == (A.WAITING, (1,))
    three = await store.get_action(wid, 3)
    assert three is not None and three.state is A.KILLED

    now = clock.advance(1)
    second = await store.finish_action(wid, 1, EXECUTING)
    assert second is not None
    assert [(a.action_id, a.state, a.waiting_on, a.updated_at) for a in second[1]] == [
        (2, A.READY, (), now)
    ]


async def test_finish_without_inputs_or_children(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    plan = make.plan({0: ()}, actions={0: {"state": A.RUNNING}})
    await store.create_workflow(plan)
    lease = clock.advance(1) + timedelta(seconds=30)
    await store.transition_action(
        plan.workflow.id, 0, {A.RUNNING}, A.RUNNING, ActionChanges(lease_expires_at=lease)
    )

    outcome = await store.finish_action(
        plan.workflow.id, 0, EXECUTING, ActionChanges(lease_expires_at=None)
    )

    assert outcome is not None
    finished, ready, attached = outcome
    assert attached == []
    assert (finished.state, finished.lease_expires_at, ready) == (A.FINISHED, None, [])
    dataset = await store.get_dataset(plan.actions[0].dataset_id)
    assert dataset is not None and dataset.state is DatasetState.TO_LEAF


async def test_finish_drops_its_claim_wherever_it_stands_and_keeps_the_order(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    """First, middle, last or only claim of an input; keys that contain the finished
    action's key (`…/20`, `x…/2`) stay, and so does the order of the others."""
    inputs = (0, 1, 3, 4)
    plan = make.plan(
        {0: (), 1: (), 3: (), 4: (), 2: inputs},
        actions={
            **{i: {"state": A.FINISHED} for i in inputs},
            2: {"state": A.RUNNING, "attempts": 1, "waiting_on": ()},
        },
    )
    wid = plan.workflow.id
    mine = claim_key(wid, 2)
    near = [claim_key(wid, 20), claim_key(f"x{wid}", 2), FOREIGN]
    by_id = {a.action_id: a for a in plan.actions}
    claims = {
        by_id[0].dataset_id: (mine, *near),
        by_id[1].dataset_id: (near[0], mine, near[1], near[2]),
        by_id[3].dataset_id: (*near, mine),
        by_id[4].dataset_id: (mine,),
    }
    plan = replace(
        plan, datasets=tuple(replace(d, claims=claims.get(d.id, ())) for d in plan.datasets)
    )
    await store.create_workflow(plan)
    clock.advance(1)

    assert await store.finish_action(wid, 2, EXECUTING, if_attempt=1) is not None

    datasets = await store.get_datasets([by_id[i].dataset_id for i in inputs])
    assert [datasets[by_id[i].dataset_id].claims for i in inputs] == [
        tuple(near),
        (near[0], near[1], near[2]),
        tuple(near),
        (),
    ]

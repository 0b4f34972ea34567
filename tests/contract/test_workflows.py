"""Workflows: persisting a plan, lookups, lists with cursors, compare-and-set."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest

from pingo import errors
from pingo.states import WorkflowState
from pingo.store.protocol import (
    Store,
    WorkflowChanges,
    new_callback_ids,
    new_workflow_id,
    planning_started_at,
)
from tests.contract.conftest import Factory, FakeClock


async def test_create_workflow_persists_every_part(store: Store, make: Factory) -> None:
    plan = make.plan()

    created = await store.create_workflow(plan)

    assert created == plan.workflow
    assert await store.get_workflow(plan.workflow.id) == plan.workflow
    assert await store.list_actions(plan.workflow.id) == list(plan.actions)
    datasets = await store.get_datasets([d.id for d in plan.datasets])
    assert set(datasets) == {d.id for d in plan.datasets}
    for planned in plan.datasets:
        record = datasets[planned.id]
        assert (record.state, record.path, record.parents) == (
            planned.state,
            planned.path,
            planned.parents,
        )
        assert record.definition == planned.definition
        assert (record.producer_workflow_id, record.producer_action_id) == (
            plan.workflow.id,
            planned.producer_action_id,
        )
        assert record.claims == ()
        assert record.created_at == record.updated_at == store.clock()


async def test_records_round_trip_exactly(store: Store, make: Factory, clock: FakeClock) -> None:
    later = clock.advance(1.5)
    plan = make.plan(
        actions={
            1: {
                "attempts": 2,
                "max_attempts": 5,
                "owner": "node-a",
                "lease_expires_at": later,
                "not_before": later,
                "external_id": "pid-7",
                "error": "boom",
                "started_at": later,
                "finished_at": later,
                "runtime_s": 1.25,
                "reused": True,
                "reason": "reused",
            }
        },
        finished_at=later,
        idempotency_key="key-1",
        rerun_of="wf-previous",
        error="nothing",
        end_dataset_id="ds-end",
        document={"name": "x", "nested": {"a": [1, 2, {"b": None}]}, "unicode": "é✓"},
    )
    await store.create_workflow(plan)

    assert await store.get_workflow(plan.workflow.id) == plan.workflow
    assert await store.get_action(plan.workflow.id, 1) == plan.actions[1]
    by_callback = await store.get_action_by_callback(plan.actions[2].callback_id)
    assert by_callback == plan.actions[2]
    assert by_callback is not None and by_callback.inputs == {1: plan.actions[1].dataset_id}
    # With its dataset, in one call.
    both = await store.get_action_and_dataset_by_callback(plan.actions[2].callback_id)
    assert both == (plan.actions[2], await store.get_dataset(plan.actions[2].dataset_id))
    assert both[1] is not None


async def test_action_and_dataset_by_callback_without_the_dataset(
    store: Store, make: Factory
) -> None:
    plan = make.plan(datasets=False)
    await store.create_workflow(plan)
    action = plan.actions[0]
    assert await store.get_action_and_dataset_by_callback(action.callback_id) == (action, None)
    assert await store.get_action_and_dataset_by_callback("nope") is None


async def test_missing_things_are_none(store: Store) -> None:
    assert await store.get_workflow("nope") is None
    assert await store.get_action("nope", 0) is None
    assert await store.get_action_by_callback("nope") is None
    assert await store.list_actions("nope") == []
    assert await store.count_actions("nope") == {}
    assert await store.find_workflow_by_idempotency_key("alice", "nope") is None


async def test_idempotency_key_lookup_and_conflict(store: Store, make: Factory) -> None:
    first = make.plan(idempotency_key="submit-1")
    await store.create_workflow(first)
    found = await store.find_workflow_by_idempotency_key("alice", "submit-1")
    assert found == first.workflow

    duplicate = make.plan(idempotency_key="submit-1")
    with pytest.raises(errors.Conflict):
        await store.create_workflow(duplicate)
    # Nothing of the rejected plan was stored.
    assert await store.get_workflow(duplicate.workflow.id) is None
    assert await store.list_actions(duplicate.workflow.id) == []
    assert await store.get_action_by_callback(duplicate.actions[0].callback_id) is None
    assert await store.get_datasets([d.id for d in duplicate.datasets]) == {}

    # Keys are per owner, and workflows without a key never collide.
    other = make.plan(idempotency_key="submit-1", owner="bob")
    await store.create_workflow(other)
    assert await store.find_workflow_by_idempotency_key("bob", "submit-1") == other.workflow
    await store.create_workflow(make.plan())
    await store.create_workflow(make.plan())


async def test_a_plan_past_its_deadline_is_refused_whole(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    """The deletor releases the claims of a planning past its deadline whose workflow it
    does not find: the store must never write such a plan after that."""
    deadline = clock.advance(0) + timedelta(seconds=10)
    on_time = replace(make.plan(), deadline_at=deadline)
    clock.advance(10)
    await store.persist_plan(on_time)
    late = replace(make.plan(), deadline_at=deadline)
    clock.advance(0.001)
    with pytest.raises(errors.PlanExpired):
        await store.persist_plan(late)
    assert isinstance(errors.PlanExpired(), errors.SubmissionInterrupted)
    assert await store.get_workflow(late.workflow.id) is None
    assert await store.list_actions(late.workflow.id) == []
    assert await store.get_datasets([d.id for d in late.datasets]) == {}
    assert await store.get_workflow(on_time.workflow.id) == on_time.workflow


async def test_planning_started_at_reads_a_new_workflow_id_back(clock: FakeClock) -> None:
    workflow_id = new_workflow_id(clock())
    assert planning_started_at(workflow_id) == clock()
    assert sorted([new_workflow_id(clock.advance(0.001)), workflow_id])[0] == workflow_id
    for other in ("wf-never", "wf-zzzzzzzzz", "x-000000001-ab", "wf-00000000!-ab", "wf"):
        assert planning_started_at(other) is None


async def test_a_plans_callback_ids_are_random_and_sort_together(clock: FakeClock) -> None:
    earlier = new_workflow_id(clock())
    later = new_workflow_id(clock.advance(0.001))
    first, second = new_callback_ids(earlier, 1000), new_callback_ids(later, 1000)
    assert len(set(first) | set(second)) == 2000
    stamp = earlier.split("-")[1]
    # 128 random bits after the planning's time, so one plan's ids sit together in an
    # index, after every earlier plan's.
    assert all(re.fullmatch(stamp + "[0-9a-f]{32}", c) for c in first)
    assert max(first) < min(second)
    assert len({c[len(stamp) :][:8] for c in first}) > 990
    # An id not made by new_workflow_id gives random ids alone.
    assert all(re.fullmatch("[0-9a-f]{32}", c) for c in new_callback_ids("wf-never", 3))


async def test_duplicate_workflow_id_conflicts(store: Store, make: Factory) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    again = make.plan(id=plan.workflow.id)
    with pytest.raises(errors.Conflict):
        await store.create_workflow(again)
    assert await store.get_workflow(plan.workflow.id) == plan.workflow


async def test_list_workflows_filters_newest_first(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    made = []
    for owner, name in [("alice", "a"), ("bob", "a"), ("alice", "b"), ("bob", "b")]:
        clock.advance(1)
        plan = make.plan(owner=owner, name=name)
        await store.create_workflow(plan)
        made.append(plan.workflow)
    done = await store.transition_workflow(
        made[2].id, {WorkflowState.RUNNING}, WorkflowState.KILLED
    )
    assert done is not None
    made[2] = done

    page = await store.list_workflows()
    assert page.items == tuple(reversed(made))
    assert page.next_cursor is None
    alice = await store.list_workflows(owner="alice")
    assert [w.id for w in alice.items] == [made[2].id, made[0].id]
    running = await store.list_workflows(state=WorkflowState.RUNNING)
    assert [w.id for w in running.items] == [made[3].id, made[1].id, made[0].id]
    named = await store.list_workflows(name="b", owner="bob")
    assert [w.id for w in named.items] == [made[3].id]
    killed_alice = await store.list_workflows(owner="alice", state=WorkflowState.KILLED)
    assert killed_alice.items == (made[2],)
    assert (await store.list_workflows(owner="carol")).items == ()


async def test_cursor_pagination_is_stable_while_rows_are_added(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    ids = []
    for i in range(7):
        # Two workflows share each instant: ties are ordered by id.
        if i % 2 == 0:
            clock.advance(1)
        plan = make.plan(datasets=False)
        await store.create_workflow(plan)
        ids.append((plan.workflow.created_at, plan.workflow.id))
    expected = [wid for _, wid in sorted(ids, reverse=True)]

    seen: list[str] = []
    page = await store.list_workflows(limit=3)
    seen.extend(w.id for w in page.items)
    while page.next_cursor is not None:
        # Newer workflows arriving meanwhile never shift the pages being read.
        clock.advance(1)
        await store.create_workflow(make.plan(datasets=False))
        page = await store.list_workflows(limit=3, cursor=page.next_cursor)
        seen.extend(w.id for w in page.items)
    assert seen == expected
    # An exact multiple of the page size ends with an empty-cursor page, not an empty page.
    full = await store.list_workflows(limit=len(seen) + 2)
    assert full.next_cursor is None


async def test_invalid_cursor_is_a_validation_error(store: Store) -> None:
    with pytest.raises(errors.ValidationFailed):
        await store.list_workflows(cursor="not a cursor!")
    with pytest.raises(errors.ValidationFailed):
        await store.list_datasets(cursor="W10")


async def test_transition_workflow_compare_and_set(store: Store, make: Factory) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    wid = plan.workflow.id
    finished = make.clock.advance(3)

    moved = await store.transition_workflow(
        wid,
        {WorkflowState.RUNNING},
        WorkflowState.FAILED,
        WorkflowChanges(finished_at=finished, error="action 1 failed"),
    )
    assert moved == replace(
        plan.workflow,
        state=WorkflowState.FAILED,
        finished_at=finished,
        error="action 1 failed",
        version=plan.workflow.version + 1,
    )
    assert await store.get_workflow(wid) == moved

    # Lost race: the state is not the expected one; nothing changes.
    lost = await store.transition_workflow(
        wid, {WorkflowState.RUNNING}, WorkflowState.KILLED, WorkflowChanges(error="late")
    )
    assert lost is None
    assert await store.get_workflow(wid) == moved
    assert (
        await store.transition_workflow("missing", {WorkflowState.RUNNING}, WorkflowState.KILLED)
        is None
    )


async def test_workflow_changes_keep_untouched_fields(store: Store, make: Factory) -> None:
    plan = make.plan(error="earlier")
    await store.create_workflow(plan)
    moved = await store.transition_workflow(
        plan.workflow.id, {WorkflowState.RUNNING}, WorkflowState.SUCCEEDED
    )
    assert moved is not None
    assert moved.error == "earlier"
    assert moved.finished_at is None
    cleared = await store.transition_workflow(
        plan.workflow.id,
        {WorkflowState.SUCCEEDED},
        WorkflowState.SUCCEEDED,
        WorkflowChanges(error=None),
    )
    assert cleared is not None and cleared.error is None

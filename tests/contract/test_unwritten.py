"""A plan written in part: MongoDB has no transaction, so a node that dies inside
`persist_plan` leaves a RUNNING workflow missing actions. The reaper fails it, with the
reason, once its planning is past the deadline and a lease (its writer is gone or would
be refused by then); what was written is killed and the deletor drops its claims. The
other stores write a plan at once and never list one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pymongo.errors import AutoReconnect

from pingo import errors
from pingo.actions.leases import HeldActions
from pingo.actions.reaper import Reaper
from pingo.config import Settings
from pingo.datasets.deletor import Deletor
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import UNWRITTEN_ERROR, OutcomeService
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store.protocol import Store, WorkflowPlan, claim_key, new_workflow_id
from pingo.workflows import planner
from tests.contract.conftest import Backend, Factory, FakeClock, seed_dataset
from tests.unit._engine_support import workflow

CHAIN = workflow({1: [], 2: [1]})


@pytest.fixture
def stepwise(backend: Backend) -> None:
    """Only for the stores that write a plan in several steps."""
    if backend.name not in ("mongomock", "wire"):
        pytest.skip("only MongoDB writes a plan in several steps")


class NodeDied(Exception):
    """Stands for the SIGKILL of the node writing the plan, at a chosen write."""


def _plan(make: Factory, clock: FakeClock) -> WorkflowPlan:
    """The chain 0 → 1 → 2 under a workflow id as planning makes them (it dates the
    planning, which is what the reaper and the deletor go by)."""
    return make.plan(id=new_workflow_id(clock()))


def _on_actions_write(store: Store, before: Callable[[list[Any]], Awaitable[None]]) -> None:
    """Run `before` with the action documents whenever `persist_plan` writes them."""
    collection = store._actions  # type: ignore[attr-defined]
    original = collection.insert_many

    async def insert_many(docs: list[Any], **kwargs: Any) -> Any:
        await before(docs)
        return await original(docs, **kwargs)

    collection.insert_many = insert_many


def _past_the_deadline(clock: FakeClock, settings: Settings) -> None:
    clock.advance(settings.plan_deadline_s + settings.lease_s + 1)


async def _reaper_pass(store: Store, settings: Settings, outcomes: OutcomeService) -> None:
    """One reaper pass (a new reaper sweeps on its first pass)."""
    await Reaper(store, settings, {}, outcomes, HeldActions({})).run_once()


async def test_a_plan_written_whole_is_never_unwritten(
    store: Store,
    make: Factory,
    clock: FakeClock,
    settings: Settings,
    outcomes: OutcomeService,
) -> None:
    plan = _plan(make, clock)
    await store.persist_plan(plan)
    assert await store.list_unwritten_workflows() == []
    _past_the_deadline(clock, settings)
    assert await outcomes.abandon_unwritten() == 0
    workflow = await store.get_workflow(plan.workflow.id)
    assert workflow is not None and workflow.state is WorkflowState.RUNNING


@pytest.mark.usefixtures("stepwise")
async def test_a_half_written_plan_fails_after_its_deadline_and_a_lease(
    store: Store,
    make: Factory,
    clock: FakeClock,
    settings: Settings,
    storage: DatasetStorage,
    outcomes: OutcomeService,
) -> None:
    plan = _plan(make, clock)
    # The planning claimed a stored dataset for action 2, which the node never wrote.
    reused = await seed_dataset(store, make, DatasetState.STORED)
    claim = claim_key(plan.workflow.id, 2)
    await store.add_dataset_claim(reused, claim, {DatasetState.STORED})

    async def die_after_the_first(docs: list[Any]) -> None:
        collection = store._actions  # type: ignore[attr-defined]
        await collection.insert_one(docs[0])
        raise NodeDied

    _on_actions_write(store, die_after_the_first)
    with pytest.raises(NodeDied):
        await store.persist_plan(plan)
    assert await store.list_unwritten_workflows() == [plan.workflow.id]
    written = await store.list_actions(plan.workflow.id)
    assert [(a.action_id, a.state) for a in written] == [(0, ActionState.READY)]

    # Its writer may still be at it until the deadline and a lease have passed.
    clock.advance(settings.plan_deadline_s + settings.lease_s)
    await _reaper_pass(store, settings, outcomes)
    deletor = Deletor(store, storage, settings)
    assert await deletor.release_orphan_claims() == 0
    running = await store.get_workflow(plan.workflow.id)
    assert running is not None and running.state is WorkflowState.RUNNING

    clock.advance(1)
    await _reaper_pass(store, settings, outcomes)
    failed = await store.get_workflow(plan.workflow.id)
    assert failed is not None
    assert (failed.state, failed.error) == (WorkflowState.FAILED, UNWRITTEN_ERROR)
    assert failed.finished_at == clock()
    action = await store.get_action(plan.workflow.id, 0)
    assert action is not None and action.state is ActionState.KILLED
    assert await store.list_unwritten_workflows() == []
    assert await outcomes.abandon_unwritten() == 0
    # The claim its missing action's planning took is an orphan now.
    assert await deletor.release_orphan_claims() == 1
    dataset = await store.get_dataset(reused)
    assert dataset is not None and claim not in dataset.claims


@pytest.mark.usefixtures("stepwise")
async def test_a_workflow_whose_writer_died_before_any_action_never_succeeds(
    store: Store,
    make: Factory,
    clock: FakeClock,
    settings: Settings,
    outcomes: OutcomeService,
) -> None:
    plan = _plan(make, clock)

    async def die_before_any(docs: list[Any]) -> None:
        raise NodeDied

    _on_actions_write(store, die_before_any)
    with pytest.raises(NodeDied):
        await store.persist_plan(plan)
    # A node starting replays the steps a dead node left: none of them ends this one.
    await outcomes.recover_running()
    running = await store.get_workflow(plan.workflow.id)
    assert running is not None and running.state is WorkflowState.RUNNING
    clock.advance(settings.plan_deadline_s + settings.lease_s + 1)
    await _reaper_pass(store, settings, outcomes)
    failed = await store.get_workflow(plan.workflow.id)
    assert failed is not None
    assert (failed.state, failed.error) == (WorkflowState.FAILED, UNWRITTEN_ERROR)


@pytest.mark.usefixtures("stepwise")
async def test_a_plan_whose_writer_died_after_its_last_action_is_whole(
    store: Store,
    make: Factory,
    clock: FakeClock,
    settings: Settings,
    outcomes: OutcomeService,
) -> None:
    """Dying between the last action and dropping the mark loses nothing: the workflow
    runs on, however long it takes."""
    plan = _plan(make, clock)

    async def die_after_all(docs: list[Any]) -> None:
        collection = store._actions  # type: ignore[attr-defined]
        for doc in docs:
            await collection.insert_one(doc)
        raise NodeDied

    _on_actions_write(store, die_after_all)
    with pytest.raises(NodeDied):
        await store.persist_plan(plan)
    _past_the_deadline(clock, settings)
    await _reaper_pass(store, settings, outcomes)
    workflow = await store.get_workflow(plan.workflow.id)
    assert workflow is not None and workflow.state is WorkflowState.RUNNING
    assert len(await store.list_actions(plan.workflow.id)) == 3
    assert await store.list_unwritten_workflows() == []


@pytest.mark.usefixtures("stepwise")
async def test_actions_written_after_their_workflow_ended_are_killed(
    backend: Backend, store: Store, make: Factory, clock: FakeClock
) -> None:
    """A user's kill (or the reaper) that lands while a plan's actions are being written
    cannot see them: the writer kills them once it finds the workflow ended."""
    plan = _plan(make, clock)

    async def killed_meanwhile(docs: list[Any]) -> None:
        ended = await store.transition_workflow(
            plan.workflow.id, {WorkflowState.RUNNING}, WorkflowState.KILLED
        )
        assert ended is not None

    _on_actions_write(store, killed_meanwhile)
    await store.persist_plan(plan)
    actions = await store.list_actions(plan.workflow.id)
    assert [a.state for a in actions] == [ActionState.KILLED] * 3
    assert {a.error for a in actions} == {"workflow killed while its actions were being written"}
    for dataset_id in (a.dataset_id for a in actions):
        dataset = await store.get_dataset(dataset_id)
        assert dataset is not None and dataset.state is DatasetState.DELETED
    assert await store.list_unwritten_workflows() == []


@pytest.mark.usefixtures("stepwise")
async def test_a_write_that_fails_ends_its_workflow_at_once(
    store: Store, manager: planner.WorkflowManager
) -> None:
    """A write refused mid-plan (the connection broke) fails the submission, and the
    writer, still alive, ends the workflow itself instead of leaving it RUNNING for the
    reaper: what it wrote is killed, and its datasets are no longer computing."""
    written: list[str] = []

    async def connection_lost_after_the_first(docs: list[Any]) -> None:
        collection = store._actions  # type: ignore[attr-defined]
        await collection.insert_one(docs[0])
        written.append(docs[0]["workflow_id"])
        raise AutoReconnect("connection reset by peer")

    _on_actions_write(store, connection_lost_after_the_first)
    with pytest.raises(errors.StoreUnavailable):
        await manager.submit(CHAIN, owner="ann", idempotency_key="nightly-1")
    [workflow_id] = written
    failed = await store.get_workflow(workflow_id)
    assert failed is not None
    assert (failed.state, failed.error) == (WorkflowState.FAILED, UNWRITTEN_ERROR)
    [action] = await store.list_actions(workflow_id)
    assert action.state is ActionState.KILLED
    dataset = await store.get_dataset(action.dataset_id)
    assert dataset is not None and dataset.state is DatasetState.DELETED
    assert await store.list_unwritten_workflows() == []
    # The key names the failed submission, with its reason, as any replay does.
    replayed = await manager.submit(CHAIN, owner="ann", idempotency_key="nightly-1")
    assert (replayed.id, replayed.error) == (workflow_id, UNWRITTEN_ERROR)

"""In-flight deduplication on every backend: an action whose dataset another workflow's
action is computing shares that computation instead of running it again.

The store verbs (`list_attached_actions`, `finish_action(if_waiting_on=…)`, releasing an
action's own id) and every interleaving of the planner, the producer's outcomes and
the settlers (`OutcomeService.settle_shared`) that the state machine in
docs/states.md names: success, failure, kill, a retry, the producer ending while a
consumer is planned, two consumers and two settlers racing, a node that died before
settling.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pingo import states
from pingo.actions.leases import HeldActions
from pingo.actions.reaper import Reaper
from pingo.api import documents
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store import protocol, rules
from pingo.store.protocol import ActionChanges, Store, claim_key
from pingo.workflows import planner, reuse
from tests.contract.conftest import SHARED_BACKENDS, Backend, Factory, FakeClock, make_store
from tests.unit._engine_support import make_settings, start_attempt, workflow, write_output

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState

#: The producer: one leaf action. The consumer: the same action, read by action 2.
PRODUCER = workflow({1: []})
CONSUMER = workflow({1: [], 2: [1]})


class Interleaved:
    """The store, with `before_create` run just before a workflow is persisted: the moment
    between planning's reads and its write, where another node's callback may land."""

    def __init__(self, store: Store, before_create: Callable[[], Awaitable[None]]) -> None:
        self._store = store
        self._before_create = before_create

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def persist_plan(self, plan: protocol.WorkflowPlan) -> protocol.Persisted:
        await self._before_create()
        return await self._store.persist_plan(plan)


async def get(store: Store, workflow_id: str, action_id: int) -> protocol.ActionRecord:
    action = await store.get_action(workflow_id, action_id)
    assert action is not None
    return action


async def state_of(store: Store, workflow_id: str) -> W:
    record = await store.get_workflow(workflow_id)
    assert record is not None
    return record.state


async def succeed(
    store: Store, storage: DatasetStorage, outcomes: OutcomeService, workflow_id: str, aid: int
) -> None:
    action = await start_attempt(store, workflow_id, aid)
    write_output(storage, action)
    await outcomes.success(action.callback_id, action.attempts)


async def fail_for_good(
    store: Store, outcomes: OutcomeService, workflow_id: str, aid: int, clock: Any
) -> None:
    for _ in range(3):
        action = await start_attempt(store, workflow_id, aid)
        await outcomes.failed(action.callback_id, action.attempts, "boom")
        clock.advance(60)


# ------------------------------------------------------------------------ store verbs


async def test_an_attached_action_is_listed_by_producer_until_it_lets_go(
    store: Store, make: Factory
) -> None:
    producer = "wf-producer/1"
    plan = make.plan(
        {0: (), 1: (0,), 2: ()},
        actions={
            1: {"shared_with": producer, "waiting_on": (0, 1)},
            2: {"shared_with": "wf-other/3", "state": A.WAITING, "waiting_on": (2,)},
        },
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id
    assert (await get(store, wid, 1)).shared_with == producer
    assert [a.action_id for a in await store.list_attached_actions("wf-producer", 1)] == [1]
    assert [a.action_id for a in await store.list_attached_actions("wf-producer")] == [1]
    assert await store.list_attached_actions("wf-producer", 2) == []
    assert await store.list_attached_actions("wf-produce") == []  # a prefix is not a workflow
    assert {a.action_id for a in await store.list_attached_actions() if a.workflow_id == wid} == {
        1,
        2,
    }
    # Its own parent finishing does not make it READY: it still waits for the producer.
    assert await store.release_parent(wid, 0, [1]) == []
    assert (await get(store, wid, 1)).waiting_on == (1,)
    # Letting go of the producer (releasing its own id): READY, and no longer attached.
    ready = await store.release_parent(wid, 1, [1])
    assert [a.action_id for a in ready] == [1]
    assert await store.list_attached_actions("wf-producer") == []
    assert not ready[0].is_attached and ready[0].shared_with == producer


async def test_finish_action_lists_the_actions_attached_to_it_when_asked(
    store: Store, make: Factory
) -> None:
    """`attached_limit`: the finish returns what `list_attached_actions` would list
    right after it, in the same order, at most that many; nothing without it."""
    producer = make.plan({0: ()}, actions={0: {"state": A.RUNNING, "attempts": 1}})
    await store.create_workflow(producer)
    pid = producer.workflow.id
    key = claim_key(pid, 0)
    sharers = make.plan(
        {0: (), 1: (), 2: (), 3: ()},
        actions={
            0: {"shared_with": key, "state": A.WAITING, "waiting_on": (0,)},
            1: {"shared_with": "wf-other/0", "state": A.WAITING, "waiting_on": (1,)},
            2: {"shared_with": key, "state": A.WAITING, "waiting_on": (2,)},
            # It let go already (its own id released): no longer attached.
            3: {"shared_with": key, "state": A.READY, "waiting_on": ()},
        },
    )
    await store.create_workflow(sharers)
    listed = await store.list_attached_actions(pid, 0)
    assert [(a.workflow_id, a.action_id) for a in listed] == [
        (sharers.workflow.id, 0),
        (sharers.workflow.id, 2),
    ]
    again = make.plan({0: ()}, actions={0: {"state": A.RUNNING, "attempts": 1}})
    await store.create_workflow(again)

    finished = await store.finish_action(pid, 0, {A.RUNNING}, attached_limit=1)
    plain = await store.finish_action(again.workflow.id, 0, {A.RUNNING})

    assert finished is not None and finished.action.state is A.FINISHED
    assert finished.attached == listed[:1]
    assert plain is not None and plain.attached == []
    assert await store.list_attached_actions(pid, 0) == listed


async def test_finishing_a_shared_action_requires_it_still_waits_for_its_producer(
    store: Store, make: Factory
) -> None:
    plan = make.plan(
        {0: (), 1: (0,)},
        actions={0: {"shared_with": "wf-p/1", "state": A.WAITING, "waiting_on": (0,)}},
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id
    # The finish and the let-go race: exactly one takes effect.
    finished, released = await asyncio.gather(
        store.finish_action(wid, 0, {A.WAITING}, ActionChanges(), if_waiting_on=0),
        store.release_parent(wid, 0, [0]),
    )
    action = await get(store, wid, 0)
    if finished is not None:
        assert action.state is A.FINISHED and released == []
        assert (await get(store, wid, 1)).state is A.READY
    else:
        assert action.state is A.READY and [a.action_id for a in released] == [0]
        assert (await get(store, wid, 1)).state is A.WAITING
    # Once it let go, finishing it as shared is refused.
    again = await store.finish_action(wid, 0, {A.WAITING}, ActionChanges(), if_waiting_on=0)
    assert again is None


# ------------------------------------------------------------------------- planning


async def test_a_consumer_shares_the_computation_and_finishes_when_it_is_stored(
    store: Store,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    shared = await get(store, second.id, 1)
    assert shared.state is A.WAITING and shared.is_attached
    assert shared.shared_with == claim_key(first.id, 1)
    assert (await get(store, second.id, 2)).waiting_on == (1,)
    dataset = await store.get_dataset(shared.dataset_id)
    assert dataset is not None and claim_key(second.id, 2) in dataset.claims

    await succeed(store, storage, outcomes, first.id, 1)
    done = await get(store, second.id, 1)
    assert done.state is A.FINISHED and done.attempts == 0  # it never ran
    assert (await get(store, second.id, 2)).state is A.READY
    stored = await store.get_dataset(shared.dataset_id)
    assert stored is not None and stored.state is D.LEAF
    assert claim_key(second.id, 2) in stored.claims  # its reader holds it
    await succeed(store, storage, outcomes, second.id, 2)
    assert await state_of(store, second.id) is W.SUCCEEDED


async def test_the_dry_run_names_the_producer_by_action_only_for_another_user(
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    theirs = (await manager.dry_run(CONSUMER, owner="bob")).to_json()["actions"][0]
    assert theirs["reuse"] == "shared" and theirs["sharedWith"] == {"name": "a1"}
    assert first.id not in str(theirs)
    own = (await manager.dry_run(CONSUMER, owner="ann")).to_json()["actions"][0]
    assert own["sharedWith"] == {"name": "a1", "workflowId": first.id, "actionId": 1}


async def test_forced_and_per_user_scopes_never_share(
    store: Store, manager: planner.WorkflowManager, tmp_path: Path
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    forced = workflow({1: [], 2: [1]}, extra={1: {"forceComputation": True}})
    record = await manager.submit(forced, owner="bob")
    action = await get(store, record.id, 1)
    assert action.shared_with is None and action.state is A.READY
    settings = make_settings(tmp_path, sharing_scope="user")
    scoped = planner.WorkflowManager(store, DatasetStorage(settings.data_root), settings)
    mine = await scoped.submit(PRODUCER, owner="ann")
    theirs = await scoped.submit(CONSUMER, owner="bob")
    # Another owner's dataset has another id in the user scope: nothing to share.
    assert (await get(store, theirs.id, 1)).shared_with is None
    own = await scoped.submit(CONSUMER, owner="ann")
    assert (await get(store, own.id, 1)).shared_with == claim_key(mine.id, 1)
    assert first.id != mine.id


# ------------------------------------------------------------------ producer outcomes


async def test_a_retry_of_the_producer_keeps_the_consumer_waiting(
    store: Store, outcomes: OutcomeService, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    attempt = await start_attempt(store, first.id, 1)
    await outcomes.failed(attempt.callback_id, 1, "flaky")
    assert (await get(store, first.id, 1)).state is A.READY
    assert (await get(store, second.id, 1)).is_attached


async def test_the_producer_failing_makes_every_consumer_compute_it(
    store: Store, outcomes: OutcomeService, manager: planner.WorkflowManager, clock: Any
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    consumers = await asyncio.gather(
        manager.submit(CONSUMER, owner="bob"), manager.submit(CONSUMER, owner="cid")
    )
    await fail_for_good(store, outcomes, first.id, 1, clock)
    assert await state_of(store, first.id) is W.FAILED
    for consumer in consumers:
        action = await get(store, consumer.id, 1)
        assert action.state is A.READY and not action.is_attached
        assert await state_of(store, consumer.id) is W.RUNNING


async def test_killing_the_producers_workflow_never_kills_the_consumer(
    store: Store,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    await start_attempt(store, first.id, 1)
    await outcomes.kill_workflow(first.id)
    assert (await get(store, first.id, 1)).state is A.KILLED
    action = await get(store, second.id, 1)
    assert action.state is A.READY and action.attempts == 0
    await succeed(store, storage, outcomes, second.id, 1)
    await succeed(store, storage, outcomes, second.id, 2)
    assert await state_of(store, second.id) is W.SUCCEEDED


async def test_killing_the_consumer_leaves_the_producer_alone(
    store: Store, outcomes: OutcomeService, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    await outcomes.kill_workflow(second.id)
    assert (await get(store, second.id, 1)).state is A.KILLED
    producer = await get(store, first.id, 1)
    assert producer.state is A.READY
    dataset = await store.get_dataset(producer.dataset_id)
    assert dataset is not None and dataset.state is D.TO_LEAF
    assert claim_key(second.id, 2) not in dataset.claims


# -------------------------------------------------------------------- interleavings


@pytest.mark.parametrize("outcome", ["success", "failure"])
async def test_the_producer_ending_while_the_consumer_is_planned(
    store: Store,
    storage: DatasetStorage,
    settings: Settings,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
    clock: Any,
    outcome: str,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")

    async def producer_ends() -> None:
        # After the consumer's planning read the dataset in flight, before its persist:
        # the producer's own settlement cannot see the consumer yet.
        if outcome == "success":
            await succeed(store, storage, outcomes, first.id, 1)
        else:
            await fail_for_good(store, outcomes, first.id, 1, clock)

    racing = planner.WorkflowManager(
        Interleaved(store, producer_ends),  # type: ignore[arg-type]
        storage,
        settings,
        outcomes=outcomes,
    )
    second = await racing.submit(CONSUMER, owner="bob")
    action = await get(store, second.id, 1)
    assert action.shared_with == claim_key(first.id, 1)
    if outcome == "success":
        assert action.state is A.FINISHED and action.attempts == 0
        assert (await get(store, second.id, 2)).state is A.READY
    else:
        assert action.state is A.READY and not action.is_attached


async def test_two_consumers_and_two_settlers_racing(
    store: Store,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    # Two nodes plan consumers at once: both attach, neither computes.
    a, b = await asyncio.gather(
        manager.submit(CONSUMER, owner="bob"), manager.submit(CONSUMER, owner="cid")
    )
    attached = await store.list_attached_actions(first.id, 1)
    assert {x.workflow_id for x in attached} == {a.id, b.id}
    action = await start_attempt(store, first.id, 1)
    write_output(storage, action)
    # The producer's success and two more settlers (another node's, the reaper's) at once.
    other = OutcomeService(store, storage, outcomes.settings)
    waiting = await get(store, a.id, 1)
    results = await asyncio.gather(
        outcomes.success(action.callback_id, 1),
        other.settle_shared(waiting),
        other.settle_shared(waiting, states.Trigger.REAPER),
    )
    assert sum(r is not None for r in results[1:]) <= 1
    for consumer in (a, b):
        done = await get(store, consumer.id, 1)
        assert done.state is A.FINISHED and done.attempts == 0
    await assert_one_computes_the_other_shares(store, a.id, b.id, 2)


async def assert_one_computes_the_other_shares(
    store: Store, first: str, second: str, action_id: int
) -> None:
    """Two workflows planned at once with the same action `action_id`: one of them will
    compute it (READY), the other shares that computation (attached to it)."""
    one, other = await get(store, first, action_id), await get(store, second, action_id)
    computing, sharing = (one, other) if other.is_attached else (other, one)
    assert computing.state is A.READY and computing.shared_with is None
    assert sharing.is_attached and sharing.shared_with == claim_key(*computing.key)


async def test_a_settlement_a_dead_node_left_undone_is_done_by_the_reaper(
    store: Store, outcomes: OutcomeService, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    producer = await start_attempt(store, first.id, 1)
    # The producer's node failed it and gave up its dataset, then died before settling.
    await store.transition_action(first.id, 1, {A.SUBMITTED}, A.FAILED)
    await store.transition_dataset(producer.dataset_id, {D.TO_LEAF}, D.DELETED)
    assert (await get(store, second.id, 1)).is_attached
    assert await outcomes.settle_stranded() >= 1
    assert (await get(store, second.id, 1)).state is A.READY
    # Nothing left to settle: a second pass changes nothing.
    assert await outcomes.settle_stranded() == 0


async def test_recovery_settles_a_consumer_whose_producer_ended(
    store: Store,
    storage: DatasetStorage,
    outcomes: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    first = await manager.submit(PRODUCER, owner="ann")
    second = await manager.submit(CONSUMER, owner="bob")
    producer = await start_attempt(store, first.id, 1)
    # Stored and finished, but the node died before settling the consumer.
    await store.transition_dataset(producer.dataset_id, {D.TO_LEAF}, D.LEAF)
    await store.finish_action(first.id, 1, {A.SUBMITTED})
    await outcomes.recover_workflow(second.id)
    assert (await get(store, second.id, 1)).state is A.FINISHED
    assert (await get(store, second.id, 2)).state is A.READY


async def test_a_wide_workflow_shares_every_action_in_flight(
    store: Store, manager: planner.WorkflowManager
) -> None:
    # More producers in one workflow than are read one by one: the planner lists it.
    wide = {i: [] for i in range(1, 21)}
    first = await manager.submit(workflow(wide), owner="ann")
    second = await manager.submit(workflow({**wide, 21: list(wide)}), owner="bob")
    actions = await store.list_actions(second.id)
    assert [a.shared_with for a in actions[:20]] == [claim_key(first.id, i) for i in wide]
    assert all(a.is_attached for a in actions[:20]) and actions[20].shared_with is None


async def test_the_reaper_giving_up_on_the_producer_or_settling_a_stranded_one(
    store: Store, storage: DatasetStorage, settings: Settings, manager: planner.WorkflowManager
) -> None:
    outcomes = OutcomeService(store, storage, settings)
    once = workflow({1: []}, extra={1: {"maxAttempts": 1}})
    first = await manager.submit(once, owner="ann")
    second = await manager.submit(
        workflow({1: [], 2: [1]}, extra={1: {"maxAttempts": 1}}), owner="bob"
    )
    assert (await get(store, second.id, 1)).is_attached
    # The producer's node died with its last attempt: the reaper fails it for good.
    producer = await start_attempt(store, first.id, 1)
    await outcomes.release_lost(producer, "the node died")
    assert (await get(store, first.id, 1)).state is A.FAILED
    assert (await get(store, second.id, 1)).state is A.READY

    # Another pair, whose producer's node died after failing it but before settling:
    # the reaper loop's pass settles it.
    third = await manager.submit(workflow({1: []}, tag="t"), owner="ann")
    fourth = await manager.submit(workflow({1: [], 2: [1]}, tag="t"), owner="bob")
    lost = await start_attempt(store, third.id, 1)
    await store.transition_action(third.id, 1, {A.SUBMITTED}, A.FAILED)
    await store.transition_dataset(lost.dataset_id, {D.TO_LEAF}, D.DELETED)
    reaper = Reaper(store, settings, {}, outcomes, HeldActions({}))
    await reaper.run_once()
    assert (await get(store, fourth.id, 1)).state is A.READY


async def test_two_nodes_on_their_own_handles_race_to_attach_and_to_settle(
    store: Store,
    backend: Backend,
    clock: FakeClock,
    storage: DatasetStorage,
    settings: Settings,
    manager: planner.WorkflowManager,
) -> None:
    if backend.name not in SHARED_BACKENDS:
        pytest.skip("only a shared store has several nodes")
    async with make_store(backend, clock) as other_store:
        other_callbacks = OutcomeService(other_store, storage, settings)
        other = planner.WorkflowManager(other_store, storage, settings, outcomes=other_callbacks)
        first = await manager.submit(PRODUCER, owner="ann")
        a, b = await asyncio.gather(
            manager.submit(CONSUMER, owner="bob"), other.submit(CONSUMER, owner="cid")
        )
        for consumer in (a, b):
            assert (await get(store, consumer.id, 1)).is_attached
        action = await start_attempt(store, first.id, 1)
        write_output(storage, action)
        outcomes = OutcomeService(store, storage, settings)
        # The producer's success on one node, the backstop on the other, at once.
        await asyncio.gather(
            outcomes.success(action.callback_id, 1), other_callbacks.settle_stranded()
        )
        for consumer in (a, b):
            done = await get(other_store, consumer.id, 1)
            assert done.state is A.FINISHED and done.attempts == 0
        await assert_one_computes_the_other_shares(other_store, a.id, b.id, 2)


# ------------------------------------------------------- planned at the same moment


def twin_plans(make: Factory, **second: Any) -> tuple[protocol.WorkflowPlan, protocol.WorkflowPlan]:
    """Two workflows that both compute one dataset, each planned when it was absent: the
    first's action 0, and the second's action 0 (`second`: its overrides), read by its 1."""
    first = make.plan({0: ()})
    dataset = first.actions[0].dataset_id
    other = make.plan(
        {0: (), 1: (0,)},
        actions={0: {"dataset_id": dataset, **second}, 1: {"inputs": {0: dataset}}},
    )
    ours = [d for d in other.datasets if d.id != dataset]
    theirs = make.dataset(
        other.actions[0], state=D.TO_STORE, claims=(claim_key(*other.actions[1].key),)
    )
    return first, dataclasses.replace(other, datasets=(theirs, *ours))


async def assert_computed_once(
    store: Store, persisted: Sequence[protocol.Persisted], first: str, second: str
) -> protocol.ActionRecord:
    """One of the two plans' action 0 computes it, the other shares it: returns the sharer."""
    one, other = await get(store, first, 0), await get(store, second, 0)
    sharer, producer = (one, other) if one.is_attached else (other, one)
    assert producer.state is A.READY and producer.shared_with is None
    assert sharer.is_attached and sharer.shared_with == claim_key(*producer.key)
    assert sharer.reason == "in-flight"  # the decision the documents and the dry run read
    assert [e.state for e in sharer.history] == [A.WAITING]
    # The store says whom it made share; the other plan, nothing.
    told = {a.key: a for p in persisted for a in p.shared}
    assert list(told) == [sharer.key] and told[sharer.key].is_attached
    dataset = await store.get_dataset(sharer.dataset_id)
    assert dataset is not None
    assert (dataset.producer_workflow_id, dataset.producer_action_id) == producer.key
    return sharer


async def test_two_plans_of_one_dataset_persisted_at_once_compute_it_once(
    store: Store, make: Factory
) -> None:
    first, second = twin_plans(make)
    persisted = await asyncio.gather(store.persist_plan(first), store.persist_plan(second))
    sharer = await assert_computed_once(store, persisted, first.workflow.id, second.workflow.id)
    if sharer.workflow_id == second.workflow.id:
        # Beside its own parents, if any: here none. Its reader waits for it as before,
        # and its claim holds the shared dataset.
        assert sharer.waiting_on == (0,)
        assert (await get(store, second.workflow.id, 1)).waiting_on == (0,)
        dataset = await store.get_dataset(sharer.dataset_id)
        assert dataset is not None and claim_key(second.workflow.id, 1) in dataset.claims


async def test_two_nodes_persisting_one_dataset_at_once_compute_it_once(
    store: Store, backend: Backend, clock: FakeClock, make: Factory
) -> None:
    if backend.name not in SHARED_BACKENDS:
        pytest.skip("only a shared store has several nodes")
    async with make_store(backend, clock) as other:
        for _ in range(5):  # several rounds: either may land first
            first, second = twin_plans(make)
            persisted = await asyncio.gather(store.persist_plan(first), other.persist_plan(second))
            await assert_computed_once(store, persisted, first.workflow.id, second.workflow.id)


@pytest.mark.parametrize("reason", sorted(rules.RUNS_ITS_OWN))
async def test_an_action_that_must_run_its_own_never_shares_at_once(
    store: Store, make: Factory, reason: str
) -> None:
    first, second = twin_plans(make, reason=reason)
    persisted = await asyncio.gather(store.persist_plan(first), store.persist_plan(second))
    assert all(not p.shared for p in persisted)
    for plan in (first, second):
        action = await get(store, plan.workflow.id, 0)
        assert action.state is A.READY and action.shared_with is None


async def test_an_ended_producer_is_not_shared_at_persist(store: Store, make: Factory) -> None:
    # A crash left the dataset computing after its producer failed for good.
    first, second = twin_plans(make)
    ended = dataclasses.replace(first.actions[0], state=A.FAILED)
    await store.persist_plan(dataclasses.replace(first, actions=(ended,)))
    assert not (await store.persist_plan(second)).shared
    assert (await get(store, second.workflow.id, 0)).state is A.READY


async def test_a_producer_whose_plan_is_not_written_yet_is_waited_for_a_lease(
    store: Store, make: Factory, outcomes: OutcomeService, clock: FakeClock
) -> None:
    """MongoDB writes a plan's datasets before its actions: a plan landing in between
    finds the dataset computing by an action not written yet. It shares it, and gives
    up on it (computes it itself) once the dataset has not moved for a lease."""
    first, second = twin_plans(make)
    await store.persist_plan(dataclasses.replace(first, actions=()))
    persisted = await store.persist_plan(second)
    assert [a.key for a in persisted.shared] == [(second.workflow.id, 0)]
    assert await outcomes.settle_waiting(persisted.shared, states.Trigger.PLANNER) == 0
    assert (await get(store, second.workflow.id, 0)).is_attached
    clock.advance(outcomes.settings.lease_s + 1)
    assert await outcomes.settle_stranded() >= 1
    action = await get(store, second.workflow.id, 0)
    assert action.state is A.READY and not action.is_attached


class Barrier:
    """Holds each of `parties` plans just before its persist until all have planned: both
    read the dataset absent, as two submissions planned at the same moment do."""

    def __init__(self, parties: int) -> None:
        self._parties = parties
        self._arrived = 0
        self._all = asyncio.Event()

    async def wait(self) -> None:
        self._arrived += 1
        if self._arrived >= self._parties:
            self._all.set()
        await asyncio.wait_for(self._all.wait(), 10)


@pytest.mark.parametrize("outcome", ["success", "failure"])
async def test_two_workflows_planned_at_the_same_moment_compute_once(
    store: Store,
    backend: Backend,
    clock: FakeClock,
    storage: DatasetStorage,
    settings: Settings,
    outcomes: OutcomeService,
    outcome: str,
) -> None:
    barrier = Barrier(2)
    held = Interleaved(store, barrier.wait)
    managers = [
        planner.WorkflowManager(held, storage, settings, outcomes=outcomes)  # type: ignore[arg-type]
        for _ in range(2)
    ]
    alice, bob = await asyncio.gather(
        managers[0].submit(PRODUCER, owner="ann"), managers[1].submit(CONSUMER, owner="bob")
    )
    ann_1, bob_1 = await get(store, alice.id, 1), await get(store, bob.id, 1)
    # Both planned it absent: the store decided which computes.
    sharer, producer = (bob_1, ann_1) if bob_1.is_attached else (ann_1, bob_1)
    assert sharer.is_attached and producer.state is A.READY
    assert sharer.shared_with == claim_key(*producer.key)
    assert documents.action_outcome(sharer) is reuse.Reuse.SHARED
    # The sharer's owner sees the producer's name, and its workflow only when theirs.
    owner = "ann" if sharer.workflow_id == alice.id else "bob"
    view = (await planner.shared_views(store, owner, [sharer.shared_with]))[sharer.shared_with]
    assert view == reuse.SharedWith(producer.name)
    if outcome == "success":
        await succeed(store, storage, outcomes, producer.workflow_id, 1)
        done = await get(store, *sharer.key)
        assert done.state is A.FINISHED and done.attempts == 0  # it never ran
        assert documents.action_outcome(done) is reuse.Reuse.SHARED
    else:
        await fail_for_good(store, outcomes, producer.workflow_id, 1, clock)
        mine = await get(store, *sharer.key)
        assert mine.state is A.READY and not mine.is_attached  # it computes it itself


async def test_a_forced_action_planned_at_the_same_moment_still_computes(
    store: Store, storage: DatasetStorage, settings: Settings, outcomes: OutcomeService
) -> None:
    barrier = Barrier(2)
    held = Interleaved(store, barrier.wait)
    manager = planner.WorkflowManager(held, storage, settings, outcomes=outcomes)  # type: ignore[arg-type]
    forced = workflow({1: [], 2: [1]}, extra={1: {"forceComputation": True}})
    alice, bob = await asyncio.gather(
        manager.submit(PRODUCER, owner="ann"), manager.submit(forced, owner="bob")
    )
    for record in (alice, bob):
        action = await get(store, record.id, 1)
        assert action.shared_with is None and action.state is A.READY


class EndsUnseen:
    """The store, where each producer a plan was made to share stores its dataset and
    finishes right after that plan lands, without settling it: on MongoDB the plan's
    actions are written after its datasets, so the producer's own settlement may run
    before they exist and miss them. The planner's settlement must catch them."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def persist_plan(self, plan: protocol.WorkflowPlan) -> protocol.Persisted:
        persisted = await self._store.persist_plan(plan)
        for action in persisted.shared:
            assert action.shared_with is not None
            producer = await start_attempt(
                self._store, *protocol.parse_claim_key(action.shared_with)
            )
            await self._store.transition_dataset(producer.dataset_id, {D.TO_LEAF}, D.LEAF)
            await self._store.finish_action(*producer.key, {A.SUBMITTED})
        return persisted


async def test_a_producer_ending_unseen_while_the_later_plan_lands(
    store: Store, storage: DatasetStorage, settings: Settings, outcomes: OutcomeService
) -> None:
    barrier = Barrier(2)
    ends = EndsUnseen(store)
    held = Interleaved(ends, barrier.wait)  # type: ignore[arg-type]
    manager = planner.WorkflowManager(held, storage, settings, outcomes=outcomes)  # type: ignore[arg-type]
    first, second = await asyncio.gather(
        manager.submit(PRODUCER, owner="ann"), manager.submit(PRODUCER, owner="bob")
    )
    actions = [await get(store, w.id, 1) for w in (first, second)]
    sharer = next(a for a in actions if a.shared_with is not None)
    assert sharer.state is A.FINISHED and sharer.attempts == 0
    assert [e.state for e in sharer.history] == [A.WAITING, A.FINISHED]
    assert await state_of(store, sharer.workflow_id) is W.SUCCEEDED

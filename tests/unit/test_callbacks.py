"""Callbacks driven directly, as an executor would: staging written, then running/success/….

Each test plans a real workflow with the workflow manager, moves actions as the
scraper and submitter do, writes output into the staging path, and calls back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pingo import errors, states
from pingo.api import documents
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService, StaleCallback
from pingo.store import protocol
from pingo.store.mongo import MongoStore
from pingo.workflows import planner
from tests.unit._engine_support import (
    CHAIN,
    ManualClock,
    content,
    is_dir,
    start_attempt,
    walk_dataset,
    workflow,
    write_output,
)

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState


class Killer:
    """Stands where an executor's kill would be: records what it was asked to stop."""

    def __init__(self) -> None:
        self.killed: list[tuple[str, int]] = []
        self.wakes = 0

    async def __call__(self, action: protocol.ActionRecord) -> None:
        self.killed.append(action.key)

    def wake(self, types: Collection[str] | None) -> None:
        self.wakes += 1


@pytest.fixture
def killer() -> Killer:
    return Killer()


@pytest.fixture
def callbacks(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, killer: Killer
) -> OutcomeService:
    return OutcomeService(store, storage, settings, on_ready=killer.wake, kill_action=killer)


@pytest.fixture
def manager(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, callbacks: OutcomeService
) -> planner.WorkflowManager:
    return planner.WorkflowManager(store, storage, settings, outcomes=callbacks)


async def get(store: protocol.Store, workflow_id: str, action_id: int) -> protocol.ActionRecord:
    action = await store.get_action(workflow_id, action_id)
    assert action is not None
    return action


async def dataset(store: protocol.Store, dataset_id: str) -> protocol.DatasetRecord:
    record = await store.get_dataset(dataset_id)
    assert record is not None
    return record


async def wf_state(store: protocol.Store, workflow_id: str) -> states.WorkflowState:
    record = await store.get_workflow(workflow_id)
    assert record is not None
    return record.state


async def run_ok(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    workflow_id: str,
    action_id: int,
    content: bytes = b"out",
) -> protocol.ActionRecord:
    action = await start_attempt(store, workflow_id, action_id)
    await callbacks.running(action.callback_id, action.attempts)
    write_output(storage, action, content)
    return await callbacks.success(action.callback_id, action.attempts, runtime_s=1.5)


# ---------------------------------------------------------------------- success


async def test_success_stores_releases_and_finishes_the_workflow(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    killer: Killer,
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    first = await start_attempt(store, record.id, 1)
    running = await callbacks.running(first.callback_id, 1)
    assert running.state is A.RUNNING
    staging = write_output(storage, first, b"12345")
    done = await callbacks.success(first.callback_id, 1, runtime_s=2.0)
    assert done.state is A.FINISHED and done.runtime_s == 2.0 and done.finished_at is not None
    d1 = await dataset(store, first.dataset_id)
    assert d1.state is D.STORED and d1.size_bytes == 5 and d1.compute_s == 2.0
    assert content(d1.path) == b"12345" and not staging.exists()
    assert (await get(store, record.id, 2)).state is A.READY
    assert killer.wakes == 1
    # Action 2 still claims its input until it finishes.
    assert d1.claims == (protocol.claim_key(record.id, 2),)

    await run_ok(store, storage, callbacks, record.id, 2)
    assert (await dataset(store, first.dataset_id)).claims == ()
    assert await wf_state(store, record.id) is W.RUNNING
    third = await run_ok(store, storage, callbacks, record.id, 3)
    assert (await dataset(store, third.dataset_id)).state is D.LEAF
    assert await wf_state(store, record.id) is W.SUCCEEDED

    # Resubmitting now runs nothing.
    again = await manager.submit(workflow(CHAIN), owner="ann")
    assert again.state is W.SUCCEEDED


async def test_callbacks_are_idempotent_and_reject_stale_attempts(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow({1: [], 2: [1]}), owner="ann")
    action = await start_attempt(store, record.id, 1)
    with pytest.raises(errors.NotFound):
        await callbacks.success("no-such-callback", 1)
    with pytest.raises(StaleCallback) as stale:
        await callbacks.success(action.callback_id, 0)
    assert stale.value.code == "STALE_CALLBACK"
    assert isinstance(stale.value, errors.Conflict)

    once = await callbacks.running(action.callback_id, 1)
    twice = await callbacks.running(action.callback_id, 1)
    assert once == twice
    write_output(storage, action)
    first = await callbacks.success(action.callback_id, 1)
    second = await callbacks.success(action.callback_id, 1)
    assert first == second
    assert (await get(store, record.id, 1)) == first
    # Late callbacks for a finished attempt change nothing.
    assert await callbacks.failed(action.callback_id, 1, "late") == first
    assert await callbacks.killed(action.callback_id, 1) == first
    assert await callbacks.running(action.callback_id, 1) == first
    assert (await get(store, record.id, 2)).state is A.READY


async def test_success_without_output_stores_an_empty_dataset(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow({1: []}), owner="ann")
    action = await start_attempt(store, record.id, 1)
    await callbacks.success(action.callback_id, 1)
    d = await dataset(store, action.dataset_id)
    assert d.state is D.LEAF and d.size_bytes == 0
    assert is_dir(d.path)
    assert await wf_state(store, record.id) is W.SUCCEEDED


async def started_twins(
    store: protocol.Store, manager: planner.WorkflowManager
) -> tuple[protocol.WorkflowRecord, protocol.ActionRecord, protocol.ActionRecord]:
    """A workflow of two actions computing the same leaf, both attempts started."""
    twins = workflow({1: [], 2: []}, end=1, extra={2: {"command": ["step", "1", ""]}})
    w = await manager.submit(twins, owner="ann")
    return w, await start_attempt(store, w.id, 1), await start_attempt(store, w.id, 2)


async def test_success_keeps_a_dataset_someone_else_stored(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    # Twins of one workflow compute the same leaf at once (another workflow would
    # share the computation instead: tests/contract/test_sharing.py).
    w1, a1, a2 = await started_twins(store, manager)
    w2 = w1
    assert a1.dataset_id == a2.dataset_id
    write_output(storage, a1, b"first")
    staging2 = write_output(storage, a2, b"second!")
    await callbacks.success(a1.callback_id, 1)
    stored = await dataset(store, a1.dataset_id)
    await callbacks.success(a2.callback_id, 1)
    d = await dataset(store, a1.dataset_id)
    assert d.state is D.LEAF and content(d.path) == b"first" and d.size_bytes == 5
    assert d == stored  # the record untouched: not measured, not written again
    assert not staging2.exists()
    assert await wf_state(store, w2.id) is W.SUCCEEDED


async def test_twins_succeeding_together_store_the_dataset_once(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    # Both read the dataset unstored; the second waits for the first's store on this
    # node instead of promoting, hashing and losing the compare-and-set (issue 15).
    w, a1, a2 = await started_twins(store, manager)
    write_output(storage, a1, b"first")
    staging2 = write_output(storage, a2, b"second!")
    writes: list[str] = []
    transition_dataset, finish_action = store.transition_dataset, store.finish_action

    async def counted(dataset_id: str, *args: Any, **kwargs: Any) -> Any:
        writes.append(dataset_id)
        return await transition_dataset(dataset_id, *args, **kwargs)

    async def finished(
        *args: Any, stored: protocol.DatasetMove | None = None, **kwargs: Any
    ) -> Any:
        # A first store is made with the action's finish (`stored`).
        if stored is not None:
            writes.append(stored.dataset_id)
        return await finish_action(*args, stored=stored, **kwargs)

    store.transition_dataset = counted  # type: ignore[method-assign]
    store.finish_action = finished  # type: ignore[method-assign]

    done = await asyncio.gather(
        callbacks.success(a1.callback_id, 1), callbacks.success(a2.callback_id, 1)
    )

    assert [a.state for a in done] == [A.FINISHED, A.FINISHED]
    assert writes == [a1.dataset_id]
    d = await dataset(store, a1.dataset_id)
    assert d.state is D.LEAF and content(d.path) == b"first" and d.size_bytes == 5
    assert not staging2.exists()
    assert await wf_state(store, w.id) is W.SUCCEEDED


async def test_twins_stored_by_the_higher_one_still_name_the_lower_as_producer(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    # The higher twin finishes first and stores the dataset: the workflow's document
    # still says action 1 computed and action 2 shared, and so must each action's
    # detail, which reads twins from the dataset's producer of record.
    w, a1, a2 = await started_twins(store, manager)
    write_output(storage, a1, b"first")
    write_output(storage, a2, b"second!")
    await callbacks.success(a2.callback_id, 1)
    await callbacks.success(a1.callback_id, 1)
    d = await dataset(store, a1.dataset_id)
    assert d.state is D.LEAF and content(d.path) == b"second!"
    assert (d.producer_workflow_id, d.producer_action_id) == (w.id, 1)
    finished = {a.action_id: a for a in await store.list_actions(w.id)}
    assert [documents.is_twin(finished[i], d) for i in (1, 2)] == [False, True]


async def test_a_twin_that_wrote_nothing_keeps_the_stored_dataset(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    w, a1, a2 = await started_twins(store, manager)
    write_output(storage, a1, b"first")
    await callbacks.success(a1.callback_id, 1)
    stored = await dataset(store, a1.dataset_id)

    await callbacks.success(a2.callback_id, 1)  # no staging output at all

    assert await dataset(store, a1.dataset_id) == stored
    assert content(stored.path) == b"first"
    finished = await store.get_action(w.id, 2)
    assert finished is not None and finished.state is A.FINISHED
    assert await wf_state(store, w.id) is W.SUCCEEDED


async def test_a_success_whose_dataset_another_node_stores_first_keeps_theirs(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    # The success prepares its dataset's move for its finish (one store call); another
    # node's twin stores the dataset just before that call, so the call changes nothing
    # and the success falls back to the two calls: the dataset kept, the action finished.
    record = await manager.submit(workflow({1: []}, tag="raced"), owner="ann")
    action = await start_attempt(store, record.id, 1)
    write_output(storage, action, b"mine")
    finish_action = store.finish_action
    theirs: list[protocol.DatasetRecord | None] = []

    async def raced(*args: Any, stored: protocol.DatasetMove | None = None, **kwargs: Any) -> Any:
        if stored is not None and not theirs:
            theirs.append(
                await store.transition_dataset(
                    stored.dataset_id,
                    stored.expected,
                    D.LEAF,
                    protocol.DatasetChanges(size_bytes=3),
                )
            )
        return await finish_action(*args, stored=stored, **kwargs)

    store.finish_action = raced  # type: ignore[method-assign]

    finished = await callbacks.success(action.callback_id, 1)

    assert finished.state is A.FINISHED and theirs[0] is not None
    d = await dataset(store, action.dataset_id)
    assert (d.state, d.size_bytes, d.version) == (D.LEAF, 3, theirs[0].version)
    assert await wf_state(store, record.id) is W.SUCCEEDED


async def test_success_after_the_dataset_was_deleted_meanwhile(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    action = await start_attempt(store, record.id, 1)
    await walk_dataset(store, action.dataset_id, [D.DELETED])  # another producer failed
    write_output(storage, action)
    await callbacks.success(action.callback_id, 1)
    assert (await dataset(store, action.dataset_id)).state is D.STORED  # not a leaf

    leaf_wf = await manager.submit(workflow({1: []}, tag="leaf"), owner="ann")
    leaf = await start_attempt(store, leaf_wf.id, 1)
    await walk_dataset(store, leaf.dataset_id, [D.DELETED])
    await callbacks.success(leaf.callback_id, 1)
    assert (await dataset(store, leaf.dataset_id)).state is D.LEAF


async def test_a_recomputed_leaf_outlives_a_pending_deletion(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    # The leaf was stored, a user force-deleted it while a reader's claim held it,
    # and a new workflow recomputes it: its output must not be deleted after success.
    record = await manager.submit(workflow({1: []}, tag="pending"), owner="ann")
    action = await start_attempt(store, record.id, 1)
    await walk_dataset(store, action.dataset_id, [D.DELETED, D.LEAF])
    held = await store.add_dataset_claim(action.dataset_id, "reader/1", {D.LEAF})
    assert held is not None
    await walk_dataset(store, action.dataset_id, [D.STORED_TO_DELETE])
    write_output(storage, action, b"kept")
    await callbacks.success(action.callback_id, 1)
    assert (await dataset(store, action.dataset_id)).state is D.LEAF
    assert await wf_state(store, record.id) is W.SUCCEEDED


async def test_success_waits_for_a_deletion_in_progress(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow({1: []}), owner="ann")
    action = await start_attempt(store, record.id, 1)
    # The same provenance, stored earlier, is being removed by a deletor right now.
    await walk_dataset(store, action.dataset_id, [D.DELETED, D.STORED, D.STORED_TO_DELETE])
    await walk_dataset(store, action.dataset_id, [D.PROCESSING, D.DELETING])
    write_output(storage, action, b"fresh")

    async def deletor_finishes() -> None:
        await asyncio.sleep(0.15)
        await walk_dataset(store, action.dataset_id, [D.DELETED])

    finisher = asyncio.create_task(deletor_finishes())
    done = await callbacks.success(action.callback_id, 1)
    await finisher
    assert done.state is A.FINISHED
    d = await dataset(store, action.dataset_id)
    assert d.state is D.LEAF and content(d.path) == b"fresh"


async def test_unmanaged_success_measures_the_users_path(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    tmp_path: Path,
) -> None:
    out = tmp_path / "users-own"
    doc = workflow({1: []}, extra={1: {"isManaged": False, "outputPath": str(out)}})
    record = await manager.submit(doc, owner="ann")
    action = await start_attempt(store, record.id, 1)
    out.mkdir()
    (out / "part-0").write_bytes(b"abc")
    (out / "part-1").write_bytes(b"defg")
    await callbacks.success(action.callback_id, 1)
    d = await dataset(store, action.dataset_id)
    assert d.state is D.LEAF and d.size_bytes == 7 and d.path == str(out)


# ---------------------------------------------------------------------- failure


async def test_failure_retries_with_backoff_then_fails_and_aborts(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    clock: ManualClock,
    killer: Killer,
) -> None:
    doc = workflow({1: [], 2: [1], 3: []}, end=2, extra={1: {"maxAttempts": 2}})
    record = await manager.submit(doc, owner="ann")
    sibling = await start_attempt(store, record.id, 3)  # independent, running meanwhile
    action = await start_attempt(store, record.id, 1)
    staging = write_output(storage, action, b"partial")
    retried = await callbacks.failed(action.callback_id, 1, "exit 1")
    assert retried.state is A.READY and retried.attempts == 1 and retried.error == "exit 1"
    assert retried.owner is None and retried.lease_expires_at is None
    assert retried.not_before == clock.now + timedelta(seconds=1.0)
    assert not staging.exists()
    # The same failure again changes nothing.
    assert await callbacks.failed(action.callback_id, 1, "exit 1") == retried

    clock.advance(1.0)
    action = await start_attempt(store, record.id, 1)
    assert action.attempts == 2
    write_output(storage, action, b"partial")
    failed = await callbacks.failed(action.callback_id, 2, "exit 2")
    assert failed.state is A.FAILED and failed.finished_at is not None
    assert (await dataset(store, action.dataset_id)).state is D.DELETED
    # abort: what has not started is KILLED, what runs is stopped, the workflow FAILED.
    assert (await get(store, record.id, 2)).state is A.KILLED
    assert (await get(store, record.id, 3)).state is A.KILLED
    assert killer.killed == [sibling.key]
    wf = await store.get_workflow(record.id)
    assert wf is not None and wf.state is W.FAILED and "exit 2" in (wf.error or "")
    assert (await dataset(store, action.dataset_id)).claims == ()
    # The stopped sibling's executor reports later: nothing changes.
    late = await callbacks.killed(sibling.callback_id, 1)
    assert late.state is A.KILLED


async def test_backoff_grows_exponentially(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    clock: ManualClock,
) -> None:
    record = await manager.submit(workflow({1: []}, extra={1: {"maxAttempts": 4}}), owner="ann")
    delays = []
    for attempt in (1, 2, 3):
        action = await start_attempt(store, record.id, 1)
        retried = await callbacks.failed(action.callback_id, attempt, "boom")
        assert retried.not_before is not None
        delays.append((retried.not_before - clock.now).total_seconds())
        clock.advance(10)
    assert delays == [1.0, 2.0, 4.0]


async def test_failure_with_continue_lets_independent_branches_finish(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    doc = workflow(
        {1: [], 2: [1], 3: [2], 4: []}, end=3, on_failure="continue",
        extra={1: {"maxAttempts": 1}},
    )  # fmt: skip
    record = await manager.submit(doc, owner="ann")
    action = await start_attempt(store, record.id, 1)
    await callbacks.failed(action.callback_id, 1, "bad input")
    # Downstream of the failure: never run, and said so (not KILLED: nobody killed them).
    for downstream in (2, 3):
        skipped = await get(store, record.id, downstream)
        assert skipped.state is A.UPSTREAM_FAILED
        assert skipped.error == "parent action 1 (a1) did not finish"
    assert (await get(store, record.id, 4)).state is A.READY
    assert await wf_state(store, record.id) is W.RUNNING
    await run_ok(store, storage, callbacks, record.id, 4)
    assert (await dataset(store, (await get(store, record.id, 4)).dataset_id)).state is D.LEAF
    wf = await store.get_workflow(record.id)
    assert wf is not None and wf.state is W.FAILED and wf.finished_at is not None


async def test_a_job_the_cluster_killed_fails_the_action_and_the_workflow(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    action = await start_attempt(store, record.id, 1)
    staging = write_output(storage, action)
    killed = await callbacks.killed(action.callback_id, 1)
    # Not Pingo's kill: the action FAILED (no retry, attempts were left), the workflow
    # aborted, and its state and counts agree: 1 failed, the rest KILLED by the abort.
    assert killed.state is A.FAILED and killed.attempts < killed.max_attempts
    assert killed.error is not None and "killed by the cluster" in killed.error
    assert not staging.exists()
    assert (await dataset(store, action.dataset_id)).state is D.DELETED
    assert (await get(store, record.id, 2)).state is A.KILLED
    assert await wf_state(store, record.id) is W.FAILED
    assert await store.count_actions(record.id) == {A.FAILED: 1, A.KILLED: 2}
    assert await callbacks.killed(action.callback_id, 1) == killed


async def test_a_cluster_kill_in_a_continue_workflow_skips_only_what_depends_on_it(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    doc = workflow({1: [], 2: [1], 3: []}, end=2, on_failure="continue")
    record = await manager.submit(doc, owner="ann")
    action = await start_attempt(store, record.id, 1)
    await callbacks.killed(action.callback_id, 1)
    await run_ok(store, storage, callbacks, record.id, 3)
    counts = await store.count_actions(record.id)
    assert counts == {A.FAILED: 1, A.UPSTREAM_FAILED: 1, A.FINISHED: 1}
    assert await wf_state(store, record.id) is W.FAILED


async def test_submit_failed_and_release_lost(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    doc = workflow({1: [], 2: []}, end=2, extra={1: {"maxAttempts": 1}, 2: {"maxAttempts": 2}})
    record = await manager.submit(doc, owner="ann", idempotency_key=None)
    second = await start_attempt(store, record.id, 2)
    lost = await callbacks.release_lost(second, "node died")
    assert lost is not None and lost.state is A.READY and lost.error == "node died"
    assert await callbacks.release_lost(second, "node died") is None  # already handled

    first = await start_attempt(store, record.id, 1)
    failed = await callbacks.submit_failed(first, "no such executable")
    assert failed.state is A.FAILED
    assert await wf_state(store, record.id) is W.FAILED
    assert (await get(store, record.id, 2)).state is A.KILLED


# ------------------------------------------------------------------------- kill


async def test_a_big_chain_submits_and_kills_in_batches(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    killer: Killer,
) -> None:
    """Past every chunk size: the body is decoded piece by piece, the plan is built in a
    thread, and the kill takes several batches."""
    if isinstance(store, MongoStore):
        # Over 90 s for 1,200 actions. tests/contract/test_kill_actions.py kills in
        # batches on MongoDB (mongomock and the wire server).
        pytest.skip("mongomock is an in-process stand-in, orders of magnitude slower")
    length = 2_500
    chain = {i: [i - 1] if i > 1 else [] for i in range(1, length + 1)}
    body = json.dumps(workflow(chain, tag="t" * 80)).encode()
    record = await manager.submit(body, owner="ann")
    assert await store.count_actions(record.id) == {A.READY: 1, A.WAITING: length - 1}
    running = await start_attempt(store, record.id, 1)

    killed = await manager.kill(record.id)

    assert killed.state is W.KILLED
    assert killer.killed == [running.key]
    assert await store.count_actions(record.id) == {A.KILLED: length}
    actions = await store.list_actions(record.id)
    datasets = await store.get_datasets({a.dataset_id for a in actions})
    assert len(datasets) == length
    assert all(d.state is D.DELETED and d.claims == () for d in datasets.values())


async def test_kill_workflow(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    killer: Killer,
) -> None:
    seed = await manager.submit(workflow({1: []}), owner="ann")
    await run_ok(store, storage, callbacks, seed.id, 1)
    record = await manager.submit(workflow({1: [], 2: [1], 3: [1], 4: [2, 3]}), owner="ann")
    running = await start_attempt(store, record.id, 2)
    staging = write_output(storage, running)
    killed = await manager.kill(record.id)
    assert killed.state is W.KILLED and killed.finished_at is not None
    assert killer.killed == [running.key]
    actions = {a.action_id: a for a in await store.list_actions(record.id)}
    assert actions[1].state is A.FINISHED and actions[1].reused
    assert {actions[i].state for i in (2, 3, 4)} == {A.KILLED}
    assert not staging.exists()
    # No claim is left behind and nothing is left being computed.
    d1 = await dataset(store, actions[1].dataset_id)
    assert d1.claims == () and d1.state is D.LEAF
    for i in (2, 3, 4):
        d = await dataset(store, actions[i].dataset_id)
        assert d.state is D.DELETED and d.claims == ()
    # Killing again is harmless; the executor's own report changes nothing.
    assert (await manager.kill(record.id)).state is W.KILLED
    assert (await callbacks.killed(running.callback_id, 1)).state is A.KILLED
    with pytest.raises(errors.NotFound):
        await manager.kill("wf-none")
    with pytest.raises(errors.Conflict):
        await manager.kill(seed.id)  # already SUCCEEDED


async def test_continue_ends_when_the_last_action_has_killed_children(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    doc = workflow({1: [], 2: [], 3: [1, 2]}, on_failure="continue", extra={2: {"maxAttempts": 1}})
    record = await manager.submit(doc, owner="ann")
    first = await start_attempt(store, record.id, 1)
    second = await start_attempt(store, record.id, 2)
    await callbacks.failed(second.callback_id, 1, "boom")
    assert (await get(store, record.id, 3)).state is A.UPSTREAM_FAILED
    assert await wf_state(store, record.id) is W.RUNNING  # action 1 still runs
    await callbacks.success(first.callback_id, 1)
    assert await wf_state(store, record.id) is W.FAILED
    # Its output is stored all the same, and action 3's claim on it is gone.
    d1 = await dataset(store, first.dataset_id)
    assert d1.state is D.STORED and d1.claims == ()


# --------------------------------------------------------------------- recovery


async def test_recover_releases_children_a_crash_left_waiting(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    killer: Killer,
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    action = await start_attempt(store, record.id, 1)
    # The node died right after the action became FINISHED: nothing else happened.
    await walk_dataset(store, action.dataset_id, [D.STORED])
    await store.transition_action(record.id, 1, {A.SUBMITTED}, A.FINISHED)
    assert (await get(store, record.id, 2)).state is A.WAITING
    assert await callbacks.recover_running() == 1
    assert (await get(store, record.id, 2)).state is A.READY
    assert killer.wakes == 1
    # Idempotent: a second recovery changes nothing.
    before = await store.list_actions(record.id)
    await callbacks.recover_workflow(record.id)
    assert await store.list_actions(record.id) == before


async def test_recover_readies_a_child_whose_release_was_half_applied(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    killer: Killer,
) -> None:
    if not isinstance(store, MongoStore):
        pytest.skip("only MongoDB releases a parent in two writes")
    record = await manager.submit(workflow(CHAIN), owner="ann")
    await run_ok(store, storage, callbacks, record.id, 1)
    second = await start_attempt(store, record.id, 2)
    write_output(storage, second)
    await callbacks.success(second.callback_id, 1)
    third = await get(store, record.id, 3)
    assert third.state is A.READY
    # Put the child back as a crash between MongoDB's two writes leaves it: the
    # parent pulled from its waiting set, the flip to READY never applied.
    await store._actions.update_one(
        {"workflow_id": record.id, "action_id": 3},
        {"$set": {"state": A.WAITING.value, "waiting_on": []}},
    )
    assert (await get(store, record.id, 3)).state is A.WAITING
    await callbacks.recover_workflow(record.id)
    assert (await get(store, record.id, 3)).state is A.READY
    assert killer.wakes >= 1


async def test_recover_drops_claims_of_ended_actions(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    await run_ok(store, storage, callbacks, record.id, 1)
    second = await start_attempt(store, record.id, 2)
    write_output(storage, second)
    # Died after action 2 finished, before it released its claim and its child.
    await walk_dataset(store, second.dataset_id, [D.STORED])
    await store.transition_action(record.id, 2, {A.SUBMITTED}, A.FINISHED)
    assert (await dataset(store, second.inputs[1])).claims
    await callbacks.recover_workflow(record.id)
    assert (await dataset(store, second.inputs[1])).claims == ()
    assert (await get(store, record.id, 3)).state is A.READY


async def test_recover_finishes_an_interrupted_abort_and_kill(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
) -> None:
    record = await manager.submit(workflow({1: [], 2: [1], 3: []}, end=2), owner="ann")
    action = await start_attempt(store, record.id, 1)
    # Died right after the action FAILED: no abort happened.
    await store.transition_action(record.id, 1, {A.SUBMITTED}, A.FAILED)
    recovered = await callbacks.recover_workflow(record.id)
    assert recovered.state is W.FAILED
    assert (await get(store, record.id, 2)).state is A.KILLED
    assert (await get(store, record.id, 3)).state is A.KILLED
    assert (await dataset(store, action.dataset_id)).state is D.DELETED

    other = await manager.submit(workflow({1: [], 2: [1]}, tag="k"), owner="ann")
    # Died right after the workflow became KILLED, before its actions were.
    await store.transition_workflow(other.id, {W.RUNNING}, W.KILLED)
    await callbacks.recover_workflow(other.id)
    assert {a.state for a in await store.list_actions(other.id)} == {A.KILLED}


# ------------------------------------------------------------ a whole workflow


async def drive(
    store: protocol.Store, storage: DatasetStorage, callbacks: OutcomeService, workflow_id: str
) -> list[int]:
    """Run every READY action until none is left, as one node would; the ids run, in order."""
    ran: list[int] = []
    while True:
        claimed = await store.claim_actions("node-a", 64, 30.0)
        if not claimed:
            return ran
        for action in claimed:
            submitted = await store.transition_action(
                action.workflow_id,
                action.action_id,
                {A.PROCESSING},
                A.SUBMITTED,
                protocol.ActionChanges(attempts=action.attempts + 1),
                if_owner="node-a",
            )
            assert submitted is not None
            write_output(storage, submitted, f"{submitted.action_id}".encode())
            await callbacks.success(submitted.callback_id, submitted.attempts)
            ran.append(submitted.action_id)


async def test_layered_100_runs_each_action_once_then_reuses(
    store: protocol.Store,
    storage: DatasetStorage,
    callbacks: OutcomeService,
    manager: planner.WorkflowManager,
    shared_dir: Path,
) -> None:
    document = json.loads((shared_dir / "bench" / "layered-100.json").read_text())
    record = await manager.submit(document, owner="ann")
    ran = await drive(store, storage, callbacks, record.id)
    assert sorted(ran) == list(range(1, 101))
    assert await wf_state(store, record.id) is W.SUCCEEDED
    assert {a.state for a in await store.list_actions(record.id)} == {A.FINISHED}

    again = await manager.submit(document, owner="ann")
    assert again.state is W.SUCCEEDED
    assert await drive(store, storage, callbacks, again.id) == []

    # Changing one action's command reruns exactly it and its descendants.
    changed = json.loads(json.dumps(document))
    target = next(a for a in changed["actions"] if a["id"] == 51)
    target["command"] = ["true", "changed"]
    rerun = await manager.submit(changed, owner="ann")
    ran = await drive(store, storage, callbacks, rerun.id)
    plan = await manager.dry_run(document, owner="ann")
    assert all(not a.compute for a in plan.actions)
    descendants = _descendant_ids(changed, 51)
    assert sorted(ran) == sorted({51} | descendants)
    assert await wf_state(store, rerun.id) is W.SUCCEEDED


def _descendant_ids(document: dict[str, Any], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for action in document["actions"]:
        for parent in action.get("parentActions", []):
            children.setdefault(parent["id"], []).append(action["id"])
    seen: set[int] = set()
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return seen

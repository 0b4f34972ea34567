"""The deletor loop: lifecycle, claims that block it, dead deletors, several at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pingo import states
from pingo.config import Settings
from pingo.datasets.deletor import Deletor
from pingo.datasets.service import DatasetService
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import (
    ManualClock,
    exists,
    make_settings,
    start_attempt,
    walk_dataset,
    workflow,
    write_output,
)

A = states.ActionState
D = states.DatasetState


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Leases long enough that no deletor's claim goes stale within a test.
    return make_settings(tmp_path, lease_s=30.0, deletor_interval_s=0.01)


async def dataset(store: protocol.Store, dataset_id: str) -> protocol.DatasetRecord:
    record = await store.get_dataset(dataset_id)
    assert record is not None
    return record


async def stored_intermediate(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, tag: str = ""
) -> tuple[protocol.WorkflowRecord, protocol.DatasetRecord]:
    """Run action 1 of the chain 1 → 2: its dataset is STORED (and claimed by action 2)."""
    manager = planner.WorkflowManager(store, storage, settings)
    callbacks = OutcomeService(store, storage, settings)
    record = await manager.submit(workflow({1: [], 2: [1]}, tag=tag), owner="ann")
    action = await start_attempt(store, record.id, 1)
    write_output(storage, action, b"data")
    await callbacks.success(action.callback_id, 1)
    return record, await dataset(store, action.dataset_id)


async def test_lifecycle_and_claims_blocking_deletion(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    record, d1 = await stored_intermediate(store, storage, settings)
    assert exists(d1.path)
    assert d1.claims == (protocol.claim_key(record.id, 2),)
    await DatasetService(store, storage).mark_for_deletion(d1.id)
    deletor = Deletor(store, storage, settings)
    assert deletor.name == "deletor"
    # Action 2 has not read it yet: its claim keeps the files.
    await deletor.run_once()
    assert (await dataset(store, d1.id)).state is D.STORED_TO_DELETE
    assert exists(d1.path)
    # Action 2 finishes: its claim goes, and the deletor removes the files.
    callbacks = OutcomeService(store, storage, settings)
    second = await start_attempt(store, record.id, 2)
    await callbacks.success(second.callback_id, 1)
    await deletor.run_once()
    gone = await dataset(store, d1.id)
    assert gone.state is D.DELETED
    assert not exists(d1.path)
    # A workflow that needs it now computes it again.
    manager = planner.WorkflowManager(store, storage, settings)
    plan = await manager.dry_run(workflow({1: []}), owner="ann")
    assert [(a.reason, a.compute) for a in plan.actions] == [("DELETED", True)]


async def test_unmanaged_files_are_never_removed(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "users-own.csv"
    doc = workflow({1: []}, extra={1: {"isManaged": False, "outputPath": str(out)}})
    record = await planner.WorkflowManager(store, storage, settings).submit(doc, owner="ann")
    action = await start_attempt(store, record.id, 1)
    out.write_text("a,b\n")
    await OutcomeService(store, storage, settings).success(action.callback_id, 1)
    await DatasetService(store, storage).mark_for_deletion(action.dataset_id, force=True)
    await Deletor(store, storage, settings).run_once()
    assert (await dataset(store, action.dataset_id)).state is D.DELETED
    assert exists(out)


async def test_a_dead_deletors_work_is_taken_over(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    _, d1 = await stored_intermediate(store, storage, settings)
    _, d2 = await stored_intermediate(store, storage, settings, tag="other")
    for d in (d1, d2):
        await store.remove_dataset_claim(d.id, next(iter(d.claims)))
        await walk_dataset(store, d.id, [D.STORED_TO_DELETE, D.PROCESSING])
    await walk_dataset(store, d2.id, [D.DELETING])
    deletor = Deletor(store, storage, settings)
    await deletor.run_once()
    # Not stale yet: another deletor may still be working on them.
    assert (await dataset(store, d1.id)).state is D.PROCESSING
    clock.advance(settings.lease_s + 1)
    await deletor.run_once()
    for d in (d1, d2):
        assert (await dataset(store, d.id)).state is D.DELETED
        assert not exists(d.path)


async def test_a_claim_that_arrives_during_processing_sends_it_back(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    _, d1 = await stored_intermediate(store, storage, settings)
    await walk_dataset(store, d1.id, [D.STORED_TO_DELETE, D.PROCESSING])
    clock.advance(settings.lease_s + 1)
    await Deletor(store, storage, settings).run_once()
    back = await dataset(store, d1.id)
    assert back.state is D.STORED_TO_DELETE and back.claims
    assert exists(d1.path)


async def test_several_deletors_at_once(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    datasets = []
    for i in range(5):
        _, d = await stored_intermediate(store, storage, settings, tag=str(i))
        await store.remove_dataset_claim(d.id, next(iter(d.claims)))
        await DatasetService(store, storage).mark_for_deletion(d.id)
        datasets.append(d)
    deletors = [Deletor(store, storage, settings) for _ in range(3)]
    marked = await _marked(store, datasets)
    results = await asyncio.gather(*(deletor.delete(d) for deletor in deletors for d in marked))
    # Each dataset was deleted by exactly one deletor; the others lost the CAS.
    assert sum(r is not None for r in results) == len(datasets)
    for d in datasets:
        assert (await dataset(store, d.id)).state is D.DELETED
        assert not exists(d.path)


async def _marked(
    store: protocol.Store, datasets: list[protocol.DatasetRecord]
) -> list[protocol.DatasetRecord]:
    return [await dataset(store, d.id) for d in datasets]


async def test_runs_as_a_loop(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    _, d1 = await stored_intermediate(store, storage, settings)
    await store.remove_dataset_claim(d1.id, next(iter(d1.claims)))
    deletor = Deletor(store, storage, settings)
    task = asyncio.create_task(deletor.run())
    try:
        await DatasetService(store, storage).mark_for_deletion(d1.id)
        deletor.wake()
        for _ in range(200):
            if (await dataset(store, d1.id)).state is D.DELETED:
                break
            await asyncio.sleep(0.01)
        assert (await dataset(store, d1.id)).state is D.DELETED
    finally:
        deletor.stop()
        await task


async def test_orphaned_claims_are_released(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    record, d1 = await stored_intermediate(store, storage, settings)
    await DatasetService(store, storage).mark_for_deletion(d1.id)
    # A planner that died between claiming and persisting its workflow.
    dead = protocol.claim_key(protocol.new_workflow_id(clock()), 7)
    await store.add_dataset_claim(d1.id, dead, {D.STORED_TO_DELETE})
    # Action 2 ended (KILLED) but died before releasing its claim.
    await store.transition_action(record.id, 2, {A.READY}, A.KILLED)
    deletor = Deletor(store, storage, settings)
    assert await deletor.release_orphan_claims() == 1  # the planning may still be under way
    assert (await dataset(store, d1.id)).claims == (dead,)
    clock.advance(settings.plan_deadline_s + settings.lease_s + 1)
    assert await deletor.release_orphan_claims() == 1
    await deletor.run_once()
    assert (await dataset(store, d1.id)).state is D.DELETED


async def test_a_slow_planning_keeps_its_claims_until_its_deadline_and_a_lease(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    """A planning still under way is never robbed of a claim, however long the dataset
    stayed unchanged: only its deadline, after which its workflow can no longer be
    stored, makes its claims orphans; and a reused LEAF is swept too."""
    _, d1 = await stored_intermediate(store, storage, settings)
    _, d2 = await stored_intermediate(store, storage, settings, tag="leaf")
    assert await store.transition_dataset(d2.id, {D.STORED}, D.LEAF) is not None
    planning = protocol.claim_key(protocol.new_workflow_id(clock()), 2)
    await store.add_dataset_claim(d1.id, planning, {D.STORED})
    await store.add_dataset_claim(d2.id, planning, {D.LEAF})
    deletor = Deletor(store, storage, settings)
    for _ in range(3):
        clock.advance(settings.lease_s + 1)
        assert await deletor.release_orphan_claims() == 0
        assert planning in (await dataset(store, d1.id)).claims
    clock.advance(settings.plan_deadline_s)
    assert await deletor.release_orphan_claims() == 2
    for record in (d1, d2):
        assert planning not in (await dataset(store, record.id)).claims

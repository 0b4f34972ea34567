"""Who may force the computation of a dataset: the planner's check, in each dataset state.

A forced computation replaces the files on disk and takes the dataset over
(`OutcomeService._store_files`), so the planner refuses it unless the owner may
manage the dataset (`DatasetService.may_manage`); tests/api/test_forcing.py tries it
over HTTP.
"""

from __future__ import annotations

from typing import Any

import pytest

from pingo import errors, states
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import CHAIN, store_all, workflow

D = states.DatasetState

FORCED = workflow(CHAIN, extra={2: {"forceComputation": True}})


@pytest.fixture
def manager(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> planner.WorkflowManager:
    return planner.WorkflowManager(store, storage, settings)


async def _anns(store: protocol.Store, manager: planner.WorkflowManager) -> tuple[str, str]:
    """Ann's stored chain and the dataset of its action 2."""
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    action = await store.get_action(first.id, 2)
    assert action is not None
    return first.id, action.dataset_id


async def _move(store: protocol.Store, dataset_id: str, *path: states.DatasetState) -> None:
    for state in path:
        current = await store.get_dataset(dataset_id)
        assert current is not None
        assert await store.transition_dataset(dataset_id, {current.state}, state) is not None


async def _refused(
    manager: planner.WorkflowManager,
    document: dict[str, Any] = FORCED,
    force: planner.ForceTargets = (),
) -> str:
    """The refusal of Bob's submission on every road one takes: the same message on each."""
    messages = set()
    for attempt in (manager.submit, manager.persist_detached, manager.dry_run):
        with pytest.raises(errors.Forbidden) as refused:
            await attempt(document, owner="bob", force=force)
        messages.add(refused.value.message)
    assert len(messages) == 1
    return messages.pop()


async def test_another_users_dataset_on_disk_may_not_be_forced(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    anns, dataset_id = await _anns(store, manager)
    before = await store.get_dataset(dataset_id)
    for state in (D.STORED, D.STORED_TO_DELETE):  # every state whose files are on disk
        if state is not D.STORED:
            await _move(store, dataset_id, state)
        message = await _refused(manager)
        assert "'a2' (id 2)" in message and "forceComputation" in message
        assert dataset_id in message and anns not in message
        # A re-run's force of Ann's document, as Bob's, likewise.
        assert "re-run" in await _refused(manager, document=workflow(CHAIN), force=["a2"])
    # Nothing stored, no claim taken, the producer unchanged.
    assert [w.id for w in (await store.list_workflows()).items] == [anns]
    after = await store.get_dataset(dataset_id)
    assert after is not None and before is not None
    assert after.claims == before.claims
    assert (after.producer_workflow_id, after.producer_action_id) == (anns, 2)


async def test_a_dataset_with_no_files_may_be_forced_by_anyone(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    anns, dataset_id = await _anns(store, manager)
    await _move(store, dataset_id, D.STORED_TO_DELETE, D.PROCESSING, D.DELETING, D.DELETED)
    bobs = await manager.submit(FORCED, owner="bob")
    action = await store.get_action(bobs.id, 2)
    assert action is not None and action.reason == "forced"
    # Being computed (by Bob's workflow now): forcing it is Ann's right too, as before.
    anns_again = await manager.submit(FORCED, owner="ann")
    assert anns_again.id != anns


async def test_the_producers_owner_and_admins_may_force_it(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    _, dataset_id = await _anns(store, manager)
    await store.create_user(
        protocol.UserRecord(
            name="root", token_hash="0" * 64, is_admin=True, created_at=store.clock()
        )
    )
    for owner in ("ann", "root"):
        plan = await manager.dry_run(FORCED, owner=owner)
        assert plan.actions[1].reason == "forced" and plan.actions[1].dataset_id == dataset_id
    # Ann has no user record here: the owner of the producing workflow is enough.
    record = await manager.submit(FORCED, owner="ann")
    action = await store.get_action(record.id, 2)
    assert action is not None and action.reason == "forced"

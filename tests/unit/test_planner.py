"""The workflow manager's decisions, claims and persistence, on a memory and a SQLite store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from pingo import errors, states
from pingo.config import Settings
from pingo.datasets import integrity
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import REPLACING_REASONS
from pingo.store import protocol, rules
from pingo.workflows import planner, reuse
from pingo.workflows.definition import ActionDefinition
from tests.unit._engine_support import (
    CHAIN,
    DIAMOND,
    PATHS_FROM_TO_LEAF,
    ManualClock,
    make_settings,
    store_all,
    walk_dataset,
    workflow,
)

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, types: Collection[str] | None) -> None:
        self.count += 1


@pytest.fixture
def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
def manager(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, wakes: Wakes
) -> planner.WorkflowManager:
    return planner.WorkflowManager(store, storage, settings, on_ready=wakes)


async def actions_by_id(
    store: protocol.Store, workflow_id: str
) -> dict[int, protocol.ActionRecord]:
    return {a.action_id: a for a in await store.list_actions(workflow_id)}


async def dataset(store: protocol.Store, dataset_id: str) -> protocol.DatasetRecord:
    record = await store.get_dataset(dataset_id)
    assert record is not None
    return record


# ------------------------------------------------------------------ fresh workflows


async def test_fresh_chain_computes_everything(
    store: protocol.Store, manager: planner.WorkflowManager, storage: DatasetStorage, wakes: Wakes
) -> None:
    record = await manager.submit(workflow(CHAIN), owner="ann")
    assert record.state is W.RUNNING
    assert record.scope == "server"
    assert record.on_failure == "abort"
    actions = await actions_by_id(store, record.id)
    assert [a.state for a in actions.values()] == [A.READY, A.WAITING, A.WAITING]
    assert all(a.reason == "absent" and not a.reused for a in actions.values())
    assert actions[1].waiting_on == () and actions[2].waiting_on == (1,)
    assert actions[3].waiting_on == (2,)
    assert actions[1].children == (2,) and actions[3].children == ()
    assert actions[2].inputs == {1: actions[1].dataset_id}
    assert actions[1].max_attempts == 3
    assert len({a.callback_id for a in actions.values()}) == 3
    assert record.end_dataset_id == actions[3].dataset_id
    d1, d2, d3 = [await dataset(store, actions[i].dataset_id) for i in (1, 2, 3)]
    assert (d1.state, d2.state, d3.state) == (D.TO_STORE, D.TO_STORE, D.TO_LEAF)
    # Every planned read is claimed, so retention never evicts an input in between.
    assert d1.claims == (protocol.claim_key(record.id, 2),)
    assert d2.claims == (protocol.claim_key(record.id, 3),)
    assert d3.claims == ()
    assert d1.path == storage.path_for(d1.id)
    assert d2.parents == (d1.id,)
    assert d1.producer_workflow_id == record.id and d1.producer_action_id == 1
    assert wakes.count == 1


async def test_workflow_ids_sort_by_creation(
    manager: planner.WorkflowManager, clock: ManualClock
) -> None:
    first = await manager.submit(workflow(CHAIN, tag="x"), owner="ann")
    clock.advance(0.002)
    second = await manager.submit(workflow(CHAIN, tag="y"), owner="ann")
    assert first.id < second.id
    assert first.id.startswith("wf-")


async def test_invalid_document_stores_nothing(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    bad = workflow(CHAIN)
    bad["actions"][1]["parentActions"] = [{"id": 9}]
    with pytest.raises(errors.ValidationFailed):
        await manager.submit(bad, owner="ann")
    assert (await store.list_workflows()).items == ()


async def test_forcing_an_unknown_action_is_invalid(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    with pytest.raises(errors.ValidationFailed) as failed:
        await manager.submit(workflow(CHAIN), owner="ann", force=[9])
    assert failed.value.issues[0].code == "UNKNOWN_ACTION_ID"
    with pytest.raises(errors.ValidationFailed):
        await manager.dry_run(workflow(CHAIN), owner="ann", force=[9])
    assert (await store.list_workflows()).items == ()


async def test_force_names_every_action_that_bears_a_name(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    twins = workflow(CHAIN, extra={3: {"name": "a1"}})
    first = await manager.submit(twins, owner="ann")
    await store_all(store, first.id)
    record = await manager.submit(twins, owner="ann", force=["a1"])
    reasons = {aid: a.reason for aid, a in (await actions_by_id(store, record.id)).items()}
    assert reasons == {1: "forced", 2: "reused", 3: "forced"}
    with pytest.raises(errors.ValidationFailed) as failed:
        await manager.submit(twins, owner="ann", force=[1, "nope", 7])
    found = [(issue.code, issue.pointer) for issue in failed.value.issues]
    assert found == [("UNKNOWN_ACTION_NAME", "/force/1"), ("UNKNOWN_ACTION_ID", "/force/2")]


async def test_accepts_bytes(store: protocol.Store, manager: planner.WorkflowManager) -> None:
    record = await manager.submit(json.dumps(workflow(CHAIN)).encode(), owner="ann")
    assert len(await store.list_actions(record.id)) == 3


# ------------------------------------------------------------------------- reuse


async def test_resubmission_reuses_and_succeeds_at_once(
    store: protocol.Store, manager: planner.WorkflowManager, wakes: Wakes
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    second = await manager.submit(workflow(CHAIN), owner="bob")
    assert second.state is W.SUCCEEDED
    assert second.finished_at is not None
    actions = await actions_by_id(store, second.id)
    assert {a.state for a in actions.values()} == {A.FINISHED}
    assert all(a.reused for a in actions.values())
    assert [a.reason for a in actions.values()] == ["not-needed", "not-needed", "reused"]
    leaf = await dataset(store, actions[3].dataset_id)
    assert leaf.use_count == 1
    assert second.end_dataset_id == leaf.id
    assert wakes.count == 1  # only the first workflow had READY actions


@pytest.mark.parametrize("state", list(D))
async def test_decision_for_every_dataset_state(
    store: protocol.Store, manager: planner.WorkflowManager, state: states.DatasetState
) -> None:
    # Action 2's dataset is put in `state` by a workflow where it is the leaf;
    # then the chain 1 → 2 → 3 asks for it under a new leaf 3.
    seed = await manager.submit(workflow({1: [], 2: [1]}), owner="ann")
    seeded = await actions_by_id(store, seed.id)
    await walk_dataset(store, seeded[2].dataset_id, PATHS_FROM_TO_LEAF[state])

    record = await manager.submit(workflow(CHAIN, end=3), owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[2].dataset_id == seeded[2].dataset_id
    d2 = await dataset(store, actions[2].dataset_id)
    if state in (D.STORED, D.LEAF):
        assert actions[2].reason == "reused" and actions[2].state is A.FINISHED
        assert actions[1].reason == "not-needed"
        assert actions[3].state is A.READY and actions[3].waiting_on == ()
        assert protocol.claim_key(record.id, 3) in d2.claims
        assert d2.state is state  # not a leaf of this workflow: no promotion
    else:
        in_flight = state in (D.TO_STORE, D.TO_LEAF)
        assert actions[2].reason == ("in-flight" if in_flight else state.value)
        # In flight (the seed's action 2 has not ended): it shares that computation,
        # waiting for its own parent and for the seed's action (its own id).
        assert actions[2].state is A.WAITING
        assert actions[2].waiting_on == ((1, 2) if in_flight else (1,))
        assert actions[2].shared_with == (protocol.claim_key(seed.id, 2) if in_flight else None)
        # Its ancestors are visited now that it computes (or may have to).
        # (the seed workflow is still computing action 1's dataset: shared too).
        assert actions[1].reason == "in-flight" and actions[1].state is A.WAITING
        assert actions[1].shared_with == protocol.claim_key(seed.id, 1)
        assert actions[1].waiting_on == (1,)
        assert actions[3].waiting_on == (2,)
        # Its computing child's read is claimed on the planned dataset.
        assert protocol.claim_key(record.id, 3) in d2.claims


async def test_stored_leaf_is_promoted_to_leaf(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    actions = await actions_by_id(store, first.id)
    assert (await dataset(store, actions[2].dataset_id)).state is D.STORED
    # A workflow that ends at action 2: its dataset is now a leaf's output.
    record = await manager.submit(workflow({1: [], 2: [1]}), owner="ann")
    assert record.state is W.SUCCEEDED
    assert (await dataset(store, actions[2].dataset_id)).state is D.LEAF


async def test_dry_run_promotes_nothing(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    actions = await actions_by_id(store, first.id)
    plan = await manager.dry_run(workflow({1: [], 2: [1]}), owner="ann")
    assert [(a.action_id, a.compute, a.reason) for a in plan.actions] == [
        (1, False, "not-needed"),
        (2, False, "reused"),
    ]
    assert (await dataset(store, actions[2].dataset_id)).state is D.STORED


async def test_ancestors_of_a_reused_action_are_not_visited(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    ids = {a.action_id: a.dataset_id for a in await store.list_actions(first.id)}
    await walk_dataset(store, ids[1], [D.DELETED])
    await walk_dataset(store, ids[2], [D.STORED])
    await walk_dataset(store, ids[3], [D.DELETED])
    record = await manager.submit(workflow(CHAIN), owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[3].reason == "DELETED" and actions[3].state is A.READY
    assert actions[2].reason == "reused"
    # Action 1's dataset is DELETED, but nothing computing needs it.
    assert actions[1].reason == "not-needed" and actions[1].state is A.FINISHED
    assert actions[1].dataset_id not in {
        d.id for d in (await store.list_datasets(state=D.TO_STORE)).items
    }


async def test_ready_and_waiting_in_a_diamond(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow({1: []}), owner="ann")  # same action 1 as DIAMOND
    await store_all(store, first.id)
    record = await manager.submit(workflow(DIAMOND), owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[1].reason == "reused"
    assert actions[2].state is A.READY and actions[3].state is A.READY
    assert actions[4].state is A.WAITING and actions[4].waiting_on == (2, 3)
    assert actions[1].children == ()  # reused: releases nobody
    assert actions[2].children == (4,)
    d1 = await dataset(store, actions[1].dataset_id)
    assert set(d1.claims) == {protocol.claim_key(record.id, 2), protocol.claim_key(record.id, 3)}
    d2 = await dataset(store, actions[2].dataset_id)
    assert d2.claims == (protocol.claim_key(record.id, 4),)


async def test_forced_and_unmanaged_actions_compute(
    store: protocol.Store, manager: planner.WorkflowManager, tmp_path: Path
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    record = await manager.submit(workflow(CHAIN), owner="ann", force=[2])
    actions = await actions_by_id(store, record.id)
    assert actions[2].reason == "forced" and actions[2].state is A.READY
    assert actions[1].reason == "reused"  # read by the forced action: claimed
    assert protocol.claim_key(record.id, 2) in (await dataset(store, actions[1].dataset_id)).claims
    assert actions[3].reason == "reused"

    by_flag = workflow(CHAIN, extra={3: {"forceComputation": True}})
    record = await manager.submit(by_flag, owner="ann")
    assert (await actions_by_id(store, record.id))[3].reason == "forced"

    out = str(tmp_path / "mine")
    unmanaged = workflow(CHAIN, extra={3: {"isManaged": False, "outputPath": out}})
    record = await manager.submit(unmanaged, owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[3].reason == "unmanaged" and actions[3].state is A.READY
    d3 = await dataset(store, actions[3].dataset_id)
    assert d3.path == out and not d3.is_managed


class RacingStore:
    """A real store whose datasets move on right after planning reads them (another node)."""

    def __init__(self, inner: protocol.Store, victim: set[str], to: states.DatasetState) -> None:
        self._inner = inner
        self._victim = victim
        self._to = to

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def get_datasets(self, dataset_ids: Collection[str]) -> dict[str, protocol.DatasetRecord]:
        records = await self._inner.get_datasets(dataset_ids)
        for ds in self._victim:
            current = records[ds]
            await self._inner.transition_dataset(ds, {current.state}, self._to)
        return records


async def test_failed_claim_means_compute_after_all(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    manager = planner.WorkflowManager(store, storage, settings)
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    ids = {a.action_id: a.dataset_id for a in await store.list_actions(first.id)}
    await walk_dataset(store, ids[3], [D.STORED_TO_DELETE])
    # Between reading and claiming, retention marks action 2's dataset for deletion.
    racing = RacingStore(store, {ids[2]}, D.STORED_TO_DELETE)
    manager = planner.WorkflowManager(racing, storage, settings)  # type: ignore[arg-type]
    record = await manager.submit(workflow(CHAIN), owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[3].reason == "STORED_TO_DELETE"
    assert actions[2].reason == "claim-failed"
    # Its parent is visited now: reused (so action 2 is READY), and claimed for it.
    assert actions[1].reason == "reused" and actions[1].state is A.FINISHED
    assert actions[2].state is A.READY and actions[3].waiting_on == (2,)
    assert protocol.claim_key(record.id, 2) in (await dataset(store, ids[1])).claims


async def test_failed_leaf_promotion_means_compute(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    manager = planner.WorkflowManager(store, storage, settings)
    first = await manager.submit(workflow(CHAIN), owner="ann")
    await store_all(store, first.id)
    ids = {a.action_id: a.dataset_id for a in await store.list_actions(first.id)}
    racing = RacingStore(store, {ids[2]}, D.STORED_TO_DELETE)
    manager = planner.WorkflowManager(racing, storage, settings)  # type: ignore[arg-type]
    record = await manager.submit(workflow({1: [], 2: [1]}), owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[2].reason == "claim-failed" and actions[2].state is A.READY
    assert actions[1].reason == "reused"


async def test_sharing_scope_per_user(
    store: protocol.Store, storage: DatasetStorage, tmp_path: Path
) -> None:
    manager = planner.WorkflowManager(store, storage, make_settings(tmp_path, sharing_scope="user"))
    first = await manager.submit(workflow(CHAIN), owner="ann")
    assert first.scope == "user:ann"
    await store_all(store, first.id)
    same_user = await manager.submit(workflow(CHAIN), owner="ann")
    other_user = await manager.submit(workflow(CHAIN), owner="bob")
    assert same_user.state is W.SUCCEEDED
    assert other_user.state is W.RUNNING
    assert other_user.end_dataset_id != first.end_dataset_id


async def test_keep_hook_marks_intermediates_to_delete_never_leaves(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    asked: list[planner.NewDatasetInfo] = []

    async def keep_nothing(info: planner.NewDatasetInfo) -> bool:
        asked.append(info)
        return False

    manager = planner.WorkflowManager(store, storage, settings, keep_hook=keep_nothing)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    actions = await actions_by_id(store, record.id)
    states_ = [(await dataset(store, actions[i].dataset_id)).state for i in (1, 2, 3)]
    assert states_ == [D.TO_DELETE, D.TO_DELETE, D.TO_LEAF]
    assert sorted(i.action.id for i in asked) == [1, 2]
    assert asked[0].owner == "ann" and asked[0].workflow_id == record.id
    # The structure around each dataset: the whole workflow, leaf and ids included.
    for info in asked:
        assert info.workflow is not None and sorted(info.workflow.actions) == [1, 2, 3]
        assert info.workflow.is_leaf(3)
        assert info.dataset_ids == {i: actions[i].dataset_id for i in (1, 2, 3)}


# ------------------------------------------------------------- dry run, idempotency


async def test_dry_run_stores_nothing(
    store: protocol.Store, manager: planner.WorkflowManager, wakes: Wakes
) -> None:
    first = await manager.submit(workflow({1: []}), owner="ann")
    await store_all(store, first.id)
    before = await store.get_dataset((await store.list_actions(first.id))[0].dataset_id)
    woken = wakes.count
    plan = await manager.dry_run(workflow(DIAMOND), owner="ann")
    assert [(a.action_id, a.compute, a.reason) for a in plan.actions] == [
        (1, False, "reused"),
        (2, True, "absent"),
        (3, True, "absent"),
        (4, True, "absent"),
    ]
    assert plan.actions[0].dataset_state is D.LEAF
    body = plan.to_json()
    assert body["summary"] == {"computed": 3, "shared": 0, "reused": 1, "notNeeded": 0}
    assert body["actions"][0]["datasetState"] == "LEAF"
    json.dumps(body)
    assert len((await store.list_workflows()).items) == 1
    assert await store.get_dataset(before.id if before else "") == before  # no claim added
    assert await store.get_dataset(plan.actions[1].dataset_id) is None
    assert wakes.count == woken


async def test_idempotency_key_returns_the_first_workflow(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann", idempotency_key="k1")
    again = await manager.submit_once(workflow(CHAIN), owner="ann", idempotency_key="k1")
    assert again.record.id == first.id and again.replayed
    with pytest.raises(errors.ValidationFailed) as reused:
        await manager.submit(workflow(CHAIN, tag="other"), owner="ann", idempotency_key="k1")
    assert reused.value.code == "IDEMPOTENCY_KEY_REUSED"
    other_owner = await manager.submit(workflow(CHAIN), owner="bob", idempotency_key="k1")
    assert other_owner.id != first.id
    assert len((await store.list_workflows()).items) == 2


async def test_racing_duplicates_release_their_claims(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    seed = await manager.submit(workflow({1: []}), owner="ann")
    await store_all(store, seed.id)
    results = await asyncio.gather(
        *(manager.submit(workflow(DIAMOND), owner="ann", idempotency_key="same") for _ in range(4))
    )
    assert len({r.id for r in results}) == 1
    d1 = await dataset(store, (await store.list_actions(seed.id))[0].dataset_id)
    # Only the winner's claims remain.
    assert {c.split("/")[0] for c in d1.claims} == {results[0].id}


async def test_a_planning_past_its_deadline_stores_nothing_and_releases_its_claims(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    """The store refuses a plan written after its deadline (the deletor may have released
    its claims as a dead planning's by then): 503, nothing stored, its claims released."""
    seed = await planner.WorkflowManager(store, storage, settings).submit(
        workflow({1: []}), owner="ann"
    )
    await store_all(store, seed.id)
    d1 = await dataset(store, (await store.list_actions(seed.id))[0].dataset_id)

    async def slow(info: planner.NewDatasetInfo) -> bool:
        # Asked after the reused dataset was claimed and before the plan is written.
        assert (await dataset(store, d1.id)).claims
        clock.advance(settings.plan_deadline_s + 0.01)
        return True

    manager = planner.WorkflowManager(store, storage, settings, keep_hook=slow)
    with pytest.raises(errors.PlanExpired) as refused:
        await manager.submit(workflow(DIAMOND), owner="ann")
    assert refused.value.code == "SUBMISSION_INTERRUPTED"
    assert [w.id for w in (await store.list_workflows()).items] == [seed.id]
    assert (await dataset(store, d1.id)).claims == ()
    # On time, the same planning is stored.
    await planner.WorkflowManager(store, storage, settings).submit(workflow(DIAMOND), owner="ann")
    assert (await dataset(store, d1.id)).claims


async def test_racing_submissions_of_different_documents_with_one_key(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    # Both miss the first lookup; the loser of the insert must not get the winner's workflow.
    results = await asyncio.gather(
        *(
            manager.submit_once(workflow(CHAIN, tag=f"t{i}"), owner="ann", idempotency_key="k")
            for i in range(4)
        ),
        return_exceptions=True,
    )
    created = [r for r in results if isinstance(r, planner.Submitted)]
    refused = [r for r in results if isinstance(r, errors.ValidationFailed)]
    assert len(created) == 1 and not created[0].replayed, results
    assert len(refused) == 3 and {r.code for r in refused} == {"IDEMPOTENCY_KEY_REUSED"}
    assert len((await store.list_workflows()).items) == 1


async def test_rerun_of_is_recorded(manager: planner.WorkflowManager) -> None:
    first = await manager.submit(workflow(CHAIN), owner="ann")
    rerun = await manager.submit(first.document, owner="ann", rerun_of=first.id, force=[1])
    assert rerun.rerun_of == first.id


async def test_twins_share_one_dataset(
    store: protocol.Store, manager: planner.WorkflowManager
) -> None:
    # Two roots with the same command compute the same dataset.
    doc = workflow({1: [], 2: [], 3: [1, 2]})
    doc["actions"][1]["command"] = doc["actions"][0]["command"]
    record = await manager.submit(doc, owner="ann")
    actions = await actions_by_id(store, record.id)
    assert actions[1].dataset_id == actions[2].dataset_id
    d = await dataset(store, actions[1].dataset_id)
    assert d.state is D.TO_STORE
    assert d.producer_action_id == 1


# ----------------------------------------------------------------------- speed


class CountingStore:
    """A real store that counts the calls made to it."""

    def __init__(self, inner: protocol.Store) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name == "clock":
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


async def test_fully_reused_resubmission_of_1000_actions_makes_no_per_action_round_trip(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, shared_dir: Path
) -> None:
    if type(store).__name__ == "MongoStore":
        pytest.skip("mongomock is an in-process stand-in, orders of magnitude slower")
    document = json.loads((shared_dir / "bench" / "layered-1000.json").read_text())
    manager = planner.WorkflowManager(store, storage, settings)
    first = await manager.submit(document, owner="ann")
    await store_all(store, first.id)
    counting = CountingStore(store)
    manager = planner.WorkflowManager(counting, storage, settings)  # type: ignore[arg-type]
    for _ in range(3):
        counting.calls.clear()
        record = await manager.submit(document, owner="ann")
        assert record.state is W.SUCCEEDED
    # No per-action round trip: one read, one write, and the reused datasets' use counts.
    assert counting.calls.count("get_datasets") == 1
    assert counting.calls.count("persist_plan") == 1
    assert counting.calls.count("record_dataset_uses") == 1
    # Who produced them, once per producing workflow (all hers: no feed event for them).
    assert counting.calls.count("get_workflow") == 1
    # The owner's feed: one event for the submission, one for its end (it ended at once).
    assert counting.calls.count("append_event") == 2
    # How fast it is is measured in bench (`resubmit_reused_ms`), not asserted here.
    assert len(counting.calls) == 2 + 1 + 1 + 2


def _action(**overrides: Any) -> ActionDefinition:
    values: dict[str, Any] = {
        "id": 1,
        "name": "a1",
        "type": "command-line",
        "parents": (),
        "force_computation": False,
        "is_managed": True,
        "output_path": None,
        "timeout_s": None,
        "max_attempts": None,
        "metadata": {},
        "spec": {"command": ["true"]},
        "raw": {},
    }
    values.update(overrides)
    return ActionDefinition(**values)


def test_the_reasons_that_never_share_are_the_planners_own() -> None:
    """The store keeps an action computing for these reasons (`rules.RUNS_ITS_OWN`): the
    words must be the ones the planner and the integrity check write."""
    forced = planner._decide(_action(force_computation=True), None, forced=False)
    unmanaged = planner._decide(_action(is_managed=False), None, forced=False)
    assert {forced.reason, unmanaged.reason, integrity.MISMATCH_REASON} == rules.RUNS_ITS_OWN
    assert REPLACING_REASONS <= rules.RUNS_ITS_OWN
    assert reuse.IN_FLIGHT == rules.IN_FLIGHT

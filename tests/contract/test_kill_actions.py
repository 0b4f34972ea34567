"""kill_actions: a bounded batch of compare-and-sets to KILLED, with claims and datasets."""

from __future__ import annotations

from dataclasses import replace

from pingo.states import ActionState, DatasetState
from pingo.store.protocol import ActionChanges, Store, WorkflowPlan, claim_key
from tests.contract.conftest import Factory, seed_dataset

A = ActionState
D = DatasetState
NOT_STARTED = {A.WAITING, A.READY}
#: Another workflow's claim, which killing must leave alone.
FOREIGN = "wf-other/7"


def _chain(make: Factory, length: int) -> WorkflowPlan:
    """0 → 1 → … → length-1, each action computing its own dataset."""
    return make.plan({i: (i - 1,) if i else () for i in range(length)})


async def test_kill_actions_kills_lowest_first_in_bounded_batches(
    store: Store, make: Factory
) -> None:
    plan = _chain(make, 25)
    await store.create_workflow(plan)
    other = make.plan({0: ()})
    await store.create_workflow(other)
    wid = plan.workflow.id
    changes = ActionChanges(error="killed by alice", owner=None)

    batches = []
    while True:
        batch = await store.kill_actions(wid, NOT_STARTED, changes, limit=10)
        batches.append([a.action_id for a in batch])
        if len(batch) < 10:
            break

    assert batches == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    actions = await store.list_actions(wid)
    assert all(a.state is A.KILLED and a.error == "killed by alice" for a in actions)
    assert await store.count_actions(wid) == {A.KILLED: 25}
    # Every dataset this workflow was computing is given up.
    datasets = await store.get_datasets([d.id for d in plan.datasets])
    assert {d.state for d in datasets.values()} == {D.DELETED}
    # Nothing of another workflow moved; killing again finds nothing.
    assert await store.count_actions(other.workflow.id) == {A.READY: 1}
    assert await store.kill_actions(wid, NOT_STARTED, changes, limit=10) == []


async def test_kill_actions_drops_claims_and_only_its_own_datasets(
    store: Store, make: Factory
) -> None:
    stored = await seed_dataset(store, make, D.STORED, claims=())
    # 0 runs; 1 waits on 0 and reads the stored dataset; 2 is READY but its dataset is
    # another workflow's computation (a twin in flight), which must stay as it is.
    plan = make.plan(
        {0: (), 1: (0,), 2: ()},
        actions={0: {"state": A.RUNNING, "attempts": 1, "owner": "node-a"}},
    )
    by_id = {a.action_id: a for a in plan.actions}
    wid = plan.workflow.id
    reader = replace(by_id[1], inputs={0: by_id[0].dataset_id, 9: stored})
    plan = replace(plan, actions=(by_id[0], reader, by_id[2]))
    datasets = []
    for dataset in plan.datasets:
        if dataset.id == by_id[0].dataset_id:
            dataset = replace(dataset, claims=(claim_key(wid, 1), FOREIGN))
        if dataset.id == by_id[2].dataset_id:
            dataset = replace(dataset, producer_workflow_id="wf-twin", producer_action_id=3)
        datasets.append(dataset)
    await store.create_workflow(replace(plan, datasets=tuple(datasets)))
    claimed = await store.add_dataset_claim(stored, claim_key(wid, 1), {D.STORED})
    assert claimed is not None

    killed = await store.kill_actions(wid, NOT_STARTED, limit=100)

    assert [a.action_id for a in killed] == [1, 2]
    assert all(a.state is A.KILLED for a in killed)
    running = await store.get_action(wid, 0)
    assert running is not None and running.state is A.RUNNING
    after = await store.get_datasets([by_id[0].dataset_id, by_id[1].dataset_id, stored])
    # The claims of the killed reader are gone, everyone else's stay.
    assert after[by_id[0].dataset_id].claims == (FOREIGN,)
    assert after[stored].claims == ()
    assert after[stored].state is D.STORED
    # The running action still computes its dataset; the killed reader's is given up.
    assert after[by_id[0].dataset_id].state is D.TO_STORE
    assert after[by_id[1].dataset_id].state is D.DELETED
    twin = await store.get_dataset(by_id[2].dataset_id)
    assert twin is not None and twin.state is D.TO_LEAF


async def test_kill_actions_with_nothing_to_kill(store: Store, make: Factory) -> None:
    plan = make.plan({0: ()}, actions={0: {"state": A.FINISHED}})
    await store.create_workflow(plan)
    assert await store.kill_actions(plan.workflow.id, NOT_STARTED) == []
    assert await store.kill_actions(plan.workflow.id, set(), limit=5) == []
    assert await store.kill_actions("wf-missing", NOT_STARTED) == []
    dataset = await store.get_dataset(plan.datasets[0].id)
    assert dataset is not None and dataset.state is D.TO_LEAF

"""Read-only views for the UI: a dataset's relatives (the datasets computed from it, the
workflows that used it) and each action's planning decision."""

from __future__ import annotations

from dataclasses import replace

from pingo.store.protocol import Store
from tests.contract.conftest import Factory


async def test_child_datasets_are_found_by_any_parent(store: Store, make: Factory) -> None:
    # 0 → 1, 0 → 2, (1, 2) → 3: a diamond.
    plan = make.plan({0: (), 1: (0,), 2: (0,), 3: (1, 2)})
    await store.create_workflow(plan)
    ids = {a.action_id: a.dataset_id for a in plan.actions}
    below_root = await store.list_child_datasets([ids[0]])
    assert [d.id for d in below_root] == sorted([ids[1], ids[2]])
    assert all(ids[0] in d.parents for d in below_root)
    # One child of two parents comes back once.
    assert [d.id for d in await store.list_child_datasets([ids[1], ids[2]])] == [ids[3]]
    assert await store.list_child_datasets([ids[3]]) == []
    assert await store.list_child_datasets(["missing"]) == []
    assert await store.list_child_datasets([]) == []
    assert len(await store.list_child_datasets([ids[0]], limit=1)) == 1


async def test_children_from_a_later_workflow_are_found(store: Store, make: Factory) -> None:
    first = make.plan({0: ()})
    await store.create_workflow(first)
    parent = first.actions[0].dataset_id
    # A second workflow reads the first one's dataset (reused) and computes from it.
    second = make.plan({0: (), 1: (0,)}, datasets=False)
    reader, writer = second.actions
    reader = replace(reader, dataset_id=parent, reused=True, reason="reused")
    writer = replace(writer, inputs={0: parent})
    later = replace(second, actions=(reader, writer), datasets=(make.dataset(writer),))
    await store.create_workflow(later)
    assert [d.id for d in await store.list_child_datasets([parent])] == [writer.dataset_id]


async def test_workflows_with_datasets_newest_first(store: Store, make: Factory) -> None:
    first = make.plan({0: ()})
    await store.create_workflow(first)
    shared = first.actions[0].dataset_id
    others = []
    for _ in range(3):
        plan = make.plan({0: ()}, datasets=False)
        action = replace(plan.actions[0], dataset_id=shared, reused=True, reason="reused")
        await store.create_workflow(replace(plan, actions=(action,)))
        others.append(plan.workflow.id)
    unrelated = make.plan({0: ()})
    await store.create_workflow(unrelated)
    everyone = sorted([first.workflow.id, *others], reverse=True)
    assert await store.find_workflows_with_datasets([shared]) == everyone
    assert await store.find_workflows_with_datasets([shared], limit=2) == everyone[:2]
    both = await store.find_workflows_with_datasets(
        [shared, unrelated.actions[0].dataset_id, "missing"]
    )
    assert both == sorted([*everyone, unrelated.workflow.id], reverse=True)
    assert await store.find_workflows_with_datasets(["missing"]) == []
    assert await store.find_workflows_with_datasets([]) == []


async def test_planned_actions_are_planning_decisions(store: Store, make: Factory) -> None:
    plan = make.plan(
        {0: (), 1: (0,), 2: (1,)},
        actions={0: {"reused": True, "reason": "not-needed"}, 1: {"reason": "in-flight"}},
    )
    await store.create_workflow(plan)
    planned = await store.list_planned_actions(plan.workflow.id)
    assert [(p.action_id, p.dataset_id, p.reused, p.reason) for p in planned] == [
        (a.action_id, a.dataset_id, a.reused, a.reason) for a in plan.actions
    ]
    assert [p.reused for p in planned] == [True, False, False]
    assert [p.reason for p in planned] == ["not-needed", "in-flight", "absent"]
    assert await store.list_planned_actions("missing") == []

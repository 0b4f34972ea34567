"""A big workflow's document reads back equal, though decoded only when read (issue 13)."""

from __future__ import annotations

from dataclasses import replace

from pingo import untrusted
from pingo.states import WorkflowState
from pingo.store.protocol import Store, WorkflowChanges
from tests.contract.conftest import Factory


async def test_a_big_document_reads_back_equal_before_and_after_the_end(
    store: Store, make: Factory
) -> None:
    actions = [{"id": i, "command": ["true", "é" * 40]} for i in range(3_000)]
    document = {"name": "big", "actions": actions}
    plan = make.plan({0: ()})
    plan = replace(plan, workflow=replace(plan.workflow, document=document))
    await store.create_workflow(plan)
    wid = plan.workflow.id

    running = await store.get_workflow(wid)
    assert running is not None
    assert running.document == document
    assert untrusted.plain(running.document)["actions"][2_999] == actions[2_999]

    await store.transition_workflow(
        wid, {WorkflowState.RUNNING}, WorkflowState.KILLED, WorkflowChanges(error="killed")
    )
    ended = await store.get_workflow(wid)
    assert ended is not None and ended.state is WorkflowState.KILLED
    assert dict(ended.document) == document

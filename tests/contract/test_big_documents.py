"""A big workflow's document reads back equal, though decoded only when read (issue 13)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pingo import untrusted
from pingo.states import ActionState, WorkflowState
from pingo.store.protocol import Store, WorkflowChanges
from tests.contract.conftest import Backend, Factory


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


async def test_every_action_of_a_big_workflow_reads_back_and_dies_whole(
    store: Store, make: Factory, backend: Backend
) -> None:
    if backend.name == "mongomock":
        pytest.skip("mongomock is an in-process stand-in, orders of magnitude slower")
    # More actions than a backend reads one by one: SQLite reads them in bulk, with
    # their definitions left as text until something reads them.
    plan = make.ready_plan(2_500)
    await store.create_workflow(plan)
    wid = plan.workflow.id
    read = await store.list_actions(wid)
    assert [a.action_id for a in read] == list(range(2_500))
    assert [dict(a.definition) for a in read] == [dict(a.definition) for a in plan.actions]
    assert read[1_234].definition["command"] == ["echo", "1234"]

    killed = await store.kill_actions(wid, {ActionState.READY}, limit=3_000)
    assert len(killed) == 2_500
    assert {a.state for a in killed} == {ActionState.KILLED}
    assert killed[-1].definition == plan.actions[-1].definition

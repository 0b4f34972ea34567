"""Durability of the SQLite store: an acknowledged transition survives `kill -9`."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pingo.states import ActionState, WorkflowState
from pingo.store import open_store
from pingo.store.protocol import ActionRecord, WorkflowPlan, WorkflowRecord

ACTIONS = 5_000

#: Moves actions READY → PROCESSING one by one, printing each acknowledged one.
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pingo.states import ActionState
    from pingo.store import open_store
    from pingo.store.protocol import ActionChanges

    async def main(url, workflow_id, count, synchronous):
        async with open_store(url, sqlite_synchronous=synchronous) as store:
            print("open", flush=True)
            for i in range(count):
                record = await store.transition_action(
                    workflow_id, i, {ActionState.READY}, ActionState.PROCESSING,
                    ActionChanges(owner="child", external_id=f"x{i}"),
                )
                assert record is not None, i
                # Every 50th: a multi-statement transaction too.
                if i % 50 == 0:
                    await store.append_event("tick", workflow_id=workflow_id, payload={"i": i})
                    await store.renew_leases("child", [(workflow_id, i)], 60)
                sys.stdout.write(f"{i}\\n")
                sys.stdout.flush()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    """
)


def _plan(count: int) -> WorkflowPlan:
    now = datetime.now(UTC)
    workflow = WorkflowRecord(
        id="wf-durable",
        name="durable",
        owner="alice",
        state=WorkflowState.RUNNING,
        document={},
        scope="server",
        on_failure="abort",
        end_dataset_id=None,
        created_at=now,
    )
    actions = tuple(
        ActionRecord(
            workflow_id=workflow.id,
            action_id=i,
            name=f"a{i}",
            type="command-line",
            state=ActionState.READY,
            dataset_id=f"ds-{i}",
            reused=False,
            reason="absent",
            definition={"command": ["true"]},
            inputs={},
            waiting_on=(),
            children=(),
            callback_id=f"cb-{i}",
            created_at=now,
            updated_at=now,
        )
        for i in range(count)
    )
    return WorkflowPlan(workflow, actions, ())


def _run_and_kill(url: str, synchronous: str) -> tuple[set[int], int, bytes]:
    """Run the child, SIGKILL it mid-stream; the transitions it acknowledged, its status."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, "wf-durable", str(ACTIONS), synchronous],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stdout is not None
    acknowledged: set[int] = set()
    try:
        assert child.stdout.readline() == b"open\n", child.stderr.read() if child.stderr else ""
        deadline = time.monotonic() + 60
        # Kill at a moment the child is busy writing (it never pauses).
        while len(acknowledged) < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acknowledged.add(int(line))
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        rest, errors = child.communicate(timeout=30)
    # Lines already written to the pipe were acknowledged too; a torn last line was not.
    acknowledged.update(int(line) for line in rest.split(b"\n")[:-1])
    return acknowledged, child.returncode, errors


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_acknowledged_transitions_survive_sigkill(tmp_path: Path, synchronous: str) -> None:
    path = tmp_path / "durable.db"
    url = f"sqlite:///{path}"
    async with open_store(url) as store:
        await store.create_workflow(_plan(ACTIONS))

    acknowledged, returncode, errors = await asyncio.to_thread(_run_and_kill, url, synchronous)
    assert returncode == -signal.SIGKILL, errors.decode()
    assert len(acknowledged) >= 400, errors.decode()
    assert max(acknowledged) < ACTIONS - 1, "the child finished before it was killed"

    # No corruption: SQLite's own check, on the files exactly as the kill left them.
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        check.close()

    async with open_store(url) as store:
        records = {a.action_id: a for a in await store.list_actions("wf-durable")}
        events = await store.list_events(kind="tick", limit=ACTIONS)
    for i in acknowledged:
        assert records[i].state is ActionState.PROCESSING, i
        assert (records[i].owner, records[i].external_id) == ("child", f"x{i}")
    moved = {i for i, a in records.items() if a.state is ActionState.PROCESSING}
    # Transitions are made in order, so what survived is a prefix holding every acknowledged one.
    assert moved == set(range(len(moved)))
    assert len(moved) >= len(acknowledged)
    assert {e.payload["i"] for e in events if e.payload} >= {i for i in acknowledged if i % 50 == 0}

"""The engine end to end: a Node on a real store running real subprocesses.

Each action's command prints `run <id>` into its attempt's log, so the tests can
tell exactly which actions ran and how often (the sandbox lets an action write
nothing but its output, so the log is the record). Runs on the embedded SQLite store and
on a MongoDB wire server (nx-27017, or `PINGO_TEST_MONGODB_URI`).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from pingo import heap, states
from pingo.actions.executors.local import LocalExecutor
from pingo.config import Settings
from pingo.datasets.storage import SPARE_PREFIX
from pingo.node import Node
from pingo.store import open_store

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState

Document = dict[str, Any]


def engine_settings(tmp_path: Path, store_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path / "home",
        "store_url": store_url,
        "poll_interval_s": 0.2,
        "lease_s": 10.0,
        "local_slots": 4,
        "retry_backoff_s": 0.05,
        "reconcile_grace_s": 0.5,
        "mongo_write_concern": "1",
        "root_actions": "everyone",  # CI runs as root (tests/conftest.py)
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings(tmp_path: Path, store_url: str) -> Settings:
    return engine_settings(tmp_path, store_url)


@pytest.fixture
async def node(settings: Settings) -> AsyncIterator[Node]:
    settings.home.mkdir(parents=True, exist_ok=True)
    async with open_store(
        settings.store_url, mongo_write_concern=settings.mongo_write_concern
    ) as store:
        node = Node(settings, store)
        await node.start()
        try:
            yield node
        finally:
            await node.stop()


def counting(action_id: int, extra: str = "") -> list[str]:
    """A command recording its run in its log and writing its output file."""
    return ["sh", "-c", f'echo run {action_id}; echo {action_id}{extra} > "$PINGO_OUTPUT"']


def layered_100(shared_dir: Path) -> Document:
    document: Document = json.loads((shared_dir / "bench" / "layered-100.json").read_text())
    for action in document["actions"]:
        action["command"] = counting(action["id"])
    return document


def read(path: str | Path) -> str:
    with open(path) as f:
        return f.read()


def logged(home: Path, tag: str) -> list[list[str]]:
    """The words after `tag` on each line of every attempt log under `home`."""
    return [
        line.split()[1:]
        for log in sorted((home / "logs").rglob("*.log"))
        for line in log.read_text().splitlines()
        if line.startswith(f"{tag} ")
    ]


def runs(home: Path) -> collections.Counter[int]:
    """How often each action id ran, from the `run <id>` lines of the attempt logs."""
    return collections.Counter(int(words[0]) for words in logged(home, "run"))


def descendants(document: Document, action_id: int) -> set[int]:
    graph = nx.DiGraph()
    for action in document["actions"]:
        graph.add_node(action["id"])
        for parent in action.get("parentActions", []):
            graph.add_edge(parent["id"], action["id"])
    return set(nx.descendants(graph, action_id))


async def test_layered_100_runs_once_reuses_and_reruns_what_changed(
    node: Node, shared_dir: Path, tmp_path: Path
) -> None:
    home = node.settings.home
    document = layered_100(shared_dir)
    ids = {a["id"] for a in document["actions"]}

    first = await node.workflows.submit(document, owner="alice")
    done = await node.wait_workflow(first.id, timeout_s=60)
    assert done.state is W.SUCCEEDED, done.error
    assert runs(home) == collections.Counter(ids)
    actions = await node.store.list_actions(first.id)
    assert {a.state for a in actions} == {A.FINISHED}
    # Every output was promoted onto its dataset path, the staging area left empty.
    datasets = await node.store.get_datasets({a.dataset_id for a in actions})
    for action in actions:
        dataset = datasets[action.dataset_id]
        assert dataset.state in (D.STORED, D.LEAF)
        assert read(dataset.path).strip() == str(action.action_id)
        assert dataset.size_bytes == len(f"{action.action_id}\n")
    staging = Path(node.storage.root) / ".staging"
    # Nothing left of any attempt; the evidence files kept for reuse are spares.
    assert not staging.exists() or all(p.name.startswith(SPARE_PREFIX) for p in staging.iterdir())
    # One log per attempt.
    assert (node.settings.home / "logs" / first.id / "1.1.log").exists()

    # The same workflow again: every dataset is reused, nothing runs.
    again = await node.workflows.submit(copy.deepcopy(document), owner="bob")
    assert again.state is W.SUCCEEDED
    assert runs(home) == collections.Counter(ids)

    # One changed command: exactly it and its descendants run again.
    changed_id = 25
    changed = copy.deepcopy(document)
    for action in changed["actions"]:
        if action["id"] == changed_id:
            action["command"] = counting(changed_id, extra=" v2")
    third = await node.workflows.submit(changed, owner="alice")
    done = await node.wait_workflow(third.id, timeout_s=60)
    assert done.state is W.SUCCEEDED, done.error
    rerun = runs(home) - collections.Counter(ids)
    assert set(rerun) == {changed_id} | descendants(document, changed_id)
    assert set(rerun.values()) == {1}


def single(command: list[str], **fields: Any) -> Document:
    action = {"id": 1, "name": "only", "type": "command-line", "command": command, **fields}
    return {"name": "single", "startActionId": 1, "endActionId": 1, "actions": [action]}


async def test_failure_is_retried_then_fails_the_workflow(node: Node, tmp_path: Path) -> None:
    home = node.settings.home
    document = single(["sh", "-c", "echo run 1; echo broken >&2; exit 4"], maxAttempts=2)
    workflow = await node.workflows.submit(document, owner="alice")
    done = await node.wait_workflow(workflow.id, timeout_s=30)
    assert done.state is W.FAILED
    [action] = await node.store.list_actions(workflow.id)
    assert action.state is A.FAILED
    assert action.attempts == 2
    assert action.error is not None and "exited with status 4" in action.error
    assert "broken" in action.error
    assert runs(home) == {1: 2}
    dataset = await node.store.get_dataset(action.dataset_id)
    assert dataset is not None and dataset.state is D.DELETED


async def test_timeout_fails_the_action(node: Node, tmp_path: Path) -> None:
    document = single(["sleep", "30"], timeoutSeconds=0.5, maxAttempts=1)
    workflow = await node.workflows.submit(document, owner="alice")
    done = await node.wait_workflow(workflow.id, timeout_s=30)
    assert done.state is W.FAILED
    [action] = await node.store.list_actions(workflow.id)
    assert action.error == "timed out after 0.5 s"


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in the group."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def test_kill_stops_the_running_process_group(node: Node, tmp_path: Path) -> None:
    document = single(["sh", "-c", "sleep 60 & sleep 60; wait"])
    workflow = await node.workflows.submit(document, owner="alice")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    local = node.executors["command-line"]
    assert isinstance(local, LocalExecutor)
    # The external id is recorded before the process is spawned: wait for both.
    while True:
        [action] = await node.store.list_actions(workflow.id)
        pgid = None if action.external_id is None else local.pid(action.external_id)
        if pgid is not None:
            break
        assert loop.time() < deadline, action
        await asyncio.sleep(0.02)
    assert group_alive(pgid)
    killed = await node.workflows.kill(workflow.id)
    assert killed.state is W.KILLED
    done = await node.wait_workflow(workflow.id, timeout_s=10)
    assert done.state is W.KILLED
    deadline = loop.time() + 10
    while group_alive(pgid):
        assert loop.time() < deadline, "the process group survived the kill"
        await asyncio.sleep(0.05)
    [action] = await node.store.list_actions(workflow.id)
    assert action.state is A.KILLED


async def store_actions(settings: Settings, workflow_id: str) -> list[Any]:
    async with open_store(settings.store_url, mongo_write_concern="1") as store:
        return await store.list_actions(workflow_id)


async def test_stop_hands_queued_work_back(tmp_path: Path, store_url: str) -> None:
    settings = engine_settings(tmp_path, store_url, local_slots=1, submitters=2)
    settings.home.mkdir(parents=True, exist_ok=True)
    actions = [
        {"id": i, "name": f"a{i}", "type": "command-line", "command": counting(i)}
        for i in range(1, 6)
    ]
    actions[0]["command"] = ["sh", "-c", "echo run 1; sleep 0.5"]
    document = {"name": "five", "startActionId": 1, "endActionId": 5, "actions": actions}
    async with open_store(settings.store_url, mongo_write_concern="1") as store:
        node = Node(settings, store)
        await node.start()
        workflow = await node.workflows.submit(document, owner="alice")
        await asyncio.sleep(0.2)
        await node.stop()
        left = await store.list_actions(workflow.id)
        # Nothing is left claimed by the stopped node: finished, or READY for anyone.
        assert {a.state for a in left} <= {A.FINISHED, A.READY}
        assert all(a.owner is None or a.state is A.FINISHED for a in left)
        # A new node finishes the rest, each action having run once.
        node = Node(settings.replace(node_id="second"), store)
        await node.start()
        try:
            done = await node.wait_workflow(workflow.id, timeout_s=30)
        finally:
            await node.stop()
    assert done.state is W.SUCCEEDED
    assert runs(settings.home) == collections.Counter(range(1, 6))


async def test_leases_are_renewed_while_work_runs_and_limits_hold(
    tmp_path: Path, store_url: str
) -> None:
    # Leases far shorter than the work: a second node must neither reclaim nor reap it.
    step = "s=$(date +%s.%N); sleep 1.2; echo span $s $(date +%s.%N)"
    actions = [
        {
            "id": i,
            "name": f"a{i}",
            "type": "command-line",
            "command": ["sh", "-c", f'echo run {i}; {step}; echo {i} > "$PINGO_OUTPUT"'],
        }
        for i in range(1, 4)
    ]
    document = {"name": "slow", "startActionId": 1, "endActionId": 3, "actions": actions}
    settings = engine_settings(
        tmp_path,
        store_url,
        lease_s=0.6,
        reconcile_grace_s=0.1,
        poll_interval_s=0.05,
        executor_limits={"command-line": 1},
    )
    settings.home.mkdir(parents=True, exist_ok=True)
    async with (
        open_store(settings.store_url, mongo_write_concern="1") as store_a,
        open_store(settings.store_url, mongo_write_concern="1") as store_b,
    ):
        first = Node(settings.replace(node_id="first"), store_a)
        second = Node(settings.replace(node_id="second", local_slots=1), store_b)
        await first.start()
        try:
            workflow = await first.workflows.submit(document, owner="alice")
            await asyncio.sleep(0.3)  # the first node holds the work before the second starts
            await second.start()
            try:
                done = await first.wait_workflow(workflow.id, timeout_s=60)
            finally:
                await second.stop()
        finally:
            await first.stop()
    assert done.state is W.SUCCEEDED, done.error
    assert runs(settings.home) == collections.Counter({1: 1, 2: 1, 3: 1})
    # Each node ran one action at a time (the limit), so never more than two at once.
    intervals = [(float(s), float(e)) for s, e in logged(settings.home, "span")]
    assert max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals) <= 2


async def test_stop_with_submitters_waiting_on_a_limit(tmp_path: Path) -> None:
    # One long action holds the only slot of its type; the others wait in submitters.
    # Stopping must not wait for a slot that only the (killed) long action would free.
    settings = engine_settings(
        tmp_path,
        f"sqlite:///{tmp_path / 'pingo.db'}",
        executor_limits={"command-line": 1},
        submitters=3,
    )
    settings.home.mkdir(parents=True, exist_ok=True)
    document = {
        "name": "waits",
        "startActionId": 1,
        "endActionId": 3,
        "actions": [
            {"id": i, "name": f"a{i}", "type": "command-line", "command": ["sleep", f"3{i}"]}
            for i in range(1, 4)
        ],
    }
    async with open_store(settings.store_url) as store:
        node = Node(settings, store)
        local = node.executors["command-line"]
        assert isinstance(local, LocalExecutor)
        local.close_grace_s = 0.2
        await node.start()
        workflow = await node.workflows.submit(document, owner="alice")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while local.running < 1:
            assert loop.time() < deadline
            await asyncio.sleep(0.02)
        await asyncio.wait_for(node.stop(), timeout=15)
        left = {a.action_id: a for a in await store.list_actions(workflow.id)}
    # The two that never started went back to READY with no attempt charged.
    waiting = [a for a in left.values() if a.state is A.READY]
    assert len(waiting) == 2
    assert all(a.attempts == 0 and a.owner is None for a in waiting)


async def test_a_started_server_node_freezes_its_startup_heap(tmp_path: Path) -> None:
    # Long-lived start-up objects out of the collector's generations (full collections
    # walked them on every gen-2 pass); what the node allocates afterwards is collected.
    import gc

    from pingo.node import running_node

    gc.unfreeze()
    thresholds = gc.get_threshold()
    settings = Settings(home=tmp_path / "home", node_id="freeze", local_slots=1)
    try:
        async with running_node(settings) as node:
            assert node.running
            assert gc.get_freeze_count() > 0
            # Young collections spaced out, the older ones relative to them as before.
            assert gc.get_threshold() == (heap.YOUNG_COLLECTIONS_EVERY, *thresholds[1:])
            garbage: list[Any] = []
            garbage.append(garbage)  # a cycle made after start-up is still collectable
            del garbage
            assert gc.collect() >= 1
        assert gc.get_threshold() == thresholds  # the process as the node found it
    finally:
        gc.unfreeze()

"""Several nodes on one store split the work (issue 16): claim by capacity, cross-node wake-ups.

The first test runs two real `pingo server` processes on one SQLite file and
submits through the file, as a third process would. The others run nodes in
this process, each on its own store connection: nothing wakes one node when
another writes, so they find each other's work only as separate machines do
(the store's change events where it has them, else the adaptive poll).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.bench_nodes import sleeps
from pingo import errors, states
from pingo.actions.executors import base, cluster, local
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.node import Node
from pingo.store import open_store, protocol
from pingo.workflows.planner import WorkflowManager
from tests.conftest import server_environ
from tests.integration.test_crash import Server, free_port
from tests.integration.test_schedule_nodes import url, wait_ready

A = states.ActionState
W = states.WorkflowState
#: The stand-in `hadoop` and `yarn` (tests/integration/test_cluster.py says what they do).
STANDIN_BIN = Path(__file__).resolve().parents[1] / "fixtures" / "bin"


def node_of(action: protocol.ActionRecord) -> str:
    """The node a local action ran on: its external id is `<callback>.<attempt>@<node>`."""
    assert action.external_id is not None, action
    return action.external_id.rsplit("@", 1)[1]


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[list[Server], str, Path]]:
    store_url = f"sqlite:///{tmp_path / 'pingo.db'}"
    base = server_environ()
    base.update(
        {
            "PINGO_STORE_URL": store_url,
            "PINGO_DATA_ROOT": str(tmp_path / "datasets"),
            "PINGO_HOST": "127.0.0.1",
            "PINGO_ADMIN_TOKEN": "nodes-test-admin-token",
            "PINGO_LOCAL_SLOTS": "2",
            "PINGO_LOG_LEVEL": "INFO",
        }
    )
    servers = []
    for name in ("node-a", "node-b"):
        env = dict(base, PINGO_HOME=str(tmp_path / name), PINGO_NODE_ID=name)
        env["PINGO_PORT"] = str(free_port())
        servers.append(Server(env, tmp_path / f"{name}.log"))
    try:
        yield servers, store_url, tmp_path
    finally:
        for server in servers:
            server.ensure_stopped()


async def test_two_server_processes_split_the_work_over_one_sqlite_file(
    two_servers: tuple[list[Server], str, Path],
) -> None:
    servers, store_url, tmp_path = two_servers
    settings = Settings(home=tmp_path / "client", store_url=store_url)
    settings.home.mkdir(parents=True)
    for server in servers:
        server.start()
    async with open_store(store_url) as store:
        manager = WorkflowManager(store, DatasetStorage(str(tmp_path / "datasets")), settings)
        workflow = await manager.submit(sleeps(16, 0.3, "split"), owner="alice")
        most_held: collections.Counter[str] = collections.Counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while True:
            actions = await store.list_actions(workflow.id)
            # Claim by capacity: a node never holds more than its 2 slots can start
            # (none ahead: 2 slots end under one of these 0.3 s sleeps in PINGO_CLAIM_AHEAD_S).
            held = collections.Counter(
                a.owner for a in actions if a.state in states.ACTION_ACTIVE and a.owner
            )
            for owner, count in held.items():
                most_held[owner] = max(most_held[owner], count)
            record = await store.get_workflow(workflow.id)
            assert record is not None
            if record.state in states.WORKFLOW_TERMINAL:
                break
            if loop.time() > deadline:
                by_state = collections.Counter((a.state, a.owner) for a in actions)
                pytest.fail(f"timed out: {by_state}\n{servers[0].log()}\n{servers[1].log()}")
            await asyncio.sleep(0.02)
        assert record.state is W.SUCCEEDED, (servers[0].log(), servers[1].log())
        actions = await store.list_actions(workflow.id)
    ran_on = collections.Counter(node_of(a) for a in actions)
    assert set(ran_on) == {"node-a", "node-b"}, ran_on
    assert sum(ran_on.values()) == 17
    assert set(most_held) <= {"node-a", "node-b"}
    assert max(most_held.values()) <= 2, most_held


#: Pairs of workflows needing one dataset, submitted to the two processes at once.
PAIRS = 20


async def test_two_server_processes_planning_one_dataset_at_once_compute_it_once(
    two_servers: tuple[list[Server], str, Path],
) -> None:
    """Two users POST workflows needing the same dataset to two `pingo server` processes
    on one SQLite file at the same moment: both plans read it absent, and the store's
    write transaction makes the one persisted second share the first's computation.
    Each action runs sandboxed; its attempts and recorded history count its runs."""
    servers, store_url, _ = two_servers
    for server in servers:
        server.start()
    admin = {"Authorization": "Bearer nodes-test-admin-token"}
    async with aiohttp.ClientSession() as http:
        for server in servers:
            await wait_ready(http, server)
        created = await http.post(
            url(servers[0]) + "/api/v1/users", json={"name": "bob"}, headers=admin
        )
        assert created.status == 201, await created.text()
        bob = {"Authorization": f"Bearer {(await created.json())['token']}"}

        async def submit(server: Server, headers: dict[str, str], document: Any) -> str:
            async with http.post(
                url(server) + "/api/v1/workflows", json=document, headers=headers
            ) as response:
                assert response.status == 201, await response.text()
                workflow_id: str = (await response.json())["id"]
                return workflow_id

        # Many pairs at once, so that the two processes' plannings overlap (one pair
        # alone is planned in a millisecond, well inside the requests' jitter).
        pairs = []
        for round_ in range(PAIRS):
            extract = ["sh", "-c", f'sleep 0.2; echo round {round_} > "$PINGO_OUTPUT"']
            pairs.append(
                (
                    submit(servers[0], admin, _extract(extract, read=False)),
                    submit(servers[1], bob, _extract(extract, read=True)),
                )
            )
        ids = await asyncio.gather(*(s for pair in pairs for s in pair))
        rounds = [ids[i : i + 2] for i in range(0, len(ids), 2)]
    async with open_store(store_url) as store:
        for ids in rounds:
            for workflow_id in ids:
                await _until_ended(store, workflow_id, servers)
            firsts = [await store.get_action(w, 1) for w in ids]
            assert all(a is not None for a in firsts)
            runs = [a.attempts for a in firsts if a is not None]
            assert sorted(runs) == [0, 1], (runs, servers[0].log(), servers[1].log())
            sharer = next(a for a in firsts if a is not None and a.attempts == 0)
            producer = next(a for a in firsts if a is not None and a.attempts == 1)
            assert sharer.shared_with == protocol.claim_key(*producer.key)
            assert [e.state for e in sharer.history] == [A.WAITING, A.FINISHED]
            assert [e.state for e in producer.history].count(A.SUBMITTED) == 1


def _extract(command: list[str], *, read: bool) -> dict[str, Any]:
    """Action 1 runs `command` (the dataset both need); with `read`, action 2 reads it."""
    actions: list[dict[str, Any]] = [
        {"id": 1, "name": "extract", "type": "command-line", "command": command}
    ]
    if read:
        actions.append(
            {
                "id": 2,
                "name": "read",
                "type": "command-line",
                "command": ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"'],
                "parentActions": [{"id": 1}],
            }
        )
    return {"name": "extract", "startActionId": 1, "endActionId": len(actions), "actions": actions}


async def _until_ended(store: protocol.Store, workflow_id: str, servers: list[Server]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while True:
        record = await store.get_workflow(workflow_id)
        assert record is not None
        if record.state in states.WORKFLOW_TERMINAL:
            assert record.state is W.SUCCEEDED, (record.error, servers[0].log())
            return
        assert loop.time() < deadline, (servers[0].log(), servers[1].log())
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- nodes in this process


def node_settings(tmp_path: Path, store_url: str, name: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path / name,
        "store_url": store_url,
        "data_root": str(tmp_path / "datasets"),
        "node_id": name,
        "lease_s": 10.0,
        "local_slots": 2,
        "mongo_write_concern": "1",
        "root_actions": "everyone",  # CI runs as root (tests/conftest.py)
    }
    values.update(overrides)
    settings = Settings(**values)
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings


@pytest.fixture
async def nodes(tmp_path: Path, store_url: str) -> AsyncIterator[Any]:
    """`await nodes(name, executors=…, **settings)` starts a node on its own store handle."""
    started: list[Node] = []
    async with contextlib.AsyncExitStack() as stack:

        async def start(name: str, executors: Any = None, **overrides: Any) -> Node:
            settings = node_settings(tmp_path, store_url, name, **overrides)
            store = await stack.enter_async_context(
                open_store(settings.store_url, mongo_write_concern="1")
            )
            node = Node(settings, store, executors=executors)
            await node.start()
            started.append(node)
            return node

        try:
            yield start
        finally:
            for node in reversed(started):
                await node.stop()


async def test_a_type_a_node_cannot_run_stays_ready_for_a_node_that_can(nodes: Any) -> None:
    planner = await nodes("planner", executors={})
    workflow = await planner.workflows.submit(sleeps(3, 0, "types"), owner="alice")
    await asyncio.sleep(0.3)
    # The planner has no executor: it claims nothing and fails nothing.
    actions = await planner.store.list_actions(workflow.id)
    assert collections.Counter(a.state for a in actions) == {A.READY: 3, A.WAITING: 1}
    assert all(a.owner is None and a.attempts == 0 for a in actions)

    await nodes("worker")
    done = await planner.wait_workflow(workflow.id, timeout_s=30)
    assert done.state is W.SUCCEEDED
    assert {node_of(a) for a in await planner.store.list_actions(workflow.id)} == {"worker"}


async def test_an_idle_node_finds_another_nodes_work_without_a_full_poll(
    nodes: Any, store_url: str
) -> None:
    # One slot on the first node, busy for a while: the second node, idle and
    # never woken in-process, must find the READY rest by itself, well within the
    # (deliberately long) poll interval, through the adaptive poll (SQLite, and
    # the wire server, which has no change streams) or change events.
    busy = await nodes("busy", local_slots=1, poll_interval_s=30.0)
    idle = await nodes("idle", local_slots=4, poll_interval_s=30.0)
    await asyncio.sleep(0.5)  # the idle node's poll has backed off
    assert idle.scraper.interval_s == idle.settings.idle_poll_s or idle.scraper.pushed
    if store_url.startswith("mongodb") and not idle.scraper.pushed:
        # The fallback: the wire server has no change streams, and said so.
        with pytest.raises(errors.Unsupported):
            await idle.store.watch_ready(lambda: None)
        assert idle.ready_watch.stopping

    started = asyncio.get_running_loop().time()
    workflow = await busy.workflows.submit(sleeps(4, 2, "busy"), owner="alice")

    async def on_idle() -> list[protocol.ActionRecord]:
        while True:
            actions = await idle.store.list_actions(workflow.id)
            mine = [a for a in actions if a.owner == "idle" and a.state in states.ACTION_ACTIVE]
            if len(mine) >= 3:
                return actions
            await asyncio.sleep(0.01)

    actions = await asyncio.wait_for(on_idle(), timeout=10)
    assert asyncio.get_running_loop().time() - started < 5
    held = collections.Counter(a.owner for a in actions if a.state in states.ACTION_ACTIVE)
    # The busy node usually claims one first; when the idle node's poll lands
    # before the busy node's own dispatch, it may take all four. Either way the
    # idle node did the finding.
    assert held["idle"] >= 3 and held["busy"] <= 1


async def test_a_workflow_on_another_node_shares_a_computation_in_flight(
    nodes: Any, tmp_path: Path
) -> None:
    # Alice's workflow is planned and run by node a; Bob's, needing the same dataset,
    # is planned on node b while a computes it. Only the store joins the two nodes.
    marker = tmp_path / "runs"
    first = ["sh", "-c", f'echo run >> {marker}; sleep 1; echo once > "$PINGO_OUTPUT"']
    reader = ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"']

    def document(*, read: bool) -> dict[str, Any]:
        actions: list[dict[str, Any]] = [
            {"id": 1, "name": "extract", "type": "command-line", "command": first}
        ]
        if read:
            actions.append(
                {
                    "id": 2,
                    "name": "read",
                    "type": "command-line",
                    "command": reader,
                    "parentActions": [{"id": 1}],
                }
            )
        return {
            "name": "shared",
            "startActionId": 1,
            "endActionId": len(actions),
            "actions": actions,
        }

    node_a = await nodes("a", sandbox="off")
    node_b = await nodes("b", sandbox="off", local_slots=1)
    alices = await node_a.workflows.submit(document(read=False), owner="alice")
    bobs = await node_b.workflows.submit(document(read=True), owner="bob")
    shared = await node_b.store.get_action(bobs.id, 1)
    assert shared is not None and shared.is_attached
    assert shared.shared_with == protocol.claim_key(alices.id, 1)
    for workflow_id in (alices.id, bobs.id):
        done = await node_b.wait_workflow(workflow_id, timeout_s=60)
        assert done.state is W.SUCCEEDED, done.error
    assert marker.read_text().splitlines() == ["run"]
    finished = await node_b.store.get_action(bobs.id, 1)
    assert finished is not None and finished.state is A.FINISHED and finished.attempts == 0


async def test_two_nodes_planning_one_dataset_at_once_compute_it_once(nodes: Any) -> None:
    """The same on SQLite and on the wire MongoDB, nodes in this process on their own
    store handles: on MongoDB the datasets' unique ids decide, before any action of
    the plan is written."""
    node_a = await nodes("a")
    node_b = await nodes("b")
    pairs = []
    for round_ in range(PAIRS // 2):
        extract = ["sh", "-c", f'sleep 0.2; echo round {round_} > "$PINGO_OUTPUT"']
        pairs.append(
            (
                node_a.workflows.submit(_extract(extract, read=False), owner="alice"),
                node_b.workflows.submit(_extract(extract, read=True), owner="bob"),
            )
        )
    records = await asyncio.gather(*(s for pair in pairs for s in pair))
    for i in range(0, len(records), 2):
        ids = [records[i].id, records[i + 1].id]
        for workflow_id in ids:
            done = await node_b.wait_workflow(workflow_id, timeout_s=120)
            assert done.state is W.SUCCEEDED, done.error
        firsts = [await node_a.store.get_action(w, 1) for w in ids]
        runs = sorted(a.attempts for a in firsts if a is not None)
        assert runs == [0, 1], firsts


# ------------------------------------------------------------------- kills across nodes


async def _running(node: Node) -> int:
    """Processes the node's local executor runs now (they exited when it says 0)."""
    running: int = getattr(node.executors["command-line"], "running")  # noqa: B009
    return running


async def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_kill_through_one_node_stops_the_work_another_node_runs(nodes: Any) -> None:
    # Each node runs two of the four long sleeps. The kill reaches node a's API
    # only: node b learns it from the store when it renews its leases (every
    # lease_s / 3) and stops its own processes; they would otherwise run on, for
    # nothing, holding b's slots.
    node_a = await nodes("a", lease_s=3.0)
    node_b = await nodes("b", lease_s=3.0)
    workflow = await node_a.workflows.submit(sleeps(4, 600, "cross-kill"), owner="alice")

    async def both_run() -> bool:
        return await _running(node_a) == 2 and await _running(node_b) == 2

    await _until(both_run, 30, "the four sleeps never ran two on each node")
    await node_a.workflows.kill(workflow.id)

    async def all_stopped() -> bool:
        return await _running(node_a) == 0 and await _running(node_b) == 0

    # A renewal (1 s) plus the kill's grace, with room for a loaded machine.
    await _until(all_stopped, 20, "node b's processes outlived the kill")
    actions = await node_b.store.list_actions(workflow.id)
    assert {a.state for a in actions} == {A.KILLED}
    assert {node_of(a) for a in actions if a.external_id} == {"a", "b"}


async def test_a_node_stops_an_attempt_taken_over_after_its_lease_lapsed(
    nodes: Any,
) -> None:
    # Node a runs a long action; the store then says another attempt took it over
    # (what the reaper and another node do once a's lease lapsed). Node a's next
    # renewal must stop its stale process: two attempts would otherwise both run.
    node_a = await nodes("a", lease_s=3.0)
    workflow = await node_a.workflows.submit(sleeps(1, 600, "taken-over"), owner="alice")

    async def runs() -> bool:
        return await _running(node_a) == 1

    await _until(runs, 30, "the sleep never ran")
    action = await node_a.store.get_action(workflow.id, 1)
    assert action is not None and action.owner == "a"
    # The end state of a takeover, written directly: node z submitted the next attempt.
    taken = await node_a.store.transition_action(
        workflow.id,
        1,
        {A.SUBMITTED, A.RUNNING},
        A.SUBMITTED,
        protocol.ActionChanges(owner="z", attempts=action.attempts + 1),
    )
    assert taken is not None

    async def stopped() -> bool:
        return await _running(node_a) == 0

    await _until(stopped, 20, "node a's stale attempt outlived the takeover")
    current = await node_a.store.get_action(workflow.id, 1)
    # The stale attempt's report changed nothing: the record is the takeover's.
    assert current is not None and current.owner == "z" and current.state is A.SUBMITTED
    assert current.attempts == action.attempts + 1
    await node_a.workflows.kill(workflow.id)


async def test_a_kill_through_another_node_kills_the_yarn_application(
    nodes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Node b runs the `hadoop` client (the stand-in, which hangs after printing its
    # YARN application id); node a has no MapReduce executor and takes the kill.
    # Only b has the client's log, so only b can name the application to kill.
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HADOOP_STANDIN_MODE", "hang")
    monkeypatch.setenv("HADOOP_STANDIN_RECORD", str(tmp_path / "hadoop.jsonl"))
    yarn_record = tmp_path / "yarn.jsonl"
    monkeypatch.setenv("YARN_STANDIN_RECORD", str(yarn_record))
    node_a = await nodes("a", executors={"command-line": local.create}, lease_s=3.0)
    # alice has no user record, so she is no admin: b must let cluster clients run for all.
    node_b = await nodes("b", lease_s=3.0, host_clients="everyone")
    job = {"id": 1, "name": "job", "type": "mapreduce-v2", "jar": "/opt/j.jar"}
    job["arguments"] = ["{output}"]
    document = {"name": "mr", "startActionId": 1, "endActionId": 1, "actions": [job]}
    workflow = await node_a.workflows.submit(document, owner="alice")

    async def application() -> str | None:
        action = await node_b.store.get_action(workflow.id, 1)
        if action is None or action.attempts < 1:
            return None
        log = base.log_path(node_b.settings.home, workflow.id, 1, action.attempts)
        jobs = await asyncio.to_thread(cluster.scan_log, log)
        return jobs.application_ids[0] if jobs.application_ids else None

    async def submitted() -> bool:
        return await application() is not None

    await _until(submitted, 30, "the hadoop client never submitted its job")
    app = await application()
    await node_a.workflows.kill(workflow.id)

    def killed() -> list[Any]:
        if not yarn_record.exists():
            return []
        return [json.loads(line)["argv"] for line in yarn_record.read_text().splitlines()]

    async def yarn_killed() -> bool:
        return bool(await asyncio.to_thread(killed))

    await _until(yarn_killed, 20, "nobody killed the YARN application")
    await asyncio.sleep(1.5)  # a later renewal must not kill it again
    assert await asyncio.to_thread(killed) == [["application", "-kill", app]]
    action = await node_a.store.get_action(workflow.id, 1)
    assert action is not None and action.state is A.KILLED and node_of(action) == "b"

"""Exactly once across nodes: three real `pingo server` processes share one store and
one per-second schedule while nodes are killed with SIGKILL (all of them, for a while).

Afterwards every tick of the window has exactly one run, and each run's workflow
is the only workflow made for that tick (its argv carries the tick): no tick was
lost while nodes died between claiming and submitting, none was doubled when a
live node took a dead node's claim over, and the ticks missed while every node
was down were caught up (catch-up `all`), or all but the latest recorded as skipped
(catch-up `latest`): `latest` on SQLite and, slow-marked, `all` on the MongoDB wire
server.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pingo import testing
from pingo.outcomes.service import UNWRITTEN_ERROR
from tests.conftest import server_environ
from tests.integration.test_crash import Server, free_port

pytestmark = pytest.mark.timeout(240)

TOKEN = "schedule-nodes-admin-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
NODES = 3
#: SIGKILLs the test sends: a node dies mid-write at most once each.
KILLS = 4
#: The planning deadline on MongoDB: far above a one-action planning, even under load.
PLAN_DEADLINE_S = 10


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'pingo.db'}"
        return
    external = os.environ.get("PINGO_TEST_MONGODB_URI")
    if external:
        from tests.contract.conftest import with_database

        yield with_database(external, f"pingo_nodes_{os.getpid()}")
        return
    with testing.wire_server(tmp_path / "wire") as server:
        yield server.url.rstrip("/") + "/pingo_nodes"


@pytest.fixture
def servers(tmp_path: Path, store_url: str) -> Iterator[list[Server]]:
    nodes = []
    for i in range(NODES):
        env = server_environ()
        env.update(
            {
                "PINGO_HOME": str(tmp_path / "home"),
                "PINGO_STORE_URL": store_url,
                "PINGO_HOST": "127.0.0.1",
                "PINGO_PORT": str(free_port()),
                "PINGO_ADMIN_TOKEN": TOKEN,
                "PINGO_NODE_ID": f"node-{i}",
                "PINGO_SCHEDULE_LEASE_S": "1.5",
                "PINGO_SCHEDULE_INTERVAL_S": "0.1",
                "PINGO_POLL_INTERVAL_S": "0.2",
                "PINGO_LOCAL_SLOTS": "2",
                "PINGO_LOG_LEVEL": "INFO",
            }
        )
        if store_url.startswith("mongodb"):
            # So that the reaper fails a workflow a killed node left half-written (MongoDB
            # writes a plan in steps) within the test: a lease past the planning deadline.
            env.update({"PINGO_PLAN_DEADLINE_S": str(PLAN_DEADLINE_S), "PINGO_LEASE_S": "2"})
        nodes.append(Server(env, tmp_path / f"node-{i}.log"))
    yield nodes
    for node in nodes:
        node.ensure_stopped()


def url(server: Server) -> str:
    return f"http://127.0.0.1:{server.env['PINGO_PORT']}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=HEADERS) as session:
        yield session


async def wait_ready(http: aiohttp.ClientSession, server: Server, timeout_s: float = 180) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            async with http.get(url(server) + "/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        assert loop.time() < deadline, server.log()
        await asyncio.sleep(0.1)


def kill(server: Server) -> None:
    server.signal(signal.SIGKILL)
    server.wait(10)


def parse(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


async def get(http: aiohttp.ClientSession, server: Server, path: str) -> Any:
    async with http.get(url(server) + path) as response:
        assert response.status == 200, await response.text()
        return await response.json()


# Each catch-up policy on one store: the policies are the scheduler's, the same on every
# store (tests/unit/test_schedules.py), and the crash windows are the store's, the same
# under either policy; the full cross product cost a minute more of the suite.
@pytest.mark.parametrize(
    ("store_url", "catch_up"),
    [("sqlite", "latest"), pytest.param("wire", "all", marks=pytest.mark.slow)],
    indirect=["store_url"],
)
async def test_each_tick_runs_exactly_once_while_nodes_are_killed(
    servers: list[Server], http: aiohttp.ClientSession, catch_up: str, store_url: str
) -> None:
    a, b, c = servers
    for server in servers:
        server.start()
    for server in servers:
        await wait_ready(http, server)
    workflow = {
        "name": "every-second",
        "startActionId": 1,
        "endActionId": 1,
        "actions": [
            {
                "id": 1,
                "name": "stamp",
                "type": "command-line",
                "command": ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"],
            }
        ],
    }
    body = {
        "name": "nodes",
        "cron": "* * * * * *",
        "timezone": "UTC",
        "workflow": workflow,
        "catchUp": catch_up,
        "catchUpLimit": 1000,
    }
    async with http.post(url(a) + "/api/v1/schedules", json=body) as response:
        assert response.status == 201, await response.text()
        created = await response.json()
    sid = created["id"]
    first = parse(created["nextFireAt"])

    await asyncio.sleep(3)
    kill(a)
    await asyncio.sleep(2)
    kill(b)  # only c is left
    await asyncio.sleep(2)
    a.start()
    await asyncio.sleep(2)
    kill(c)
    kill(a)  # nobody is left: these ticks wait for catch-up
    await asyncio.sleep(2.5)
    b.start()
    c.start()
    await wait_ready(http, b)
    await asyncio.sleep(4)

    async with http.post(url(b) + f"/api/v1/schedules/{sid}/pause") as response:
        assert response.status == 200
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (await get(http, b, f"/api/v1/schedules/{sid}"))["pendingTickAt"] is not None:
        assert loop.time() < deadline, b.log()
        await asyncio.sleep(0.1)

    runs = (await get(http, b, f"/api/v1/schedules/{sid}/runs?limit=1000"))["items"]
    ticks = sorted(parse(r["tickAt"]) for r in runs)
    last = ticks[-1]
    expected = []
    tick = first
    while tick <= last:
        expected.append(tick)
        tick += timedelta(seconds=1)
    assert ticks == expected, "a tick is missing or recorded twice"
    assert len(expected) >= 15
    submitted = [r for r in runs if r["outcome"] == "submitted"]
    if catch_up == "all":
        assert submitted == runs, runs
        # The ticks due while every node was down were caught up late, not dropped.
        late = [
            r for r in runs if parse(r["recordedAt"]) - parse(r["tickAt"]) > timedelta(seconds=2)
        ]
        assert len(late) >= 2, runs
    else:
        # Of the ticks due while every node was down, only the latest ran: the others
        # are recorded as skipped by the policy, with no workflow.
        skipped = [r for r in runs if r["outcome"] == "skipped"]
        assert len(skipped) >= 2, runs
        assert {(r["reason"], r["workflowId"]) for r in skipped} == {("catch-up latest", None)}
        assert len(submitted) + len(skipped) == len(runs), runs

    # One workflow per run, and it is that tick's: no tick doubled under another id.
    listed = (await get(http, b, "/api/v1/workflows?name=every-second&limit=1000"))["items"]
    assert sorted(w["id"] for w in listed) == sorted(r["workflowId"] for r in submitted)
    half_written = []
    for run in submitted:
        path = f"/api/v1/workflows/{run['workflowId']}/actions/1"
        async with http.get(url(b) + path) as response:
            if response.status == 404 and store_url.startswith("mongodb"):
                # MongoDB's crash window (`MongoStore.persist_plan`, no transaction): a
                # node killed between a workflow's write and its actions' leaves that
                # workflow with no action at all, which the reaper fails (below).
                half_written.append(run["workflowId"])
                continue
            assert response.status == 200, await response.text()
            action = await response.json()
        stamped = parse(action["definition"]["command"][-1])
        assert stamped == parse(run["tickAt"])
    assert len(half_written) <= KILLS, half_written
    for workflow_id in half_written:
        ended = await wait_ended(http, b, workflow_id, timeout_s=PLAN_DEADLINE_S + 60)
        assert (ended["state"], ended["error"], ended["actions"]) == (
            "FAILED",
            UNWRITTEN_ERROR,
            [],
        ), ended


async def wait_ended(
    http: aiohttp.ClientSession, server: Server, workflow_id: str, timeout_s: float
) -> Any:
    """The workflow's document once it is no longer RUNNING."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (workflow := await get(http, server, f"/api/v1/workflows/{workflow_id}"))[
        "state"
    ] == "RUNNING":
        assert loop.time() < deadline, server.log()
        await asyncio.sleep(0.5)
    return workflow

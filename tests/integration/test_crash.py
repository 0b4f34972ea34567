"""Crash safety: a `pingo server` killed with SIGKILL and restarted finishes its workflow.

Every action that had FINISHED before the crash never runs again; at most the
actions that were running at the crash run twice. The node is a real process
on a real SQLite file; the test submits through the same file, as a second
Pingo process on the machine would.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pingo import states
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.store import open_store, protocol
from pingo.workflows.planner import WorkflowManager
from tests.conftest import server_environ

A = states.ActionState
W = states.WorkflowState


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """`pingo server` as a subprocess, its output in a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, argv: list[str] | None = None) -> None:
        self.env = env
        self.log_path = log_path
        self.argv = argv or [str(Path(sys.executable).parent / "pingo"), "server"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-6000:]

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def server_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    env = server_environ()
    env.update(
        {
            "PINGO_HOME": str(home),
            "PINGO_STORE_URL": f"sqlite:///{tmp_path / 'pingo.db'}",
            "PINGO_HOST": "127.0.0.1",
            "PINGO_PORT": str(free_port()),
            "PINGO_ADMIN_TOKEN": "crash-test-admin-token",
            "PINGO_LEASE_S": "2",
            "PINGO_RECONCILE_GRACE_S": "0.5",
            "PINGO_POLL_INTERVAL_S": "0.1",
            "PINGO_LOCAL_SLOTS": "3",
            "PINGO_RETRY_BACKOFF_S": "0.1",
            "PINGO_LOG_LEVEL": "INFO",
        }
    )
    return env


@pytest.fixture
def server(server_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    srv = Server(server_env, tmp_path / "server.log")
    yield srv
    srv.ensure_stopped()


def slow_workflow(layers: int = 4, width: int = 3) -> dict[str, Any]:
    """Layers of actions, each depending on every action of the layer above."""
    actions = []
    for layer in range(layers):
        for i in range(width):
            aid = layer * width + i + 1
            action: dict[str, Any] = {
                "id": aid,
                "name": f"l{layer}-{i}",
                "type": "command-line",
                # The run is counted (in its attempt's log) when it starts: a run cut
                # short still counts.
                "command": [
                    "sh",
                    "-c",
                    f'echo run {aid}; sleep 0.6; echo {aid} > "$PINGO_OUTPUT"',
                ],
            }
            if layer:
                action["parentActions"] = [
                    {"id": (layer - 1) * width + j + 1} for j in range(width)
                ]
            actions.append(action)
    return {
        "name": "slow",
        "startActionId": 1,
        "endActionId": len(actions),
        "actions": actions,
    }


def runs(home: Path) -> collections.Counter[int]:
    """How often each action id ran, from the `run <id>` lines of the attempt logs."""
    return collections.Counter(
        int(line.split()[1])
        for log in (home / "logs").rglob("*.log")
        for line in log.read_text().splitlines()
        if line.startswith("run ")
    )


async def wait_for(
    store: protocol.Store, workflow_id: str, done: Any, timeout_s: float, server: Server
) -> list[protocol.ActionRecord]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        actions = await store.list_actions(workflow_id)
        if done(actions):
            return actions
        if loop.time() > deadline:
            pytest.fail(
                f"timed out: {collections.Counter(a.state for a in actions)}\n{server.log()}"
            )
        await asyncio.sleep(0.02)


async def test_sigkilled_node_restarts_and_finishes_its_workflow(
    server: Server, server_env: dict[str, str], tmp_path: Path
) -> None:
    settings = Settings(
        home=Path(server_env["PINGO_HOME"]), store_url=server_env["PINGO_STORE_URL"]
    )
    settings.home.mkdir(parents=True, exist_ok=True)
    async with open_store(settings.store_url) as store:
        server.start()
        manager = WorkflowManager(store, DatasetStorage(settings.data_root), settings)
        workflow = await manager.submit(slow_workflow(), owner="alice")

        # Crash once the first layer finished and the second is running.
        def mid_run(actions: list[protocol.ActionRecord]) -> bool:
            by_state = collections.Counter(a.state for a in actions)
            return by_state[A.FINISHED] >= 3 and by_state[A.SUBMITTED] + by_state[A.RUNNING] > 0

        snapshot = await wait_for(store, workflow.id, mid_run, 30, server)
        server.signal(signal.SIGKILL)
        assert server.wait(10) == -signal.SIGKILL
        finished_before = {a.action_id for a in snapshot if a.state is A.FINISHED}
        active_at_crash = {a.action_id for a in snapshot if a.state in states.ACTION_ACTIVE}

        server.start()
        await wait_for(
            store,
            workflow.id,
            lambda actions: all(a.state is A.FINISHED for a in actions),
            60,
            server,
        )
        record = await store.get_workflow(workflow.id)
        assert record is not None and record.state is W.SUCCEEDED, server.log()

    counts = runs(settings.home)
    assert set(counts) == set(range(1, 13))
    for action_id in finished_before:
        assert counts[action_id] == 1, (action_id, counts)
    twice = {action_id for action_id, n in counts.items() if n > 1}
    assert twice <= active_at_crash, (twice, active_at_crash)
    assert max(counts.values()) <= 2

    # A graceful stop after that: SIGTERM ends the server cleanly.
    server.signal(signal.SIGTERM)
    assert server.wait(30) == 0, server.log()


async def test_run_node_runs_the_engine_alone_until_sigterm(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    # `run_node` is the engine without HTTP: it must work and stop cleanly on SIGTERM.
    script = (
        "import asyncio, logging\n"
        "from pingo.config import Settings\n"
        "from pingo.node import run_node\n"
        "logging.basicConfig(level='INFO')\n"
        "asyncio.run(run_node(Settings.from_env()))\n"
    )
    node = Server(server_env, tmp_path / "node.log", [sys.executable, "-c", script])
    settings = Settings(
        home=Path(server_env["PINGO_HOME"]), store_url=server_env["PINGO_STORE_URL"]
    )
    settings.home.mkdir(parents=True, exist_ok=True)
    node.start()
    try:
        async with open_store(settings.store_url) as store:
            manager = WorkflowManager(store, DatasetStorage(settings.data_root), settings)
            workflow = await manager.submit(slow_workflow(layers=1), owner="alice")
            await wait_for(
                store,
                workflow.id,
                lambda actions: all(a.state is A.FINISHED for a in actions),
                30,
                node,
            )
        node.signal(signal.SIGTERM)
        assert node.wait(30) == 0, node.log()
    finally:
        node.ensure_stopped()
    assert runs(settings.home) == collections.Counter({1: 1, 2: 1, 3: 1})

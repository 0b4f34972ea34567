"""The HTTP API: submission latency, fully reused resubmission, and GET throughput.

submit_layered1000_ms       POST of layered-1000 (every action to compute) to its 201,
  (_p99_ms)                 over HTTP with the bearer token; p50 (and p99) of SUBMITS posts,
                            each with a fresh tag in every command so nothing is reused,
                            after one unmeasured warm-up POST;
                            the node's loops are not running, so the work a submission sets
                            in motion does not compete with the next POST measured
submit_montage_ms (_p99_ms) the same on the Montage workflow (1,738 actions)
resubmit_reused_ms          POST of a finished layered-1000 again, until SUCCEEDED (every
                            dataset reused, so the 201 already says SUCCEEDED; otherwise the
                            workflow is polled); median of RESUBMITS
get_workflow_rps            GET /api/v1/workflows/{id} of a finished 10-action workflow,
                            20 concurrent clients (one keep-alive connection each) in a
                            separate process for LOAD_S seconds: requests / second
get_layered1000_rps         the same for a SUCCEEDED layered-1000 workflow (1,000 actions;
                            its serialized document is cached once SUCCEEDED)

The server is `create_app` on embedded SQLite in a temporary directory, served by an
aiohttp AppRunner on a loopback port, with the no-op executor (this measures the API and
the control plane, not subprocesses). Request bodies are encoded before timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench import _workloads
from pingo.actions.executors import noop
from pingo.api.app import create_app
from pingo.config import Settings
from pingo.node import Node, freeze_startup_heap
from pingo.store import open_store

RUNS = 3
SUBMITS = 7
MONTAGE_SUBMITS = 3
RESUBMITS = 7
LOAD_CLIENTS = 20
LOAD_S = 3.0
TOKEN = "bench-api-token"

_LOAD_SCRIPT = r"""
import asyncio, sys, time
import aiohttp

async def main(url, token, clients, seconds):
    headers = {"Authorization": "Bearer " + token}
    counts = [0] * clients
    deadline = time.perf_counter() + seconds

    async def client(i):
        async with aiohttp.ClientSession(headers=headers) as session:
            while time.perf_counter() < deadline:
                async with session.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        raise SystemExit(f"HTTP {response.status}")
                counts[i] += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    print(sum(counts) / (time.perf_counter() - started))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


def _tagged(document: Mapping[str, Any], tag: str) -> dict[str, Any]:
    """The document with `tag` appended to every command: same shape, all-new provenance."""
    actions = [{**a, "command": [*a["command"], tag]} for a in document["actions"]]
    return {**document, "actions": actions}


def _body(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document).encode()


class _Bench:
    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def post(self, body: bytes) -> tuple[float, dict[str, Any]]:
        """Milliseconds from sending the POST to the 201 read, and the document."""
        started = time.perf_counter()
        async with self.session.post(
            f"{self.base_url}/api/v1/workflows", data=body, headers=self.headers
        ) as response:
            payload = await response.read()
            elapsed = (time.perf_counter() - started) * 1000
            if response.status != 201:
                raise RuntimeError(f"POST answered {response.status}: {payload[:300]!r}")
        document: dict[str, Any] = json.loads(payload)
        return elapsed, document

    async def wait(self, workflow_id: str, timeout_s: float = 300) -> dict[str, Any]:
        deadline = time.perf_counter() + timeout_s
        while True:
            async with self.session.get(
                f"{self.base_url}/api/v1/workflows/{workflow_id}", headers=self.headers
            ) as response:
                document: dict[str, Any] = await response.json()
            if document["state"] != "RUNNING":
                if document["state"] != "SUCCEEDED":
                    raise RuntimeError(f"workflow {workflow_id} ended {document['state']}")
                return document
            if time.perf_counter() > deadline:
                raise RuntimeError(f"workflow {workflow_id} still RUNNING")
            await asyncio.sleep(0.01)

    async def submit_ms(self, document: Mapping[str, Any], count: int, run: str) -> list[float]:
        bodies = [_body(_tagged(document, f"{run}-{i}")) for i in range(count)]
        samples = []
        for body in bodies:
            elapsed, created = await self.post(body)
            if created["state"] != "RUNNING" or any(a["reused"] for a in created["actions"]):
                raise RuntimeError("a fresh submission reused something")
            samples.append(elapsed)
        return samples

    async def resubmit_ms(self, document: Mapping[str, Any], count: int) -> tuple[list[float], str]:
        """Samples, and the id of one fully reused (SUCCEEDED) workflow."""
        body = _body(document)
        _, first = await self.post(body)
        await self.wait(first["id"])
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            _, again = await self.post(body)
            if again["state"] != "SUCCEEDED":
                await self.wait(again["id"])
            samples.append((time.perf_counter() - started) * 1000)
            if not all(a["reused"] for a in again["actions"]):
                raise RuntimeError("a resubmission computed something")
        return samples, str(again["id"])

    async def get_rps(self, workflow_id: str) -> float:
        url = f"{self.base_url}/api/v1/workflows/{workflow_id}"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _LOAD_SCRIPT, url, TOKEN, str(LOAD_CLIENTS), str(LOAD_S),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"load generator exited with {process.returncode}")
        return float(out.decode().strip())


class _Server:
    """create_app on a fresh SQLite store, served on a loopback port, with a no-op node."""

    def __init__(self, tmp: Path, *, run_node: bool) -> None:
        self.settings = Settings(
            home=tmp / "home",
            store_url=f"sqlite:///{tmp / 'pingo.db'}",
            admin_token=TOKEN,
            node_id="bench-api",
        )
        self.run_node = run_node
        self.stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> str:
        self.settings.home.mkdir(parents=True)
        store = await self.stack.enter_async_context(open_store(self.settings.store_url))
        node = Node(self.settings, store, executors={"command-line": noop.create})
        if self.run_node:
            await node.start()
            self.stack.push_async_callback(node.stop)
        runner = web.AppRunner(create_app(self.settings, node=node), access_log=None)
        await runner.setup()
        self.stack.push_async_callback(runner.cleanup)
        port = _workloads.free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        freeze_startup_heap()  # as `pingo server` does once started (pingo.node.running_node)
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()


async def _measure() -> dict[str, float]:
    layered = _workloads.layered_1000()
    montage = _workloads.montage()
    run = f"r{time.time_ns()}"
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="pingo-bench-api-") as tmp:
        # Submission latency: the node's loops are not running, so what a submission
        # sets in motion never competes with the next POST being measured.
        async with _Server(Path(tmp) / "submit", run_node=False) as url:
            async with aiohttp.ClientSession() as session:
                bench = _Bench(session, url)
                # One unmeasured POST first: validators compiled, caches and pools warm.
                await bench.submit_ms(layered, 1, f"{run}-warm")
                layered_ms = await bench.submit_ms(layered, SUBMITS, run)
                montage_ms = await bench.submit_ms(montage, MONTAGE_SUBMITS, run)
        figures["submit_layered1000_ms"] = statistics.median(layered_ms)
        figures["submit_layered1000_p99_ms"] = _workloads.percentile(layered_ms, 99)
        figures["submit_montage_ms"] = statistics.median(montage_ms)
        figures["submit_montage_p99_ms"] = _workloads.percentile(montage_ms, 99)
        # Reuse and reads: a running node finishes the workflows first.
        async with _Server(Path(tmp) / "serve", run_node=True) as url:
            async with aiohttp.ClientSession() as session:
                bench = _Bench(session, url)
                reused_ms, layered_id = await bench.resubmit_ms(
                    _tagged(layered, f"{run}-re"), RESUBMITS
                )
                _, small = await bench.post(_body(_tagged(_small(10), run)))
                await bench.wait(small["id"])
                figures["resubmit_reused_ms"] = statistics.median(reused_ms)
                figures["get_workflow_rps"] = await bench.get_rps(small["id"])
                figures["get_layered1000_rps"] = await bench.get_rps(layered_id)
    return figures


def _small(n: int) -> dict[str, Any]:
    """A chain of `n` actions."""
    actions: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        action: dict[str, Any] = {
            "id": i, "name": f"step{i}", "type": "command-line", "command": ["true", str(i)],
        }  # fmt: skip
        if i > 1:
            action["parentActions"] = [{"id": i - 1}]
        actions.append(action)
    return {"name": "small", "startActionId": 1, "endActionId": n, "actions": actions}


def measure() -> dict[str, float]:
    """ONE run of every figure above."""
    return asyncio.run(_measure())


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

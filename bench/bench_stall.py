"""One user's huge workflow must not stall the server for everyone else (issue 13).

loop_stall_max_ms      the largest gap between two `/healthz` answers while a 100,000-action
                       chained workflow is submitted and then killed (goal < 100 ms)
submit_100k_s          POST of that workflow to its 201, over HTTP
kill_100k_s            POST .../kill until the workflow reads KILLED
rss_mb_before_100k     VmRSS (MiB) of the server, idle, before the submission
rss_mb_after_100k      VmRSS once the workflow is KILLED and the server idled
rss_after_100k_ratio   the two divided (goal <= 1.10)
rss_mb_after_second_100k  VmRSS once the same workflow was submitted and killed a second
                       time (not polled): near the first, what stays is a high-water mark
                       the next big workflow reuses; above it, growth

The server is the real one (`pingo server` subprocess, embedded SQLite, free loopback
port; see bench_memory.Server). A poller, in a process of its own, asks `/healthz`
back to back on its own connection during the submission and the kill; a gap is the
time between two answers, so it includes the request's own round trip (about 1 ms on
loopback). Action i of the workflow is `["true"]` with parent i - 1; the kill comes as
soon as the 201 has.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import _workloads
from bench.bench_memory import API, Server, _wait_ready, rss_mb

#: One run submits and kills 100,000 actions: once is enough on a shared machine.
RUNS = 1
ACTIONS = 100_000
IDLE_S = 5.0
KILL_TIMEOUT_S = 600.0


def chained_workflow(n: int) -> bytes:
    """n `true` actions in a line, serialized once (the bench measures the server, not this)."""
    actions: list[dict[str, Any]] = [
        {"id": 1, "name": "a1", "type": "command-line", "command": ["true"]}
    ]
    actions += [
        {
            "id": i,
            "name": f"a{i}",
            "type": "command-line",
            "command": ["true"],
            "parentActions": [{"id": i - 1}],
        }
        for i in range(2, n + 1)
    ]
    document = {"name": "chain-100k", "startActionId": 1, "endActionId": n, "actions": actions}
    return json.dumps(document, separators=(",", ":")).encode()


class _Poller:
    """Back-to-back `/healthz` requests; remembers the largest gap between answers."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.max_gap_s = 0.0
        self.answers = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            last = time.perf_counter()
            while not self._stop.is_set():
                async with session.get(f"{self.url}/healthz") as response:
                    await response.read()
                now = time.perf_counter()
                self.max_gap_s = max(self.max_gap_s, now - last)
                self.answers += 1
                last = now

    def stop(self) -> None:
        self._stop.set()


def _poll_until_stopped(url: str, stop: Any, results: Any) -> None:
    """A `_Poller` in a process of its own (see `_PollerProcess`)."""

    async def main() -> None:
        poller = _Poller(url)
        task = asyncio.create_task(poller.run())
        # The stop event is a multiprocessing one: waited for in a thread.
        await asyncio.to_thread(stop.wait)
        poller.stop()
        await task
        results.put((poller.max_gap_s, poller.answers))

    asyncio.run(main())


class _PollerProcess:
    """The poller in its own process: the driver decodes 30 MB workflow documents, and
    doing that in the poller's event loop would count the driver's own pauses as the
    server's."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results: Any = context.Queue()
        self._process = context.Process(
            target=_poll_until_stopped, args=(url, self._stop, self._results), daemon=True
        )
        self.max_gap_s = 0.0
        self.answers = 0

    def start(self) -> None:
        self._process.start()

    def stop(self) -> None:
        self._stop.set()
        self.max_gap_s, self.answers = self._results.get(timeout=120)
        self._process.join(timeout=30)


async def _state(session: aiohttp.ClientSession, server: Server, workflow_id: str) -> str:
    async with session.get(f"{server.url}{API}/workflows/{workflow_id}") as response:
        response.raise_for_status()
        document: dict[str, Any] = await response.json()
    return str(document["state"])


async def _submit(session: aiohttp.ClientSession, server: Server, body: bytes) -> str:
    """POST the workflow; its id once the 201 has come."""
    async with session.post(f"{server.url}{API}/workflows", data=body) as response:
        text = await response.text()
        if response.status != 201:
            raise RuntimeError(f"submission: {response.status} {text[:500]}")
    return str(json.loads(text)["id"])


async def _kill(session: aiohttp.ClientSession, server: Server, workflow_id: str) -> None:
    """POST the kill, then poll until the workflow reads KILLED."""
    asked = time.perf_counter()
    async with session.post(f"{server.url}{API}/workflows/{workflow_id}/kill") as response:
        if response.status >= 300:
            raise RuntimeError(f"kill: {response.status} {(await response.text())[:500]}")
    while await _state(session, server, workflow_id) != "KILLED":
        server.check_alive()
        if time.perf_counter() - asked > KILL_TIMEOUT_S:
            raise TimeoutError(f"workflow not KILLED after {KILL_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.2)


async def _drive(server: Server, body: bytes) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=KILL_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        await _wait_ready(session, server)
        await asyncio.sleep(IDLE_S)
        before = rss_mb(server.pid)

        poller = _PollerProcess(server.url)
        poller.start()
        await asyncio.sleep(2.0)  # the process starts, then a few answers: the baseline gap
        started = time.perf_counter()
        workflow_id = await _submit(session, server, body)
        submitted = time.perf_counter()
        await _kill(session, server, workflow_id)
        killed = time.perf_counter()
        await asyncio.to_thread(poller.stop)

        await asyncio.sleep(IDLE_S)
        server.check_alive()
        after = rss_mb(server.pid)

        # The same again: is what stays a high-water mark, reused, or growth?
        workflow_id = await _submit(session, server, body)
        await _kill(session, server, workflow_id)
        await asyncio.sleep(IDLE_S)
        server.check_alive()
        after_second = rss_mb(server.pid)
    print(
        f"bench_stall: {poller.answers} /healthz answers; RSS {before:.1f} -> {after:.1f}"
        f" -> {after_second:.1f} MiB",
        file=sys.stderr,
    )
    return {
        "loop_stall_max_ms": poller.max_gap_s * 1000,
        "submit_100k_s": submitted - started,
        "kill_100k_s": killed - submitted,
        "rss_mb_before_100k": before,
        "rss_mb_after_100k": after,
        "rss_after_100k_ratio": after / before,
        "rss_mb_after_second_100k": after_second,
    }


def measure() -> dict[str, float]:
    """Stall, submission and kill times of a 100,000-action workflow, and RSS around it."""
    body = chained_workflow(ACTIONS)
    with tempfile.TemporaryDirectory(
        prefix="pingo-bench-stall-", dir=_workloads.scratch_dir()
    ) as tmp:
        server = Server(Path(tmp))
        server.start()
        try:
            return asyncio.run(_drive(server, body))
        finally:
            server.stop()


if __name__ == "__main__":
    print(measure())

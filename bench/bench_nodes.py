"""Several nodes on one store: does a second node add throughput, and how fast does it
find work another node made READY (issue 16)?

two_node_speedup            makespan of 40 independent `sleep 0.5` actions (plus one
                            `true` that ends the workflow) on ONE node with 2 local
                            slots, divided by the makespan of the same workflow on TWO
                            such nodes sharing one SQLite file. Submission → SUCCEEDED,
                            submitted through the first node (which is woken in-process;
                            the second finds the work on its own). 2.0 is the ceiling.
one_node_sleep40_s,         the two makespans behind that ratio
two_node_sleep40_s
cross_node_dispatch_p50_ms, READY on one node → started by another. The first node's 2
cross_node_dispatch_p99_ms  slots are taken by long `sleep`s, so it cannot claim; 100
                            one-action workflows (`true`) are submitted through it, one
                            at a time, each after the previous one started, with a random
                            gap of 0-250 ms (seed 1) so the second node's poll has
                            backed off by varying amounts. Origin: just before the
                            submit call (planning and the READY commit included); end:
                            the second node's executor `submit` returned (the process
                            runs). Percentiles over the 100 samples of one run.

idle_node_cpu_percent       CPU time (all threads) of this process while one node sits
                            idle on an empty SQLite store for 5 s, after 1 s to settle:
                            what the adaptive poll costs when there is nothing to do

…_wire                      the same makespans, speedup and dispatch on the MongoDB wire
                            server (nx-27017, a fresh database for each measurement; it
                            has no change streams, so nodes find each other's work by
                            the same adaptive poll)

Both nodes run in this process, each on its own store handle (its own SQLite
connection and writer thread): nothing in-process tells the second node about
the first one's writes, so it learns of them as a node on another machine does,
through the store (the scraper's adaptive poll on SQLite and on the wire
server). Real local processes; the sandbox as configured (`auto`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench import _workloads
from pingo import states, testing
from pingo.config import Settings
from pingo.node import Node
from pingo.store import open_store

A = states.ActionState

RUNS = 3
SLEEPS = 40
SLEEP_S = 0.5
SLOTS = 2
DISPATCH_SAMPLES = 100
DISPATCH_MAX_GAP_S = 0.25


def _settings(tmp: Path, name: str, store_url: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp / name,
        "store_url": store_url or f"sqlite:///{tmp / 'pingo.db'}",
        "data_root": str(tmp / "datasets"),
        "node_id": name,
        "local_slots": SLOTS,
        # The benchmark's own commands, on machines that run it as root too (docs/security.md).
        "root_actions": "everyone",
    }
    values.update(overrides)
    settings = Settings(**values)
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings


@contextlib.asynccontextmanager
async def _nodes(
    tmp: Path, count: int, store_url: str | None = None, **overrides: Any
) -> AsyncIterator[list[Node]]:
    async with contextlib.AsyncExitStack() as stack:
        nodes = []
        for i in range(count):
            settings = _settings(tmp, f"node-{i}", store_url, **overrides)
            store = await stack.enter_async_context(open_store(settings.store_url))
            node = Node(settings, store)
            await node.start()
            nodes.append(node)
        try:
            yield nodes
        finally:
            for node in reversed(nodes):
                await node.stop()


def sleeps(count: int, seconds: float, tag: str) -> dict[str, Any]:
    """`count` independent sleeps (distinct per `tag`, so nothing is reused) and an end."""
    actions: list[dict[str, Any]] = [
        {
            "id": i,
            "name": f"sleep-{i}",
            "type": "command-line",
            "command": ["sh", "-c", f'sleep {seconds}; echo {tag} {i} > "$PINGO_OUTPUT"'],
        }
        for i in range(1, count + 1)
    ]
    actions.append(
        {
            "id": count + 1,
            "name": "end",
            "type": "command-line",
            "parentActions": [{"id": i} for i in range(1, count + 1)],
            "command": ["true", tag],
        }
    )
    return {"name": "sleeps", "startActionId": 1, "endActionId": count + 1, "actions": actions}


async def _sleep_makespan_s(node_count: int, store_url: str | None = None) -> float:
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        async with _nodes(Path(tmp), node_count, store_url) as nodes:
            started = time.perf_counter()
            workflow = await nodes[0].workflows.submit(
                sleeps(SLEEPS, SLEEP_S, f"{node_count}-{time.time_ns()}"), owner="bench"
            )
            done = await nodes[0].wait_workflow(workflow.id, timeout_s=300, max_poll_s=0.02)
            elapsed = time.perf_counter() - started
    if done.state.value != "SUCCEEDED":
        raise RuntimeError(f"workflow ended {done.state.value}: {done.error}")
    return elapsed


async def _cross_node_dispatch_ms(store_url: str | None = None) -> list[float]:
    samples: list[float] = []
    started = asyncio.Event()

    def observed(_: float) -> None:
        started.set()

    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        async with _nodes(Path(tmp), 1, store_url) as (busy,):
            blockers = await busy.workflows.submit(sleeps(SLOTS, 600, "blocker"), owner="bench")
            await _until_running(busy, blockers.id)
            settings = _settings(Path(tmp), "idle", store_url)
            async with open_store(settings.store_url) as store:
                idle = Node(settings, store, observe_dispatch=observed)
                await idle.start()
                try:
                    await asyncio.sleep(0.5)  # idle: its poll has backed off
                    for n in range(DISPATCH_SAMPLES):
                        await asyncio.sleep(rng.uniform(0, DISPATCH_MAX_GAP_S))
                        started.clear()
                        t0 = time.perf_counter()
                        await busy.workflows.submit(_one(n), owner="bench")
                        await asyncio.wait_for(started.wait(), timeout=30)
                        samples.append((time.perf_counter() - t0) * 1000)
                finally:
                    await idle.stop()
            await busy.workflows.kill(blockers.id)
    return samples


async def _until_running(node: Node, workflow_id: str) -> None:
    """Until all of `node`'s slots run `workflow_id`'s blockers."""
    for _ in range(3000):
        counts = await node.store.count_actions(workflow_id)
        if counts.get(A.SUBMITTED, 0) + counts.get(A.RUNNING, 0) >= SLOTS:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the blockers never ran")


def _one(n: int) -> dict[str, Any]:
    action = {"id": 1, "name": "one", "type": "command-line", "command": ["true", str(n)]}
    return {"name": f"one-{n}", "startActionId": 1, "endActionId": 1, "actions": [action]}


IDLE_S = 5.0


async def _idle_cpu_percent() -> float:
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        async with _nodes(Path(tmp), 1):
            await asyncio.sleep(1.0)
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(IDLE_S)
            return 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)


async def _store_figures(suffix: str, url: Any) -> dict[str, float]:
    """The makespans, speedup and dispatch on one kind of store; `url(name)` is a fresh one."""
    one_s = await _sleep_makespan_s(1, url("one"))
    two_s = await _sleep_makespan_s(2, url("two"))
    print(f"# {suffix or 'sqlite'}: one node {one_s:.2f} s, two {two_s:.2f} s", file=sys.stderr)
    dispatch = await _cross_node_dispatch_ms(url("dispatch"))
    return {
        f"one_node_sleep40{suffix}_s": one_s,
        f"two_node_sleep40{suffix}_s": two_s,
        f"two_node_speedup{suffix}": one_s / two_s,
        f"cross_node_dispatch_p50_ms{suffix}": _workloads.percentile(dispatch, 50),
        f"cross_node_dispatch_p99_ms{suffix}": _workloads.percentile(dispatch, 99),
    }


async def _measure() -> dict[str, float]:
    figures = await _store_figures("", lambda _: None)
    figures["idle_node_cpu_percent"] = await _idle_cpu_percent()
    with tempfile.TemporaryDirectory(prefix="pingo-bench-wire-") as tmp:
        with testing.wire_server(Path(tmp)) as server:
            base = server.url.rstrip("/")
            stamp = time.time_ns()
            figures.update(
                await _store_figures("_wire", lambda name: f"{base}/bench_{name}_{stamp}")
            )
    return figures


def measure() -> dict[str, float]:
    """ONE run of every figure of this module."""
    logging.getLogger("pingo").setLevel(logging.WARNING)
    return asyncio.run(_measure())


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:32} {value:10.3f}")

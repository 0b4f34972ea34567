"""The engine: control-plane throughput, dispatch latency, and real-process makespan.

noop_actions_per_s          layered-1000 on a node whose executor is the no-op one
                            (embedded SQLite in a temporary directory): actions /
                            (submission → workflow SUCCEEDED)
noop_montage_actions_per_s  the same on the Montage trace workflow (1,738 actions)
noop_cpu_ms_per_action,     CPU time of the whole process (every thread: event loop,
noop_montage_cpu_ms_per_action
                            SQLite worker, file threads) per action over the same
                            runs: the control plane's cost, steadier than a rate on a
                            machine shared with other work
noop_store_calls_per_action,
noop_montage_store_calls_per_action
                            calls the SQLite store ran per action over the same runs
                            (hops to its worker thread: reads, writes, claims; a
                            group-committed batch counts each call): independent of load
dispatch_p50_ms, _p99_ms    READY → executor start with 100 workflows in flight: 100
                            chains of 5 actions, submitted 5 ms apart, each action
                            "running" 0.5 s in a delayed no-op executor (as a cluster
                            job would), so READY events arrive spread out (~200/s), as
                            in production, and what is measured is the control plane:
                            wake → claim → PROCESSING → SUBMITTED → executor.submit.
                            Origin: the scraper's wake after the READY write (see
                            pingo/actions/scraper.py); end: `submit` returned.
true_makespan_s             layered-1000 running the real command `true` on 2 local
                            slots, submission → SUCCEEDED, with the sandbox on (as users
                            run it)
true_makespan_bare_s        the same with the sandbox off (`PINGO_SANDBOX=off`): like
                            for like with Luigi, which runs `true` bare
true_cpu_ms_per_action,     the server process's CPU time (every thread, kernel time
true_bare_cpu_ms_per_action included; not the spawned processes') per action over those
                            two runs: on 2 cores the sandboxed spawns alone keep about
                            1.5 busy, so each millisecond here lengthens the makespan
                            (bench/README.md, "Issue 15, fourteenth pass")
sandbox_spawn_overhead_ms   median time of one `true` run in the local executor's
                            sandbox (the same bwrap command line) minus the median of
                            plain `true`, spawned one at a time, alternating, in one run
spawn_floor_s               1,000 `true` processes spawned 2 at a time by a plain
                            Python loop (a new one as soon as one of the two exits),
                            each through `$PINGO_BENCH_SPAWN_PREFIX` when set (the
                            argv the local executor wraps every action in, e.g. its
                            sandbox), so the floor costs what Pingo's spawns must
spawn_floor_prefixed        1 when that prefix was set, else 0 (so a reader knows
                            which floor the figures were held against)
spawn_floor_sandboxed_s     the same loop with every `true` under the local executor's
                            own bubblewrap command line (what `true_makespan_s` spawns);
                            left out where the sandbox cannot run

Every part runs its own node on a fresh SQLite file, so no dataset is reused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import _workloads
from pingo.actions.executors import base, noop, sandbox
from pingo.config import Settings
from pingo.node import Node, freeze_startup_heap
from pingo.store import open_store

RUNS = 3
#: Dispatch workload: workflows in flight, actions per chain, simulated runtime.
DISPATCH_WORKFLOWS = 100
DISPATCH_CHAIN = 5
DISPATCH_RUNTIME_S = 0.5
DISPATCH_SPACING_S = 0.005
SPAWN_COUNT = 1000
SPAWN_PARALLEL = 2
#: Spawns of each kind (plain, sandboxed) behind sandbox_spawn_overhead_ms.
SANDBOX_SPAWNS = 200
#: What every spawned `true` of the floor runs under: the same wrapper (a sandbox) the
#: local executor puts around each action, or nothing. Shell words.
SPAWN_PREFIX_ENV = "PINGO_BENCH_SPAWN_PREFIX"


def _settings(tmp: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp / "home",
        "store_url": f"sqlite:///{tmp / 'pingo.db'}",
        "node_id": "bench",
        # The benchmark's own commands, on machines that run it as root too (docs/security.md).
        "root_actions": "everyone",
    }
    values.update(overrides)
    return Settings(**values)


async def _makespan(
    document: Mapping[str, Any],
    *,
    executors: Mapping[str, base.ExecutorFactory] | None,
    **overrides: Any,
) -> float:
    """Seconds from submission to SUCCEEDED on a fresh node."""
    return (await _makespan_and_cpu(document, executors=executors, **overrides))[0]


async def _makespan_and_cpu(
    document: Mapping[str, Any],
    *,
    executors: Mapping[str, base.ExecutorFactory] | None,
    calls: list[int] | None = None,
    **overrides: Any,
) -> tuple[float, float]:
    """Seconds from submission to SUCCEEDED on a fresh node, and the process's CPU seconds.

    With `calls`, the number of calls the SQLite store ran in that window is appended.
    """
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        settings = _settings(Path(tmp), **overrides)
        settings.home.mkdir(parents=True)
        async with open_store(settings.store_url) as store:
            counted = [0]
            if calls is not None:
                _count_calls(store, counted)
            node = Node(settings, store, executors=executors)
            await node.start()
            freeze_startup_heap()  # as `pingo server` does (pingo.node.running_node)
            try:
                started = time.perf_counter()
                cpu_started = time.process_time()
                counted[0] = 0
                workflow = await node.workflows.submit(document, owner="bench")
                done = await node.wait_workflow(
                    workflow.id, timeout_s=300, poll_s=0.005, max_poll_s=0.02
                )
                elapsed = time.perf_counter() - started
                cpu_s = time.process_time() - cpu_started
                if calls is not None:
                    calls.append(counted[0])
            finally:
                await node.stop()
        if done.state.value != "SUCCEEDED":
            raise RuntimeError(f"workflow ended {done.state.value}: {done.error}")
        return elapsed, cpu_s


def _count_calls(store: Any, counted: list[int]) -> None:
    """Count every call `store` (SQLite) hands to its worker thread into `counted[0]`.

    The wrapper costs a few hundred nanoseconds per call, against ~100 µs per action.
    """
    submit = store._submit

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await submit(*args, **kwargs)

    store._submit = counting


def _chain(n: int, length: int) -> dict[str, Any]:
    """A chain of `length` no-op actions, distinct from every other chain by `n`."""
    actions: list[dict[str, Any]] = []
    for i in range(1, length + 1):
        action: dict[str, Any] = {
            "id": i,
            "name": f"c{n}-{i}",
            "type": "command-line",
            "command": ["true", str(n), str(i)],
        }
        if i > 1:
            action["parentActions"] = [{"id": i - 1}]
        actions.append(action)
    return {"name": f"chain-{n}", "startActionId": 1, "endActionId": length, "actions": actions}


def _delayed_noop(settings: Settings, reporter: base.Reporter) -> noop.NoopExecutor:
    return noop.NoopExecutor(reporter, delay_s=DISPATCH_RUNTIME_S)


async def _dispatch_ms() -> list[float]:
    samples: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        settings = _settings(Path(tmp))
        settings.home.mkdir(parents=True)
        async with open_store(settings.store_url) as store:
            node = Node(
                settings,
                store,
                executors={"command-line": _delayed_noop},
                observe_dispatch=lambda s: samples.append(s * 1000),
            )
            await node.start()
            try:
                ids = []
                for n in range(DISPATCH_WORKFLOWS):
                    workflow = await node.workflows.submit(_chain(n, DISPATCH_CHAIN), owner="bench")
                    ids.append(workflow.id)
                    await asyncio.sleep(DISPATCH_SPACING_S)
                for workflow_id in ids:
                    done = await node.wait_workflow(workflow_id, timeout_s=300)
                    if done.state.value != "SUCCEEDED":
                        raise RuntimeError(f"workflow ended {done.state.value}: {done.error}")
            finally:
                await node.stop()
    expected = DISPATCH_WORKFLOWS * DISPATCH_CHAIN
    if len(samples) != expected:
        raise RuntimeError(f"{len(samples)} dispatch samples, expected {expected}")
    return samples


def spawn_prefix() -> list[str]:
    """The argv every floor spawn is wrapped in (`$PINGO_BENCH_SPAWN_PREFIX`), or none."""
    return shlex.split(os.environ.get(SPAWN_PREFIX_ENV, ""))


def spawn_floor_s(
    count: int = SPAWN_COUNT, parallel: int = SPAWN_PARALLEL, prefix: Sequence[str] = ()
) -> float:
    """`count` `true` processes (each under `prefix`), `parallel` at a time, from a loop."""
    argv = [*prefix, "true"]
    started = time.perf_counter()
    running: dict[int, subprocess.Popen[bytes]] = {}
    spawned = 0
    while spawned < count or running:
        while len(running) < parallel and spawned < count:
            proc = subprocess.Popen(argv)
            running[proc.pid] = proc
            spawned += 1
        pid, status = os.wait()
        # Keep the Popen objects until reaped here: a collected one would be reaped
        # behind our back by subprocess's own cleanup.
        running.pop(pid).returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - started


def sandboxed_spawn_floor_s() -> float | None:
    """`spawn_floor_s` under the local executor's own bwrap command line; None without one."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        settings = _settings(Path(tmp), sandbox="auto")
        box = _runnable(sandbox.from_settings(settings))
        if box is None:
            return None
        output = f"{settings.data_root}/.staging/d.wf.1.1"
        os.makedirs(sandbox.box_for(output))
        prefix = box.argv([], output=output, box=sandbox.box_for(output), inputs=())
        return spawn_floor_s(prefix=prefix)


def _runnable(box: sandbox.Sandbox | None) -> sandbox.Sandbox | None:
    """`box` with its argv[0] the bwrap binary (the executor runs the binary under a tag)."""
    return None if box is None else dataclasses.replace(box, tag=box.bwrap)


def sandbox_spawn_overhead_ms(count: int = SANDBOX_SPAWNS) -> float:
    """Median extra milliseconds of a sandboxed `true` over a plain one (alternating)."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-") as tmp:
        settings = _settings(Path(tmp), sandbox="on")
        box = _runnable(sandbox.from_settings(settings))
        assert box is not None
        output = f"{settings.data_root}/.staging/d.wf.1.1"
        os.makedirs(sandbox.box_for(output))
        plain = ["/bin/true"]
        wrapped = box.argv(plain, output=output, box=sandbox.box_for(output), inputs=())
        env = sandbox.environment({})
        plain_ms: list[float] = []
        wrapped_ms: list[float] = []
        for _ in range(count):
            for argv, samples in ((plain, plain_ms), (wrapped, wrapped_ms)):
                started = time.perf_counter()
                subprocess.run(argv, env=env, check=True)
                samples.append((time.perf_counter() - started) * 1000)
    return _workloads.percentile(wrapped_ms, 50) - _workloads.percentile(plain_ms, 50)


def _log(what: str, since: float) -> None:
    print(f"# {what} done at {time.perf_counter() - since:.1f} s", file=sys.stderr)


async def _measure() -> dict[str, float]:
    noop_executors = {"command-line": noop.create}
    layered = _workloads.layered_1000()
    montage = _workloads.montage()
    t = time.perf_counter()
    calls: list[int] = []
    noop_s, noop_cpu_s = await _makespan_and_cpu(layered, executors=noop_executors, calls=calls)
    _log("noop layered-1000", t)
    montage_s, montage_cpu_s = await _makespan_and_cpu(
        montage, executors=noop_executors, calls=calls
    )
    _log("noop montage", t)
    dispatch = await _dispatch_ms()
    _log("dispatch", t)
    true_s, true_cpu_s = await _makespan_and_cpu(
        layered, executors=None, local_slots=2, sandbox="on"
    )
    _log("true layered-1000", t)
    bare_s, bare_cpu_s = await _makespan_and_cpu(
        layered, executors=None, local_slots=2, sandbox="off"
    )
    _log("true layered-1000, no sandbox", t)
    return {
        "noop_actions_per_s": len(layered["actions"]) / noop_s,
        "noop_montage_actions_per_s": len(montage["actions"]) / montage_s,
        "noop_cpu_ms_per_action": noop_cpu_s * 1000 / len(layered["actions"]),
        "noop_montage_cpu_ms_per_action": montage_cpu_s * 1000 / len(montage["actions"]),
        "noop_store_calls_per_action": calls[0] / len(layered["actions"]),
        "noop_montage_store_calls_per_action": calls[1] / len(montage["actions"]),
        "dispatch_p50_ms": _workloads.percentile(dispatch, 50),
        "dispatch_p99_ms": _workloads.percentile(dispatch, 99),
        "true_makespan_s": true_s,
        "true_makespan_bare_s": bare_s,
        "true_cpu_ms_per_action": true_cpu_s * 1000 / len(layered["actions"]),
        "true_bare_cpu_ms_per_action": bare_cpu_s * 1000 / len(layered["actions"]),
    }


def measure() -> dict[str, float]:
    """ONE run of every engine figure."""
    logging.getLogger("pingo").setLevel(logging.WARNING)
    figures = asyncio.run(_measure())
    prefix = spawn_prefix()
    figures["spawn_floor_s"] = spawn_floor_s(prefix=prefix)
    figures["spawn_floor_prefixed"] = 1.0 if prefix else 0.0
    sandboxed = sandboxed_spawn_floor_s()
    if sandboxed is not None:
        figures["spawn_floor_sandboxed_s"] = sandboxed
    figures["sandbox_spawn_overhead_ms"] = sandbox_spawn_overhead_ms()
    return figures


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:32} {value:10.3f}")

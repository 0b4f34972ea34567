"""In-flight deduplication: workflows needing the same datasets at once compute them once.

dedup_runs_per_dataset   4 workflows (2 owners, server scope) of the same 100 actions
                         (20 chains of 5) submitted back to back to one node on an
                         embedded SQLite file, each action "running" 0.1 s in a delayed
                         no-op executor: executor runs ÷ distinct datasets (1.0: each
                         computed once; 4.0 before in-flight deduplication)
dedup_makespan_s         the same: first submission → every workflow ended
dedup_shared_actions     actions of the 3 later workflows that ended shared (never ran);
                         the rest of their 300 were reused (planned after their
                         producer had finished)
attached_lookup_ms       what a producer's outcome now adds: one `list_attached_actions`
                         of a producer nothing shares with, on that SQLite file after
                         the run (median of 500)
dedup_together_runs_per_dataset
                         the same 4 workflows submitted at the same moment, alternately to
                         two nodes on one SQLite file (each its own store handle): every
                         planning reads the datasets absent, so only the store's creation
                         can tell the later plans to share (4.0 when it does not)
dedup_together_makespan_s
                         the same: first submission → every workflow ended
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pingo.actions.executors import base, noop
from pingo.config import Settings
from pingo.node import Node
from pingo.store import open_store

RUNS = 3
CHAINS = 20
LENGTH = 5
WORKFLOWS = 4
RUNTIME_S = 0.1
LOOKUPS = 500


def _document() -> dict[str, Any]:
    """`CHAINS` independent chains of `LENGTH` actions, in one workflow."""
    actions: list[dict[str, Any]] = []
    for chain in range(CHAINS):
        for step in range(LENGTH):
            aid = chain * LENGTH + step + 1
            action: dict[str, Any] = {
                "id": aid,
                "name": f"c{chain}-{step}",
                "type": "command-line",
                "command": ["true", str(chain), str(step)],
            }
            if step:
                action["parentActions"] = [{"id": aid - 1}]
            actions.append(action)
    return {"name": "dedup", "startActionId": 1, "endActionId": len(actions), "actions": actions}


def _delayed_executors(
    made: list[noop.NoopExecutor],
) -> Callable[[Settings, base.Reporter], noop.NoopExecutor]:
    """An executor factory whose no-op executors take `RUNTIME_S` and are kept in `made`
    (their `submitted` counts are the runs)."""

    def delayed(settings: Settings, reporter: base.Reporter) -> noop.NoopExecutor:
        executor = noop.NoopExecutor(reporter, delay_s=RUNTIME_S)
        made.append(executor)
        return executor

    return delayed


async def _run(tmp: Path) -> dict[str, float]:
    settings = Settings(
        home=tmp / "home", store_url=f"sqlite:///{tmp / 'pingo.db'}", node_id="bench"
    )
    settings.home.mkdir(parents=True)
    executors: list[noop.NoopExecutor] = []
    delayed = _delayed_executors(executors)

    document = _document()
    async with open_store(settings.store_url) as store:
        node = Node(settings, store, executors={"command-line": delayed})
        await node.start()
        try:
            started = time.perf_counter()
            ids = [
                (await node.workflows.submit(document, owner=("ann", "bob")[i % 2])).id
                for i in range(WORKFLOWS)
            ]
            for workflow_id in ids:
                done = await node.wait_workflow(workflow_id, timeout_s=300, poll_s=0.01)
                if done.state.value != "SUCCEEDED":
                    raise RuntimeError(f"workflow ended {done.state.value}: {done.error}")
            makespan = time.perf_counter() - started
            shared = 0
            for workflow_id in ids[1:]:
                shared += sum(
                    1
                    for a in await store.list_actions(workflow_id)
                    if a.shared_with is not None and a.attempts == 0
                )
            lookups = []
            for _ in range(LOOKUPS):
                t0 = time.perf_counter()
                await store.list_attached_actions(ids[-1], 1)
                lookups.append((time.perf_counter() - t0) * 1000)
        finally:
            await node.stop()
    runs = sum(e.submitted for e in executors)
    lookups.sort()
    return {
        "dedup_runs_per_dataset": runs / (CHAINS * LENGTH),
        "dedup_makespan_s": makespan,
        "dedup_shared_actions": float(shared),
        "attached_lookup_ms": lookups[len(lookups) // 2],
    }


async def _together(tmp: Path) -> dict[str, float]:
    """The workflows submitted at once, alternately to two nodes sharing one SQLite file."""
    store_url = f"sqlite:///{tmp / 'together.db'}"
    executors: list[noop.NoopExecutor] = []
    delayed = _delayed_executors(executors)

    document = _document()
    nodes: list[Node] = []
    async with open_store(store_url) as one, open_store(store_url) as other:
        for name, store in (("a", one), ("b", other)):
            settings = Settings(home=tmp / name, store_url=store_url, node_id=name)
            settings.home.mkdir(parents=True)
            nodes.append(Node(settings, store, executors={"command-line": delayed}))
        for node in nodes:
            await node.start()
        try:
            started = time.perf_counter()
            records = await asyncio.gather(
                *(
                    nodes[i % 2].workflows.submit(document, owner=("ann", "bob")[i % 2])
                    for i in range(WORKFLOWS)
                )
            )
            for record in records:
                done = await nodes[0].wait_workflow(record.id, timeout_s=300, poll_s=0.01)
                if done.state.value != "SUCCEEDED":
                    raise RuntimeError(f"workflow ended {done.state.value}: {done.error}")
            makespan = time.perf_counter() - started
        finally:
            for node in reversed(nodes):
                await node.stop()
    runs = sum(e.submitted for e in executors)
    return {
        "dedup_together_runs_per_dataset": runs / (CHAINS * LENGTH),
        "dedup_together_makespan_s": makespan,
    }


def measure() -> dict[str, float]:
    """One run of every figure."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-dedup-") as tmp:
        figures = asyncio.run(_run(Path(tmp)))
        figures.update(asyncio.run(_together(Path(tmp))))
        return figures


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

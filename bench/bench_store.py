"""Store throughput: compare-and-set transitions and claims, per backend.

sqlite_cas_per_s          transition_action calls/s on one SQLite file, 16 coroutines of one
                          process each moving its own actions READY ⇄ PROCESSING (every call a
                          real CAS on state and a commit), synchronous=NORMAL
sqlite_cas_per_cpu_s      the same CAS count per CPU second used by the process (both
                          threads): what the rate would be with a core to itself, which a
                          machine shared with other work does not give (compare the two)
sqlite_cas_serial_per_s   the same, one call at a time (each awaited before the next)
sqlite_claims_per_s       actions claimed/s by claim_actions(limit=10) in one process
sqlite_3proc_claims_per_s actions claimed/s by 3 processes sharing one file (spawned, each
                          opening the store by URL, claiming limit=10 until none is left;
                          wall time from the common start to the last process done)
sqlite_claims_capped_per_s
                          sqlite_claims_per_s with a per-user in-flight cap in force that
                          never binds (max_in_flight=10,000, every claimed action stays in
                          flight): the price of counting each owner's in-flight actions in
                          every claim, as the default settings do
sqlite_claim_past_backlog_ms
                          one claim_actions(limit=10) while one user is at an in-flight cap
                          of 10 with 20,000 older READY actions waiting and another user has
                          READY work: median ms of 10 such claims (the claim pages past the
                          full user's backlog)
memory_cas_per_s          the in-memory store's CAS rate (the simulator's store), for scale
wire_cas_per_s            the sqlite_cas_per_s workload against nx-27017 (a MongoDB wire
                          server on a free loopback port); `wire_claims_per_s`,
                          `wire_claims_capped_per_s` (1,000 actions) and
                          `wire_claim_past_backlog_ms` (a 2,000-action backlog) likewise

Every figure is ONE run; the harness repeats `measure()` and reports the median.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import tempfile
import time
from datetime import UTC, datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from pingo.states import ActionState, WorkflowState
from pingo.store import open_store
from pingo.store.protocol import (
    ActionChanges,
    ActionRecord,
    Store,
    WorkflowPlan,
    WorkflowRecord,
)

CAS_TASKS = 16
CAS_ACTIONS_PER_TASK = 40
CAS_ROUNDS = 16  # each round moves every action there and back: 2 CAS
SERIAL_CAS = 4_000
CLAIM_ACTIONS = 10_000
CLAIM_BATCH = 10
PROC_CLAIM_ACTIONS = 15_000
PROCESSES = 3
WIRE_CAS_ROUNDS = 2


def ready_plan(workflow_id: str, count: int, owner: str = "bench") -> WorkflowPlan:
    """A workflow of `count` independent READY actions with realistic definitions."""
    now = datetime.now(UTC)
    workflow = WorkflowRecord(
        id=workflow_id,
        name="bench",
        owner=owner,
        state=WorkflowState.RUNNING,
        document={"name": "bench"},
        scope="server",
        on_failure="abort",
        end_dataset_id=None,
        created_at=now,
    )
    actions = tuple(
        ActionRecord(
            workflow_id=workflow_id,
            action_id=i,
            name=f"action-{i}",
            type="command-line",
            state=ActionState.READY,
            dataset_id=f"{i:064x}",
            reused=False,
            reason="absent",
            definition={
                "id": i,
                "name": f"action-{i}",
                "type": "command-line",
                "command": ["python", "-c", "print('hello')", str(i)],
                "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                "metadata": {"owner": "bench", "tags": ["a", "b", "c"]},
            },
            inputs={},
            waiting_on=(),
            children=(),
            callback_id=f"{workflow_id}-cb-{i}",
            created_at=now,
            updated_at=now,
        )
        for i in range(count)
    )
    return WorkflowPlan(workflow, actions, ())


async def cas_rate(store: Store, rounds: int) -> float:
    """CAS calls per second with CAS_TASKS coroutines, each on its own actions."""
    return (await cas_rates(store, rounds))[0]


async def cas_rates(store: Store, rounds: int) -> tuple[float, float]:
    """CAS calls per wall second and per CPU second of this process (all its threads)."""
    count = CAS_TASKS * CAS_ACTIONS_PER_TASK
    await store.create_workflow(ready_plan("wf-cas", count))
    claim = ActionChanges(owner="bench-node")
    release = ActionChanges(owner=None)
    ready = {ActionState.READY}
    processing = {ActionState.PROCESSING}

    async def worker(task: int) -> int:
        ids = range(task * CAS_ACTIONS_PER_TASK, (task + 1) * CAS_ACTIONS_PER_TASK)
        done = 0
        for _ in range(rounds):
            for i in ids:
                moved = await store.transition_action(
                    "wf-cas", i, ready, ActionState.PROCESSING, claim
                )
                back = await store.transition_action(
                    "wf-cas", i, processing, ActionState.READY, release
                )
                assert moved is not None and back is not None
                done += 2
        return done

    start = time.perf_counter()
    cpu_start = time.process_time()
    total = sum(await asyncio.gather(*(worker(t) for t in range(CAS_TASKS))))
    cpu = time.process_time() - cpu_start
    return total / (time.perf_counter() - start), total / cpu


async def serial_cas_rate(store: Store) -> float:
    """CAS calls per second, one at a time."""
    await store.create_workflow(ready_plan("wf-serial", 1))
    states = [ActionState.READY, ActionState.PROCESSING]
    start = time.perf_counter()
    for n in range(SERIAL_CAS):
        moved = await store.transition_action("wf-serial", 0, {states[n % 2]}, states[(n + 1) % 2])
        assert moved is not None
    return SERIAL_CAS / (time.perf_counter() - start)


async def claim_rate(
    store: Store, count: int, max_in_flight: int | None = None, workflow_id: str = "wf-claim"
) -> float:
    """Actions claimed per second, CLAIM_BATCH at a time."""
    await store.create_workflow(ready_plan(workflow_id, count))
    claimed = 0
    start = time.perf_counter()
    while batch := await store.claim_actions(
        "bench-node", CLAIM_BATCH, lease_s=600, max_in_flight=max_in_flight
    ):
        claimed += len(batch)
    elapsed = time.perf_counter() - start
    assert claimed == count, claimed
    return claimed / elapsed


async def claim_past_backlog_ms(store: Store, backlog: int) -> float:
    """Median ms of a claim while a capped user's `backlog` of older READY actions waits."""
    cap = CLAIM_BATCH
    await store.create_workflow(ready_plan("wf-heavy", backlog + cap, owner="heavy"))
    first = await store.claim_actions("bench-node", cap, lease_s=600, max_in_flight=cap)
    assert len(first) == cap, len(first)  # heavy is now full, with `backlog` older READY
    await store.create_workflow(ready_plan("wf-light", 10 * cap, owner="light"))
    times = []
    for _ in range(10):
        start = time.perf_counter()
        batch = await store.claim_actions("bench-node", cap, lease_s=600, max_in_flight=cap)
        times.append((time.perf_counter() - start) * 1000)
        assert len(batch) == cap and all(a.workflow_id == "wf-light" for a in batch)
        # Light's work finishes at once, so light always has room again.
        for action in batch:
            await store.transition_action(
                *action.key, {ActionState.PROCESSING}, ActionState.FINISHED
            )
    return statistics.median(times)


async def _claimer(url: str, node_id: str, barrier: Barrier) -> tuple[int, float, float]:
    async with open_store(url) as store:
        barrier.wait(timeout=120)
        start = time.time()
        claimed = 0
        while batch := await store.claim_actions(node_id, CLAIM_BATCH, lease_s=600):
            claimed += len(batch)
        return claimed, start, time.time()


def claimer_process(url: str, node_id: str, barrier: Barrier, results: Queue[Any]) -> None:
    """One of the claiming processes (spawned)."""
    results.put(asyncio.run(_claimer(url, node_id, barrier)))


async def processes_claim_rate(url: str) -> float:
    """Actions claimed per second by PROCESSES processes sharing one store."""
    async with open_store(url) as store:
        await store.create_workflow(ready_plan("wf-procs", PROC_CLAIM_ACTIONS))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results: Queue[Any] = ctx.Queue()
    procs = [
        ctx.Process(target=claimer_process, args=(url, f"proc-{i}", barrier, results))
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    reports: list[tuple[int, float, float]] = [
        await asyncio.to_thread(results.get, True, 300) for _ in procs
    ]
    for proc in procs:
        proc.join(timeout=60)
    claimed = sum(r[0] for r in reports)
    assert claimed == PROC_CLAIM_ACTIONS, claimed
    start = min(r[1] for r in reports)
    end = max(r[2] for r in reports)
    return float(claimed / (end - start))


async def measure_sqlite(root: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    async with open_store(f"sqlite:///{root / 'cas.db'}") as store:
        wall, cpu = await cas_rates(store, CAS_ROUNDS)
        figures["sqlite_cas_per_s"] = wall
        figures["sqlite_cas_per_cpu_s"] = cpu
        figures["sqlite_cas_serial_per_s"] = await serial_cas_rate(store)
    async with open_store(f"sqlite:///{root / 'claims.db'}") as store:
        figures["sqlite_claims_per_s"] = await claim_rate(store, CLAIM_ACTIONS)
    async with open_store(f"sqlite:///{root / 'capped.db'}") as store:
        figures["sqlite_claims_capped_per_s"] = await claim_rate(
            store, CLAIM_ACTIONS, max_in_flight=CLAIM_ACTIONS
        )
    async with open_store(f"sqlite:///{root / 'backlog.db'}") as store:
        figures["sqlite_claim_past_backlog_ms"] = await claim_past_backlog_ms(store, 20_000)
    figures["sqlite_3proc_claims_per_s"] = await processes_claim_rate(
        f"sqlite:///{root / 'procs.db'}"
    )
    async with open_store("memory://") as store:
        figures["memory_cas_per_s"] = await cas_rate(store, CAS_ROUNDS)
    return figures


async def measure_wire(root: Path) -> dict[str, float]:
    from pingo import testing

    figures: dict[str, float] = {}
    with testing.wire_server(root / "wire") as server:
        async with open_store(f"{server.url}/bench_cas") as store:
            figures["wire_cas_per_s"] = await cas_rate(store, WIRE_CAS_ROUNDS)
        async with open_store(f"{server.url}/bench_claims") as store:
            figures["wire_claims_per_s"] = await claim_rate(store, 1_000)
        async with open_store(f"{server.url}/bench_capped") as store:
            figures["wire_claims_capped_per_s"] = await claim_rate(
                store, 1_000, max_in_flight=1_000
            )
        async with open_store(f"{server.url}/bench_backlog") as store:
            figures["wire_claim_past_backlog_ms"] = await claim_past_backlog_ms(store, 2_000)
    return figures


def measure() -> dict[str, float]:
    """ONE run of every store figure."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-store-") as tmp:
        root = Path(tmp)
        figures = asyncio.run(measure_sqlite(root))
        figures.update(asyncio.run(measure_wire(root)))
    return figures


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:28} {value:12.1f}")

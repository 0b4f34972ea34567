"""`pingo simulate`: replay workflow traces under a storage budget to compare policies.

Each run is the real engine on a virtual clock: the real `WorkflowManager`
plans every submission (reuse, claims, the policy's keep hook), the real
`OutcomeService` stores datasets and releases children, the real
`RetentionLoop` asks the policy what to evict and the real `Deletor` deletes,
all on the in-memory store. Only two things are simulated:

- the executor: a claimed action "runs" for its trace runtime
  (`metadata.runtimeSeconds`), then its output (`metadata.outputBytes`) is
  written and the success callback is called in-process. Time does not pass
  by sleeping: the clock jumps to the next completion.
- the file system: `SimulatedStorage` is a `DatasetStorage` whose files are
  sizes in a dictionary. Promotion, measurement and removal keep their
  meaning (so the callback service measures the metadata size as it would
  measure files), without fsspec's in-memory filesystem, whose listings scan
  every file and would make a long replay quadratic.

Submissions run one after another (the next is planned when the previous one
finished). The retention loop passes at most once per
`Settings.retention_interval_s` of virtual time, as it would on a node.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import csv
import dataclasses
import functools
import heapq
import html
import io
import itertools
import logging
import math
import multiprocessing
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pingo import errors, states
from pingo.config import Settings
from pingo.datasets.deletor import Deletor
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.retention.loop import RetentionLoop
from pingo.retention.policy import RetentionPolicy, keep_hook, load_policy
from pingo.simulation import bound, oracle, sequence, traces
from pingo.store import open_store
from pingo.store.protocol import ActionChanges, ActionRecord, Store
from pingo.workflows.keep import NewDatasetInfo
from pingo.workflows.planner import WorkflowManager

logger = logging.getLogger(__name__)

A = states.ActionState

#: Where the virtual clock starts.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: The default policies compared (keep-all ignores the budget: it is the unlimited reference).
DEFAULT_POLICIES = ("lru", "lfu", "cost-benefit", "gdsf", "most-used", "adaptive", "lineage")
DEFAULT_CAPACITIES = (0.05, 0.10, 0.20, 0.50)
_NODE = "simulator"
_OWNER = "simulation"
#: Leases never expire in a replay: nothing dies.
_LEASE_S = 10.0**9


class VirtualClock:
    """A clock that only moves when told to: the simulator's `Store.clock`."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start

    def __call__(self) -> datetime:
        return self._now

    def now(self) -> datetime:
        return self._now

    def advance_to(self, moment: datetime) -> None:
        """Move to `moment` (never backwards)."""
        if moment > self._now:
            self._now = moment

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)


class SimulatedStorage(DatasetStorage):
    """Dataset files as sizes in a dictionary, with the real storage's paths and semantics."""

    def __init__(self, data_root: str = "memory://pingo-simulation") -> None:
        super().__init__(data_root)
        self.files: dict[str, int] = {}
        #: Bytes of every file present now, and the most there ever were.
        self.used_bytes = 0
        self.peak_bytes = 0

    def write(self, path: str, size: int) -> None:
        """What the simulated executor does: its output appears at `path`."""
        self.used_bytes += size - self.files.get(path, 0)
        self.files[path] = size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    async def promote(
        self, staging: str, final: str, *, replace: bool = False, readers: bool = False
    ) -> int:
        # `readers`: a replaced copy kept for its readers is not simulated (no bytes).
        size = self.files.pop(staging, None)
        if replace and final in self.files:
            # A forced recompute: the new copy replaces the stored one.
            self.used_bytes -= self.files.pop(final) + (size or 0)
            self.write(final, size or 0)
            return size or 0
        if final in self.files:
            # Same provenance stored by someone else first: keep theirs.
            if size is not None:
                self.used_bytes -= size
            return self.files[final]
        self.files[final] = size or 0
        return size or 0

    async def size(self, path: str) -> int:
        return self.files.get(path, 0)

    async def remove(self, path: str) -> bool:
        self.used_bytes -= self.files.pop(path, 0)
        return True

    async def exists(self, path: str) -> bool:
        return path in self.files


@dataclass(order=True, slots=True)
class _Running:
    finishes_at: datetime
    seq: int
    callback_id: str = field(compare=False)
    attempt: int = field(compare=False)
    runtime_s: float = field(compare=False)
    size: int = field(compare=False)
    staging: str = field(compare=False)
    dataset_id: str = field(compare=False)


class SimulatedExecutor:
    """Claims READY actions as a node would and completes them on the virtual clock."""

    def __init__(
        self,
        store: Store,
        storage: SimulatedStorage,
        outcomes: OutcomeService,
        clock: VirtualClock,
        on_compute: Callable[[str, float], None] | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self.outcomes = outcomes
        self.clock = clock
        #: Told the dataset id and runtime of every action that completes.
        self.on_compute = on_compute
        self.running: list[_Running] = []
        self._seq = itertools.count()
        self.compute_s = 0.0
        self.executed = 0

    async def dispatch(self) -> None:
        """Claim every READY action and start it (PROCESSING → SUBMITTED, as a submitter)."""
        while True:
            claimed = await self.store.claim_actions(_NODE, 10_000, _LEASE_S)
            if not claimed:
                return
            for action in claimed:
                await self._start(action)

    async def _start(self, action: ActionRecord) -> None:
        now = self.clock()
        states.ensure_transition(A.PROCESSING, A.SUBMITTED, states.Trigger.SUBMITTER)
        record = await self.store.transition_action(
            action.workflow_id,
            action.action_id,
            {A.PROCESSING},
            A.SUBMITTED,
            ActionChanges(attempts=action.attempts + 1, started_at=now),
            if_owner=_NODE,
        )
        if record is None:
            raise errors.Conflict(f"simulated action {action.key} was taken by someone else")
        runtime = traces.runtime_s(record.definition)
        heapq.heappush(
            self.running,
            _Running(
                finishes_at=now + timedelta(seconds=runtime),
                seq=next(self._seq),
                callback_id=record.callback_id,
                attempt=record.attempts,
                runtime_s=runtime,
                size=traces.output_bytes(record.definition),
                staging=self.storage.staging_path(
                    record.dataset_id, record.workflow_id, record.action_id, record.attempts
                ),
                dataset_id=record.dataset_id,
            ),
        )

    async def complete_next(self) -> None:
        """Advance the clock to the next completion and report every action ending then."""
        moment = self.running[0].finishes_at
        self.clock.advance_to(moment)
        while self.running and self.running[0].finishes_at <= moment:
            done = heapq.heappop(self.running)
            self.storage.write(done.staging, done.size)
            await self.outcomes.success(done.callback_id, done.attempt, runtime_s=done.runtime_s)
            self.compute_s += done.runtime_s
            self.executed += 1
            if self.on_compute is not None:
                self.on_compute(done.dataset_id, done.runtime_s)


@dataclass(frozen=True, slots=True)
class RunResult:
    """One replay of the sequence with one policy and one budget."""

    policy: str
    capacity_bytes: int | None
    compute_s: float
    executed_actions: int
    evictions: int
    #: Bytes of the datasets retention evicted.
    evicted_bytes: int
    peak_bytes: int
    #: New intermediates the policy's keep hook declined.
    dropped_new: int
    wall_s: float
    #: Bytes on disk other than LEAF datasets at the end of each submission (a
    #: boundary): what the run kept there, which may exceed the budget (see
    #: `bound.lower_bound`'s `held`).
    boundary_bytes: tuple[int, ...] = ()


async def run_engine(
    submissions: Sequence[sequence.Submission],
    policy_name: str,
    capacity_bytes: int | None,
    *,
    high_water: float = 0.90,
    low_water: float = 0.75,
    retention_interval_s: float = 5.0,
    policy: RetentionPolicy | None = None,
    on_submission: Callable[[int], None] | None = None,
    on_compute: Callable[[str, float], None] | None = None,
) -> RunResult:
    """Replay `submissions` through the real engine with `policy_name` and a budget.

    `policy`, when given, is used instead of loading `policy_name` (an offline
    reference such as `foresight.Foresight`); `on_submission` is told the index of
    each submission before it is planned, and `on_compute` the dataset id and
    runtime of every action the run computes.
    """
    started = time.perf_counter()
    clock = VirtualClock()
    settings = Settings(
        home=Path("/nonexistent/pingo-simulation"),
        store_url="memory://",
        data_root="memory://pingo-simulation",
        storage_capacity_bytes=capacity_bytes,
        retention_policy=policy_name,
        high_water=high_water,
        low_water=low_water,
        retention_interval_s=retention_interval_s,
        lease_s=_LEASE_S,
    )
    if policy is None:
        policy = load_policy(policy_name)
    storage = SimulatedStorage(settings.data_root)
    async with open_store(settings.store_url, clock=clock) as store:
        ask = keep_hook(policy, store)
        dropped = 0

        async def counting_hook(info: NewDatasetInfo) -> bool:
            nonlocal dropped
            keep = await ask(info)
            dropped += not keep
            return keep

        outcomes = OutcomeService(store, storage, settings, feed=False)
        manager = WorkflowManager(
            store, storage, settings, keep_hook=counting_hook, outcomes=outcomes, feed=False
        )
        retention = RetentionLoop(store, settings, policy)
        deletor = Deletor(store, storage, settings)
        executor = SimulatedExecutor(store, storage, outcomes, clock, on_compute)
        evictions = evicted_bytes = 0
        boundary: list[int] = []
        next_pass = clock()
        high = None if capacity_bytes is None else high_water * capacity_bytes

        async def maintain() -> None:
            nonlocal evictions, evicted_bytes, next_pass
            # The physical bytes present equal the store's bytes on disk between
            # steps, so this is the loop's own first test, without a store scan.
            if high is not None and storage.used_bytes > high and clock() >= next_pass:
                next_pass = clock() + timedelta(seconds=retention_interval_s)
                evicted = await retention.enforce()
                evictions += len(evicted)
                evicted_bytes += sum(e.size_bytes for e in evicted)
            while await deletor.run_once():
                pass

        for index, sub in enumerate(submissions):
            if on_submission is not None:
                on_submission(index)
            workflow = await manager.submit(sub.document, owner=_OWNER)
            await executor.dispatch()
            await maintain()
            while executor.running:
                await executor.complete_next()
                await executor.dispatch()
                await maintain()
            final = await store.get_workflow(workflow.id)
            if final is None or final.state is not states.WorkflowState.SUCCEEDED:
                raise errors.PingoError(
                    f"simulated workflow {workflow.id} ({sub.family} v{sub.version}) ended "
                    f"{None if final is None else final.state.value}"
                )
            # Nothing runs now; the loop may have left more than the budget (its
            # passes are throttled, claims held what it chose, lineage keeps some).
            leaves = (await store.bytes_by_state()).get(states.DatasetState.LEAF, 0)
            boundary.append(storage.used_bytes - leaves)
            # The next submission arrives a second later.
            clock.advance(1.0)
    return RunResult(
        policy=policy_name,
        capacity_bytes=capacity_bytes,
        compute_s=executor.compute_s,
        executed_actions=executor.executed,
        evictions=evictions,
        evicted_bytes=evicted_bytes,
        peak_bytes=storage.peak_bytes,
        dropped_new=dropped,
        wall_s=time.perf_counter() - started,
        boundary_bytes=tuple(boundary),
    )


# ------------------------------------------------------------------------ the study


@dataclass(frozen=True, slots=True)
class Result:
    """One cell of the study: a seed, a policy and a capacity fraction."""

    seed: int
    policy: str
    capacity_fraction: float
    capacity_bytes: int
    compute_s: float
    no_reuse_compute_s: float
    unlimited_compute_s: float
    oracle_compute_s: float
    #: The LP lower bound on this run's compute (`pingo.simulation.bound`): on any
    #: policy's at this budget, or, when the run kept more than the budget at the
    #: end of a submission, on any policy's keeping as much as the run did there.
    bound_compute_s: float
    evictions: int
    oracle_evictions: int
    peak_bytes: int
    executed_actions: int
    dropped_new: int
    working_set_bytes: int
    reusable_bytes: int
    wall_s: float
    #: The most bytes the run kept over the budget at the end of a submission (0: never).
    boundary_excess_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacityFraction": self.capacity_fraction,
            "computeSeconds": round(self.compute_s, 3),
            "noReuseComputeSeconds": round(self.no_reuse_compute_s, 3),
            "unlimitedComputeSeconds": round(self.unlimited_compute_s, 3),
            "oracleComputeSeconds": round(self.oracle_compute_s, 3),
            "boundComputeSeconds": round(self.bound_compute_s, 3),
            "evictions": self.evictions,
            "peakBytes": self.peak_bytes,
            "seed": self.seed,
            "capacityBytes": self.capacity_bytes,
            "oracleEvictions": self.oracle_evictions,
            "executedActions": self.executed_actions,
            "droppedNew": self.dropped_new,
            "workingSetBytes": self.working_set_bytes,
            "reusableBytes": self.reusable_bytes,
            "wallSeconds": round(self.wall_s, 3),
            "boundaryExcessBytes": self.boundary_excess_bytes,
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Result:
        """A result back from `to_json` (to summarize a saved `--json` run)."""
        return cls(
            seed=int(row["seed"]),
            policy=str(row["policy"]),
            capacity_fraction=float(row["capacityFraction"]),
            capacity_bytes=int(row["capacityBytes"]),
            compute_s=float(row["computeSeconds"]),
            no_reuse_compute_s=float(row["noReuseComputeSeconds"]),
            unlimited_compute_s=float(row["unlimitedComputeSeconds"]),
            oracle_compute_s=float(row["oracleComputeSeconds"]),
            # Saved before the bound existed: unlimited storage is a (weaker) bound.
            bound_compute_s=float(row.get("boundComputeSeconds", row["unlimitedComputeSeconds"])),
            evictions=int(row["evictions"]),
            oracle_evictions=int(row["oracleEvictions"]),
            peak_bytes=int(row["peakBytes"]),
            executed_actions=int(row["executedActions"]),
            dropped_new=int(row["droppedNew"]),
            working_set_bytes=int(row["workingSetBytes"]),
            reusable_bytes=int(row["reusableBytes"]),
            wall_s=float(row["wallSeconds"]),
            # Saved before it was measured: unknown, taken as none.
            boundary_excess_bytes=int(row.get("boundaryExcessBytes", 0)),
        )


@dataclass(frozen=True, slots=True)
class SeedSummary:
    """What one seed's sequence is, independent of the policy."""

    seed: int
    submissions: int
    families: dict[str, int]
    working_set: oracle.WorkingSet
    #: The real engine with keep-all and no budget (the model must agree).
    unlimited: RunResult

    def to_json(self) -> dict[str, Any]:
        ws = self.working_set
        return {
            "seed": self.seed,
            "submissions": self.submissions,
            "submissionsByFamily": self.families,
            "workingSetBytes": ws.bytes,
            "workingSetDatasets": ws.datasets,
            "reusableBytes": ws.reusable_bytes,
            "noReuseComputeSeconds": round(ws.no_reuse_compute_s, 3),
            "unlimitedComputeSeconds": round(self.unlimited.compute_s, 3),
            "modelUnlimitedComputeSeconds": round(ws.unlimited_compute_s, 3),
        }


@dataclass(frozen=True, slots=True)
class Study:
    results: tuple[Result, ...]
    seeds: tuple[SeedSummary, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "results": [r.to_json() for r in self.results],
            "sequences": [s.to_json() for s in self.seeds],
        }


@dataclass(frozen=True, slots=True)
class _Cell:
    """One engine replay to run: picklable, so a worker process can regenerate its sequence."""

    trace_paths: tuple[str, ...]
    submissions: int
    seed: int
    policy: str
    capacity_bytes: int | None
    high_water: float
    low_water: float


@functools.lru_cache(maxsize=4)
def _sequence(
    trace_paths: tuple[str, ...], submissions: int, seed: int
) -> tuple[sequence.Submission, ...]:
    families = traces.load_families(trace_paths)
    return tuple(sequence.generate(families, submissions, seed))


async def _run_cell(cell: _Cell) -> RunResult:
    subs = _sequence(cell.trace_paths, cell.submissions, cell.seed)
    return await run_engine(
        subs,
        cell.policy,
        cell.capacity_bytes,
        high_water=cell.high_water,
        low_water=cell.low_water,
    )


def _run_cell_in_process(cell: _Cell) -> RunResult:
    return asyncio.run(_run_cell(cell))


async def _run_cells(
    cells: Sequence[_Cell], jobs: int, done: Callable[[_Cell, RunResult], None]
) -> list[RunResult]:
    if jobs <= 1:
        results = []
        for cell in cells:
            result = await _run_cell(cell)
            done(cell, result)
            results.append(result)
        return results
    loop = asyncio.get_running_loop()
    # spawn, not fork: a forked child would inherit this process's running event loop.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:

        async def one(cell: _Cell) -> RunResult:
            result = await loop.run_in_executor(pool, _run_cell_in_process, cell)
            done(cell, result)
            return result

        return list(await asyncio.gather(*(one(c) for c in cells)))


async def study(
    trace_paths: Sequence[str | Path],
    *,
    submissions: int,
    seeds: Sequence[int],
    policies: Sequence[str] = DEFAULT_POLICIES,
    capacities: Sequence[float] = DEFAULT_CAPACITIES,
    high_water: float = 0.90,
    low_water: float = 0.75,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
) -> Study:
    """Every seed x policy x capacity, with the no-reuse, unlimited and oracle references."""
    for name in policies:
        load_policy(name)  # fail before a long replay on a typo
    for fraction in capacities:
        if not fraction > 0:
            raise errors.ConfigurationError(f"capacity fractions must be positive, not {fraction}")
    paths = tuple(str(p) for p in trace_paths)
    say = progress or (lambda _line: None)
    cells: list[_Cell] = []
    per_seed: dict[int, tuple[oracle.WorkingSet, dict[str, int]]] = {}
    planned: dict[int, tuple[list[oracle.SubmissionModel], oracle.Catalog]] = {}
    references: dict[tuple[int, float], tuple[int, oracle.OracleResult]] = {}
    floors: dict[tuple[int, float], bound.Bound] = {}
    #: Bytes each boundary allows besides the leaves, per seed and capacity.
    budgets: dict[tuple[int, float], tuple[int, ...]] = {}
    for seed in seeds:
        subs = _sequence(paths, submissions, seed)
        models, catalog = oracle.build_models(subs)
        ws = oracle.working_set(models, catalog)
        counts: dict[str, int] = {}
        for sub in subs:
            counts[sub.family] = counts.get(sub.family, 0) + 1
        per_seed[seed] = (ws, counts)
        planned[seed] = (models, catalog)
        cells.append(_Cell(paths, submissions, seed, "keep-all", None, high_water, low_water))
        for fraction in capacities:
            capacity = ws.capacity_bytes(fraction)
            reference = oracle.run_oracle(models, catalog, int(high_water * capacity))
            references[(seed, fraction)] = (capacity, reference)
            problem = bound.instance(models, catalog, int(high_water * capacity))
            floor = bound.solve(problem)
            floors[(seed, fraction)] = floor
            budgets[(seed, fraction)] = problem.budgets
            say(
                f"seed {seed}: oracle at {fraction:.0%}: {reference.compute_s:,.0f} s "
                f"({reference.evictions} evictions); lower bound {floor.compute_s:,.0f} s "
                f"({floor.solve_s:.1f} s to solve)"
            )
            cells.extend(
                _Cell(paths, submissions, seed, name, capacity, high_water, low_water)
                for name in policies
            )

    def done(cell: _Cell, run: RunResult) -> None:
        budget = "unlimited" if cell.capacity_bytes is None else f"{cell.capacity_bytes:,} B"
        say(
            f"seed {cell.seed}: {cell.policy} at {budget}: {run.compute_s:,.0f} s, "
            f"{run.evictions} evictions ({run.wall_s:.1f} s)"
        )

    runs = await _run_cells(cells, jobs, done)
    unlimited = {c.seed: r for c, r in zip(cells, runs, strict=True) if c.capacity_bytes is None}
    summaries: list[SeedSummary] = []
    for seed in seeds:
        ws, counts = per_seed[seed]
        summaries.append(SeedSummary(seed, submissions, counts, ws, unlimited[seed]))
        if abs(unlimited[seed].compute_s - ws.unlimited_compute_s) > 1e-6 * max(
            1.0, ws.unlimited_compute_s
        ):
            logger.warning(
                "the planning model disagrees with the engine on unlimited storage: %.1f vs %.1f",
                ws.unlimited_compute_s,
                unlimited[seed].compute_s,
                extra={"event": "simulate_model_mismatch"},
            )
    results: list[Result] = []
    for cell, run in zip(cells, runs, strict=True):
        if cell.capacity_bytes is None:
            continue
        ws, _ = per_seed[cell.seed]
        fraction = next(
            f for f in capacities if references[(cell.seed, f)][0] == cell.capacity_bytes
        )
        _, reference = references[(cell.seed, fraction)]
        # The engine may keep more than the budget at the end of a submission (the
        # loop's passes are throttled, lineage keeps candidates while leaves or
        # claims hold the excess): such a run is bounded with what it kept there.
        allowed = budgets[(cell.seed, fraction)]
        excess = max((h - b for h, b in zip(run.boundary_bytes, allowed, strict=True)), default=0)
        floor = floors[(cell.seed, fraction)]
        if excess > 0:
            models, catalog = planned[cell.seed]
            floor = bound.lower_bound(
                models, catalog, int(high_water * cell.capacity_bytes), held=run.boundary_bytes
            )
        results.append(
            Result(
                seed=cell.seed,
                policy=cell.policy,
                capacity_fraction=fraction,
                capacity_bytes=cell.capacity_bytes,
                compute_s=run.compute_s,
                no_reuse_compute_s=ws.no_reuse_compute_s,
                unlimited_compute_s=unlimited[cell.seed].compute_s,
                oracle_compute_s=reference.compute_s,
                bound_compute_s=floor.compute_s,
                evictions=run.evictions,
                oracle_evictions=reference.evictions,
                peak_bytes=run.peak_bytes,
                executed_actions=run.executed_actions,
                dropped_new=run.dropped_new,
                working_set_bytes=ws.bytes,
                reusable_bytes=ws.reusable_bytes,
                wall_s=run.wall_s,
                boundary_excess_bytes=max(excess, 0),
            )
        )
    return Study(tuple(results), tuple(summaries))


# ------------------------------------------------------------------- aggregation


@dataclass(frozen=True, slots=True)
class Row:
    """Mean and spread over seeds of one policy at one capacity."""

    policy: str
    capacity_fraction: float
    seeds: int
    compute_s: float
    compute_min_s: float
    compute_max_s: float
    #: compute / LRU's compute (mean of per-seed ratios), None without LRU.
    vs_lru: float | None
    #: compute / the oracle's compute (mean of per-seed ratios).
    vs_oracle: float
    vs_oracle_stdev: float
    #: compute / the lower bound (mean of per-seed ratios): 1.0 is provably optimal.
    vs_bound: float
    vs_bound_stdev: float
    #: Share of LRU's gap to unlimited storage that this policy closes (mean).
    gap_closed: float | None
    gap_closed_stdev: float | None
    oracle_compute_s: float
    unlimited_compute_s: float
    no_reuse_compute_s: float
    evictions: float
    peak_bytes: float


def _stdev(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(results: Sequence[Result]) -> list[Row]:
    """Rows per policy and capacity, averaged over seeds, compared with LRU and the oracle."""
    cells: dict[tuple[str, float], list[Result]] = {}
    lru: dict[tuple[int, float], Result] = {}
    for r in results:
        cells.setdefault((r.policy, r.capacity_fraction), []).append(r)
        if r.policy == "lru":
            lru[(r.seed, r.capacity_fraction)] = r
    rows: list[Row] = []
    for (policy, fraction), group in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        computes = [r.compute_s for r in group]
        vs_oracle = [r.compute_s / max(r.oracle_compute_s, 1e-9) for r in group]
        vs_bound = [r.compute_s / max(r.bound_compute_s, 1e-9) for r in group]
        vs_lru: list[float] = []
        closed: list[float] = []
        for r in group:
            base = lru.get((r.seed, fraction))
            if base is None:
                continue
            vs_lru.append(r.compute_s / max(base.compute_s, 1e-9))
            gap = base.compute_s - r.unlimited_compute_s
            if gap > 1e-9:
                closed.append((base.compute_s - r.compute_s) / gap)
        rows.append(
            Row(
                policy=policy,
                capacity_fraction=fraction,
                seeds=len(group),
                compute_s=statistics.fmean(computes),
                compute_min_s=min(computes),
                compute_max_s=max(computes),
                vs_lru=statistics.fmean(vs_lru) if vs_lru else None,
                vs_oracle=statistics.fmean(vs_oracle),
                vs_oracle_stdev=_stdev(vs_oracle),
                vs_bound=statistics.fmean(vs_bound),
                vs_bound_stdev=_stdev(vs_bound),
                gap_closed=statistics.fmean(closed) if closed else None,
                gap_closed_stdev=_stdev(closed) if closed else None,
                oracle_compute_s=statistics.fmean(r.oracle_compute_s for r in group),
                unlimited_compute_s=statistics.fmean(r.unlimited_compute_s for r in group),
                no_reuse_compute_s=statistics.fmean(r.no_reuse_compute_s for r in group),
                evictions=statistics.fmean(r.evictions for r in group),
                peak_bytes=statistics.fmean(r.peak_bytes for r in group),
            )
        )
    return rows


#: Line colours of the policies in `plot` (Tableau 10), reused in turn.
_PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Curve:
    label: str
    points: list[tuple[float, float]]
    style: str


def _curves(results: Sequence[Result]) -> tuple[list[_Curve], float]:
    """Each policy's mean ratio to unlimited storage per capacity, the references, no reuse."""

    def ratio(r: Result, compute_s: float) -> float:
        return compute_s / max(r.unlimited_compute_s, 1e-9)

    cells: dict[tuple[str, float], list[Result]] = {}
    for r in results:
        cells.setdefault((r.policy, r.capacity_fraction), []).append(r)
    fractions = sorted({f for _, f in cells})
    policies = sorted({p for p, _ in cells})
    curves: list[_Curve] = []
    for n, policy in enumerate(policies):
        groups = [cells.get((policy, f), []) for f in fractions]
        points = [
            (100 * f, statistics.fmean(ratio(r, r.compute_s) for r in g))
            for f, g in zip(fractions, groups, strict=True)
            if g
        ]
        style = f'stroke="{_PALETTE[n % len(_PALETTE)]}" stroke-width="2"'
        curves.append(_Curve(policy, points, style))
    # The references do not depend on the policy: take any policy's rows.
    refs = [(f, cells[(policies[0], f)]) for f in fractions if (policies[0], f) in cells]
    curves.append(
        _Curve(
            "oracle (offline)",
            [(100 * f, statistics.fmean(ratio(r, r.oracle_compute_s) for r in g)) for f, g in refs],
            'stroke="black" stroke-width="1.5" stroke-dasharray="6 4"',
        )
    )
    # A run that kept more than the budget at a boundary has a lower bound of its
    # own (`Result.bound_compute_s`): the floor is the lowest of a seed's bounds.
    lowest: dict[tuple[int, float], float] = {}
    for r in results:
        key = (r.seed, r.capacity_fraction)
        lowest[key] = min(lowest.get(key, math.inf), r.bound_compute_s)
    curves.append(
        _Curve(
            "lower bound (LP): the floor",
            [
                (100 * f, statistics.fmean(ratio(r, lowest[(r.seed, f)]) for r in g))
                for f, g in refs
            ],
            'stroke="black" stroke-width="3"',
        )
    )
    no_reuse = statistics.fmean(ratio(r, r.no_reuse_compute_s) for _, g in refs for r in g)
    return curves, no_reuse


def plot_svg(results: Sequence[Result], *, title: str | None = None) -> str:
    """Compute-vs-capacity curves as an SVG document, the lower bound drawn as the floor.

    Each seed's compute is divided by its compute with unlimited storage
    (seeds differ in scale), and the curves are the means over seeds; the
    capacity axis is logarithmic. SVG is written directly: a few lines and
    polylines need no plotting library, so `--plot` works from any install.
    """
    curves, no_reuse = _curves(results)
    width, height, left, right, top, bottom = 820, 500, 70, 220, 40, 50
    xs = sorted({x for c in curves for x, _ in c.points})
    ys = [y for c in curves for _, y in c.points]
    if not xs:
        raise errors.ConfigurationError("nothing to plot: no results")
    x_lo, x_hi = math.log10(xs[0]), math.log10(xs[-1])
    y_lo, y_hi = min(0.9, *ys), max(1.1, *ys) * 1.03
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        span = x_hi - x_lo
        return left + (plot_w * (math.log10(x) - x_lo) / span if span else plot_w / 2)

    def sy(y: float) -> float:
        return top + plot_h * (1 - (y - y_lo) / (y_hi - y_lo))

    seeds = len({r.seed for r in results})
    heading = title or (f"Compute vs capacity: mean of {seeds} seed(s) (no reuse: x{no_reuse:.1f})")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2:.0f}" y="22" text-anchor="middle" font-size="14">'
        f"{html.escape(heading)}</text>",
        f'<line x1="{left}" y1="{sy(1.0):.1f}" x2="{left + plot_w}" y2="{sy(1.0):.1f}" '
        'stroke="green" stroke-dasharray="2 3"/>',
        f'<text x="{left + plot_w - 4}" y="{sy(1.0) - 4:.1f}" text-anchor="end" fill="green">'
        "unlimited storage</text>",
    ]
    for tick in _ticks(y_lo, y_hi):
        parts.append(
            f'<line x1="{left}" y1="{sy(tick):.1f}" x2="{left + plot_w}" y2="{sy(tick):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{sy(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>'
        )
    for x in xs:
        parts.append(
            f'<line x1="{sx(x):.1f}" y1="{top}" x2="{sx(x):.1f}" y2="{top + plot_h}" '
            'stroke="#eee"/>'
            f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x:g}%</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#333"/>'
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 10}" text-anchor="middle">'
        "storage capacity (share of the working set, log scale)</text>"
        f'<text transform="translate(16 {top + plot_h / 2:.0f}) rotate(-90)" '
        'text-anchor="middle">compute executed / compute with unlimited storage</text>'
    )
    for n, curve in enumerate(curves):
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in curve.points)
        legend_y = top + 10 + 18 * n
        parts.append(
            f'<polyline fill="none" {curve.style} points="{points}"/>'
            f'<line x1="{width - right + 12}" y1="{legend_y}" x2="{width - right + 40}" '
            f'y2="{legend_y}" {curve.style}/>'
            f'<text x="{width - right + 46}" y="{legend_y + 4}">{html.escape(curve.label)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _ticks(lo: float, hi: float) -> list[float]:
    """About six round values between `lo` and `hi`."""
    raw = (hi - lo) / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + k * step, 10) for k in range(int((hi - first) / step) + 1)]


def plot(results: Sequence[Result], path: str | Path, *, title: str | None = None) -> None:
    """Write `plot_svg` to `path`."""
    Path(path).write_text(plot_svg(results, title=title), encoding="utf-8")


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


def render(result: Study) -> list[Any]:
    """Rich renderables for a study: the sequences, then one table row per capacity x policy."""
    from rich.table import Table

    sequences = Table(title="Submission sequences (per seed)")
    for column in ("seed", "working set GB", "reusable GB", "no reuse h", "unlimited h"):
        sequences.add_column(column, justify="right")
    for s in result.seeds:
        sequences.add_row(
            str(s.seed),
            _gb(s.working_set.bytes),
            _gb(s.working_set.reusable_bytes),
            f"{s.working_set.no_reuse_compute_s / 3600:,.1f}",
            f"{s.unlimited.compute_s / 3600:,.1f}",
        )
    many = len(result.seeds) > 1
    table = Table(
        title="Compute executed" + (" (mean over seeds; ± is the spread)" if many else ""),
        caption="gap: share of LRU's excess over unlimited storage removed",
    )
    for column in (
        "cap",
        "policy",
        "compute h",
        "xbound",
        "xLRU",
        "gap",
        "xoracle",
        "evicted",
        "peak GB",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)
    previous: float | None = None
    for row in summarize(result.results):
        if previous is not None and row.capacity_fraction != previous:
            table.add_section()
        previous = row.capacity_fraction
        spread = f" {row.compute_min_s / 3600:,.1f}-{row.compute_max_s / 3600:,.1f}" if many else ""
        closed = "-"
        if row.gap_closed is not None and row.policy != "lru":
            closed = f"{row.gap_closed:+.0%}" + (
                f"±{row.gap_closed_stdev or 0:.0%}" if many else ""
            )
        table.add_row(
            f"{row.capacity_fraction:.0%}",
            row.policy,
            f"{row.compute_s / 3600:,.1f}{spread}",
            f"{row.vs_bound:.3f}" + (f"±{row.vs_bound_stdev:.3f}" if many else ""),
            "-" if row.vs_lru is None else f"{row.vs_lru:.3f}",
            closed,
            f"{row.vs_oracle:.3f}" + (f"±{row.vs_oracle_stdev:.3f}" if many else ""),
            f"{row.evictions:,.0f}",
            _gb(row.peak_bytes),
        )
    return [sequences, table]


def csv_text(results: Sequence[Result]) -> str:
    """The summary rows (`Row`'s fields, seconds and bytes) as CSV."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    names = [f.name for f in dataclasses.fields(Row)]
    writer.writerow(names)
    for row in summarize(results):
        writer.writerow(["" if (v := getattr(row, n)) is None else v for n in names])
    return buffer.getvalue()


def markdown(results: Sequence[Result]) -> str:
    """The summary as a Markdown table (for docs and notes)."""
    lines = [
        "| capacity | policy | compute h (mean) | min-max h | x bound | x LRU | LRU gap closed "
        "| x oracle | evictions | peak GB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in summarize(results):
        closed = (
            "-"
            if row.gap_closed is None or row.policy == "lru"
            else f"{row.gap_closed:+.0%} ± {row.gap_closed_stdev or 0:.0%}"
        )
        lines.append(
            f"| {row.capacity_fraction:.0%} | {row.policy} | {row.compute_s / 3600:,.1f} "
            f"| {row.compute_min_s / 3600:,.1f}-{row.compute_max_s / 3600:,.1f} "
            f"| {row.vs_bound:.3f} ± {row.vs_bound_stdev:.3f} "
            f"| {'-' if row.vs_lru is None else f'{row.vs_lru:.3f}'} | {closed} "
            f"| {row.vs_oracle:.3f} ± {row.vs_oracle_stdev:.3f} | {row.evictions:,.0f} "
            f"| {_gb(row.peak_bytes)} |"
        )
    return "\n".join(lines)

"""A provable lower bound on any retention policy's compute, for a sequence and a budget.

The problem is relaxed to generalized caching (Bar-Noy et al. 2001): planning
the sequence with unlimited storage gives, for every intermediate, the
submission that first computes it and the submissions that read it. Every
consecutive pair of these (a *gap*) is an interval; keeping the dataset
through an interval needs its bytes at every submission boundary the interval
spans, and not keeping it costs at least one recompute of its action. The
budget holds at every boundary. docs/retention.md proves that any policy of
the model pays at least the unlimited-storage compute plus the optimum of
this problem; the LP relaxation (HiGHS, through scipy.optimize.milp) is below that optimum,
and the integer program (`exact=True`) is the optimum itself, for small cases.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, sparse

from pingo.simulation.oracle import Catalog, SubmissionModel, plan


@dataclass(frozen=True, slots=True)
class Interval:
    """Keep `dataset` from the end of submission `start` to submission `end`, which reads it."""

    dataset: str
    start: int
    end: int
    size: int
    #: What evicting it within the interval costs at least (its own runtime).
    cost_s: float


@dataclass(frozen=True, slots=True)
class Instance:
    """The relaxed problem: intervals and the bytes available at each boundary."""

    intervals: tuple[Interval, ...]
    #: Bytes intermediates may use at the end of submission b (leaves deducted).
    budgets: tuple[int, ...]
    unlimited_compute_s: float


@dataclass(frozen=True, slots=True)
class Bound:
    """The lower bound on compute for one budget."""

    compute_s: float
    unlimited_compute_s: float
    intervals: int
    exact: bool
    solve_s: float


def instance(models: Sequence[SubmissionModel], catalog: Catalog, budget_bytes: int) -> Instance:
    """The intervals of the sequence planned with unlimited storage, and the budgets."""
    on_disk: set[str] = set()
    last: dict[str, int] = {}
    intervals: list[Interval] = []
    budgets: list[int] = []
    leaf_bytes = 0
    unlimited = 0.0
    for model in models:
        computed, reads = plan(model, on_disk)
        t = model.index
        for ds in reads:
            if ds in catalog.leaf:
                continue
            intervals.append(Interval(ds, last[ds], t, catalog.size[ds], catalog.runtime[ds]))
            last[ds] = t
        for n in computed:
            ds = model.datasets[n]
            unlimited += model.runtimes[n]
            if ds in on_disk:
                continue
            on_disk.add(ds)
            if ds in catalog.leaf:
                leaf_bytes += catalog.size[ds]
            else:
                last[ds] = t
        budgets.append(max(0, budget_bytes - leaf_bytes))
    return Instance(tuple(intervals), tuple(budgets), unlimited)


def solve(problem: Instance, *, exact: bool = False) -> Bound:
    """Minimum recompute cost of the intervals dropped, LP relaxation or integer optimum.

    Variable x_i in [0, 1] is the part of interval i not kept; the constraint at
    boundary b is sum over the intervals spanning b of size_i * (1 - x_i) <= budget_b.
    """
    started = time.perf_counter()
    # Zero-byte and zero-cost intervals never matter: keep the first, drop the second.
    live = [iv for iv in problem.intervals if iv.size > 0 and iv.cost_s > 0]
    if not live:
        return Bound(problem.unlimited_compute_s, problem.unlimited_compute_s, 0, True, 0.0)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    spanned = np.zeros(len(problem.budgets))
    for i, iv in enumerate(live):
        for b in range(iv.start, iv.end):
            rows.append(b)
            cols.append(i)
            vals.append(float(iv.size))
            spanned[b] += iv.size
    # sum size*(1-x) <= B  <=>  -sum size*x <= B - sum size.
    matrix = sparse.csr_matrix(
        (-np.asarray(vals), (rows, cols)), shape=(len(problem.budgets), len(live))
    )
    upper = np.asarray(problem.budgets, dtype=float) - spanned
    needed = upper < 0  # boundaries that the unlimited plan already fits impose nothing
    cost = np.asarray([iv.cost_s for iv in live])
    if not needed.any():
        value = 0.0
    else:
        # One HiGHS call for both: integrality 0 is the LP relaxation, 1 the integer program.
        result = optimize.milp(
            cost,
            constraints=optimize.LinearConstraint(matrix[needed], -np.inf, upper[needed]),
            integrality=np.full(len(live), int(exact), dtype=np.int64),
            bounds=optimize.Bounds(0, 1),
        )
        value = _value(result)
    return Bound(
        compute_s=problem.unlimited_compute_s + value,
        unlimited_compute_s=problem.unlimited_compute_s,
        intervals=len(live),
        exact=exact,
        solve_s=time.perf_counter() - started,
    )


def _value(result: optimize.OptimizeResult) -> float:
    if not result.success:
        raise RuntimeError(f"HiGHS did not solve the retention bound: {result.message}")
    # HiGHS's tolerances can put an optimum a hair below zero.
    return max(float(result.fun), 0.0)


def lower_bound(
    models: Sequence[SubmissionModel],
    catalog: Catalog,
    budget_bytes: int,
    *,
    exact: bool = False,
) -> Bound:
    """The lower bound on the compute of any policy keeping `budget_bytes` between submissions."""
    return solve(instance(models, catalog, budget_bytes), exact=exact)

"""A provable lower bound on any retention policy's compute, for a sequence and a budget.

The problem is relaxed to generalized caching (Bar-Noy et al. 2001): planning
the sequence with unlimited storage gives, for every intermediate, the
submission that first computes it and the submissions that read it. Every
consecutive pair of these (a *gap*) is an interval; keeping the dataset
through an interval needs its bytes at every submission boundary the interval
spans, and not keeping it costs at least one recompute of its action. The
budget holds at every boundary. A dropped interval also pays for a parent the
unlimited plan never reads again, unless that parent stays on disk until the
interval starts, and again in each disjoint window of such reads (`Cascade`).
docs/retention.md proves that any policy of the model pays at least the
unlimited-storage compute plus the optimum of this problem; the LP relaxation
(HiGHS, through scipy.optimize.milp) is below that optimum, and the integer
program (`exact=True`) is the optimum itself, for small cases. An integer solve
stopped by `time_limit_s` still proves the larger of HiGHS's dual bound and the
LP value, and brackets the optimum with its best integer solution.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Mapping, Sequence
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
class Cascade:
    """A parent the sequence never reads after `since`, whose children's intervals start later.

    Dropping such a child's interval recomputes the child after the interval's
    start, and that recompute needs `dataset`: either it stayed on disk from
    `since` through the interval's start, or it is computed again after
    `since` (at most one such recompute is charged, whatever the number of
    children).
    """

    dataset: str
    since: int
    size: int
    cost_s: float
    #: Indices (into `Instance.intervals`) of the children's intervals starting at or after `since`.
    children: tuple[int, ...]
    #: Pairwise disjoint ranges (a, c] of submissions after `since`, each holding the
    #: (start, end] of one child interval or more: a compute of p in one is not one in another.
    windows: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Instance:
    """The relaxed problem: intervals and the bytes available at each boundary."""

    intervals: tuple[Interval, ...]
    #: Bytes intermediates may use at the end of submission b (leaves deducted).
    budgets: tuple[int, ...]
    unlimited_compute_s: float
    cascades: tuple[Cascade, ...] = ()


@dataclass(frozen=True, slots=True)
class Bound:
    """The lower bound on compute for one budget."""

    #: The proved lower bound: the LP value, the integer optimum, or, for an integer
    #: solve stopped by its time limit, the larger of HiGHS's dual bound and the LP value.
    compute_s: float
    unlimited_compute_s: float
    intervals: int
    #: True when `compute_s` is the integer optimum of the relaxed problem, proved.
    exact: bool
    solve_s: float
    #: An integer solve's best integer solution (a feasible point of the relaxed
    #: problem, so at least its optimum); None for the LP or when none was found in time.
    integer_upper_s: float | None = None
    #: An integer solve's dual bound from HiGHS (None when it stopped before having one).
    dual_compute_s: float | None = None
    #: The LP value, for an integer solve with a time limit (solved first, as a floor).
    lp_compute_s: float | None = None
    #: The solution: the part of each interval (`Instance.intervals`, in order) not
    #: kept, the integer solve's best solution when there is one. Empty when no
    #: boundary binds (everything is kept).
    dropped: tuple[float, ...] = ()


def instance(
    models: Sequence[SubmissionModel],
    catalog: Catalog,
    budget_bytes: int,
    held: Sequence[int] | None = None,
) -> Instance:
    """The intervals of the sequence planned with unlimited storage, and the budgets.

    `held[b]`, when given, is what a run kept on disk at the end of submission b
    besides leaves: the budget there becomes the larger of it and `budget_bytes`
    less the leaves (the bound of a run that exceeded the budget at boundaries).
    """
    if held is not None and len(held) != len(models):
        raise ValueError(f"held has {len(held)} boundaries for {len(models)} submissions")
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
        allowed = max(0, budget_bytes - leaf_bytes)
        if held is not None:
            allowed = max(allowed, held[len(budgets)])
        budgets.append(allowed)
    return Instance(
        tuple(intervals), tuple(budgets), unlimited, _cascades(intervals, catalog, last)
    )


def _cascades(
    intervals: Sequence[Interval], catalog: Catalog, last: dict[str, int]
) -> tuple[Cascade, ...]:
    """The parents whose recompute a dropped child interval may force (see `Cascade`).

    `last` holds each intermediate's last event with unlimited storage (its
    creation or its last read): after it, the unlimited plan never reads it.
    Parents that are free to keep (no bytes) or to recompute (no runtime) are left out.
    """
    children: dict[str, list[int]] = {}
    for i, iv in enumerate(intervals):
        for parent in catalog.parents.get(iv.dataset, ()):
            since = last.get(parent)
            if since is not None and since <= iv.start:
                children.setdefault(parent, []).append(i)
    return tuple(
        Cascade(
            p,
            last[p],
            catalog.size[p],
            catalog.runtime[p],
            tuple(kids),
            _disjoint_windows([(intervals[i].start, intervals[i].end) for i in kids]),
        )
        for p, kids in children.items()
        if catalog.size[p] > 0 and catalog.runtime[p] > 0
    )


def solve(problem: Instance, *, exact: bool = False, time_limit_s: float | None = None) -> Bound:
    """Minimum recompute cost of the intervals dropped, LP relaxation or integer optimum.

    Variable x_i in [0, 1] is the part of interval i not kept; the constraint at
    boundary b is sum over the intervals spanning b of size_i * (1 - x_i) <= budget_b.
    Each cascade parent p adds its computes after its last read (q_p, cost runtime_p
    each) and its presence on disk up to its children's starts (`_add_cascade`).
    `time_limit_s` stops the integer solve (`exact`): the LP is solved first, so a
    stopped solve proves at least the LP's value (see `Bound.compute_s`).
    """
    started = time.perf_counter()
    unlimited = problem.unlimited_compute_s
    # Zero-byte intervals cost nothing to keep, so keeping them is optimal.
    live = [i for i, iv in enumerate(problem.intervals) if iv.size > 0]
    if not live:
        return Bound(unlimited, unlimited, 0, True, 0.0, unlimited, unlimited, unlimited)
    column = {i: n for n, i in enumerate(live)}
    model = _Model(len(problem.budgets))
    cost = [problem.intervals[i].cost_s for i in live]
    for i in live:
        iv = problem.intervals[i]
        for b in range(iv.start, iv.end):
            model.capacity(b, column[i], -float(iv.size))
            model.spanned[b] += iv.size
    for cascade in problem.cascades:
        _add_cascade(model, cost, cascade, column, problem.intervals)
    program = _program(model, cost, problem.budgets)
    if program is None:
        # No boundary can bind: keeping everything is feasible, and optimal.
        return Bound(unlimited, unlimited, len(live), True, 0.0, unlimited, unlimited, unlimited)
    if not exact:
        result = _milp(program, integer=False)
        value = _value(result)
        return Bound(
            unlimited + value,
            unlimited,
            len(live),
            False,
            _since(started),
            dropped=_dropped(result, column, len(problem.intervals)),
        )
    lp = None if time_limit_s is None else _value(_milp(program, integer=False))
    result = _milp(program, integer=True, time_limit_s=time_limit_s)
    found = _integer(result, lp)
    return Bound(
        compute_s=unlimited + found.lower,
        unlimited_compute_s=unlimited,
        intervals=len(live),
        exact=found.proved,
        solve_s=_since(started),
        integer_upper_s=None if found.upper is None else unlimited + found.upper,
        dual_compute_s=None if found.dual is None else unlimited + found.dual,
        lp_compute_s=None if lp is None else unlimited + lp,
        dropped=_dropped(result, column, len(problem.intervals)),
    )


def _dropped(
    result: optimize.OptimizeResult, column: Mapping[int, int], intervals: int
) -> tuple[float, ...]:
    """Each interval's x in the solution (0 for those without a column: kept for free)."""
    if result.x is None:
        return ()
    x = np.clip(result.x, 0.0, 1.0)  # HiGHS's tolerances can step a hair outside
    return tuple(float(x[column[i]]) if i in column else 0.0 for i in range(intervals))


def _since(started: float) -> float:
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class _Program:
    cost: np.ndarray
    constraints: optimize.LinearConstraint
    bounds: optimize.Bounds


def _program(model: _Model, cost: list[float], budgets: Sequence[int]) -> _Program | None:
    """The program HiGHS solves, or None when no row can bind."""
    matrix, lower, upper = model.constraints(budgets)
    if matrix is None:
        return None
    return _Program(
        np.asarray(cost),
        optimize.LinearConstraint(matrix, lower, upper),
        optimize.Bounds(0, model.uppers(len(cost))),
    )


def _milp(
    program: _Program, *, integer: bool, time_limit_s: float | None = None
) -> optimize.OptimizeResult:
    """One HiGHS call: integrality 0 is the LP relaxation, 1 the integer program."""
    # HiGHS stops at a relative gap of 1e-4 by default: its "optimum" could then be
    # above the true one, and no longer a lower bound. The gap is closed instead
    # (an LP has no gap: the option changes nothing there).
    limit = math.inf if time_limit_s is None else time_limit_s
    return optimize.milp(
        program.cost,
        constraints=program.constraints,
        integrality=np.full(len(program.cost), int(integer), dtype=np.int64),
        bounds=program.bounds,
        options={"mip_rel_gap": 0.0, "time_limit": limit},
    )


@dataclass(frozen=True, slots=True)
class _Integer:
    """What an integer solve proved (`lower`) and found (`upper`), beyond the unlimited compute."""

    lower: float
    proved: bool
    upper: float | None
    dual: float | None


#: scipy's status for a solve stopped by its time (or iteration) limit.
_STOPPED = 1


def _integer(result: optimize.OptimizeResult, lp: float | None) -> _Integer:
    """The bound an integer solve proves, finished or stopped by its time limit.

    Finished, HiGHS's dual bound meets its best solution (the gap is closed, to
    HiGHS's absolute tolerance). Stopped, the dual bound is still a bound on the
    optimum of the integer program, but it may be below the LP's (before the root
    node is solved, it is minus infinity): the larger of the two is proved.
    """
    dual = getattr(result, "mip_dual_bound", None)
    dual = None if dual is None or not math.isfinite(dual) else float(dual)
    upper = None if result.x is None else max(float(result.fun), 0.0)
    if result.status == _STOPPED:
        floors = [v for v in (dual, lp) if v is not None]
        if not floors:
            raise RuntimeError("a stopped integer solve needs the LP value as its floor")
        return _Integer(max(*floors, 0.0), False, upper, dual)
    value = _value(result)
    return _Integer(value if dual is None else max(min(dual, value), 0.0), True, upper, dual)


class _Model:
    """The sparse rows of the problem: capacity per boundary, then cascade links."""

    def __init__(self, boundaries: int) -> None:
        self.boundaries = boundaries
        #: Bytes of the intervals spanning each boundary (all kept).
        self.spanned = np.zeros(boundaries)
        #: Bytes a cascade may add at each boundary (all its parents kept).
        self.extra = np.zeros(boundaries)
        self._cap: tuple[list[int], list[int], list[float]] = ([], [], [])
        self._links: tuple[list[int], list[int], list[float]] = ([], [], [])
        self._link_rows = 0
        #: Upper bounds other than 1, by column.
        self.upper: dict[int, float] = {}

    def uppers(self, columns: int) -> np.ndarray:
        upper = np.ones(columns)
        for col, value in self.upper.items():
            upper[col] = value
        return upper

    def capacity(self, boundary: int, col: int, value: float) -> None:
        rows, cols, vals = self._cap
        rows.append(boundary)
        cols.append(col)
        vals.append(value)

    def variable(self, cost: list[float], cost_s: float, *, upper: float = 1.0) -> int:
        """A new column costing `cost_s` per unit, in [0, upper]."""
        cost.append(cost_s)
        if upper != 1.0:
            self.upper[len(cost) - 1] = upper
        return len(cost) - 1

    def link(self, terms: Sequence[tuple[int, float]]) -> None:
        """A row sum(value * var) <= 0."""
        rows, cols, vals = self._links
        for col, value in terms:
            rows.append(self._link_rows)
            cols.append(col)
            vals.append(value)
        self._link_rows += 1

    def constraints(
        self, budgets: Sequence[int]
    ) -> tuple[sparse.csr_matrix | None, np.ndarray, np.ndarray]:
        """The rows that can bind, with their bounds (None when none can)."""
        width = 1 + max([*self._cap[1], *self._links[1]], default=0)
        # sum size*(1-x) + sum size_p*u <= B  <=>  -sum size*x + sum size_p*u <= B - sum size.
        cap = sparse.csr_matrix(
            (self._cap[2], (self._cap[0], self._cap[1])), shape=(self.boundaries, width)
        )
        upper = np.asarray(budgets, dtype=float) - self.spanned
        # A boundary that holds everything kept, cascades included, imposes nothing.
        needed = upper - self.extra < 0
        if not needed.any():
            return None, np.zeros(0), np.zeros(0)
        rows = [cap[needed]]
        bounds = [upper[needed]]
        if self._link_rows:
            rows.append(
                sparse.csr_matrix(
                    (self._links[2], (self._links[0], self._links[1])),
                    shape=(self._link_rows, width),
                )
            )
            bounds.append(np.zeros(self._link_rows))
        matrix = sparse.vstack(rows, format="csr")
        upper_all = np.concatenate(bounds)
        return matrix, np.full(len(upper_all), -np.inf), upper_all


def _add_cascade(
    model: _Model,
    cost: list[float],
    cascade: Cascade,
    column: dict[int, int],
    intervals: Sequence[Interval],
) -> None:
    """The variables and rows of one cascade parent p (docs/retention.md proves them).

    q_p counts p's computes after `since` (cost runtime_p each); u_pk says p stayed
    from `since` through the k-th start a_k, o_pk that p is on disk at boundary a_k.
    A dropped child interval needs p: x_i <= q_p + u_pk (p kept since `since`),
    and x_i <= z_pw + o_pk where z_pw is a compute of p inside the disjoint
    window w that holds the interval: sum_w z_pw <= q_p, so each window whose
    child is dropped pays for p again unless p is on disk at its start.
    """
    children = [i for i in cascade.children if i in column]
    if not children:
        return
    windows = cascade.windows
    q = model.variable(cost, cascade.cost_s, upper=float(max(1, len(windows))))
    starts = sorted({intervals[i].start for i in children})
    u = {a: model.variable(cost, 0.0) for a in starts}
    o = {a: model.variable(cost, 0.0) for a in starts}
    z = [model.variable(cost, 0.0) for _ in windows]
    for i in children:
        a, c = intervals[i].start, intervals[i].end
        # x_i - q_p - u_pk <= 0
        model.link([(column[i], 1.0), (q, -1.0), (u[a], -1.0)])
        w = _window_of(windows, a, c)
        if w is not None:
            # x_i - z_pw - o_pk <= 0
            model.link([(column[i], 1.0), (z[w], -1.0), (o[a], -1.0)])
    if z:
        model.link([*((zw, 1.0) for zw in z), (q, -1.0)])
    for earlier, later in itertools.pairwise(starts):
        model.link([(u[later], 1.0), (u[earlier], -1.0)])
    previous = cascade.since
    for a in starts:
        model.link([(u[a], 1.0), (o[a], -1.0)])
        for b in range(previous, a):
            model.capacity(b, u[a], float(cascade.size))
            model.extra[b] += cascade.size
        # At a_k itself the bytes are p's presence there, which u_pk implies.
        model.capacity(a, o[a], float(cascade.size))
        model.extra[a] += cascade.size
        previous = a + 1


def _disjoint_windows(spans: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Pairwise disjoint windows (a, c], as many as `spans` allow, each holding one span or more.

    A child recomputed in one window needs p there; p's computes in disjoint
    windows are distinct computes, so each can be charged. The ends are chosen
    earliest first (as many windows as possible); each window starts where the
    previous one ended, so it holds every span between the two ends.
    """
    chosen: list[tuple[int, int]] = []
    previous = min(a for a, _ in spans)
    for a, c in sorted(set(spans), key=lambda ac: (ac[1], ac[0])):
        if a >= previous:
            # The window reaches back to the previous one's end: it holds more spans.
            chosen.append((min(a, chosen[-1][1]) if chosen else a, c))
            previous = c
    return tuple(chosen)


def _window_of(windows: Sequence[tuple[int, int]], start: int, end: int) -> int | None:
    """The index of the window (sorted, disjoint) that holds (start, end], if one does."""
    w = bisect.bisect_left(windows, end, key=lambda ac: ac[1])
    if w < len(windows) and windows[w][0] <= start:
        return w
    return None


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
    held: Sequence[int] | None = None,
    time_limit_s: float | None = None,
) -> Bound:
    """The lower bound on the compute of any policy keeping `budget_bytes` between submissions.

    With `held` (bytes on disk other than leaves at the end of each submission,
    as `simulate.RunResult.boundary_bytes`), the bound of any policy keeping at
    each boundary at most the larger of that and the budget: a run that held
    more than the budget at a boundary is only bounded by this one.
    `exact` solves the integer program; `time_limit_s` stops it (see `solve`).
    """
    return solve(
        instance(models, catalog, budget_bytes, held), exact=exact, time_limit_s=time_limit_s
    )

"""How close the engine can come to the bound: the bound's own decisions, replayed.

The lower bound (`bound`) is solved on the planning model, where the budget only
has to hold at submission boundaries. The engine also passes while a workflow
runs, when claims hold what its actions read and what they write is still to
come. `Foresight` replays the bound's solution in the engine (`simulate.run_engine`):
at a pass during submission `t`, a candidate goes first when no interval of it
spans `t` (the sequence does not read it before it is computed again, if ever),
then by how much of its interval spanning `t` the solution drops (x = 1 first),
then by the lowest recompute cost per byte and per submission until its next read.
When evicting every candidate would still leave storage over the mark (claims
hold the excess), only what the solution drops at least half of, or nothing
reads again, goes: as `lineage`, it does not flush what the next submissions read.
Its keep hook declines a new dataset the solution does not keep past the running
submission: it is deleted once its readers there are done, and the passes do not
have to find its room among what the solution keeps.

`Ledger` records what a run computes in each submission and files its recomputes
against the solution (`Distance`): `Foresight`'s own, or another policy's run
(`replay(..., policy=NAME)`).

`Foresight`'s compute is what a policy that knows the whole sequence and the model's
optimum reaches in the engine: one policy's cost, so an upper bound on the
engine's optimum at that budget, where `bound` gives a lower one. Offline, like
the oracle: not a built-in policy (docs/retention.md, "How close the engine can
come to the bound").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pingo.retention.builtin import take_until_freed
from pingo.retention.policy import Candidate, Eviction, NewDatasetInfo
from pingo.simulation import bound, oracle, simulate
from pingo.simulation.sequence import Submission

#: An x this close to 1 is a drop (HiGHS's tolerances).
_DROPPED = 1.0 - 1e-6

_Span = tuple[int, int, float]


def _kept(span: _Span | None) -> bool:
    """Whether the solution keeps the interval `span` (drops less than half of it)."""
    return span is not None and span[2] < 0.5


class Ledger:
    """The solution's intervals, and what a run computed in each submission.

    Its `advance` and `computed` are `simulate.run_engine`'s `on_submission` and
    `on_compute`; `distance` files the run's recomputes against the solution.
    """

    def __init__(self, problem: bound.Instance, solution: bound.Bound) -> None:
        if solution.dropped and len(solution.dropped) != len(problem.intervals):
            raise ValueError("the solution is not one of this problem")
        self._problem, self._solution = problem, solution
        self._spans: dict[str, list[_Span]] = {}
        for n, interval in enumerate(problem.intervals):
            x = solution.dropped[n] if solution.dropped else 0.0
            self._spans.setdefault(interval.dataset, []).append((interval.start, interval.end, x))
        #: The submission running now (`advance`).
        self.submission = 0
        #: (submission, dataset id, runtime) of every action the run computed (`computed`).
        self.computes: list[tuple[int, str, float]] = []

    def advance(self, index: int) -> None:
        """Submission `index` is being planned (`simulate.run_engine`'s `on_submission`)."""
        self.submission = index

    def computed(self, dataset_id: str, runtime_s: float) -> None:
        """An action completed (`simulate.run_engine`'s `on_compute`)."""
        self.computes.append((self.submission, dataset_id, runtime_s))

    def distance(self) -> Distance:
        """Where the run's compute above the unlimited-storage compute went (`Distance`)."""
        seen: set[str] = set()
        kept = dropped = unplanned = 0.0
        for t, dataset, runtime in self.computes:
            if dataset not in seen:
                seen.add(dataset)
                continue
            held = [span for span in self._spans.get(dataset, ()) if span[0] < t <= span[1]]
            if not held:
                unplanned += runtime
            elif _kept(held[0]):
                kept += runtime
            else:
                dropped += runtime
        intervals, solution = self._problem.intervals, self._solution
        # `dropped` is empty when no boundary binds: nothing is charged.
        charged = sum(i.cost_s * x for i, x in zip(intervals, solution.dropped, strict=False))
        return Distance(
            kept_s=kept,
            dropped_s=dropped,
            unplanned_s=unplanned,
            charged_intervals_s=charged,
            charged_cascades_s=solution.compute_s - solution.unlimited_compute_s - charged,
        )


class Foresight(Ledger):
    """Evicts in the order the bound's solution implies (see the module's docstring)."""

    name = "foresight"

    def __init__(self, problem: bound.Instance, solution: bound.Bound) -> None:
        super().__init__(problem, solution)
        #: Passes that chose datasets the solution keeps (x < 0.5), and their bytes.
        self.passes_into_kept = 0
        self.kept_evicted_bytes = 0

    def distance(self) -> Distance:
        return dataclasses.replace(
            super().distance(),
            passes_into_kept=self.passes_into_kept,
            kept_evicted_bytes=self.kept_evicted_bytes,
        )

    def _span(self, dataset_id: str) -> _Span | None:
        """The interval of `dataset_id` spanning the end of the running submission."""
        for span in self._spans.get(dataset_id, ()):
            if span[0] <= self.submission < span[1]:
                return span
        return None

    def _rank(self, candidate: Candidate) -> tuple[int, float, float]:
        span = self._span(candidate.dataset_id)
        if span is None:
            return (0, 0.0, 0.0)
        per_byte = candidate.recompute_cost_s / max(candidate.size_bytes, 1)
        return (1, -span[2], per_byte / max(span[1] - self.submission, 1))

    def _expendable(self, candidate: Candidate) -> bool:
        """Not read again, or at least half dropped by the solution."""
        return not _kept(self._span(candidate.dataset_id))

    def _reason(self, candidate: Candidate) -> str:
        span = self._span(candidate.dataset_id)
        if span is None:
            return "foresight: not read again before it is computed again"
        kept = "dropped" if span[2] >= _DROPPED else f"x={span[2]:.2f}"
        return f"foresight: the bound's solution {kept}, next read at submission {span[1]}"

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        ranked = sorted(candidates, key=self._rank)
        if sum(c.size_bytes for c in ranked) < bytes_to_free:
            # Claims hold the excess: evicting what the solution keeps would not bring
            # storage under the mark, and the next submissions would recompute it.
            ranked = [c for c in ranked if self._expendable(c)]
            bytes_to_free = sum(c.size_bytes for c in ranked)
        chosen = take_until_freed(((c, self._reason(c)) for c in ranked), bytes_to_free)
        self._count_kept(ranked, {e.dataset_id for e in chosen})
        return chosen

    def _count_kept(self, ranked: Sequence[Candidate], chosen: set[str]) -> None:
        kept = sum(
            c.size_bytes for c in ranked if c.dataset_id in chosen and not self._expendable(c)
        )
        if kept:
            self.passes_into_kept += 1
            self.kept_evicted_bytes += kept

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        # What the solution would not keep past this submission is deleted once its
        # readers here are done, instead of waiting for a pass: left stored, it would
        # take room a pass then finds only among what the solution keeps.
        return _kept(self._span(dataset.dataset_id))


@dataclass(frozen=True, slots=True)
class Distance:
    """Where a replay's compute above the unlimited-storage compute went.

    Each recompute (a compute of a dataset after its first) at submission `t`
    falls in the interval `(start, end]` of its dataset that holds `t`, if any.
    `kept_s + dropped_s + unplanned_s` is the run's compute less the unlimited
    one; `charged_intervals_s + charged_cascades_s` is the bound's. The run's
    distance to the bound is `kept_s` (what the solution keeps and the engine did
    not), `dropped_s - charged_intervals_s` (dropped intervals recomputed more
    than once, or the solution's fractions) and `unplanned_s - charged_cascades_s`
    (cascades the relaxation does not charge).
    """

    #: Recomputes inside an interval the solution keeps (x < 0.5).
    kept_s: float
    #: Recomputes inside an interval the solution drops at least half of.
    dropped_s: float
    #: Recomputes no interval holds: parents of recomputed datasets, and reads the
    #: run's own evictions created.
    unplanned_s: float
    #: What the bound charges for dropped intervals (the sum of `x * cost`).
    charged_intervals_s: float
    #: What it charges for cascades (the rest of the bound over the unlimited compute).
    charged_cascades_s: float
    #: Passes that evicted datasets the solution keeps, and the bytes they chose
    #: (`Foresight` only: another policy's passes are not seen).
    passes_into_kept: int | None = None
    kept_evicted_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """A replay (`Foresight`'s, or another policy's), with the bounds around it."""

    run: simulate.RunResult
    capacity_bytes: int
    #: The bound at the budget, whose solution was replayed (or filed against).
    budget_bound: bound.Bound
    #: The bound of what the replay kept at boundaries (`bound.lower_bound`'s `held`).
    own_bound: bound.Bound
    #: Where its compute went, against the solution's charges.
    distance: Distance


async def replay(
    submissions: Sequence[Submission],
    capacity_fraction: float,
    *,
    high_water: float = 0.90,
    low_water: float = 0.75,
    policy: str | None = None,
) -> Replay:
    """Run `Foresight` on the bound's LP solution in the engine, at `capacity_fraction`
    of the working set (the capacity `pingo simulate` gives that fraction).

    With `policy` (a name as `pingo simulate --policy` takes it), that policy runs
    instead, and its recomputes are filed against the same solution.
    """
    models, catalog = oracle.build_models(submissions)
    capacity_bytes = oracle.working_set(models, catalog).capacity_bytes(capacity_fraction)
    budget = int(high_water * capacity_bytes)
    problem = bound.instance(models, catalog, budget)
    solution = bound.solve(problem)
    ledger = Foresight(problem, solution) if policy is None else Ledger(problem, solution)
    run = await simulate.run_engine(
        submissions,
        policy or Foresight.name,
        capacity_bytes,
        high_water=high_water,
        low_water=low_water,
        policy=ledger if isinstance(ledger, Foresight) else None,
        on_submission=ledger.advance,
        on_compute=ledger.computed,
    )
    own = bound.lower_bound(models, catalog, budget, held=run.boundary_bytes)
    return Replay(run, capacity_bytes, solution, own, ledger.distance())

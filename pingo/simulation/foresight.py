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

Its compute is what a policy that knows the whole sequence and the model's
optimum reaches in the engine: one policy's cost, so an upper bound on the
engine's optimum at that budget, where `bound` gives a lower one. Offline, like
the oracle: not a built-in policy (docs/retention.md, "How close the engine can
come to the bound").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pingo.retention.builtin import take_until_freed
from pingo.retention.policy import Candidate, Eviction, NewDatasetInfo
from pingo.simulation import bound, oracle, simulate
from pingo.simulation.sequence import Submission

#: An x this close to 1 is a drop (HiGHS's tolerances).
_DROPPED = 1.0 - 1e-6


class Foresight:
    """Evicts in the order the bound's solution implies (see the module's docstring)."""

    name = "foresight"

    def __init__(self, problem: bound.Instance, solution: bound.Bound) -> None:
        if solution.dropped and len(solution.dropped) != len(problem.intervals):
            raise ValueError("the solution is not one of this problem")
        self._spans: dict[str, list[tuple[int, int, float]]] = {}
        for n, interval in enumerate(problem.intervals):
            x = solution.dropped[n] if solution.dropped else 0.0
            self._spans.setdefault(interval.dataset, []).append((interval.start, interval.end, x))
        #: The submission running now (`advance`).
        self.submission = 0

    def advance(self, index: int) -> None:
        """Submission `index` is being planned (`simulate.run_engine`'s `on_submission`)."""
        self.submission = index

    def _span(self, candidate: Candidate) -> tuple[int, int, float] | None:
        for span in self._spans.get(candidate.dataset_id, ()):
            if span[0] <= self.submission < span[1]:
                return span
        return None

    def _rank(self, candidate: Candidate) -> tuple[int, float, float]:
        span = self._span(candidate)
        if span is None:
            return (0, 0.0, 0.0)
        per_byte = candidate.recompute_cost_s / max(candidate.size_bytes, 1)
        return (1, -span[2], per_byte / max(span[1] - self.submission, 1))

    def _expendable(self, candidate: Candidate) -> bool:
        """Not read again, or at least half dropped by the solution."""
        span = self._span(candidate)
        return span is None or span[2] >= 0.5

    def _reason(self, candidate: Candidate) -> str:
        span = self._span(candidate)
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
        return take_until_freed(((c, self._reason(c)) for c in ranked), bytes_to_free)

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Replay:
    """A foresight replay, with the bounds around it."""

    run: simulate.RunResult
    capacity_bytes: int
    #: The bound at the budget, whose solution was replayed.
    budget_bound: bound.Bound
    #: The bound of what the replay kept at boundaries (`bound.lower_bound`'s `held`).
    own_bound: bound.Bound


async def replay(
    submissions: Sequence[Submission],
    capacity_fraction: float,
    *,
    high_water: float = 0.90,
    low_water: float = 0.75,
) -> Replay:
    """Run `Foresight` on the bound's LP solution in the engine, at `capacity_fraction`
    of the working set (the capacity `pingo simulate` gives that fraction)."""
    models, catalog = oracle.build_models(submissions)
    capacity_bytes = oracle.working_set(models, catalog).capacity_bytes(capacity_fraction)
    budget = int(high_water * capacity_bytes)
    problem = bound.instance(models, catalog, budget)
    solution = bound.solve(problem)
    policy = Foresight(problem, solution)
    run = await simulate.run_engine(
        submissions,
        policy.name,
        capacity_bytes,
        high_water=high_water,
        low_water=low_water,
        policy=policy,
        on_submission=policy.advance,
    )
    own = bound.lower_bound(models, catalog, budget, held=run.boundary_bytes)
    return Replay(run, capacity_bytes, solution, own)

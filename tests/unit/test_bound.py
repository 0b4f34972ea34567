"""The lower bound: below every policy on random instances, and the IP is the true optimum."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import settings as settings_hypothesis
from hypothesis import strategies as st

from pingo.simulation import bound, oracle
from pingo.simulation.oracle import Catalog, SubmissionModel


def random_sequence(
    seed: int, datasets: int, submissions: int
) -> tuple[list[SubmissionModel], Catalog]:
    """Submissions drawn from one random DAG: each an ancestor-closed random subset."""
    rng = random.Random(seed)
    parents = [
        tuple(sorted(rng.sample(range(d), min(d, rng.randint(0, 2))))) for d in range(datasets)
    ]
    catalog = Catalog()
    for d in range(datasets):
        catalog.size[f"d{d}"] = rng.choice([0, 1, 2, 3, 5, 8])
        catalog.runtime[f"d{d}"] = float(rng.randint(1, 9))
        catalog.parents[f"d{d}"] = tuple(f"d{p}" for p in parents[d])
        catalog.family[f"d{d}"] = "f"
    models: list[SubmissionModel] = []
    for index in range(submissions):
        todo = rng.sample(range(datasets), rng.randint(1, min(3, datasets)))
        members: set[int] = set()
        while todo:
            d = todo.pop()
            if d not in members:
                members.add(d)
                todo.extend(parents[d])
        order = sorted(members)
        position = {d: n for n, d in enumerate(order)}
        has_child = {p for d in order for p in parents[d]}
        leaves = tuple(position[d] for d in order if d not in has_child)
        for n in leaves:
            catalog.leaf.add(f"d{order[n]}")
        models.append(
            SubmissionModel(
                index=index,
                family="f",
                datasets=tuple(f"d{d}" for d in order),
                parents=tuple(tuple(position[p] for p in parents[d]) for d in order),
                leaves=leaves,
                runtimes=tuple(catalog.runtime[f"d{d}"] for d in order),
            )
        )
    for ds in catalog.size:
        catalog.last_seen[ds] = submissions
    # A dataset that is a leaf anywhere is never evicted: keep the test's policies honest.
    return models, catalog


Rank = Callable[[str, int], float]


def replay(models: Sequence[SubmissionModel], catalog: Catalog, budget: int, rank: Rank) -> float:
    """Plan each submission, then evict intermediates by `rank` until within the budget."""
    on_disk: set[str] = set()
    compute = 0.0
    for model in models:
        computed, _ = oracle.plan(model, on_disk)
        for n in computed:
            compute += model.runtimes[n]
            on_disk.add(model.datasets[n])
        used = sum(catalog.size[d] for d in on_disk)
        victims = sorted(
            (d for d in on_disk if d not in catalog.leaf), key=lambda d: rank(d, model.index)
        )
        for d in victims:
            if used <= budget:
                break
            on_disk.discard(d)
            used -= catalog.size[d]
    return compute


def policies(seed: int) -> list[Rank]:
    rng = random.Random(seed)
    noise = {f"d{d}": rng.random() for d in range(64)}
    return [
        lambda d, t: noise[d],
        lambda d, t: -noise[d],
        lambda d, t: int(d[1:]),
        lambda d, t: -int(d[1:]),
    ]


@settings_hypothesis(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    datasets=st.integers(2, 8),
    submissions=st.integers(1, 8),
    budget=st.integers(0, 20),
)
def test_the_bound_is_below_every_policy_and_the_lp_below_the_ip(
    seed: int, datasets: int, submissions: int, budget: int
) -> None:
    models, catalog = random_sequence(seed, datasets, submissions)
    lp = bound.lower_bound(models, catalog, budget)
    ip = bound.lower_bound(models, catalog, budget, exact=True)
    assert lp.compute_s <= ip.compute_s + 1e-6
    assert ip.compute_s >= oracle.working_set(models, catalog).unlimited_compute_s - 1e-6
    costs = [replay(models, catalog, budget, rank) for rank in policies(seed)]
    costs.append(oracle.run_oracle(models, catalog, budget).compute_s)
    assert ip.compute_s <= min(costs) + 1e-6


def brute_force(problem: bound.Instance) -> float:
    """The integer optimum by trying every set of dropped intervals and recomputed parents.

    A cascade parent not recomputed after its last read stays on disk from then
    through the latest start of its children's dropped intervals.
    """
    best = float("inf")
    intervals = problem.intervals
    cascades = problem.cascades
    for choice in itertools.product((0, 1), repeat=len(intervals) + len(cascades)):
        dropped, recomputed = choice[: len(intervals)], choice[len(intervals) :]
        kept_at = [0] * len(problem.budgets)
        for iv, x in zip(intervals, dropped, strict=True):
            if not x:
                for b in range(iv.start, iv.end):
                    kept_at[b] += iv.size
        for cascade, w in zip(cascades, recomputed, strict=True):
            starts = [intervals[i].start for i in cascade.children if dropped[i]]
            if starts and not w:
                for b in range(cascade.since, max(starts) + 1):
                    kept_at[b] += cascade.size
        if all(k <= cap for k, cap in zip(kept_at, problem.budgets, strict=True)):
            paid = sum(iv.cost_s for iv, x in zip(intervals, dropped, strict=True) if x)
            paid += sum(c.cost_s for c, w in zip(cascades, recomputed, strict=True) if w)
            best = min(best, paid)
    return problem.unlimited_compute_s + best


@settings_hypothesis(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(0, 12))
def test_the_integer_program_equals_brute_force_on_tiny_instances(seed: int, budget: int) -> None:
    models, catalog = random_sequence(seed, 5, 5)
    problem = bound.instance(models, catalog, budget)
    if len(problem.intervals) + len(problem.cascades) > 14:
        return
    exact = bound.solve(problem, exact=True)
    assert exact.compute_s == pytest.approx(brute_force(problem))


def test_a_dropped_read_pays_for_a_parent_nothing_else_reads() -> None:
    # b (d1) is computed from a (d0), then read by two later submissions for new
    # leaves (d2, d3, d4); with unlimited storage a is never read again: b hides it.
    catalog = Catalog()
    shapes = [("d0", 4, 10.0, ()), ("d1", 4, 1.0, ("d0",))]
    shapes += [(f"d{2 + k}", 0, 1.0, ("d1",)) for k in range(3)]
    for ds, size, runtime, parents in shapes:
        catalog.size[ds], catalog.runtime[ds], catalog.parents[ds] = size, runtime, parents
        catalog.family[ds] = "f"
    models = []
    for k in range(3):
        catalog.leaf.add(f"d{2 + k}")
        models.append(
            SubmissionModel(
                k, "f", ("d0", "d1", f"d{2 + k}"), ((), (0,), (1,)), (2,), (10.0, 1.0, 1.0)
            )
        )
    problem = bound.instance(models, catalog, 4)
    assert [(c.dataset, c.since, len(c.children)) for c in problem.cascades] == [("d0", 0, 2)]
    # Room for one dataset: keep b, and pay only the unlimited 14 s.
    assert bound.solve(problem).compute_s == pytest.approx(14.0)
    # No room: each read of b is a recompute of b (1 s each), and a is gone by the
    # first of them (kept, it would need room): one more recompute of a (10 s).
    starved = bound.instance(models, catalog, 0)
    for result in (bound.solve(starved), bound.solve(starved, exact=True)):
        assert result.compute_s == pytest.approx(26.0)
    assert brute_force(starved) == pytest.approx(26.0)
    # Without the cascade the bound would be 16 s; a real policy pays a twice (36 s).
    assert min(replay(models, catalog, 0, rank) for rank in policies(1)) == pytest.approx(36.0)


def test_a_budget_that_fits_everything_is_the_unlimited_compute() -> None:
    models, catalog = random_sequence(7, 8, 8)
    everything = sum(catalog.size.values())
    result = bound.lower_bound(models, catalog, everything)
    assert result.compute_s == pytest.approx(
        oracle.working_set(models, catalog).unlimited_compute_s
    )


def test_a_starved_budget_charges_every_read() -> None:
    models, catalog = random_sequence(11, 8, 8)
    problem = bound.instance(models, catalog, 0)
    charged = sum(iv.cost_s for iv in problem.intervals if iv.size > 0)
    # With no room at all, every parent a dropped read needs is computed again too.
    charged += sum(
        c.cost_s for c in problem.cascades if any(problem.intervals[i].size for i in c.children)
    )
    assert bound.solve(problem).compute_s == pytest.approx(problem.unlimited_compute_s + charged)

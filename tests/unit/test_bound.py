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


def _closure(starts: Sequence[int], parents: Sequence[Sequence[int]]) -> list[int]:
    """`starts` and all their ancestors, in ascending order (a submission's datasets)."""
    members: set[int] = set()
    todo = list(starts)
    while todo:
        d = todo.pop()
        if d not in members:
            members.add(d)
            todo.extend(parents[d])
    return sorted(members)


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
        order = _closure(rng.sample(range(datasets), rng.randint(1, min(3, datasets))), parents)
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


def leafy_sequence(
    seed: int, datasets: int, submissions: int
) -> tuple[list[SubmissionModel], Catalog]:
    """Each submission a new leaf on a random DAG of intermediates, with its ancestors.

    The intermediates are read again and again while the ones above them are
    hidden (a stored child is reused instead): the shape of a resubmitted
    workflow whose last step changes, where recompute cascades arise.
    """
    rng = random.Random(seed)
    parents = [
        tuple(sorted(rng.sample(range(d), min(d, rng.randint(0, 2))))) for d in range(datasets)
    ]
    catalog = Catalog()
    for d in range(datasets):
        catalog.size[f"d{d}"] = rng.choice([1, 2, 3, 5])
        catalog.runtime[f"d{d}"] = float(rng.randint(1, 9))
        catalog.parents[f"d{d}"] = tuple(f"d{p}" for p in parents[d])
        catalog.family[f"d{d}"] = "f"
    models: list[SubmissionModel] = []
    for index in range(submissions):
        leaf = f"l{index}"
        tops = sorted(rng.sample(range(datasets), rng.randint(1, min(2, datasets))))
        catalog.size[leaf], catalog.runtime[leaf] = 0, 1.0
        catalog.parents[leaf], catalog.family[leaf] = tuple(f"d{t}" for t in tops), "f"
        catalog.leaf.add(leaf)
        order = _closure(tops, parents)
        position = {d: n for n, d in enumerate(order)}
        models.append(
            SubmissionModel(
                index=index,
                family="f",
                datasets=(*(f"d{d}" for d in order), leaf),
                parents=(
                    *(tuple(position[p] for p in parents[d]) for d in order),
                    tuple(position[t] for t in tops),
                ),
                leaves=(len(order),),
                runtimes=(*(catalog.runtime[f"d{d}"] for d in order), 1.0),
            )
        )
    for ds in catalog.size:
        catalog.last_seen[ds] = submissions
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
    """The integer optimum by trying every set of dropped intervals and of parent recomputes.

    For each cascade parent: whether it is computed again after its last read
    outside the windows, and in which windows. Not computed again at all, it
    stays on disk from its last read through the latest start of its children's
    dropped intervals; a dropped child in a window where it is not computed
    needs it on disk at the child's start.
    """
    best = float("inf")
    intervals = problem.intervals
    cascades = problem.cascades
    width = len(intervals) + sum(1 + len(c.windows) for c in cascades)
    for choice in itertools.product((0, 1), repeat=width):
        dropped, rest = choice[: len(intervals)], list(choice[len(intervals) :])
        kept_at = [0] * len(problem.budgets)
        for iv, x in zip(intervals, dropped, strict=True):
            if not x:
                for b in range(iv.start, iv.end):
                    kept_at[b] += iv.size
        paid = sum(iv.cost_s for iv, x in zip(intervals, dropped, strict=True) if x)
        for cascade in cascades:
            again, computed_in = rest[0], rest[1 : 1 + len(cascade.windows)]
            del rest[: 1 + len(cascade.windows)]
            recomputes = max(again, sum(computed_in))
            paid += cascade.cost_s * recomputes
            present: set[int] = set()
            starts = [intervals[i].start for i in cascade.children if dropped[i]]
            if starts and not recomputes:
                present.update(range(cascade.since, max(starts) + 1))
            for i in cascade.children:
                iv = intervals[i]
                for (a, c), z in zip(cascade.windows, computed_in, strict=True):
                    if dropped[i] and a <= iv.start and iv.end <= c and not z:
                        present.add(iv.start)
            for b in present:
                kept_at[b] += cascade.size
        if all(k <= cap for k, cap in zip(kept_at, problem.budgets, strict=True)):
            best = min(best, paid)
    return problem.unlimited_compute_s + best


def optimum(
    models: Sequence[SubmissionModel],
    catalog: Catalog,
    budget: int,
    held: Sequence[int] | None = None,
) -> float:
    """The least compute of any policy of the model: every choice of what to keep, at every end.

    A policy keeps, at the end of each submission, any set of intermediates on
    disk that fits the budget beside the leaves (all intermediates go when the
    leaves alone exceed it): dynamic programming over the sets on disk. With
    `held`, it may keep up to `held[b]` bytes of intermediates at the end of
    submission b whatever the budget (as the engine may: `bound.instance`).
    """
    states: dict[frozenset[str], float] = {frozenset(): 0.0}
    for model in models:
        following: dict[frozenset[str], float] = {}
        for on_disk, paid in states.items():
            computed, _ = oracle.plan(model, on_disk)
            after = set(on_disk) | {model.datasets[n] for n in computed}
            cost = paid + sum(model.runtimes[n] for n in computed)
            leaves = frozenset(d for d in after if d in catalog.leaf)
            room = max(0, budget - sum(catalog.size[d] for d in leaves))
            if held is not None:
                room = max(room, held[model.index])
            free = sorted(after - leaves)
            for r in range(len(free) + 1):
                for keep in itertools.combinations(free, r):
                    if sum(catalog.size[d] for d in keep) <= room:
                        state = leaves | frozenset(keep)
                        following[state] = min(following.get(state, float("inf")), cost)
        states = following
    return min(states.values())


@settings_hypothesis(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    datasets=st.integers(2, 7),
    submissions=st.integers(1, 7),
    budget=st.integers(0, 16),
)
@pytest.mark.parametrize("shape", [random_sequence, leafy_sequence])
def test_the_integer_program_is_below_the_exact_optimum_of_any_policy(
    shape: Callable[[int, int, int], tuple[list[SubmissionModel], Catalog]],
    seed: int,
    datasets: int,
    submissions: int,
    budget: int,
) -> None:
    models, catalog = shape(seed, datasets, submissions)
    best = optimum(models, catalog, budget)
    ip = bound.lower_bound(models, catalog, budget, exact=True)
    lp = bound.lower_bound(models, catalog, budget)
    assert lp.compute_s <= ip.compute_s + 1e-6
    assert ip.compute_s <= best + 1e-6


@settings_hypothesis(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    datasets=st.integers(2, 6),
    submissions=st.integers(1, 6),
    budget=st.integers(0, 12),
    data=st.data(),
)
@pytest.mark.parametrize("shape", [random_sequence, leafy_sequence])
def test_with_what_a_run_held_at_boundaries_the_bound_is_below_any_such_policy(
    shape: Callable[[int, int, int], tuple[list[SubmissionModel], Catalog]],
    seed: int,
    datasets: int,
    submissions: int,
    budget: int,
    data: st.DataObject,
) -> None:
    # The engine may end a submission with more than the budget on disk: a policy
    # allowed held[b] bytes of intermediates at boundary b is bounded with them.
    models, catalog = shape(seed, datasets, submissions)
    held = data.draw(st.lists(st.integers(0, 12), min_size=submissions, max_size=submissions))
    ip = bound.lower_bound(models, catalog, budget, held=held, exact=True)
    lp = bound.lower_bound(models, catalog, budget, held=held)
    assert lp.compute_s <= ip.compute_s + 1e-6
    assert ip.compute_s <= optimum(models, catalog, budget, held) + 1e-6
    # More room never raises the bound.
    assert lp.compute_s <= bound.lower_bound(models, catalog, budget).compute_s + 1e-6


@settings_hypothesis(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    datasets=st.integers(2, 7),
    submissions=st.integers(1, 7),
    budget=st.integers(0, 16),
)
@pytest.mark.parametrize("shape", [random_sequence, leafy_sequence])
def test_an_integer_solve_stopped_at_once_proves_the_lp_and_no_more(
    shape: Callable[[int, int, int], tuple[list[SubmissionModel], Catalog]],
    seed: int,
    datasets: int,
    submissions: int,
    budget: int,
) -> None:
    models, catalog = shape(seed, datasets, submissions)
    lp = bound.lower_bound(models, catalog, budget)
    stopped = bound.lower_bound(models, catalog, budget, exact=True, time_limit_s=0.0)
    assert lp.compute_s - 1e-6 <= stopped.compute_s <= optimum(models, catalog, budget) + 1e-6
    if stopped.exact:
        # Nothing could bind, or HiGHS's presolve solved the program before the clock counted.
        ip = bound.lower_bound(models, catalog, budget, exact=True)
        assert stopped.compute_s == pytest.approx(ip.compute_s)
    else:
        # Stopped before the root node: no dual bound, no solution, the LP's value proved.
        assert stopped.compute_s == pytest.approx(lp.compute_s)
        assert stopped.lp_compute_s == pytest.approx(lp.compute_s)
        assert (stopped.dual_compute_s, stopped.integer_upper_s) == (None, None)


@pytest.mark.parametrize("time_limit_s", [0.01, 0.05, 0.2, None])
@pytest.mark.parametrize(("seed", "budget"), [(1, 5), (3, 15), (5, 5)])
def test_a_stopped_integer_solve_brackets_the_integer_optimum(
    seed: int, budget: int, time_limit_s: float | None
) -> None:
    # Instances large enough (100 to 125 intervals) for HiGHS to branch for a
    # fraction of a second: where the limit stops it depends on the machine, so
    # the test holds whatever was reached, finished included (None).
    models, catalog = leafy_sequence(seed, 80, 80)
    problem = bound.instance(models, catalog, budget)
    ip = bound.solve(problem, exact=True)
    lp = bound.solve(problem)
    assert ip.exact and ip.integer_upper_s == pytest.approx(ip.compute_s)
    assert ip.dual_compute_s is not None and ip.dual_compute_s >= lp.compute_s - 1e-6
    found = bound.solve(problem, exact=True, time_limit_s=time_limit_s)
    assert lp.compute_s - 1e-6 <= found.compute_s <= ip.compute_s + 1e-6
    if found.integer_upper_s is not None:
        assert found.integer_upper_s >= ip.compute_s - 1e-6
    if found.exact:
        assert found.compute_s == pytest.approx(ip.compute_s)
        return
    # Stopped: before the root node is solved, HiGHS's dual bound can be below the
    # LP's value (even minus infinity), so the larger of the two is what is proved.
    assert found.lp_compute_s == pytest.approx(lp.compute_s)
    floors = [lp.compute_s] + ([found.dual_compute_s] if found.dual_compute_s is not None else [])
    assert found.compute_s == pytest.approx(max(floors))


def test_held_bytes_replace_a_smaller_budget_only() -> None:
    models, catalog = random_sequence(3, 6, 5)
    plain = bound.instance(models, catalog, 4).budgets
    held = [0, 9, 2, 9, 0]
    assert bound.instance(models, catalog, 4, held).budgets == tuple(
        max(b, h) for b, h in zip(plain, held, strict=True)
    )
    with pytest.raises(ValueError, match="held has 2 boundaries for 5 submissions"):
        bound.instance(models, catalog, 4, [1, 2])


@settings_hypothesis(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), budget=st.integers(0, 12))
@pytest.mark.parametrize("shape", [random_sequence, leafy_sequence])
def test_the_integer_program_equals_brute_force_on_tiny_instances(
    shape: Callable[[int, int, int], tuple[list[SubmissionModel], Catalog]], seed: int, budget: int
) -> None:
    models, catalog = shape(seed, 5, 5)
    problem = bound.instance(models, catalog, budget)
    if len(problem.intervals) + sum(1 + len(c.windows) for c in problem.cascades) > 14:
        return
    exact = bound.solve(problem, exact=True)
    assert exact.compute_s == pytest.approx(brute_force(problem))


def _two_reads_of_a_child() -> tuple[list[SubmissionModel], Catalog]:
    """b (d1, 4 bytes, 1 s) is computed from a (d0, 4 bytes, 10 s), then read by two
    later submissions for new leaves (d2, d3, d4): with unlimited storage a is never
    read again, b hides it."""
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
    return models, catalog


def test_a_dropped_read_pays_for_a_parent_nothing_else_reads() -> None:
    models, catalog = _two_reads_of_a_child()
    problem = bound.instance(models, catalog, 4)
    assert [(c.dataset, c.since, len(c.children)) for c in problem.cascades] == [("d0", 0, 2)]
    # Room for one dataset: keep b, and pay only the unlimited 14 s.
    assert bound.solve(problem).compute_s == pytest.approx(14.0)
    # No room: each read of b is a recompute of b (1 s each), and each needs a
    # again (10 s each), which has no room to stay between them: 36 s, what a
    # real policy pays. Without the cascade the bound was 16 s; charging a once
    # per parent, not once per disjoint window of its children's reads, 26 s.
    starved = bound.instance(models, catalog, 0)
    assert [c.windows for c in starved.cascades] == [((0, 1), (1, 2))]
    for result in (bound.solve(starved), bound.solve(starved, exact=True)):
        assert result.compute_s == pytest.approx(36.0)
    assert brute_force(starved) == pytest.approx(36.0)
    assert optimum(models, catalog, 0) == pytest.approx(36.0)
    assert min(replay(models, catalog, 0, rank) for rank in policies(1)) == pytest.approx(36.0)
    # A run that kept 4 bytes at every boundary anyway (as the engine may: leaves
    # over the budget, a throttled pass) could keep b: its bound is 14 s again.
    held = bound.lower_bound(models, catalog, 0, held=[4, 4, 4], exact=True)
    assert held.compute_s == pytest.approx(14.0)
    assert optimum(models, catalog, 0, [4, 4, 4]) == pytest.approx(14.0)


def test_the_solution_says_which_intervals_the_bound_drops() -> None:
    models, catalog = _two_reads_of_a_child()
    roomy = bound.instance(models, catalog, 4)
    starved = bound.instance(models, catalog, 0)
    for exact in (False, True):
        kept = bound.solve(roomy, exact=exact)
        assert len(kept.dropped) == len(roomy.intervals)
        assert kept.dropped == pytest.approx([0.0] * len(roomy.intervals))
        # No room: b's two intervals are dropped whole.
        assert bound.solve(starved, exact=exact).dropped == pytest.approx([1.0, 1.0])
    # Without cascades, the solution costs exactly the bound above the unlimited compute.
    models, catalog = random_sequence(5, 8, 10)
    problem = bound.instance(models, catalog, 6)
    plain = bound.Instance(problem.intervals, problem.budgets, problem.unlimited_compute_s)
    found = bound.solve(plain)
    paid = sum(iv.cost_s * x for iv, x in zip(plain.intervals, found.dropped, strict=True))
    assert found.compute_s == pytest.approx(plain.unlimited_compute_s + paid)
    assert all(0.0 <= x <= 1.0 for x in found.dropped)


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
    # With no room at all, every parent a dropped read needs is computed again too,
    # once in each window that holds such a read.
    for c in problem.cascades:
        dropped = [problem.intervals[i] for i in c.children if problem.intervals[i].size]
        windows = {w for w in c.windows for iv in dropped if w[0] <= iv.start and iv.end <= w[1]}
        if dropped:
            charged += c.cost_s * max(1, len(windows))
    assert bound.solve(problem).compute_s == pytest.approx(problem.unlimited_compute_s + charged)

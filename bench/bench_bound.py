"""The retention lower bound: how long the LP takes on a 200-submission sweep.

bound_200_s  the LP lower bound (`pingo.simulation.bound`, HiGHS through scipy) for the
             200-submission sequence over the seven shipped WfCommons traces (seed 1),
             at every default capacity of `pingo simulate` (5, 10, 20, 50% of the
             working set), the planning model included; target < 30 s

Loading the traces and generating the sequence are not timed.

`python -m bench.bench_bound --tightness SECONDS [--seed N ...]` (not part of
`make bench`: it takes SECONDS per seed) measures how tight the bound is at full
scale: for the 200-submission sequences `pingo simulate` replays (seeds 1 to 3
unless given, 5% of the working set), the LP, HiGHS's dual bound and best
integer solution after at most SECONDS of integer solving (docs/retention.md,
"How tight").

`python -m bench.bench_bound --foresight [--seed N ...] [--capacity F ...]` (not part
of `make bench` either: about 20 s per cell) replays the LP's solution in the engine
(`pingo.simulation.foresight`) for those seeds (default 1 to 3) and capacities
(default 2, 5, 10 and 20% of the working set): how close a policy that knows the
model's optimum comes to the bound once the engine's passes during runs and its
claims count (docs/retention.md, "How close the engine can come to the bound").
With `--policy NAME` (as `pingo simulate --policy` takes it), that policy runs
instead and its recomputes are filed against the same LP solution: where its
distance to the bound goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

# The sequence bench_simulate replays (200 submissions, seed 1), cached there.
from bench.bench_simulate import _sequence
from pingo.simulation import bound, foresight, oracle, simulate, traces
from pingo.simulation.sequence import Submission

HIGH_WATER = 0.90


def measure() -> dict[str, float]:
    """The bound at each default capacity, for one sequence."""
    subs = _sequence()
    started = time.perf_counter()
    models, catalog = oracle.build_models(subs)
    ws = oracle.working_set(models, catalog)
    for fraction in simulate.DEFAULT_CAPACITIES:
        bound.lower_bound(models, catalog, int(HIGH_WATER * fraction * ws.bytes))
    return {"bound_200_s": time.perf_counter() - started}


def _shipped_sequence(seed: int) -> tuple[Submission, ...]:
    """The 200 submissions `pingo simulate` replays for `seed` over the shipped traces."""
    return simulate._sequence(tuple(str(p) for p in traces.shipped_traces()), 200, seed)


def tightness(time_limit_s: float, seeds: tuple[int, ...] = (1, 2, 3)) -> list[dict[str, object]]:
    """LP, dual bound and best integer solution at 5% for each seed, the sequence of `simulate`."""
    rows: list[dict[str, object]] = []
    for seed in seeds:
        models, catalog = oracle.build_models(_shipped_sequence(seed))
        ws = oracle.working_set(models, catalog)
        budget = int(HIGH_WATER * ws.capacity_bytes(0.05))
        found = bound.lower_bound(models, catalog, budget, exact=True, time_limit_s=time_limit_s)
        rows.append(
            {
                "seed": seed,
                "lp_s": found.lp_compute_s,
                "proved_s": found.compute_s,
                "dual_s": found.dual_compute_s,
                "integer_s": found.integer_upper_s,
                "optimal": found.exact,
                "solve_s": round(found.solve_s, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def foresight_replays(
    seeds: tuple[int, ...] = (1, 2, 3),
    fractions: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2),
    policy: str | None = None,
) -> list[dict[str, object]]:
    """The foresight replay (or `policy`'s run) of each seed and capacity, with its own
    bound and the budget's, and where its compute went against the LP's solution."""
    rows: list[dict[str, object]] = []
    for seed in seeds:
        subs = _shipped_sequence(seed)
        for fraction in fractions:
            found = asyncio.run(
                foresight.replay(subs, fraction, high_water=HIGH_WATER, policy=policy)
            )
            spent = found.distance
            rows.append(
                {
                    "seed": seed,
                    "capacity": fraction,
                    "policy": found.run.policy,
                    "bound_s": round(found.budget_bound.compute_s),
                    "compute_s": round(found.run.compute_s),
                    "x_own_bound": round(found.run.compute_s / found.own_bound.compute_s, 3),
                    "peak_x_capacity": round(found.run.peak_bytes / found.capacity_bytes, 2),
                    # Its distance to the budget's bound, by cause (foresight.Distance).
                    "kept_recomputed_s": round(spent.kept_s),
                    "dropped_beyond_charge_s": round(spent.dropped_s - spent.charged_intervals_s),
                    "cascades_beyond_charge_s": round(spent.unplanned_s - spent.charged_cascades_s),
                    # Foresight's own passes only (None for another policy).
                    "passes_into_kept": spent.passes_into_kept,
                    "kept_evicted_gb": None
                    if spent.kept_evicted_bytes is None
                    else round(spent.kept_evicted_bytes / 1e9, 1),
                    "wall_s": round(found.run.wall_s, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.bench_bound")
    parser.add_argument("--tightness", type=float, metavar="SECONDS", default=None)
    parser.add_argument("--foresight", action="store_true")
    parser.add_argument("--seed", type=int, action="append", help="default 1-3")
    parser.add_argument("--capacity", type=float, action="append", help="with --foresight")
    parser.add_argument(
        "--policy", help="with --foresight: run this policy instead, filed against the LP"
    )
    args = parser.parse_args()
    seeds = tuple(args.seed or (1, 2, 3))
    if args.foresight:
        foresight_replays(seeds, tuple(args.capacity or (0.02, 0.05, 0.1, 0.2)), args.policy)
    elif args.tightness is None:
        print(json.dumps(measure(), indent=2))
    else:
        tightness(args.tightness, seeds)

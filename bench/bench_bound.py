"""The retention lower bound: how long the LP takes on a 200-submission sweep.

bound_200_s  the LP lower bound (`pingo.simulation.bound`, HiGHS through scipy) for the
             200-submission sequence over the seven shipped WfCommons traces (seed 1),
             at every default capacity of `pingo simulate` (5, 10, 20, 50% of the
             working set), the planning model included; target < 30 s

Loading the traces and generating the sequence are not timed.
"""

from __future__ import annotations

import json
import time

# The sequence bench_simulate replays (200 submissions, seed 1), cached there.
from bench.bench_simulate import _sequence
from pingo.simulation import bound, oracle, simulate

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


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

"""The retention lower bound: how long the LP takes on a 200-submission sweep.

bound_200_s  the LP lower bound (`pingo.retention.bound`, HiGHS through scipy) for the
             200-submission sequence over the seven shipped WfCommons traces (seed 1),
             at every default capacity of `pingo simulate` (5, 10, 20, 50% of the
             working set), the planning model included; target < 30 s

Loading the traces and generating the sequence are not timed.
"""

from __future__ import annotations

import functools
import json
import time

from bench import _workloads
from pingo.retention import bound, oracle, sequence, simulate, traces

SUBMISSIONS = 200
SEED = 1
HIGH_WATER = 0.90


@functools.cache
def _sequence() -> tuple[sequence.Submission, ...]:
    paths = sorted(_workloads.shared_file(p) for p in _workloads.TRACES_DIR.glob("*.json"))
    return tuple(sequence.generate(traces.load_families(paths), SUBMISSIONS, SEED))


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

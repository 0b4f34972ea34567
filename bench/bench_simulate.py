"""`pingo simulate`: how long the real engine takes to replay a trace study.

simulate_200_s         200 submissions over the seven shipped WfCommons traces (seed 1, Zipf
                       1.1, perturbations accumulating per family) replayed through the real
                       WorkflowManager, OutcomeService, RetentionLoop and Deletor on the
                       in-memory store, with `gdsf` at 20% of the working set; target < 60 s
simulate_oracle_200_s  the same sequence's planning model and offline oracle at 20%

Loading and converting the traces and generating the sequence are not timed. Seed 1
makes the 1,738-action Montage the most popular family (75 of the 200 submissions),
the heaviest of the seeds the docs report.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time

from bench import _workloads
from pingo.simulation import oracle, sequence, simulate, traces

#: One run replays 200 workflows (tens of seconds): once is enough.
RUNS = 1
SUBMISSIONS = 200
SEED = 1
POLICY = "gdsf"
CAPACITY = 0.20


@functools.cache
def _sequence() -> tuple[sequence.Submission, ...]:
    paths = sorted(_workloads.shared_file(p) for p in _workloads.TRACES_DIR.glob("*.json"))
    return tuple(sequence.generate(traces.load_families(paths), SUBMISSIONS, SEED))


def measure() -> dict[str, float]:
    """One replay, and the oracle for the same sequence."""
    subs = _sequence()
    started = time.perf_counter()
    models, catalog = oracle.build_models(subs)
    ws = oracle.working_set(models, catalog)
    capacity = int(CAPACITY * ws.bytes)
    oracle.run_oracle(models, catalog, int(0.9 * capacity))
    oracle_s = time.perf_counter() - started
    started = time.perf_counter()
    asyncio.run(simulate.run_engine(subs, POLICY, capacity))
    return {"simulate_200_s": time.perf_counter() - started, "simulate_oracle_200_s": oracle_s}


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

"""The workflow language: parse, validate and compute provenance ids.

validate_montage_ms  the 1,738-action Montage workflow (make_workloads.py wfcommons
                     ../shared/traces/montage-chameleon-2mass-05d-001.json), target < 100 ms
validate_100k_s      a 100,000-action layered workflow (make_workloads.py layered
                     --layers 100 --width 1000), target < 5 s

Each figure is `language.parse` on the document's JSON bytes (as an HTTP body
arrives) followed by `provenance.dataset_ids` in the server scope. Generating the
workloads and one warm-up parse (which compiles the schema validators and loads
the action-type plug-ins, once per process) are not timed.
"""

from __future__ import annotations

import functools
import json
import time

from bench import _workloads
from pingo.workflows import language, provenance


@functools.cache
def _documents() -> tuple[bytes, bytes]:
    montage = json.dumps(_workloads.montage()).encode()
    layered = json.dumps(_workloads.layered(layers=100, width=1000, fanin=2, seed=1)).encode()
    return montage, layered


def _time_s(document: bytes) -> float:
    started = time.perf_counter()
    definition = language.parse(document)
    provenance.dataset_ids(definition, provenance.SERVER_SCOPE)
    return time.perf_counter() - started


def measure() -> dict[str, float]:
    """One run of both figures."""
    montage, layered = _documents()
    language.parse(json.dumps(_workloads.small_workflow(0)))  # warm-up, not timed
    return {
        "validate_montage_ms": _time_s(montage) * 1000,
        "validate_100k_s": _time_s(layered),
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

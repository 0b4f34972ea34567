"""The command line's start-up: `pingo validate` on a small document, as a user runs it.

cli_validate_s       wall time of `pingo validate examples/wordcount.json` (5 actions) in a
                     fresh process: interpreter start, imports, parse, validate, exit;
                     target < 0.3 s (issue 14)
cli_validate_cpu_s   the CPU time (user + system) of that process: steadier than wall time
                     when other work shares the cores
cli_python_floor_s   the same wall time for `python -c pass` with the same interpreter: what
                     any Python command costs here, to read the figure above against

Each run times one process of each, one after the other, so both see the same load,
after one untimed `pingo validate` that lets Python cache its bytecode: a user's second
command starts from that cache, and so do these (PYTHONDONTWRITEBYTECODE is dropped for
them; with it set, every import compiles its source again).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINGO = str(Path(sys.executable).parent / "pingo")
DOCUMENT = REPO / "examples" / "wordcount.json"
RUNS = 5


#: The environment of the timed processes: bytecode is cached as on a user's machine.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO, env=_ENV)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def measure() -> dict[str, float]:
    """One timed `pingo validate` and one timed bare interpreter."""
    _run([PINGO, "validate", str(DOCUMENT)])  # warm-up: bytecode cached, not timed
    wall_s, cpu_s = _run([PINGO, "validate", str(DOCUMENT)])
    floor_s, _ = _run([sys.executable, "-c", "pass"])
    return {"cli_validate_s": wall_s, "cli_validate_cpu_s": cpu_s, "cli_python_floor_s": floor_s}


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

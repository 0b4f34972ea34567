"""Luigi on the same 1,000-task DAG as Pingo's `true_makespan_s`, run as its docs recommend.

luigi_local_true_makespan_s   `luigi.build([Root()], workers=2, local_scheduler=True)`:
                              one WrapperTask root requiring the DAG's sinks; each task
                              spawns `true` and writes its marker file (a LocalTarget)
luigi_luigid_true_makespan_s  the same build against a central scheduler `luigid` on a
                              loopback port (started before the timer, stopped after)
luigi_local_rerun_s,          the same build again, every task already complete
luigi_luigid_rerun_s

One run does one build of each kind, the local scheduler first; the harness runs the module
`RUNS` times, so every figure is a median of at least three. `luigi_true_makespan_s` (the
faster of the two medians) and `luigi_speedup` (Luigi ÷ Pingo, same `make bench` run) are
derived by the harness (`bench.DERIVED`) once every module has run.

Luigi's documented way to ask for many targets is one `WrapperTask` whose `requires()`
returns them: a list of targets handed to `luigi.build` makes the worker restart its
dependency walk per target, which with `luigid` turns every step into an RPC. Only logging
is turned down (to WARNING) so a terminal does not measure Luigi's per-task INFO lines.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import luigi

from bench import _workloads

RUNS = 3
WORKERS = 2
HOST = "127.0.0.1"
LUIGID_START_TIMEOUT_S = 30.0

# The DAG the tasks walk: action id -> parent ids. A module global rather than a task
# parameter because Luigi parameters must be strings on the wire; the worker forks each
# task process, so the children inherit it as it was set before `luigi.build`.
_PARENTS: dict[int, tuple[int, ...]] = {}


class TrueTask(luigi.Task):
    """One action of the DAG: spawn `true`, then write the marker file."""

    action_id = luigi.IntParameter()
    root = luigi.Parameter()

    def requires(self) -> list[TrueTask]:
        parents = _PARENTS[self.action_id]
        return [TrueTask(action_id=p, root=self.root) for p in parents]  # type: ignore[no-untyped-call]

    def output(self) -> luigi.LocalTarget:
        path = os.path.join(self.root, f"{self.action_id}.done")
        return luigi.LocalTarget(path)  # type: ignore[no-untyped-call]

    def run(self) -> None:
        subprocess.run(["true"], check=True)
        # LocalTarget writes through a temporary file renamed into place, as real tasks do.
        with self.output().open("w") as marker:  # type: ignore[no-untyped-call]
            marker.write("")


class Root(luigi.WrapperTask):
    """The one task asked for: complete when every sink of the DAG is."""

    root = luigi.Parameter()

    def requires(self) -> list[TrueTask]:
        return [TrueTask(action_id=a, root=self.root) for a in _sinks(_PARENTS)]  # type: ignore[no-untyped-call]


def _luigid_bin() -> str:
    beside = Path(sys.executable).parent / "luigid"
    found = str(beside) if beside.exists() else shutil.which("luigid")
    if not found:
        raise FileNotFoundError("luigid not found: install the bench group (uv sync --all-groups)")
    return found


class Luigid:
    """A `luigid` central scheduler on a free loopback port, for the duration of a build."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _workloads.free_port(HOST)
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Luigid:
        logdir = self.workdir / "luigid-log"
        logdir.mkdir()
        config = self.workdir / "luigi.cfg"
        # An isolated config: no user/system luigi.cfg, no task history database.
        config.write_text("[scheduler]\nrecord_task_history = false\n")
        env = dict(os.environ, LUIGI_CONFIG_PATH=str(config))
        self.process = subprocess.Popen(
            [
                _luigid_bin(),
                "--port",
                str(self.port),
                "--address",
                HOST,
                "--state-path",
                str(self.workdir / "luigid-state.pickle"),
                "--logdir",
                str(logdir),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_accepting()
        return self

    def _wait_accepting(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + LUIGID_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"luigid exited with status {self.process.returncode}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise TimeoutError(f"luigid did not listen on {HOST}:{self.port} within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def _quiet_luigi() -> None:
    for name in ("luigi", "luigi-interface", "luigi.scheduler", "luigi.worker"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _build(root: Path, port: int | None) -> float:
    """One `luigi.build` of the WrapperTask (luigid on `port`, or the local scheduler)."""
    scheduler: dict[str, Any] = (
        {"local_scheduler": True}
        if port is None
        else {"local_scheduler": False, "scheduler_host": HOST, "scheduler_port": port}
    )
    started = time.perf_counter()
    ok = luigi.build(  # type: ignore[no-untyped-call]
        [Root(root=str(root))],  # type: ignore[no-untyped-call]
        workers=WORKERS,
        detailed_summary=False,
        log_level="WARNING",
        **scheduler,
    )
    elapsed = time.perf_counter() - started
    if not ok:
        raise RuntimeError("luigi.build reported a scheduling failure")
    return elapsed


def _sinks(parents: dict[int, tuple[int, ...]]) -> list[int]:
    has_child = {p for ps in parents.values() for p in ps}
    return [a for a in sorted(parents) if a not in has_child]


def _build_twice(workdir: Path, port: int | None) -> tuple[float, float]:
    """A fresh build of the whole DAG, then the all-complete rebuild; both in seconds."""
    root = workdir / ("markers-local" if port is None else "markers-luigid")
    root.mkdir()
    makespan_s = _build(root, port)
    done = len(list(root.glob("*.done")))
    if done != len(_PARENTS):
        raise RuntimeError(f"Luigi completed {done} of {len(_PARENTS)} tasks")
    return makespan_s, _build(root, port)


def measure() -> dict[str, float]:
    """Build layered-1000 with the local scheduler, then against luigid; each twice."""
    _PARENTS.clear()
    _PARENTS.update(_workloads.parents(_workloads.layered_1000()))
    _quiet_luigi()
    with tempfile.TemporaryDirectory(prefix="pingo-bench-luigi-") as tmp:
        workdir = Path(tmp)
        local_s, local_rerun_s = _build_twice(workdir, None)
        with Luigid(workdir) as luigid:
            luigid_s, luigid_rerun_s = _build_twice(workdir, luigid.port)
    return {
        "luigi_local_true_makespan_s": local_s,
        "luigi_local_rerun_s": local_rerun_s,
        "luigi_luigid_true_makespan_s": luigid_s,
        "luigi_luigid_rerun_s": luigid_rerun_s,
    }


if __name__ == "__main__":
    print(measure())

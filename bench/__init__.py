"""Pingo's benchmark suite: `make bench` (or `python -m bench`).

Every `bench/bench_*.py` module exposes `measure() -> dict[str, float]`, which does ONE
run and returns named figures. The harness here discovers those modules, runs each one
several times (in its own child process, so a crash, a hang or a leaked thread in one
benchmark cannot spoil the others), and reduces every figure to its median with min and
max beside it. The result is one flat JSON object, `bench/results/latest.json`, together
with the machine and the git commit it was measured on. Figures are never asserted:
the targets below only colour the printed table.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

#: This package's directory: where `bench_*.py` modules are discovered by default.
BENCH_DIR = Path(__file__).resolve().parent
#: The repository root (for `git`).
REPO_DIR = BENCH_DIR.parent
RESULTS_PATH = BENCH_DIR / "results" / "latest.json"
DEFAULT_RUNS = 3
#: Wall-clock limit for one module (all its runs), in seconds.
DEFAULT_TIMEOUT_S = 420.0
#: `wire_claims_per_s` before issue 15 (f803a49, this 2-core VM, 2026-11-22): the goal is 5x.
WIRE_CLAIMS_BEFORE_PER_S = 287.0
PREFIX = "bench_"


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One discovered benchmark module: `name` is `bench_luigi`, `short` is `luigi`."""

    name: str
    path: Path

    @property
    def short(self) -> str:
        return self.name.removeprefix(PREFIX)


@dataclass(slots=True)
class Outcome:
    """What running one benchmark module produced: its runs, and an error if any."""

    benchmark: Benchmark
    runs: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure reduced over its runs."""

    name: str
    median: float
    min: float
    max: float
    runs: int


# --------------------------------------------------------------------------- discovery


def discover(directory: Path = BENCH_DIR) -> list[Benchmark]:
    """Every `bench_*.py` module in `directory`, sorted by name."""
    return [
        Benchmark(path.stem, path)
        for path in sorted(directory.glob(f"{PREFIX}*.py"))
        if path.is_file() and path.stem.isidentifier()
    ]


def select(benchmarks: Sequence[Benchmark], only: Iterable[str]) -> list[Benchmark]:
    """The benchmarks named in `only` (`engine` or `bench_engine`); unknown names raise."""
    wanted = [n.strip() for n in only if n.strip()]
    by_name = {b.short: b for b in benchmarks} | {b.name: b for b in benchmarks}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        known = ", ".join(b.short for b in benchmarks) or "none"
        raise LookupError(f"no benchmark named {', '.join(unknown)} (known: {known})")
    chosen = {by_name[n].name: by_name[n] for n in wanted}
    return [b for b in benchmarks if b.name in chosen]


def load(benchmark: Benchmark) -> ModuleType:
    """Import a benchmark module: as `bench.<name>` when it lives in this package."""
    if benchmark.path.parent.resolve() == BENCH_DIR:
        return importlib.import_module(f"{__name__}.{benchmark.name}")
    # A module outside the package (the harness's own tests) is loaded from its file.
    spec = importlib.util.spec_from_file_location(benchmark.name, benchmark.path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {benchmark.path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[benchmark.name] = module
    spec.loader.exec_module(module)
    return module


def runs_for(module: ModuleType, requested: int | None) -> int:
    """`--runs` when given, else the module's `RUNS`, else `DEFAULT_RUNS`."""
    if requested is not None:
        return max(1, requested)
    runs = getattr(module, "RUNS", DEFAULT_RUNS)
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise TypeError(f"RUNS must be a positive int, not {runs!r}")
    return runs


# --------------------------------------------------------------------------- running


def check_figures(result: object) -> dict[str, float]:
    """Validate what `measure()` returned: a mapping of names to finite numbers."""
    if not isinstance(result, Mapping):
        raise TypeError(f"measure() must return dict[str, float], not {type(result).__name__}")
    figures: dict[str, float] = {}
    for name, value in result.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"figure name {name!r} is not an identifier")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"figure {name} is {value!r}, not a number")
        if not math.isfinite(value):
            raise ValueError(f"figure {name} is {value!r}")
        figures[name] = float(value)
    return figures


def run_in_process(
    benchmark: Benchmark,
    runs: int | None = None,
    on_run: Callable[[dict[str, float]], None] = lambda _: None,
) -> Outcome:
    """Import `benchmark` and call its `measure()` `runs` times in this process.

    An exception stops this module's remaining runs; the runs already done are kept.
    """
    outcome = Outcome(benchmark)
    started = time.perf_counter()
    try:
        module = load(benchmark)
        measure = getattr(module, "measure", None)
        if not callable(measure):
            raise TypeError(f"{benchmark.name} has no measure() function")
        for _ in range(runs_for(module, runs)):
            figures = check_figures(measure())
            outcome.runs.append(figures)
            on_run(figures)
    except Exception as exc:  # any failure is a reported result, never a crash
        outcome.error = _describe(exc)
        traceback.print_exc()
    outcome.wall_s = time.perf_counter() - started
    return outcome


def run_isolated(
    benchmark: Benchmark,
    runs: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    scratch: Path | None = None,
) -> Outcome:
    """Run `benchmark` in a child `python -m bench --child`, killed after `timeout_s`.

    The child appends one JSON line per finished run, so runs done before a crash or a
    timeout are still counted.
    """
    import tempfile

    outcome = Outcome(benchmark)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pingo-bench-", dir=scratch) as tmp:
        out = Path(tmp) / "runs.jsonl"
        command = [sys.executable, "-m", __name__, "--child", str(benchmark.path)]
        command += ["--child-out", str(out)]
        if runs is not None:
            command += ["--runs", str(runs)]
        # The child must import this package even when started from elsewhere.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")]))
        # A new session lets a timeout kill the whole tree (Luigi forks, servers spawn).
        child = subprocess.Popen(command, cwd=REPO_DIR, env=env, start_new_session=True)
        try:
            returncode: int | None = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            returncode = None
        lines = out.read_text().splitlines() if out.exists() else []
    for line in lines:
        record = json.loads(line)
        if "figures" in record:
            outcome.runs.append(check_figures(record["figures"]))
        elif "error" in record:
            outcome.error = str(record["error"])
    if returncode is None:
        outcome.error = f"timed out after {timeout_s:.0f} s"
    elif returncode != 0 and outcome.error is None:
        outcome.error = f"child exited with status {returncode}"
    outcome.wall_s = time.perf_counter() - started
    return outcome


def child_main(path: Path, out: Path, runs: int | None) -> int:
    """The `--child` side of `run_isolated`: run one module, stream its runs to `out`."""
    benchmark = Benchmark(path.stem, path)

    def append(record: Mapping[str, Any]) -> None:
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    outcome = run_in_process(benchmark, runs, on_run=lambda f: append({"figures": f}))
    if outcome.error is not None:
        append({"error": outcome.error})
        return 1
    return 0


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    import signal

    for sig, grace_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


# --------------------------------------------------------------------------- reducing


def aggregate(runs: Sequence[Mapping[str, float]]) -> dict[str, Figure]:
    """Reduce runs to one `Figure` per name (a name missing from some runs uses the rest)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for name, value in run.items():
            values.setdefault(name, []).append(value)
    return {
        name: Figure(name, statistics.median(vs), min(vs), max(vs), len(vs))
        for name, vs in values.items()
    }


def flatten(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """`<name>`, `<name>_min`, `<name>_max` per figure; `<module>_error`, `_runs`, `_wall_s`."""
    flat: dict[str, Any] = {}
    for outcome in outcomes:
        for name, fig in aggregate(outcome.runs).items():
            flat[name] = fig.median
            flat[f"{name}_min"] = fig.min
            flat[f"{name}_max"] = fig.max
        module = outcome.benchmark.name
        flat[f"{module}_runs"] = len(outcome.runs)
        flat[f"{module}_wall_s"] = round(outcome.wall_s, 3)
        if outcome.error is not None:
            flat[f"{module}_error"] = outcome.error
    return flat


# --------------------------------------------------------------------------- context


def machine_info() -> dict[str, Any]:
    """The machine the figures were measured on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    info: dict[str, Any] = {
        "machine_cores": os.cpu_count() or 0,
        "machine_cores_usable": usable,
        "machine_python": platform.python_version(),
        "machine_python_implementation": platform.python_implementation(),
        "machine_sqlite": sqlite3.sqlite_version,
        "machine_platform": platform.platform(),
        "machine_arch": platform.machine(),
    }
    cpu = _cpu_model()
    if cpu:
        info["machine_cpu"] = cpu
    memory_mb = _memory_mb()
    if memory_mb:
        info["machine_memory_mb"] = memory_mb
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def git_info(repo: Path = REPO_DIR) -> dict[str, Any]:
    """The commit measured and whether the working tree differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # The results folder is this run's own output: it does not make the tree dirty.
        status = git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": True}
    return {"git_commit": commit, "git_dirty": bool(status)}


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True, slots=True)
class Target:
    """An expectation from issue 15, shown beside a figure; never asserted."""

    text: str
    #: True when met, False when missed, None when a figure it needs is missing.
    check: Callable[[Mapping[str, Any]], bool | None]


def _at_least(name: str, bound: float) -> Target:
    return Target(f">= {bound:g}", lambda r: _cmp(r, name, lambda v: v >= bound))


def _below(name: str, bound: float) -> Target:
    return Target(f"< {bound:g}", lambda r: _cmp(r, name, lambda v: v < bound))


def _ratio(name: str, other: str, text: str, ok: Callable[[float, float], bool]) -> Target:
    def check(r: Mapping[str, Any]) -> bool | None:
        if not isinstance(r.get(name), float) or not isinstance(r.get(other), float):
            return None
        return ok(r[name], r[other])

    return Target(text, check)


def _cmp(r: Mapping[str, Any], name: str, ok: Callable[[float], bool]) -> bool | None:
    value = r.get(name)
    return ok(value) if isinstance(value, float) else None


def _share(name: str, other: str, factor: float) -> Target:
    """`name` at least `factor` times `other` (both measured in the same run)."""
    return _ratio(name, other, f">= {factor:g} x {other}", lambda v, o: v >= factor * o)


#: Issue 15's goals, keyed by figure, for the printout only. Every target is on a Pingo
#: figure (or Pingo's ratio to its floor or peer), never on the peer's own figure.
TARGETS: dict[str, Target] = {
    # Two store writes per action or better: half the store's compare-and-set rate.
    "noop_actions_per_s": _share("noop_actions_per_s", "sqlite_cas_per_s", 0.5),
    "noop_montage_actions_per_s": _share("noop_montage_actions_per_s", "sqlite_cas_per_s", 0.5),
    "dispatch_p99_ms": _below("dispatch_p99_ms", 20),
    # Issue 16: concurrent workflows compute a dataset once.
    "dedup_runs_per_dataset": _below("dedup_runs_per_dataset", 1.01),
    "dedup_together_runs_per_dataset": _below("dedup_together_runs_per_dataset", 1.01),
    # Issue 18: 100 per-second schedules on two nodes.
    "schedule_fire_lag_p99_ms": _below("schedule_fire_lag_p99_ms", 250),
    "true_makespan_s": _ratio(
        "true_makespan_s", "spawn_floor_s", "<= 1.3 x spawn_floor_s", lambda v, o: v <= 1.3 * o
    ),
    "luigi_speedup": _at_least("luigi_speedup", 20),
    "true_makespan_over_sandboxed_floor": _below("true_makespan_over_sandboxed_floor", 1.3),
    "resubmit_reused_ms": _below("resubmit_reused_ms", 100),
    "submit_layered1000_ms": _below("submit_layered1000_ms", 100),
    "validate_100k_s": _below("validate_100k_s", 5),
    # Issue 14: checking a document offline feels instant.
    "cli_validate_s": _below("cli_validate_s", 0.3),
    "sqlite_cas_per_s": _at_least("sqlite_cas_per_s", 10_000),
    # "Memory flat": within 5 % of the 10k figure.
    "rss_mb_idle_20k": _ratio(
        "rss_mb_idle_20k",
        "rss_mb_idle_10k",
        "<= 1.05 x rss_mb_idle_10k",
        lambda v, o: v <= 1.05 * o,
    ),
    # Five times the figure measured before issue 15.
    "wire_claims_per_s": _at_least("wire_claims_per_s", 5 * WIRE_CLAIMS_BEFORE_PER_S),
    # Issue 16: a second node adds throughput, and finds another node's work fast.
    "two_node_speedup": _at_least("two_node_speedup", 1.8),
    "cross_node_dispatch_p99_ms": _below("cross_node_dispatch_p99_ms", 100),
    # The same goals on the wire MongoDB (the issue names both stores).
    "two_node_speedup_wire": _at_least("two_node_speedup_wire", 1.8),
    "cross_node_dispatch_p99_ms_wire": _below("cross_node_dispatch_p99_ms_wire", 100),
    # Issue 17: the workflow page stays usable for Montage's 1,738 actions.
    "ui_montage_render_ms": _below("ui_montage_render_ms", 2000),
    "ui_montage_page_ms": _below("ui_montage_page_ms", 2000),
    "ui_lineage_up_ms": _below("ui_lineage_up_ms", 2000),
    "ui_lineage_down_ms": _below("ui_lineage_down_ms", 2000),
}


# --------------------------------------------------------------------------- derived


def _faster_luigi(r: Mapping[str, Any]) -> float | None:
    medians = [r.get(f"luigi_{s}_true_makespan_s") for s in ("local", "luigid")]
    found = [m for m in medians if isinstance(m, float)]
    return min(found) if found else None


def _quotient(name: str, other: str) -> Callable[[Mapping[str, Any]], float | None]:
    def divide(r: Mapping[str, Any]) -> float | None:
        value, by = r.get(name), r.get(other)
        if not isinstance(value, float) or not isinstance(by, float) or by == 0:
            return None
        return value / by

    return divide


#: Figures computed from other modules' medians once every module has run, in this order
#: (a later one may use an earlier one). Absent when a figure they need was not measured.
DERIVED: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    # Luigi's better set-up: the faster of its two medians.
    "luigi_true_makespan_s": _faster_luigi,
    # How many times faster Pingo ran the same DAG, both measured in this run.
    "luigi_speedup": _quotient("luigi_true_makespan_s", "true_makespan_s"),
    # Like for like: Luigi runs `true` bare, so against Pingo without its sandbox.
    "luigi_speedup_bare": _quotient("luigi_true_makespan_s", "true_makespan_bare_s"),
    "true_makespan_over_floor": _quotient("true_makespan_s", "spawn_floor_s"),
    # The same against spawning what the makespan spawns: `true` inside the sandbox.
    "true_makespan_over_sandboxed_floor": _quotient("true_makespan_s", "spawn_floor_sandboxed_s"),
    "true_makespan_bare_over_floor": _quotient("true_makespan_bare_s", "spawn_floor_s"),
    "noop_actions_per_cas": _quotient("noop_actions_per_s", "sqlite_cas_per_s"),
    "noop_montage_actions_per_cas": _quotient("noop_montage_actions_per_s", "sqlite_cas_per_s"),
    # How many times slower pydantic is than msgspec at the API's models (issue 14).
    "models_encode_pydantic_over_msgspec": _quotient(
        "models_encode_pydantic_ms", "models_encode_msgspec_ms"
    ),
    "models_decode_pydantic_over_msgspec": _quotient(
        "models_decode_pydantic_ms", "models_decode_msgspec_ms"
    ),
}


def derive(flat: Mapping[str, Any]) -> dict[str, float]:
    """The `DERIVED` figures that `flat` has the inputs for."""
    derived: dict[str, float] = {}
    for name, compute in DERIVED.items():
        value = compute({**flat, **derived})
        if value is not None:
            derived[name] = value
    return derived


# --------------------------------------------------------------------------- output


def results(
    outcomes: Sequence[Outcome], started_at: datetime, repo: Path = REPO_DIR
) -> dict[str, Any]:
    """The flat object written to `latest.json`."""
    flat: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "benchmarks": ",".join(o.benchmark.short for o in outcomes),
    }
    flat |= machine_info()
    flat |= git_info(repo)
    flat |= flatten(outcomes)
    flat |= derive(flat)
    return flat


def write_results(flat: Mapping[str, Any], path: Path = RESULTS_PATH) -> Path:
    """Write `flat` as JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(flat, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def render(outcomes: Sequence[Outcome], flat: Mapping[str, Any]) -> Any:
    """A rich table: figure, median, min, max, target, OK/miss; errors as rows."""
    from rich.table import Table

    table = Table(title="Pingo benchmarks (median of runs)", title_justify="left")
    # Figure names never wrap (they are what a reader greps for); targets may.
    table.add_column("figure", no_wrap=True)
    for column in ("median", "min", "max", "runs"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("target", overflow="fold")
    table.add_column("", no_wrap=True)
    for outcome in outcomes:
        for name, fig in aggregate(outcome.runs).items():
            table.add_row(
                name,
                _fmt(fig.median),
                _fmt(fig.min),
                _fmt(fig.max),
                str(fig.runs),
                *_target_cells(name, flat),
            )
        if outcome.error is not None:
            table.add_row(
                f"[red]{outcome.benchmark.name}[/]", "", "", "", "", f"[red]{outcome.error}[/]", ""
            )
    for name in DERIVED:
        value = flat.get(name)
        if isinstance(value, float):
            table.add_row(name, _fmt(value), "", "", "derived", *_target_cells(name, flat))
    return table


def _target_cells(name: str, flat: Mapping[str, Any]) -> tuple[str, str]:
    """The target column and the OK/miss mark of figure `name`."""
    target = TARGETS.get(name)
    verdict = target.check(flat) if target else None
    mark = {True: "[green]OK[/]", False: "[red]miss[/]", None: ""}[verdict]
    return (target.text if target else "", mark)


def render_timing(outcomes: Sequence[Outcome]) -> Any:
    """Per-module wall time, to keep the whole suite under its 10-minute budget."""
    from rich.table import Table

    table = Table(title="Time per benchmark module", title_justify="left")
    table.add_column("module")
    table.add_column("runs", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("status")
    for o in outcomes:
        status = "[red]error[/]" if o.error else "[green]ok[/]"
        table.add_row(o.benchmark.name, str(len(o.runs)), f"{o.wall_s:.1f}", status)
    table.add_row("total", "", f"{sum(o.wall_s for o in outcomes):.1f}", "")
    return table

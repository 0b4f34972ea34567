"""The benchmark harness (bench/): discovery, runs, aggregation, isolation, JSON output.

Fake benchmark modules are written to tmp_path; nothing here measures anything real.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import bench
from bench import __main__ as bench_main

COUNTING = """
RUNS = {runs}
_calls = []

def measure():
    _calls.append(1)
    n = len(_calls)
    return {{"{prefix}_per_s": float(n * 10), "{prefix}_ms": n}}
"""


@pytest.fixture
def write_module(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """Write `bench_<name>.py` into tmp_path; forget the imported modules afterwards."""
    names: list[str] = []

    def write(name: str, source: str) -> Path:
        path = tmp_path / f"bench_{name}.py"
        path.write_text(textwrap.dedent(source))
        names.append(path.stem)
        return path

    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_discover_finds_only_bench_modules_sorted(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module("zeta", COUNTING.format(runs=1, prefix="z"))
    write_module("alpha", COUNTING.format(runs=1, prefix="a"))
    (tmp_path / "_helpers.py").write_text("")
    (tmp_path / "benchmark_notes.txt").write_text("")
    found = bench.discover(tmp_path)
    assert [b.name for b in found] == ["bench_alpha", "bench_zeta"]
    assert [b.short for b in found] == ["alpha", "zeta"]


def test_select_accepts_short_and_full_names_and_rejects_unknown(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    for name in ("engine", "luigi", "store"):
        write_module(name, COUNTING.format(runs=1, prefix=name))
    found = bench.discover(tmp_path)
    chosen = bench.select(found, ["store", "bench_engine"])
    assert [b.short for b in chosen] == ["engine", "store"]
    with pytest.raises(LookupError, match="nope"):
        bench.select(found, ["engine", "nope"])


def test_run_in_process_honours_module_runs_and_aggregates(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module("count", COUNTING.format(runs=3, prefix="c"))
    (b,) = bench.discover(tmp_path)
    outcome = bench.run_in_process(b)
    assert outcome.error is None
    assert outcome.runs == [
        {"c_per_s": 10.0, "c_ms": 1.0},
        {"c_per_s": 20.0, "c_ms": 2.0},
        {"c_per_s": 30.0, "c_ms": 3.0},
    ]
    flat = bench.flatten([outcome])
    assert flat["c_per_s"] == 20.0
    assert flat["c_per_s_min"] == 10.0
    assert flat["c_per_s_max"] == 30.0
    assert flat["c_ms"] == 2.0
    assert flat["bench_count_runs"] == 3
    assert "bench_count_error" not in flat


def test_requested_runs_override_module_runs(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module("count", COUNTING.format(runs=1, prefix="c"))
    (b,) = bench.discover(tmp_path)
    outcome = bench.run_in_process(b, runs=4)
    assert len(outcome.runs) == 4
    # Even count: the median is the mean of the middle two.
    assert bench.aggregate(outcome.runs)["c_ms"] == bench.Figure("c_ms", 2.5, 1.0, 4.0, 4)


def test_default_runs_is_three(tmp_path: Path, write_module: Callable[[str, str], Path]) -> None:
    write_module("plain", "def measure():\n    return {'x_s': 1.5}\n")
    (b,) = bench.discover(tmp_path)
    assert len(bench.run_in_process(b).runs) == bench.DEFAULT_RUNS == 3


def test_failures_are_reported_and_do_not_stop_other_modules(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module("broken_import", "import no_such_module_anywhere\n")
    write_module(
        "fails_second",
        """
        _calls = []
        def measure():
            _calls.append(1)
            if len(_calls) == 2:
                raise RuntimeError("disk full")
            return {"f_s": 1.0}
        """,
    )
    write_module("no_measure", "X = 1\n")
    write_module("bad_value", "def measure():\n    return {'v_s': float('nan')}\n")
    write_module("fine", COUNTING.format(runs=2, prefix="ok"))
    outcomes = [bench.run_in_process(b) for b in bench.discover(tmp_path)]
    flat = bench.flatten(outcomes)
    assert "ModuleNotFoundError" in flat["bench_broken_import_error"]
    assert flat["bench_fails_second_error"] == "RuntimeError: disk full"
    # The run before the failure still counts.
    assert flat["bench_fails_second_runs"] == 1
    assert flat["f_s"] == 1.0
    assert "no measure()" in flat["bench_no_measure_error"]
    assert "v_s" in flat["bench_bad_value_error"]
    assert "v_s" not in flat
    assert flat["ok_per_s"] == 15.0
    assert "bench_fine_error" not in flat


@pytest.mark.parametrize(
    "value",
    [True, "3", None, float("inf")],
)
def test_check_figures_rejects_non_numbers(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        bench.check_figures({"x_s": value})


def test_check_figures_rejects_non_mappings_and_bad_names() -> None:
    with pytest.raises(TypeError):
        bench.check_figures([("x_s", 1.0)])
    with pytest.raises(TypeError):
        bench.check_figures({"not a name": 1.0})
    assert bench.check_figures({"n": 3}) == {"n": 3.0}


def test_isolated_run_streams_runs_from_a_child_process(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module(
        "pid",
        """
        import os
        RUNS = 2
        def measure():
            return {"pid": float(os.getpid())}
        """,
    )
    (b,) = bench.discover(tmp_path)
    outcome = bench.run_isolated(b, timeout_s=60, scratch=tmp_path)
    assert outcome.error is None
    assert len(outcome.runs) == 2
    import os

    assert outcome.runs[0]["pid"] != os.getpid()


def test_isolated_run_survives_a_crash_and_a_hang(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module(
        "crash",
        """
        import os
        _calls = []
        def measure():
            _calls.append(1)
            if len(_calls) == 2:
                os._exit(3)
            return {"c_s": 1.0}
        """,
    )
    write_module(
        "hang",
        """
        import time
        def measure():
            time.sleep(60)
            return {"h_s": 1.0}
        """,
    )
    crash, hang = bench.discover(tmp_path)
    crashed = bench.run_isolated(crash, timeout_s=60, scratch=tmp_path)
    assert crashed.runs == [{"c_s": 1.0}]
    assert crashed.error == "child exited with status 3"
    hung = bench.run_isolated(hang, timeout_s=1.5, scratch=tmp_path)
    assert hung.runs == []
    assert hung.error == "timed out after 2 s"
    assert hung.wall_s < 30


def test_targets_mark_met_missed_and_unknown() -> None:
    flat = {
        "noop_actions_per_s": 8000.0,
        "sqlite_cas_per_s": 15000.0,
        "dispatch_p99_ms": 25.0,
        "true_makespan_s": 2.0,
        "spawn_floor_s": 1.8,
        "luigi_speedup": 5.0,
    }
    assert bench.TARGETS["noop_actions_per_s"].check(flat) is True
    assert bench.TARGETS["dispatch_p99_ms"].check(flat) is False
    assert bench.TARGETS["true_makespan_s"].check(flat) is True
    assert bench.TARGETS["luigi_speedup"].check(flat) is False
    assert bench.TARGETS["validate_100k_s"].check(flat) is None
    assert bench.TARGETS["rss_mb_idle_20k"].check(flat) is None


def test_no_target_is_on_the_peers_own_figures() -> None:
    # Our targets are about us: Luigi's figures are context, only our ratio to it is a goal.
    peer = [name for name in bench.TARGETS if name.startswith("luigi_") and name != "luigi_speedup"]
    assert peer == []


def test_derived_figures_use_the_faster_luigi_and_the_same_runs_pingo() -> None:
    flat = {
        "luigi_local_true_makespan_s": 9.0,
        "luigi_luigid_true_makespan_s": 12.0,
        "true_makespan_s": 0.5,
        "true_makespan_bare_s": 0.45,
        "spawn_floor_s": 0.4,
    }
    derived = bench.derive(flat)
    assert derived["luigi_true_makespan_s"] == 9.0
    assert derived["luigi_speedup"] == 18.0
    assert derived["luigi_speedup_bare"] == 20.0
    assert derived["true_makespan_over_floor"] == 1.25
    assert derived["true_makespan_bare_over_floor"] == 1.125
    assert "noop_actions_per_cas" not in derived  # its inputs were not measured


def test_derived_figures_are_absent_without_their_inputs() -> None:
    assert bench.derive({"true_makespan_s": 0.5}) == {}
    assert bench.derive({"luigi_luigid_true_makespan_s": 12.0}) == {"luigi_true_makespan_s": 12.0}


def test_plot_draws_the_measured_panels_and_skips_an_empty_run(tmp_path: Path) -> None:
    from bench import plot

    assert plot.plot({"g_per_s": 1.0}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    flat = {"true_makespan_s": 0.5, "spawn_floor_s": 0.4, "luigi_local_true_makespan_s": 9.0}
    path = plot.plot(flat, tmp_path / "latest.png")
    assert path == tmp_path / "latest.png"
    assert path.read_bytes().startswith(b"\x89PNG")


def test_main_writes_flat_json_with_machine_and_commit(
    tmp_path: Path, write_module: Callable[[str, str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_module("good", COUNTING.format(runs=3, prefix="g"))
    write_module("bad", "def measure():\n    raise ValueError('boom')\n")
    out = tmp_path / "results" / "latest.json"
    status = bench_main.main(["--dir", str(tmp_path), "--output", str(out), "--in-process"])
    assert status == 1  # one module failed
    flat = json.loads(out.read_text())
    assert all(not isinstance(v, dict | list) for v in flat.values())  # flat
    assert flat["g_per_s"] == 20.0
    assert flat["g_per_s_min"] == 10.0
    assert flat["g_per_s_max"] == 30.0
    assert flat["bench_bad_error"] == "ValueError: boom"
    assert flat["benchmarks"] == "bad,good"
    assert flat["machine_cores"] >= 1
    assert flat["machine_python"] == ".".join(map(str, sys.version_info[:3]))
    assert flat["machine_sqlite"].count(".") == 2
    assert flat["machine_platform"]
    assert len(flat["git_commit"]) == 40 or flat["git_commit"] == "unknown"
    assert isinstance(flat["git_dirty"], bool)
    printed = capsys.readouterr().out
    assert "g_per_s" in printed
    assert "bench_bad" in printed


def test_main_only_runs_the_named_module(
    tmp_path: Path, write_module: Callable[[str, str], Path]
) -> None:
    write_module("one", COUNTING.format(runs=1, prefix="one"))
    write_module("two", COUNTING.format(runs=1, prefix="two"))
    out = tmp_path / "latest.json"
    argv = ["--dir", str(tmp_path), "--output", str(out), "--only", "two", "--runs", "2"]
    assert bench_main.main(argv) == 0
    flat = json.loads(out.read_text())
    assert flat["benchmarks"] == "two"
    assert flat["bench_two_runs"] == 2
    assert "one_per_s" not in flat
    assert bench_main.main([*argv[:4], "--only", "three"]) == 2

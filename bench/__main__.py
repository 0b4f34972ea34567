"""`python -m bench`: run the benchmarks, print a table, write `bench/results/latest.json`.

python -m bench                       every bench/bench_*.py, each run 3 times (or RUNS)
python -m bench --only engine,luigi   just those (names with or without `bench_`)
python -m bench --runs 5              override every module's number of runs
python -m bench --list                list the benchmarks found
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import bench


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated benchmarks to run alone")
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per module (default: its RUNS, else 3)"
    )
    parser.add_argument(
        "--output", type=Path, default=bench.RESULTS_PATH, help="where to write the JSON"
    )
    parser.add_argument(
        "--dir", type=Path, default=bench.BENCH_DIR, help="folder holding bench_*.py"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=bench.DEFAULT_TIMEOUT_S,
        help="seconds allowed per module (all its runs) before it is killed",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run modules in this process instead of one child process each",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    # Internal: the child side of one isolated module.
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return bench.child_main(args.child, args.child_out, args.runs)

    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # Piped or under make in CI: rich would assume 80 columns and squeeze the names.
        console = Console(width=132)
    found = bench.discover(args.dir)
    if args.list:
        for b in found:
            console.print(f"{b.short:<12} {b.path}")
        return 0
    try:
        chosen = bench.select(found, args.only.split(",")) if args.only else found
    except LookupError as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    if not chosen:
        console.print(f"[red]no bench_*.py modules in {args.dir}[/]")
        return 2

    started_at = datetime.now(UTC)
    outcomes: list[bench.Outcome] = []
    for b in chosen:
        console.print(f"[bold]{b.name}[/] …", highlight=False)
        t0 = time.perf_counter()
        if args.in_process:
            outcome = bench.run_in_process(b, args.runs)
        else:
            outcome = bench.run_isolated(b, args.runs, args.timeout)
        outcomes.append(outcome)
        status = f"[red]{outcome.error}[/]" if outcome.error else "[green]ok[/]"
        console.print(
            f"[bold]{b.name}[/]: {len(outcome.runs)} run(s) in "
            f"{time.perf_counter() - t0:.1f} s, {status}",
            highlight=False,
        )

    flat = bench.results(outcomes, started_at)
    path = bench.write_results(flat, args.output)
    image = _plot(flat, args.output)
    console.print(bench.render(outcomes, flat))
    console.print(bench.render_timing(outcomes))
    dirty = " (dirty tree)" if flat["git_dirty"] else ""
    wrote = f"{path} and {image}" if image is not None else str(path)
    console.print(f"commit {flat['git_commit'][:12]}{dirty}; wrote {wrote}", highlight=False)
    # A benchmark error is a result, reported above; the exit status says so too.
    return 1 if any(o.error for o in outcomes) else 0


def _plot(flat: dict[str, object], output: Path) -> Path | None:
    """The chart beside the JSON (`latest.png`), when the `plot` extra is installed."""
    try:
        from bench import plot
    except ImportError:
        return None
    try:
        return plot.plot(flat, output.with_suffix(".png"))
    except ImportError:
        print("no plot: matplotlib is missing (install the `plot` extra)", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())

"""`bench/results/latest.png`: Pingo's figures against their floors, goals and Luigi.

One horizontal bar chart per comparison, drawn from the flat results of one run (so every
ratio on it was measured in the same sitting). A panel whose figures the run did not
measure (an `--only` run) is left out. Needs the `plot` extra (matplotlib).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import WIRE_CLAIMS_BEFORE_PER_S

PLOT_PATH = Path(__file__).resolve().parent / "results" / "latest.png"

PINGO = "#1f77b4"
FLOOR = "#7f7f7f"
PEER = "#d62728"


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: a label, the figure it shows, its colour."""

    label: str
    figure: str
    colour: str


@dataclass(frozen=True, slots=True)
class Panel:
    """One comparison: bars, the unit, and where the goal line sits (figure x factor)."""

    title: str
    unit: str
    bars: tuple[Bar, ...]
    goal: tuple[str, float] | None = None
    log: bool = False


PANELS: tuple[Panel, ...] = (
    Panel(
        "layered-1000 running `true`, 2 slots (lower is better)",
        "seconds",
        (
            Bar("spawn floor (plain loop)", "spawn_floor_s", FLOOR),
            Bar("Pingo, no sandbox", "true_makespan_bare_s", PINGO),
            Bar("spawn floor, sandboxed", "spawn_floor_sandboxed_s", FLOOR),
            Bar("Pingo, sandboxed (default)", "true_makespan_s", PINGO),
            Bar("Luigi, local scheduler", "luigi_local_true_makespan_s", PEER),
            Bar("Luigi, luigid", "luigi_luigid_true_makespan_s", PEER),
        ),
        goal=("spawn_floor_s", 1.3),
        log=True,
    ),
    Panel(
        "control plane, no-op executor (higher is better)",
        "per second",
        (
            Bar("SQLite compare-and-sets", "sqlite_cas_per_s", FLOOR),
            Bar("Pingo actions, layered-1000", "noop_actions_per_s", PINGO),
            Bar("Pingo actions, Montage", "noop_montage_actions_per_s", PINGO),
        ),
        goal=("sqlite_cas_per_s", 0.5),
    ),
    Panel(
        "MongoDB wire store (higher is better)",
        "per second",
        (
            Bar("compare-and-sets", "wire_cas_per_s", FLOOR),
            Bar("actions claimed", "wire_claims_per_s", PINGO),
        ),
        goal=("", 5 * WIRE_CLAIMS_BEFORE_PER_S),
    ),
    Panel(
        "HTTP (lower is better)",
        "milliseconds",
        (
            Bar("resubmit layered-1000, all reused", "resubmit_reused_ms", PINGO),
            Bar("submit layered-1000", "submit_layered1000_ms", PINGO),
        ),
        goal=("", 100.0),
    ),
    Panel(
        "server memory after finished workflows (flat is better)",
        "MiB",
        (
            Bar("10,000 finished", "rss_mb_idle_10k", FLOOR),
            Bar("20,000 finished", "rss_mb_idle_20k", PINGO),
        ),
        goal=("rss_mb_idle_10k", 1.05),
    ),
)


def _value(flat: Mapping[str, Any], name: str) -> float | None:
    value = flat.get(name)
    return value if isinstance(value, float) else None


def _goal(flat: Mapping[str, Any], panel: Panel) -> float | None:
    if panel.goal is None:
        return None
    name, factor = panel.goal
    if not name:
        return factor
    base = _value(flat, name)
    return None if base is None else base * factor


def _drawable(flat: Mapping[str, Any], panels: Sequence[Panel]) -> list[tuple[Panel, list[Bar]]]:
    drawn = []
    for panel in panels:
        bars = [bar for bar in panel.bars if _value(flat, bar.figure) is not None]
        if any(bar.colour == PINGO for bar in bars):
            drawn.append((panel, bars))
    return drawn


def plot(flat: Mapping[str, Any], path: Path = PLOT_PATH) -> Path | None:
    """Draw the panels `flat` has figures for into `path`; None when it has none."""
    drawable = _drawable(flat, PANELS)
    if not drawable:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(drawable), 1, figsize=(9, 2.0 * len(drawable) + 0.8), dpi=110)
    axes = [axes] if len(drawable) == 1 else list(axes)
    for ax, (panel, bars) in zip(axes, drawable, strict=True):
        values = [_value(flat, bar.figure) or 0.0 for bar in bars]
        ax.barh([bar.label for bar in bars], values, color=[bar.colour for bar in bars])
        ax.invert_yaxis()
        for i, value in enumerate(values):
            text = f" {value:,.0f}" if value >= 100 else f" {value:.3g}"
            ax.annotate(text, (value, i), va="center", fontsize=8)
        goal = _goal(flat, panel)
        if goal is not None:
            ax.axvline(goal, color="black", linestyle="--", linewidth=1, label="goal")
            ax.legend(loc="best", fontsize=8)
        if panel.log:
            ax.set_xscale("log")
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_xlabel(panel.unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.margins(x=0.15)
    commit = str(flat.get("git_commit", "unknown"))[:12]
    cores = flat.get("machine_cores_usable", "?")
    fig.suptitle(f"Pingo benchmarks: commit {commit}, {cores} cores, medians", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

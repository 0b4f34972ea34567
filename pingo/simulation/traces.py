"""Workflow traces for the simulator: Pingo documents or raw WfCommons instances.

`bench/make_workloads.py wfcommons` turns a WfCommons (WfFormat) execution
instance into a Pingo workflow whose actions carry the measured runtime and
output size under `metadata.runtimeSeconds` and `metadata.outputBytes`; a raw
instance is converted here the same way, in-process.

Such documents give every action the same placeholder command (`true`), so two
root actions of a trace would have the same provenance and collapse into one
dataset. The simulator therefore appends the task's family and name to each
action's argument list: every trace task is its own computation, and two
families never share a dataset by accident.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pingo import errors

#: The argument-list field of each action type, where the simulator's marks go.
ARGV_FIELDS: Mapping[str, str] = {
    "command-line": "command",
    "mapreduce-v1": "arguments",
    "mapreduce-v2": "arguments",
    "spark": "arguments",
}


@dataclass(frozen=True, slots=True)
class Family:
    """One workflow of the trace set, as first submitted."""

    name: str
    #: The Pingo document, each action marked with its task identity.
    document: Mapping[str, Any]

    @property
    def action_count(self) -> int:
        return len(self.document["actions"])


def wfcommons_to_pingo(instance: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The Pingo document for a WfCommons instance (as `make_workloads.py wfcommons`)."""
    wf = instance["workflow"]
    tasks = wf.get("tasks") or wf["specification"]["tasks"]
    # WfFormat 1.5 keeps runtimes under workflow.execution.tasks.
    executed = {t.get("id"): t for t in (wf.get("execution") or {}).get("tasks", [])}
    ids = {t.get("id", t["name"]): n + 1 for n, t in enumerate(tasks)}
    by_name = {t["name"]: ids[t.get("id", t["name"])] for t in tasks}
    actions: list[dict[str, Any]] = []
    for t in tasks:
        aid = ids[t.get("id", t["name"])]
        parents = sorted(
            {p for p in (by_name.get(q, ids.get(q)) for q in t.get("parents", [])) if p is not None}
        )
        out_bytes = sum(
            f.get("sizeInBytes", f.get("size", 0))
            for f in t.get("files", [])
            if f.get("link") == "output"
        )
        run = executed.get(t.get("id"), t)
        action: dict[str, Any] = {
            "id": aid,
            "name": t["name"],
            "type": "command-line",
            "command": ["true"],
            "metadata": {
                "category": t.get("category", ""),
                "runtimeSeconds": run.get("runtimeInSeconds", run.get("runtime", 0)),
                "outputBytes": out_bytes,
            },
        }
        if parents:
            action["parentActions"] = [{"id": p} for p in parents]
        actions.append(action)
    has_child = {p["id"] for a in actions for p in a.get("parentActions", [])}
    roots = [a["id"] for a in actions if not a.get("parentActions")]
    leaves = [a["id"] for a in actions if a["id"] not in has_child]
    return {
        "name": instance.get("name", name),
        "startActionId": min(roots),
        "endActionId": max(leaves),
        "actions": actions,
    }


def with_argument(action: Mapping[str, Any], argument: str) -> dict[str, Any]:
    """A copy of `action` with `argument` appended to its argument list (changes its identity)."""
    field = ARGV_FIELDS.get(str(action.get("type")))
    if field is None:
        raise errors.ConfigurationError(
            f"the simulator cannot vary actions of type {action.get('type')!r}"
        )
    return {**action, field: [*action.get(field, []), argument]}


def mark_tasks(document: Mapping[str, Any], family: str) -> dict[str, Any]:
    """`document` with each action's argument list ending in its task identity."""
    actions = [
        with_argument(a, f"--pingo-sim-task={family}/{a['id']}:{a.get('name', '')}")
        for a in document["actions"]
    ]
    return {**document, "actions": actions}


#: The seven WfCommons instances shipped with Pingo (gzipped package data).
SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_traces() -> list[Path]:
    """The traces shipped as package data, sorted by name (the order of `--trace` in docs)."""
    return sorted(SHIPPED_DIR.glob("*.json.gz"))


def trace_stem(path: str | Path) -> str:
    """The family name a trace file gives: its name without `.json` or `.json.gz`."""
    name = Path(path).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def load_family(path: str | Path, name: str | None = None) -> Family:
    """A family from a Pingo document or a raw WfCommons instance file (`.gz` read as gzip)."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as f:
            raw = json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise errors.ConfigurationError(f"cannot read trace {path}: {exc}") from exc
    family = name or trace_stem(path)
    if isinstance(raw, dict) and "actions" in raw:
        document: dict[str, Any] = raw
    elif isinstance(raw, dict) and "workflow" in raw:
        document = wfcommons_to_pingo(raw, family)
    else:
        raise errors.ConfigurationError(
            f"{path} is neither a Pingo workflow (actions) nor a WfCommons instance (workflow)"
        )
    return Family(family, mark_tasks(document, family))


def load_families(paths: Sequence[str | Path]) -> list[Family]:
    """Families for `paths`, named by file stem (made unique when two stems collide)."""
    families: list[Family] = []
    seen: dict[str, int] = {}
    for path in paths:
        stem = trace_stem(path)
        seen[stem] = seen.get(stem, 0) + 1
        name = stem if seen[stem] == 1 else f"{stem}#{seen[stem]}"
        families.append(load_family(path, name))
    return families


def runtime_s(action: Mapping[str, Any]) -> float:
    """The simulated runtime of an action (its `metadata.runtimeSeconds`, 0 when absent)."""
    meta = action.get("metadata") or {}
    return float(meta.get("runtimeSeconds") or 0.0)


def output_bytes(action: Mapping[str, Any]) -> int:
    """The simulated output size of an action (its `metadata.outputBytes`, 0 when absent)."""
    meta = action.get("metadata") or {}
    return int(meta.get("outputBytes") or 0)

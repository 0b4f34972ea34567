"""Benchmark workloads from ../shared/bench, and small helpers the benchmarks share.

layered_1000()            the committed 1,000-action layered DAG (layered-1000.json),
                          every action computing (`computing`)
layered(layers=..., ...)  a new seeded layered DAG (make_workloads.py layered)
montage()                 the Montage trace workflow (make_workloads.py wfcommons ...),
                          every action computing
computing(document)       the document with each command ending in its action's id
wfcommons(trace)          any WfCommons trace under ../shared/traces, or a path
parents(document)         action id -> parent action ids (the DAG's edges)
small_workflow(n)         a distinct one-action workflow running `true n`
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: ../shared beside the repository (bench/ -> repo -> its parent).
SHARED = Path(__file__).resolve().parents[2] / "shared"
WORKLOADS_DIR = SHARED / "bench"
TRACES_DIR = SHARED / "traces"
LAYERED_1000 = WORKLOADS_DIR / "layered-1000.json"
MONTAGE_TRACE = TRACES_DIR / "montage-chameleon-2mass-05d-001.json"

Document = dict[str, Any]


def shared_file(path: Path) -> Path:
    """`path`, or a FileNotFoundError that says where the shared folder was expected."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (the shared folder is expected at {SHARED})")
    return path


@functools.cache
def _load_json(path: Path) -> Document:
    with shared_file(path).open() as fh:
        document: Document = json.load(fh)
    return document


@functools.cache
def _make_workloads() -> ModuleType:
    # make_workloads.py is a script, not a package module: load it from its file.
    path = shared_file(WORKLOADS_DIR / "make_workloads.py")
    spec = importlib.util.spec_from_file_location("_pingo_make_workloads", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layered_1000() -> Document:
    """The 1,000-action layered DAG (20 layers of 50, fan-in 2, seed 1), a fresh copy,
    every action computing (`computing`)."""
    return computing(copy.deepcopy(_load_json(LAYERED_1000)))


def computing(document: Document) -> Document:
    """`document` with each action's command ending in its id: 1,000 actions, 1,000
    computations, as Luigi's 1,000 tasks and the spawn floor's 1,000 spawns.

    The shared workloads run the same command (`true`) everywhere, so which of their
    actions compute depends on Pingo's identity rules, not on the benchmark: the 50
    roots of layered-1000 are one provenance, and before a dataset's identity held its
    parents' action ids (cfb7fe7) its 1,000 actions were 20 datasets, 980 of them
    shared rather than computed. A figure per action must count computations.
    """
    actions = [{**a, "command": [*a["command"], f"a{a['id']}"]} for a in document["actions"]]
    return {**document, "actions": actions}


def layered(
    layers: int = 20,
    width: int = 50,
    fanin: int = 2,
    seed: int = 1,
    command: Sequence[str] = ("true",),
) -> Document:
    """A seeded layered DAG, exactly as `make_workloads.py layered` writes it."""
    document: Document = _make_workloads().layered(layers, width, fanin, seed, list(command))
    return document


def wfcommons(trace: str | Path, command: Sequence[str] = ("true",)) -> Document:
    """A WfCommons trace (a name under ../shared/traces, or a path) as a Pingo workflow."""
    path = Path(trace)
    if not path.is_absolute() and not path.exists():
        path = TRACES_DIR / path
    document: Document = _make_workloads().wfcommons(str(shared_file(path)), list(command))
    return document


def montage(command: Sequence[str] = ("true",)) -> Document:
    """The Montage trace workflow (montage-chameleon-2mass-05d-001), every action
    computing (`computing`)."""
    return computing(wfcommons(MONTAGE_TRACE, command))


def parents(document: Document) -> dict[int, tuple[int, ...]]:
    """Action id -> its parent action ids, for every action of `document`."""
    return {
        int(action["id"]): tuple(int(p["id"]) for p in action.get("parentActions", ()))
        for action in document["actions"]
    }


def small_workflow(n: int, command: Sequence[str] = ("true",)) -> Document:
    """A one-action workflow whose command ends in `n`, so no two share a provenance."""
    action = {"id": 1, "name": f"small-{n}", "type": "command-line", "command": [*command, str(n)]}
    return {"name": f"small-{n}", "startActionId": 1, "endActionId": 1, "actions": [action]}


def scratch_dir(min_free_bytes: int = 2 * 10**9) -> str | None:
    """A RAM-backed folder (/dev/shm) for many small files, or None for the default tmp.

    Creating and deleting tens of thousands of files on the VM's disk costs minutes
    (removing 18,000 took 26 s), time that would measure the filesystem, not Pingo.
    """
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    if not os.access(shm, os.W_OK) or stats.f_bavail * stats.f_frsize < min_free_bytes:
        return None
    return str(shm)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, linearly interpolated (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))

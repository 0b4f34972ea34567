"""The seven WfCommons traces, converted by make_workloads.py, are valid workflows."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import networkx as nx
import pytest

from pingo.workflows import language, provenance

TRACES = [
    "1000genome-chameleon-2ch-100k-001.json",
    "epigenomics-chameleon-hep-1seq-100k-001.json",
    "montage-chameleon-2mass-01d-001.json",
    "montage-chameleon-2mass-05d-001.json",
    "seismology-chameleon-100p-001.json",
    "soykb-chameleon-10fastq-10ch-001.json",
    "srasearch-chameleon-10a-001.json",
]


@pytest.fixture(scope="module")
def make_workloads(shared_dir: Path) -> ModuleType:
    path = shared_dir / "bench" / "make_workloads.py"
    spec = importlib.util.spec_from_file_location("make_workloads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_trace_is_listed(shared_dir: Path) -> None:
    assert sorted(p.name for p in (shared_dir / "traces").glob("*.json")) == TRACES


@pytest.mark.parametrize("trace", TRACES)
def test_trace_validates(make_workloads: ModuleType, shared_dir: Path, trace: str) -> None:
    document = make_workloads.wfcommons(str(shared_dir / "traces" / trace), ["true"])
    assert language.validate(document) == []
    definition = language.parse(document)
    assert len(definition.actions) == len(document["actions"])
    assert nx.is_directed_acyclic_graph(definition.graph)
    edges = sum(len(a.get("parentActions", [])) for a in document["actions"])
    assert definition.graph.number_of_edges() == edges
    dataset_ids = provenance.dataset_ids(definition, "server")
    assert len(dataset_ids) == len(definition.actions)


def test_montage_metadata_is_kept_but_not_part_of_identity(
    make_workloads: ModuleType, shared_dir: Path
) -> None:
    document = make_workloads.wfcommons(str(shared_dir / "traces" / TRACES[3]), ["true"])
    definition = language.parse(document)
    assert len(definition.actions) == 1738
    assert "runtimeSeconds" in definition.actions[1].metadata
    # Every root runs the same command with no parent: one shared dataset.
    dataset_ids = provenance.dataset_ids(definition, "server")
    roots = [a for a in definition.actions.values() if not a.parents]
    assert len({dataset_ids[a.id] for a in roots}) == 1


def test_layered_workload_validates(make_workloads: ModuleType) -> None:
    document = make_workloads.layered(10, 30, 2, 1, ["true"])
    definition = language.parse(document)
    assert len(definition.actions) == 300
    assert definition.graph.number_of_edges() == 9 * 30 * 2

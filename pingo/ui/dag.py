"""DAGs laid out on the server: layers, then barycenter crossing reduction.

Two graphs use it: a workflow's actions, and a dataset's lineage (its ancestors
above it, the datasets computed from it below).

Layers are networkx's topological generations; a few down and up sweeps then
order each layer by the mean position of its neighbours in the layer before,
the usual Sugiyama heuristic. The template draws the result as SVG, with the
failed branch (failed actions and their ancestors) and the critical path (the
longest chain by measured runtime) marked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import networkx as nx

from pingo import states
from pingo.store.protocol import ActionRecord

SWEEPS = 4
X_STEP = 120
Y_STEP = 70
MARGIN = 40
#: Added to every action's weight so that, with no runtime measured yet, the
#: critical path is the longest chain of actions.
_CHAIN_WEIGHT_S = 1e-6
_FAILED = frozenset({states.ActionState.FAILED})
#: A graph's node keys: action ids or dataset ids.
N = TypeVar("N", int, str)


@dataclass(frozen=True, slots=True)
class Node:
    action_id: int
    name: str
    state: str
    x: int
    y: int
    reused: bool = False
    critical: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int
    #: "failed" (on a failed branch), "critical" (on the critical path) or "".
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Layout:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def _graph(actions: Iterable[ActionRecord]) -> nx.DiGraph[int]:
    graph: nx.DiGraph[int] = nx.DiGraph()
    for action in actions:
        graph.add_node(action.action_id)
        graph.add_edges_from((parent, action.action_id) for parent in action.inputs)
    return graph


def _reorder(layer: list[N], position: dict[N, int], neighbours: dict[N, list[N]]) -> None:
    def barycenter(node: N) -> float:
        around = [position[n] for n in neighbours[node] if n in position]
        return sum(around) / len(around) if around else float(position[node])

    layer.sort(key=barycenter)
    position.update((node, index) for index, node in enumerate(layer))


def _order(graph: nx.DiGraph[N]) -> list[list[N]]:
    layers = [sorted(generation) for generation in nx.topological_generations(graph)]
    position = {node: i for layer in layers for i, node in enumerate(layer)}
    parents = {node: list(graph.predecessors(node)) for node in graph}
    children = {node: list(graph.successors(node)) for node in graph}
    for _ in range(SWEEPS):
        for layer in layers[1:]:
            _reorder(layer, position, parents)
        for layer in reversed(layers[:-1]):
            _reorder(layer, position, children)
    return layers


def _positions(layers: list[list[N]]) -> tuple[dict[N, tuple[int, int]], int, int]:
    """Each node's (x, y), one row per layer, rows centred; and the drawing's size."""
    widest = max((len(layer) for layer in layers), default=0)
    at: dict[N, tuple[int, int]] = {}
    for row, layer in enumerate(layers):
        offset = (widest - len(layer)) * X_STEP // 2
        for column, node in enumerate(layer):
            at[node] = (MARGIN + offset + column * X_STEP, MARGIN + row * Y_STEP)
    # A whole X_STEP beyond the widest layer: the last column's labels sit right of it.
    return at, 2 * MARGIN + widest * X_STEP, 2 * MARGIN + len(layers) * Y_STEP


def _critical_path(graph: nx.DiGraph[int], by_id: dict[int, ActionRecord]) -> list[int]:
    """The actions on the longest chain weighted by runtime (reused ones weigh nothing)."""
    if not graph:
        return []
    weights = {
        (u, v): (by_id[v].runtime_s or 0.0) + _CHAIN_WEIGHT_S if v in by_id else 0.0
        for u, v in graph.edges
    }
    nx.set_edge_attributes(graph, weights, "runtime_s")
    path: list[int] = nx.dag_longest_path(graph, weight="runtime_s")
    return path


def _failed_branch(graph: nx.DiGraph[int], by_id: dict[int, ActionRecord]) -> set[int]:
    """Failed actions and every ancestor of one."""
    branch: set[int] = set()
    for action_id, action in by_id.items():
        if action.state in _FAILED and action_id not in branch:
            branch.add(action_id)
            branch.update(nx.ancestors(graph, action_id))
    return branch


def _edge_kind(u: int, v: int, failed: set[int], critical: set[tuple[int, int]]) -> str:
    if u in failed and v in failed:
        return "failed"
    if (u, v) in critical:
        return "critical"
    return ""


def layout(actions: list[ActionRecord]) -> Layout:
    """Coordinates of every action (one row per layer) and of every parent → child edge."""
    by_id = {a.action_id: a for a in actions}
    graph = _graph(actions)
    at, width, height = _positions(_order(graph))
    failed = _failed_branch(graph, by_id)
    path = _critical_path(graph, by_id)
    critical, critical_edges = set(path), set(itertools.pairwise(path))
    nodes = tuple(
        Node(n, a.name, a.state.value, *at[n], reused=a.reused, critical=n in critical)
        for n in at
        if (a := by_id.get(n)) is not None
    )
    edges = tuple(
        Edge(*at[u], *at[v], kind=_edge_kind(u, v, failed, critical_edges))
        for u, v in graph.edges
        if u in at and v in at
    )
    return Layout(nodes, edges, width, height)


@dataclass(frozen=True, slots=True)
class DatasetNode:
    dataset_id: str
    label: str
    #: The dataset's state, "" for an input whose record is gone.
    state: str
    x: int
    y: int
    #: The dataset whose page this is.
    root: bool = False


@dataclass(frozen=True, slots=True)
class DatasetGraph:
    nodes: tuple[DatasetNode, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def lineage_layout(
    labels: Mapping[str, tuple[str, str]], edges: Iterable[tuple[str, str]], root: str
) -> DatasetGraph:
    """Coordinates of a lineage: `labels` maps each dataset id to (label, state), `edges`
    are (parent, child) pairs; ancestors come out above `root`, descendants below."""
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(labels)
    graph.add_edges_from((u, v) for u, v in edges if u in labels and v in labels)
    layers: list[list[str]] = _order(graph)
    at, width, height = _positions(layers)
    nodes = tuple(DatasetNode(n, *labels[n], *at[n], root=n == root) for n in at)
    lines = tuple(Edge(*at[u], *at[v]) for u, v in graph.edges)
    return DatasetGraph(nodes, lines, width, height)

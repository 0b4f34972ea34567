"""Immutable workflow definitions, as produced by `pingo.workflows.language.parse`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx


@dataclass(frozen=True, slots=True)
class ActionDefinition:
    """One action of a workflow, validated."""

    id: int
    name: str
    type: str
    #: Parent action ids, sorted, without duplicates.
    parents: tuple[int, ...]
    force_computation: bool
    is_managed: bool
    #: The user's own output path (required when `is_managed` is false).
    output_path: str | None
    timeout_s: float | None
    max_attempts: int | None
    metadata: Mapping[str, Any]
    #: The type-specific fields (`command`, `env`, `jar`, `conf`, …): part of identity.
    spec: Mapping[str, Any]
    #: The action exactly as submitted.
    raw: Mapping[str, Any]
    #: For an action whose output is not a function of its inputs (`isDeterministic`
    #: false), random per parse: part of its identity, so it is never reused or shared.
    run: str | None = None


@dataclass(frozen=True)
class WorkflowDefinition:
    """A validated workflow: its actions and their DAG (edges go parent → child)."""

    name: str
    description: str | None
    start_action_id: int
    end_action_id: int
    #: "abort" (default) or "continue".
    on_failure: str
    actions: Mapping[int, ActionDefinition]
    #: Read-only by convention: nodes are action ids, edges parent → child.
    graph: nx.DiGraph = field(repr=False)
    #: The document exactly as submitted.
    document: Mapping[str, Any] = field(repr=False)

    def children(self, action_id: int) -> tuple[int, ...]:
        """Child action ids, ascending."""
        return tuple(sorted(self.graph.successors(action_id)))

    def is_leaf(self, action_id: int) -> bool:
        """Whether no action of this workflow reads the action's output."""
        return bool(self.graph.out_degree(action_id) == 0)

    def leaves(self) -> tuple[int, ...]:
        """Action ids with no children, ascending."""
        return tuple(sorted(n for n in self.graph.nodes if self.graph.out_degree(n) == 0))

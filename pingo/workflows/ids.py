"""Provenance dataset ids.

A dataset's id is the sha256 of the canonical JSON of its identity document:
the producing action's type and type-specific fields, the dataset ids of its
parents (sorted, so the order of `parentActions` does not matter), the sharing
scope, and, for an unmanaged action, its `outputPath`. Names, action ids,
`metadata`, `forceComputation`, `timeoutSeconds` and `maxAttempts` say nothing
about *what* is computed and are left out, so two actions anywhere that compute
the same thing in the same scope share one dataset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import networkx as nx

from pingo.workflows import language
from pingo.workflows.definition import ActionDefinition, WorkflowDefinition

#: The scope of a server where everyone shares datasets (`Settings.sharing_scope == "server"`).
SERVER_SCOPE = "server"

_encode = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def user_scope(user: str) -> str:
    """The scope of `user` when each user is their own scope."""
    return f"user:{user}"


def canonical_json(document: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 as is: the text that is hashed."""
    return _encode(document)


def identity(
    action: ActionDefinition, parent_dataset_ids: Iterable[str], scope: str
) -> dict[str, Any]:
    """The identity document of an action's output (stored as `DatasetRecord.definition`)."""
    document: dict[str, Any] = {
        "type": action.type,
        "spec": dict(action.spec),
        "parents": sorted(parent_dataset_ids),
        "scope": scope,
    }
    if not action.is_managed:
        # The user's own path is part of what the action produces.
        document["isManaged"] = False
        document["outputPath"] = action.output_path
    return document


def hash_identity(document: Mapping[str, Any]) -> str:
    """The 64-hex sha256 of an identity document."""
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def dataset_ids(definition: WorkflowDefinition, scope: str) -> dict[int, str]:
    """Action id → dataset id of its output, for every action of `definition`."""
    if not scope:
        raise ValueError("the sharing scope must not be empty")
    order = definition.graph.graph.get(language.TOPOLOGICAL_ORDER)
    if order is None:  # a definition not made by `language.parse`
        order = tuple(nx.topological_sort(definition.graph))
    actions = definition.actions
    ids: dict[int, str] = {}
    for aid in order:
        action = actions[aid]
        ids[aid] = hash_identity(identity(action, [ids[p] for p in action.parents], scope))
    return ids

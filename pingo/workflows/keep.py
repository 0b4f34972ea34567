"""The planning-time keep hook's contract: what retention sees of a dataset to compute.

The planner calls the hook; a retention policy implements it (`pingo.retention.policy`).
Both import these two names from here, so the plug-in API depends on the language's
data types and the store's records only, never on the planner and the engine behind it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from pingo.store.protocol import DatasetRecord
from pingo.workflows.definition import ActionDefinition, WorkflowDefinition


@dataclass(frozen=True, slots=True)
class NewDatasetInfo:
    """What retention's keep hook sees about a dataset a workflow is about to compute."""

    dataset_id: str
    workflow_id: str
    owner: str
    scope: str
    action: ActionDefinition
    #: Dataset ids of its inputs.
    parents: tuple[str, ...]
    #: The dataset's record if it existed before (e.g. DELETED: its past size and compute time).
    previous: DatasetRecord | None
    #: The workflow being planned, whole (its DAG, leaves included), and the dataset id
    #: of each of its actions, reused ones included: the structure around the dataset.
    #: The same two objects for every dataset of one workflow.
    workflow: WorkflowDefinition | None = None
    dataset_ids: Mapping[int, str] = field(default_factory=dict)


KeepHook = Callable[[NewDatasetInfo], Awaitable[bool]]
"""Retention's planning-time hook: False means "not worth keeping" (TO_DELETE)."""

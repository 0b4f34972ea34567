"""The JSON documents the API returns (camelCase), built from store records."""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pingo import limits, states
from pingo.actions.executors import cluster
from pingo.config import Settings
from pingo.datasets.integrity import Verdict
from pingo.store.protocol import (
    ActionRecord,
    DatasetRecord,
    EventRecord,
    UserRecord,
    WorkflowRecord,
)
from pingo.workflows import reuse

#: Actions per call of the JSON encoder in `encode_workflow_document`.
_ENCODE_CHUNK = 1000


def encode(data: Any) -> bytes:
    """Compact UTF-8 JSON: how every document leaves the server."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def timestamp(at: datetime | None) -> str | None:
    """RFC 3339 in UTC with a `Z`, or None."""
    if at is None:
        return None
    return at.isoformat().replace("+00:00", "Z")


def counts(actions: Iterable[ActionRecord]) -> dict[str, int]:
    """Actions per state, every state present (zeros included) so clients need no defaults."""
    result = {state.value: 0 for state in states.ActionState}
    for action in actions:
        result[action.state.value] += 1
    return result


def action_outcome(action: ActionRecord, *, twin: bool = False) -> reuse.Reuse:
    """Computed, shared, reused or not needed (`pingo.workflows.reuse`)."""
    if action.shared_with is not None and not twin:
        # Shared while it waits for the other workflow's computation, or once that one
        # stored the dataset (it never ran); computed once it computes it itself.
        waited = action.is_attached or (
            action.state is states.ActionState.FINISHED and action.attempts == 0
        )
        return reuse.Reuse.SHARED if waited else reuse.Reuse.COMPUTED
    return reuse.outcome(runs=not action.reused, reason=action.reason, twin=twin)


#: Producer claim key → how the document shows it (`pingo.api.routes.workflows` reads them).
SharedViews = Mapping[str, reuse.SharedWith]


def shared_with(action: ActionRecord, views: SharedViews) -> dict[str, Any] | None:
    """`sharedWith` of an action: whom it shared (or shares) its dataset's computation with."""
    if action.shared_with is None:
        return None
    view = views.get(action.shared_with)
    return None if view is None else view.to_json()


def action_summary(
    action: ActionRecord, *, twin: bool = False, views: SharedViews | None = None
) -> dict[str, Any]:
    """An action as it appears in the workflow document (`error`: why it failed, if it did)."""
    return {
        "actionId": action.action_id,
        "name": action.name,
        "type": action.type,
        "state": action.state.value,
        "datasetId": action.dataset_id,
        "reused": action.reused,
        "reuse": action_outcome(action, twin=twin).value,
        "sharedWith": shared_with(action, views or {}),
        "attempts": action.attempts,
        "startedAt": timestamp(action.started_at),
        "finishedAt": timestamp(action.finished_at),
        "error": action.error,
    }


def cluster_jobs(attempt: int, jobs: cluster.ClusterJobs) -> dict[str, Any]:
    """`GET …/actions/{actionId}/cluster-jobs`: the jobs one attempt's client submitted."""
    return {
        "attempt": attempt,
        "applications": [
            {"id": app, "logsCommand": ["yarn", *cluster.logs_command(app)]}
            for app in jobs.application_ids
        ],
        "drivers": list(jobs.driver_ids),
        "urls": list(jobs.urls),
    }


def is_twin(action: ActionRecord, dataset: DatasetRecord | None) -> bool:
    """Whether a lower action of the same workflow computes this action's dataset too.

    Planning makes the lowest of such twins the dataset's producer of record, so one
    dataset read answers it, where `reuse.twins` needs every action of the workflow.
    """
    return (
        not action.reused
        and dataset is not None
        and dataset.producer_workflow_id == action.workflow_id
        and dataset.producer_action_id < action.action_id
    )


def action_detail(
    action: ActionRecord,
    dataset: DatasetRecord | None = None,
    views: SharedViews | None = None,
) -> dict[str, Any]:
    """`GET /workflows/{id}/actions/{actionId}`: the summary plus what a debugger needs.

    `dataset` (the action's) tells whether it shares its dataset with a twin.
    """
    return {
        **action_summary(action, twin=is_twin(action, dataset), views=views),
        "reason": action.reason,
        "callbackId": action.callback_id,
        "externalId": action.external_id,
        "definition": action.definition,
        "history": [{"state": e.state.value, "at": timestamp(e.at)} for e in action.history],
    }


def workflow_summary(workflow: WorkflowRecord) -> dict[str, Any]:
    """A workflow as it appears in lists (the document without `counts` and `actions`)."""
    return {
        "id": workflow.id,
        "name": workflow.name,
        "owner": workflow.owner,
        "state": workflow.state.value,
        "createdAt": timestamp(workflow.created_at),
        "finishedAt": timestamp(workflow.finished_at),
        "endDatasetId": workflow.end_dataset_id,
    }


def workflow_document(
    workflow: WorkflowRecord, actions: list[ActionRecord], views: SharedViews | None = None
) -> dict[str, Any]:
    """The workflow document: every action of the definition, in ascending action id."""
    ordered = sorted(actions, key=lambda a: a.action_id)
    twins = _twins(ordered)
    return {
        **_workflow_head(workflow, ordered, twins),
        "actions": [action_summary(a, twin=a.action_id in twins, views=views) for a in ordered],
    }


def encode_workflow_document(
    workflow: WorkflowRecord, actions: Sequence[ActionRecord], views: SharedViews | None = None
) -> bytes:
    """`encode(workflow_document(...))`, the same bytes, a thousand actions per encoder call.

    One call of the C encoder over a 100,000-action document holds the GIL for
    most of a second; in slices, a worker thread doing this lets the event loop
    run in between (issue 13).
    """
    ordered = sorted(actions, key=lambda a: a.action_id)
    twins = _twins(ordered)
    head = encode(_workflow_head(workflow, ordered, twins))
    parts = [head[:-1], b',"actions":[']
    for start in range(0, len(ordered), _ENCODE_CHUNK):
        chunk = encode(
            [
                action_summary(a, twin=a.action_id in twins, views=views)
                for a in ordered[start : start + _ENCODE_CHUNK]
            ]
        )
        if start:
            parts.append(b",")
        parts.append(chunk[1:-1])
    parts.append(b"]}")
    return b"".join(parts)


def _twins(ordered: Sequence[ActionRecord]) -> frozenset[int]:
    """The actions that share their dataset with a lower action of the same workflow."""
    return reuse.twins((a.action_id, a.dataset_id, not a.reused) for a in ordered)


def _workflow_head(
    workflow: WorkflowRecord, ordered: list[ActionRecord], twins: Collection[int]
) -> dict[str, Any]:
    """The workflow document but its `actions`, which come last."""
    summary = workflow_summary(workflow)
    return {
        "id": summary["id"],
        "name": summary["name"],
        "owner": summary["owner"],
        "state": summary["state"],
        "createdAt": summary["createdAt"],
        "finishedAt": summary["finishedAt"],
        "error": workflow.error,
        "counts": counts(ordered),
        "reuse": reuse.summary(action_outcome(a, twin=a.action_id in twins) for a in ordered),
        "endDatasetId": summary["endDatasetId"],
    }


class DatasetView(enum.Enum):
    """How much of a dataset a viewer may see (decided in `pingo.api.routes.datasets`)."""

    #: An admin: everything, readers' claims included.
    ADMIN = "admin"
    #: The owner of the workflow that produced it: everything but other workflows' claims.
    OWNER = "owner"
    #: Anyone else in its sharing scope: what it is, never whose workflow made it or how.
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Producer:
    """The owner of a dataset's producing workflow and the producing action's name."""

    owner: str | None
    name: str | None


def stored_size(dataset: DatasetRecord) -> int | None:
    """The bytes a dataset's files take now: None while it is computed and once DELETED."""
    return dataset.size_bytes if dataset.state in states.DATASET_USING_STORAGE else None


def dataset_document(
    dataset: DatasetRecord,
    view: DatasetView = DatasetView.ADMIN,
    producer: Producer | None = None,
) -> dict[str, Any]:
    """A dataset, with where it came from, as much as `view` may see.

    Another user's workflow id, document and `env` values are never shown to
    OTHER viewers: their `producedBy` holds the action's name and type only,
    and the claims (which name the reading workflows) are shown as a count.
    """
    produced_by: dict[str, Any] = {
        "name": None if producer is None else producer.name,
        "type": dataset.action_type,
    }
    document: dict[str, Any] = {
        "id": dataset.id,
        "state": dataset.state.value,
        "sizeBytes": stored_size(dataset),
        "digest": dataset.digest,
    }
    if view is not DatasetView.OTHER or dataset.is_managed:
        # An unmanaged path is the producer's own path; a managed one only says the id.
        document["path"] = dataset.path
    document.update(
        {
            "scope": dataset.scope,
            "managed": dataset.is_managed,
            "pinned": dataset.pinned,
            "claimCount": len(dataset.claims),
        }
    )
    if view is DatasetView.ADMIN:
        document["claims"] = list(dataset.claims)
    if view is not DatasetView.OTHER:
        produced_by.update(
            workflowId=dataset.producer_workflow_id,
            actionId=dataset.producer_action_id,
            definition=dataset.definition,
        )
    document.update(
        {
            "producedBy": produced_by,
            "parents": list(dataset.parents),
            "computeSeconds": dataset.compute_s,
            "useCount": dataset.use_count,
            "createdAt": timestamp(dataset.created_at),
            "storedAt": timestamp(dataset.stored_at),
            "lastUsedAt": timestamp(dataset.last_used_at),
        }
    )
    return document


def lineage_node(
    dataset_id: str,
    dataset: DatasetRecord | None,
    view: DatasetView = DatasetView.ADMIN,
    producer: Producer | None = None,
) -> dict[str, Any]:
    """One node of a lineage graph, as much as `view` may see (as `dataset_document`)."""
    if dataset is None:
        # An input whose record is gone: still part of the lineage.
        return {"id": dataset_id, "state": None}
    node: dict[str, Any] = {
        "id": dataset.id,
        "state": dataset.state.value,
        "actionType": dataset.action_type,
        "actionName": None if producer is None else producer.name,
        "sizeBytes": stored_size(dataset),
        "digest": dataset.digest,
        "isManaged": dataset.is_managed,
        "storedAt": timestamp(dataset.stored_at),
    }
    if view is not DatasetView.OTHER:
        node["producerWorkflowId"] = dataset.producer_workflow_id
        node["producerActionId"] = dataset.producer_action_id
    return node


def verification_document(verdict: Verdict, dataset: DatasetRecord) -> dict[str, Any]:
    """`?verify=true`: the recorded digest against what the files hash to now."""
    return {
        "status": verdict.status.value,
        "recordedDigest": dataset.digest,
        "actualDigest": verdict.digest,
        "recordedSizeBytes": dataset.size_bytes,
        "actualSizeBytes": verdict.size_bytes,
    }


#: JSON field → `UserLimits` field, for user documents and `PATCH /users/{name}`.
LIMIT_FIELDS: dict[str, str] = {
    "maxWorkflows": "max_workflows",
    "maxInFlightActions": "max_in_flight_actions",
    "submissionsPerMinute": "submissions_per_minute",
}


def user_document(user: UserRecord, settings: Settings) -> dict[str, Any]:
    """A user with the limits that apply to them, never with a token hash.

    `limits` are in force (null: unlimited); `ownLimits` are the user's own
    overrides (null: the server's default applies).
    """
    in_force = limits.effective(user.limits, settings)
    return {
        "name": user.name,
        "admin": user.is_admin,
        "createdAt": timestamp(user.created_at),
        "limits": {key: getattr(in_force, attr) for key, attr in LIMIT_FIELDS.items()},
        "ownLimits": {key: getattr(user.limits, attr) for key, attr in LIMIT_FIELDS.items()},
    }


def page(items: list[dict[str, Any]], next_cursor: str | None) -> dict[str, Any]:
    """A page of a list: `{"items": [...], "next": cursor-or-null}`."""
    return {"items": items, "next": next_cursor}


def callback_answer(action: ActionRecord) -> Mapping[str, Any]:
    """What a callback returns: enough for the caller, nothing about the workflow."""
    return {
        "callbackId": action.callback_id,
        "attempt": action.attempts,
        "state": action.state.value,
    }


def event_document(event: EventRecord) -> dict[str, Any]:
    """An event of a user's feed (`GET /api/v1/events`)."""
    return {
        "id": str(event.seq),
        "kind": event.kind,
        "at": timestamp(event.at),
        "workflowId": event.workflow_id,
        "datasetId": event.dataset_id,
        "data": dict(event.payload or {}),
    }


def audit_document(event: EventRecord) -> dict[str, Any]:
    """An entry of the audit log (`GET /api/v1/audit`)."""
    payload = event.payload or {}
    return {
        "id": str(event.seq),
        "at": timestamp(event.at),
        "actor": payload.get("actor"),
        "action": payload.get("action"),
        "remote": payload.get("remote"),
        "target": payload.get("target", {}),
        "status": payload.get("status"),
    }

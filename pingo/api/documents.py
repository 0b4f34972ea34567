"""The JSON documents the API returns (camelCase), built from store records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pingo import states
from pingo.store.protocol import ActionRecord, DatasetRecord, UserRecord, WorkflowRecord
from pingo.workflows import reuse


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
    return reuse.outcome(runs=not action.reused, reason=action.reason, twin=twin)


def action_summary(action: ActionRecord, *, twin: bool = False) -> dict[str, Any]:
    """An action as it appears in the workflow document (`error`: why it failed, if it did)."""
    return {
        "actionId": action.action_id,
        "name": action.name,
        "type": action.type,
        "state": action.state.value,
        "datasetId": action.dataset_id,
        "reused": action.reused,
        "reuse": action_outcome(action, twin=twin).value,
        "attempts": action.attempts,
        "startedAt": timestamp(action.started_at),
        "finishedAt": timestamp(action.finished_at),
        "error": action.error,
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


def action_detail(action: ActionRecord, dataset: DatasetRecord | None = None) -> dict[str, Any]:
    """`GET /workflows/{id}/actions/{actionId}`: the summary plus what a debugger needs.

    `dataset` (the action's) tells whether it shares its dataset with a twin.
    """
    return {
        **action_summary(action, twin=is_twin(action, dataset)),
        "reason": action.reason,
        "callbackId": action.callback_id,
        "externalId": action.external_id,
        "definition": action.definition,
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


def workflow_document(workflow: WorkflowRecord, actions: list[ActionRecord]) -> dict[str, Any]:
    """The workflow document: every action of the definition, in ascending action id."""
    ordered = sorted(actions, key=lambda a: a.action_id)
    summary = workflow_summary(workflow)
    twins = reuse.twins((a.action_id, a.dataset_id, not a.reused) for a in ordered)
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
        "actions": [action_summary(a, twin=a.action_id in twins) for a in ordered],
    }


def dataset_document(dataset: DatasetRecord) -> dict[str, Any]:
    """A dataset, with where it came from (its producer and its parents' ids)."""
    return {
        "id": dataset.id,
        "state": dataset.state.value,
        # Only files that are there take storage: a DELETED dataset's old size is history.
        "sizeBytes": dataset.size_bytes if dataset.state in states.DATASET_USING_STORAGE else None,
        "path": dataset.path,
        "scope": dataset.scope,
        "managed": dataset.is_managed,
        "pinned": dataset.pinned,
        "claims": list(dataset.claims),
        "producedBy": {
            "workflowId": dataset.producer_workflow_id,
            "actionId": dataset.producer_action_id,
            "type": dataset.action_type,
            "definition": dataset.definition,
        },
        "parents": list(dataset.parents),
        "computeSeconds": dataset.compute_s,
        "useCount": dataset.use_count,
        "createdAt": timestamp(dataset.created_at),
        "storedAt": timestamp(dataset.stored_at),
        "lastUsedAt": timestamp(dataset.last_used_at),
    }


def user_document(user: UserRecord) -> dict[str, Any]:
    """A user, never with a token hash."""
    return {"name": user.name, "admin": user.is_admin, "createdAt": timestamp(user.created_at)}


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

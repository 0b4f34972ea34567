"""The JSON documents the API returns (camelCase), built from store records."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pingo import states
from pingo.store.protocol import ActionRecord, DatasetRecord, UserRecord, WorkflowRecord

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


def action_summary(action: ActionRecord) -> dict[str, Any]:
    """An action as it appears in the workflow document."""
    return {
        "actionId": action.action_id,
        "name": action.name,
        "type": action.type,
        "state": action.state.value,
        "datasetId": action.dataset_id,
        "reused": action.reused,
        "attempts": action.attempts,
        "startedAt": timestamp(action.started_at),
        "finishedAt": timestamp(action.finished_at),
    }


def action_detail(action: ActionRecord) -> dict[str, Any]:
    """`GET /workflows/{id}/actions/{actionId}`: the summary plus what a debugger needs."""
    return {
        **action_summary(action),
        "callbackId": action.callback_id,
        "externalId": action.external_id,
        "definition": action.definition,
        "error": action.error,
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
    return {**_workflow_head(workflow, ordered), "actions": [action_summary(a) for a in ordered]}


def encode_workflow_document(workflow: WorkflowRecord, actions: Sequence[ActionRecord]) -> bytes:
    """`encode(workflow_document(...))`, the same bytes, a thousand actions per encoder call.

    One call of the C encoder over a 100,000-action document holds the GIL for
    most of a second; in slices, a worker thread doing this lets the event loop
    run in between (issue 13).
    """
    ordered = sorted(actions, key=lambda a: a.action_id)
    head = encode(_workflow_head(workflow, ordered))
    parts = [head[:-1], b',"actions":[']
    for start in range(0, len(ordered), _ENCODE_CHUNK):
        chunk = encode([action_summary(a) for a in ordered[start : start + _ENCODE_CHUNK]])
        if start:
            parts.append(b",")
        parts.append(chunk[1:-1])
    parts.append(b"]}")
    return b"".join(parts)


def _workflow_head(workflow: WorkflowRecord, ordered: list[ActionRecord]) -> dict[str, Any]:
    """The workflow document but its `actions`, which come last."""
    summary = workflow_summary(workflow)
    return {
        "id": summary["id"],
        "name": summary["name"],
        "owner": summary["owner"],
        "state": summary["state"],
        "createdAt": summary["createdAt"],
        "finishedAt": summary["finishedAt"],
        "counts": counts(ordered),
        "endDatasetId": summary["endDatasetId"],
    }


def dataset_document(dataset: DatasetRecord) -> dict[str, Any]:
    """A dataset, with where it came from (its producer and its parents' ids)."""
    return {
        "id": dataset.id,
        "state": dataset.state.value,
        "sizeBytes": dataset.size_bytes,
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

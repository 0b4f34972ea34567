"""The OpenAPI 3.1 document of the API, and the /docs page rendered from it.

This module writes the paths and operations. The schemas of the response
documents and of most request bodies are generated from `pingo.api.models`;
written here are only those of bodies another module validates: a schedule
(`pingo.schedules.rules`) and a callback's report.

The workflow request body is `schemas/workflow.schema.json` itself, embedded
as `components.schemas.Workflow`: the one schema validates submissions and
documents them. OpenAPI 3.1 schemas are JSON Schema 2020-12, so it goes in
as it is; its internal `#/$defs/...` references are rewritten to where it now
sits in this document, so that every tool resolves them.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Mapping
from typing import Any

from pingo import __version__, events, states, untrusted
from pingo.api import models, problems
from pingo.schedules import rules
from pingo.store import _cursor

_WORKFLOW_POINTER = "#/components/schemas/Workflow"

JSON = "application/json"


def _rebase_refs(node: Any, prefix: str) -> Any:
    """A copy of `node` whose local `$ref`s (`#/...`) point under `prefix`."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/"):
                out[key] = prefix + value[1:]
            elif key in ("$id", "$schema"):
                # The document's own base URI would re-root its references elsewhere.
                continue
            else:
                out[key] = _rebase_refs(value, prefix)
        return out
    if isinstance(node, list):
        return [_rebase_refs(item, prefix) for item in node]
    return node


def workflow_schema() -> dict[str, Any]:
    """The workflow JSON Schema, as it appears in the OpenAPI document."""
    from pingo.workflows import _schema

    schema: dict[str, Any] = _rebase_refs(_schema.workflow_schema(), _WORKFLOW_POINTER)
    return schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _schemas() -> dict[str, Any]:
    """`components/schemas`: generated from `models`, but for the request bodies whose
    shape another module owns (the workflow language, the schedule rules, callbacks)."""
    return {
        "Workflow": workflow_schema(),
        **models.schemas(),
        **_schedule_request_schemas(),
        "CallbackBody": {
            "type": "object",
            "properties": {
                "error": {"type": "string", "description": "for failed: why"},
                "runtimeS": {
                    "type": ["number", "string"],
                    "description": "for success: measured runtime in seconds",
                },
            },
        },
    }


def _too_many(codes: str) -> dict[str, Any]:
    return {
        **_problem(f"Over a per-user limit ({codes}); retry after Retry-After seconds."),
        "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
    }


def _schedule_request_schemas() -> dict[str, Any]:
    """A schedule's request body: `pingo.schedules.rules` validates it, with its own
    pointers, so this is written beside the rules' constants rather than generated."""
    settings = {
        "cron": {
            "type": "string",
            "description": "5 fields, or 6 with the seconds first (`*/10 * * * * *`).",
        },
        "timezone": {"type": "string", "default": "UTC", "description": "An IANA zone name."},
        "catchUp": {"enum": list(rules.CATCH_UP_POLICIES), "default": "latest"},
        "catchUpLimit": {
            "type": "integer",
            "minimum": 1,
            "maximum": rules.MAX_CATCH_UP,
            "default": 100,
        },
        "maxConcurrent": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": rules.MAX_CONCURRENT,
        },
        "overlap": {"enum": list(rules.OVERLAP_POLICIES), "default": "skip"},
        "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
        "start": {"type": ["string", "null"], "description": models.SCHEDULE_TIME},
        "end": {"type": ["string", "null"], "description": models.SCHEDULE_TIME},
    }
    return {
        "ScheduleRequest": {
            "type": "object",
            "required": ["name", "workflow"],
            "oneOf": [{"required": ["cron"]}, {"required": ["trigger"]}],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                **settings,
                "trigger": _ref("Trigger"),
                "workflow": {
                    "oneOf": [
                        _ref("Workflow"),
                        {"type": "string", "description": "the id of a stored workflow"},
                    ],
                    "description": "May use {schedule.time}, {schedule.date}, {param.NAME}.",
                },
                "webhooks": {"type": "array", "items": {"$ref": "#/components/schemas/Webhook"}},
                "paused": {"type": "boolean", "default": False},
            },
        },
        "Trigger": {
            "description": "Fire on data instead of a cron (docs/schedules.md#data-triggers).",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["dataset"],
                    "additionalProperties": False,
                    "properties": {
                        "dataset": {
                            "type": "object",
                            "required": ["workflow", "action"],
                            "additionalProperties": False,
                            "properties": {
                                "workflow": {"type": "string", "minLength": 1, "maxLength": 200},
                                "action": {"type": "string", "minLength": 1, "maxLength": 200},
                            },
                            "description": "Your workflow and action (by name) whose dataset "
                            "being stored fires the schedule.",
                        }
                    },
                },
                {
                    "type": "object",
                    "required": ["path"],
                    "additionalProperties": False,
                    "properties": {
                        "path": {
                            "type": "string",
                            "maxLength": 500,
                            "pattern": r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]*"
                            r"(/[A-Za-z0-9_=-][A-Za-z0-9_.=-]*)*$",
                            "description": "Relative to the data root; fires when it appears "
                            "or its modification time moves forward. Not under a dataset "
                            "directory (a first segment of two hex digits).",
                        }
                    },
                },
            ],
        },
        "Webhook": dict(workflow_schema()["$defs"]["webhook"]),
    }


def _schedule_paths() -> dict[str, Any]:
    sid = _param("scheduleId", "path", {"type": "string"}, "the schedule's id")
    schedule_ok = _json_body(_ref("Schedule"), "The schedule.")
    return {
        "/api/v1/schedules": {
            "post": _op(
                "createSchedule",
                "Create a schedule",
                "schedules",
                {
                    "201": _json_body(_ref("Schedule"), "Created; Location names it."),
                    "403": _problem(
                        "What a submission may be refused for (SANDBOX_UNAVAILABLE,"
                        " FORBIDDEN), or the user has PINGO_USER_MAX_SCHEDULES schedules"
                        " already (TOO_MANY_SCHEDULES)."
                    ),
                    "404": _problem("`workflow` names no workflow of yours (NOT_FOUND)."),
                    "422": _problem(
                        "Invalid schedule or workflow; `errors` points at each issue "
                        "(VALIDATION_FAILED, UNKNOWN_EXECUTOR)."
                    ),
                },
                description="Ticks are claimed by compare-and-set in the store, so each fires "
                "once across every node. See docs/schedules.md.",
                request_body={
                    "required": True,
                    "content": {JSON: {"schema": _ref("ScheduleRequest")}},
                },
            ),
            "get": _op(
                "listSchedules",
                "List schedules",
                "schedules",
                {"200": _json_body(_ref("ScheduleList"), "Yours (an admin's: everyone's).")},
                parameters=[
                    _LIMIT,
                    _param("owner", "query", {"type": "string"}, "only this user's (admins)"),
                ],
            ),
        },
        "/api/v1/schedules/{scheduleId}": {
            "get": _op(
                "getSchedule",
                "One schedule, with its next fire times",
                "schedules",
                {"200": schedule_ok, "404": _NOT_FOUND},
                parameters=[sid],
            ),
            "delete": _op(
                "deleteSchedule",
                "Delete a schedule (its workflows stay)",
                "schedules",
                {"204": {"description": "Deleted."}, "404": _NOT_FOUND},
                parameters=[sid],
            ),
        },
        "/api/v1/schedules/{scheduleId}/runs": {
            "get": _op(
                "listScheduleRuns",
                "What became of the schedule's ticks, latest first",
                "schedules",
                {"200": _json_body(_ref("ScheduleRunList"), "The runs."), "404": _NOT_FOUND},
                parameters=[sid, _LIMIT],
            )
        },
        "/api/v1/schedules/{scheduleId}/pause": {
            "post": _op(
                "pauseSchedule",
                "Pause a schedule",
                "schedules",
                {"200": schedule_ok, "404": _NOT_FOUND, "409": _problem("Busy (CONFLICT).")},
                parameters=[sid],
            )
        },
        "/api/v1/schedules/{scheduleId}/resume": {
            "post": _op(
                "resumeSchedule",
                "Resume a schedule from its next tick",
                "schedules",
                {
                    "200": schedule_ok,
                    "404": _NOT_FOUND,
                    "409": _problem("Busy (CONFLICT)."),
                    "422": _problem(
                        "Its stored definition fails the checks of a new one (VALIDATION_FAILED)."
                    ),
                },
                parameters=[sid],
            )
        },
        "/api/v1/schedules/{scheduleId}/deliveries": {
            "get": _op(
                "listScheduleDeliveries",
                "Webhook delivery log of the schedule's runs",
                "schedules",
                {"200": _json_body(_ref("DeliveryList"), "Newest first."), "404": _NOT_FOUND},
                parameters=[sid, _LIMIT],
            )
        },
        "/api/v1/workflows/{workflowId}/deliveries": {
            "get": _op(
                "listWorkflowDeliveries",
                "Webhook delivery log of a workflow",
                "workflows",
                {"200": _json_body(_ref("DeliveryList"), "Newest first."), "404": _NOT_FOUND},
                parameters=[_WORKFLOW_ID, _LIMIT],
            )
        },
    }


# ---- events and audit (issue 18): self-contained, merged into the document above.

#: What `cursor` and `Last-Event-ID` take: a position, or empty (absent, like any empty
#: parameter).
_EVENT_POSITION_PARAM = {"type": "string", "pattern": "^[0-9]{0,18}$"}


def _event_paths() -> dict[str, Any]:
    cursor = _param("cursor", "query", _EVENT_POSITION_PARAM, "the `next` of the previous page")
    bad_position = _problem(
        "A malformed cursor or Last-Event-ID (INVALID_CURSOR), or another query parameter "
        "(INVALID_PARAMETER)."
    )
    return {
        "/api/v1/events": {
            "get": _op(
                "listEvents",
                "Your workflows' events: pages, or a stream of server-sent events",
                "events",
                {
                    "200": {
                        "description": "Newest first; with `Accept: text/event-stream`, "
                        "each new event as `id`, `event` (its kind) and `data` (the Event).",
                        "content": {
                            JSON: {"schema": _ref("EventPage")},
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    "400": bad_position,
                    "429": _too_many("RATE_LIMITED: event streams open, per user or on the node"),
                },
                description="Only your own workflows' events, admins included. A stream "
                "resumes after `Last-Event-ID`. See docs/api.md#events.",
                parameters=[
                    _LIMIT,
                    cursor,
                    _param(
                        "kind",
                        "query",
                        {"enum": list(events.FEED_KINDS)},
                        "only this kind",
                    ),
                    _param(
                        "Last-Event-ID", "header", _EVENT_POSITION_PARAM, "resume a stream after it"
                    ),
                ],
            )
        },
        "/api/v1/audit": {
            "get": _op(
                "listAudit",
                "Every user action, newest first (admins)",
                "events",
                {
                    "200": _json_body(_ref("AuditPage"), "The audit log."),
                    "400": bad_position,
                    "403": _problem("Not an admin (FORBIDDEN)."),
                },
                parameters=[_LIMIT, cursor],
            )
        },
    }


def _json_body(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": dict(schema)}}}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {problems.PROBLEM_JSON: {"schema": _ref("Problem")}},
    }


_COMMON_ERRORS = {
    "401": _problem("No bearer token, or an unknown one (UNAUTHORIZED)."),
    "500": _problem("Unexpected error; the detail names a log reference (INTERNAL)."),
}


#: A big workflow is planned in a process of its own (`pingo.node.BigSubmission`).
_INTERRUPTED = _problem(
    "A big workflow's planning process ended before it answered, or planning took longer "
    "than its deadline (SUBMISSION_INTERRUPTED); "
    "retry, with an Idempotency-Key so that it is stored once."
)

_QUERY_ERRORS = {"400": _problem("A query parameter is not valid (INVALID_PARAMETER).")}
#: Path parameters that take a unique id prefix (`pingo.store.lookup`).
_PREFIXED = frozenset({"workflowId", "datasetId"})
_AMBIGUOUS = "an id prefix starts several of the ids you may see (AMBIGUOUS_ID)"
_BODY_ERRORS = {
    "400": _problem(
        "The body is not strict JSON (MALFORMED_JSON), or a query parameter is not valid "
        "(INVALID_PARAMETER)."
    ),
    "413": _problem("Body over the limit (PAYLOAD_TOO_LARGE)."),
    "415": _problem("Not application/json (UNSUPPORTED_MEDIA_TYPE)."),
}


def _op(
    operation_id: str,
    summary: str,
    tag: str,
    responses: Mapping[str, Any],
    *,
    description: str = "",
    parameters: list[dict[str, Any]] | None = None,
    request_body: dict[str, Any] | None = None,
    public: bool = False,
) -> dict[str, Any]:
    responses = {
        # Query parameters and bodies are read by the one strict reader of each,
        # which can refuse them these ways on any operation.
        **(_QUERY_ERRORS if any(p["in"] == "query" for p in parameters or ()) else {}),
        **(_BODY_ERRORS if request_body is not None else {}),
        **dict(responses),
        **({} if public else _COMMON_ERRORS),
    }
    if any(p["name"] in _PREFIXED for p in parameters or ()):
        other = responses.get("400", {}).get("description", "").rstrip(".")
        responses["400"] = _problem(
            f"{other[0].upper()}{other[1:]}, or {_AMBIGUOUS}." if other else f"An {_AMBIGUOUS}."
        )
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "responses": responses,
    }
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if request_body is not None:
        operation["requestBody"] = request_body
    if public:
        operation["security"] = []
    return operation


def _param(
    name: str, where: str, schema: Mapping[str, Any], description: str, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": dict(schema),
        "description": description,
    }


_WORKFLOW_ID = _param(
    "workflowId",
    "path",
    {"type": "string"},
    "the workflow's id, or a unique prefix of it (8 characters or more) among yours",
)
#: Every integer the API takes is one the stores hold (`pingo.untrusted`).
_INT64 = {"type": "integer", "minimum": untrusted.INT64_MIN, "maximum": untrusted.INT64_MAX}
_ATTEMPT = {"type": "integer", "minimum": 1, "maximum": untrusted.INT64_MAX}
_ACTION_ID = _param("actionId", "path", _INT64, "the action's id in its workflow")
_DATASET_ID_PARAM = _param(
    "datasetId",
    "path",
    {"type": "string"},
    "the dataset's id, or a unique prefix of it (8 characters or more) among those you see",
)
_CALLBACK_ID = _param("callbackId", "path", {"type": "string"}, "the action's callback id")
_LIMIT = _param(
    "limit",
    "query",
    {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    "page size",
)
_CURSOR = _param(
    "cursor",
    "query",
    # Empty, like any empty query parameter, means absent: the first page.
    {"type": "string", "pattern": f"^(?:{_cursor.CURSOR_PATTERN})?$"},
    "the `next` of the previous page",
)
_CALLBACK_AUTH = [
    _param("attempt", "query", _ATTEMPT, "the attempt reporting", True),
    _param("token", "query", {"type": "string"}, "HMAC of callback id and attempt", True),
]
_USER_NAME = _param("name", "path", {"type": "string"}, "the user's name")
_NOT_FOUND = _problem("No such resource, or another user's (NOT_FOUND).")
_SUBMISSION_FORBIDDEN = _problem(
    "Command-line actions of a non-admin user while the sandbox cannot run or the"
    " server runs as root (SANDBOX_UNAVAILABLE), or an action forcing the computation"
    " of a stored dataset the user may not manage (FORBIDDEN), or the owner's stored"
    " datasets at or past their storage quota (STORAGE_QUOTA_EXCEEDED)."
)


def _paths() -> dict[str, Any]:
    workflow_ok = _json_body(_ref("WorkflowDocument"), "The workflow document.")
    return {
        **_schedule_paths(),
        **_event_paths(),
        "/api/v1/workflows": {
            "post": _op(
                "submitWorkflow",
                "Submit a workflow",
                "workflows",
                {
                    "201": {
                        **workflow_ok,
                        "description": "Accepted: the workflow document. A retry with the same "
                        "Idempotency-Key answers 201 again with the same workflow and the header "
                        "`Idempotent-Replayed: true` (Stripe's convention).",
                        "headers": {
                            "Location": {"schema": {"type": "string"}},
                            "Idempotent-Replayed": {"schema": {"type": "string"}},
                        },
                    },
                    "200": _json_body(_ref("Plan"), "With ?dryRun=true: the plan; nothing stored."),
                    "400": _problem("Malformed JSON or too deeply nested (MALFORMED_JSON)."),
                    "403": _SUBMISSION_FORBIDDEN,
                    "413": _problem("Body over the limit (PAYLOAD_TOO_LARGE)."),
                    "415": _problem("Not application/json (UNSUPPORTED_MEDIA_TYPE)."),
                    "422": _problem(
                        "Invalid workflow (VALIDATION_FAILED, UNKNOWN_EXECUTOR, "
                        "IDEMPOTENCY_KEY_REUSED); `errors` lists every issue."
                    ),
                    "429": _too_many("RATE_LIMITED, TOO_MANY_WORKFLOWS"),
                    "503": _INTERRUPTED,
                },
                description="Plans the workflow: actions whose datasets are stored are reused, "
                "the rest are computed. A fully reused workflow is SUCCEEDED at once.",
                parameters=[
                    _param("dryRun", "query", {"type": "boolean"}, "plan only; store nothing"),
                    _param(
                        "Idempotency-Key",
                        "header",
                        {"type": "string", "minLength": 1, "maxLength": 255},
                        "a retried POST with the same key returns the same workflow",
                    ),
                ],
                request_body={
                    "required": True,
                    "content": {JSON: {"schema": _ref("Workflow")}},
                },
            ),
            "get": _op(
                "listWorkflows",
                "List workflows, newest first",
                "workflows",
                {
                    "200": _json_body(_ref("WorkflowPage"), "A page of workflows."),
                    "400": _problem("A bad parameter or cursor (INVALID_PARAMETER)."),
                },
                description="Users see their own workflows; admins see all (and may filter "
                "by owner). Pages are stable while workflows are added.",
                parameters=[
                    _param(
                        "state",
                        "query",
                        {"type": "string", "enum": [s.value for s in states.WorkflowState]},
                        "only workflows in this state",
                    ),
                    _param("name", "query", {"type": "string"}, "only workflows with this name"),
                    _param("owner", "query", {"type": "string"}, "admins: only this owner's"),
                    _LIMIT,
                    _CURSOR,
                ],
            ),
        },
        "/api/v1/workflows/{workflowId}": {
            "get": _op(
                "getWorkflow",
                "Get a workflow",
                "workflows",
                {"200": workflow_ok, "404": _NOT_FOUND},
                parameters=[_WORKFLOW_ID],
            )
        },
        "/api/v1/workflows/{workflowId}/kill": {
            "post": _op(
                "killWorkflow",
                "Kill a workflow",
                "workflows",
                {
                    "200": workflow_ok,
                    "404": _NOT_FOUND,
                    "409": _problem("Already finished (CONFLICT)."),
                },
                parameters=[_WORKFLOW_ID],
            )
        },
        "/api/v1/workflows/{workflowId}/rerun": {
            "post": _op(
                "rerunWorkflow",
                "Re-run a workflow as a new one",
                "workflows",
                {
                    "201": {**workflow_ok, "headers": {"Location": {"schema": {"type": "string"}}}},
                    "403": _SUBMISSION_FORBIDDEN,
                    "404": _NOT_FOUND,
                    "422": _problem("Unknown action names or ids in `force`."),
                    "429": _too_many("RATE_LIMITED, or the owner's TOO_MANY_WORKFLOWS"),
                    "503": _INTERRUPTED,
                },
                description="Submits the same document again as a NEW workflow owned by the "
                "original owner: provenance makes a fresh plan the natural re-run (stored "
                "datasets are reused, lost or failed ones computed). `force` recomputes the "
                "named actions even when their datasets are stored.",
                parameters=[_WORKFLOW_ID],
                request_body={
                    "required": False,
                    "content": {JSON: {"schema": _ref("RerunRequest")}},
                },
            )
        },
        "/api/v1/workflows/{workflowId}/actions/{actionId}": {
            "get": _op(
                "getAction",
                "Get an action",
                "workflows",
                {
                    "200": _json_body(_ref("ActionDetail"), "The action."),
                    "404": _NOT_FOUND,
                },
                parameters=[_WORKFLOW_ID, _ACTION_ID],
            )
        },
        "/api/v1/workflows/{workflowId}/actions/{actionId}/logs": {
            "get": _op(
                "getActionLogs",
                "Get an action's log",
                "workflows",
                {
                    "200": {
                        "description": "stdout and stderr of the attempt (local executor).",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "206": {
                        "description": "The part of the log a `Range` header asked for.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "404": _problem("No such action, no attempt yet, or no log on this node."),
                    "416": {"description": "A `Range` outside the log (an empty one's end)."},
                },
                parameters=[
                    _WORKFLOW_ID,
                    _ACTION_ID,
                    _param("attempt", "query", _ATTEMPT, "default: latest"),
                    _param(
                        "Range",
                        "header",
                        {"type": "string"},
                        "bytes=-N for the log's last N bytes (RFC 9110 byte ranges)",
                    ),
                ],
            )
        },
        "/api/v1/workflows/{workflowId}/actions/{actionId}/cluster-jobs": {
            "get": _op(
                "getActionClusterJobs",
                "Where a cluster action's jobs and logs are",
                "workflows",
                {
                    "200": _json_body(
                        _ref("ClusterJobs"),
                        "The YARN applications, Spark drivers and tracking or UI URLs the "
                        "attempt's client (hadoop, spark-submit) printed; empty lists for "
                        "an action that names none.",
                    ),
                    "404": _problem("No such action, no attempt yet, or no log on this node."),
                },
                parameters=[
                    _WORKFLOW_ID,
                    _ACTION_ID,
                    _param("attempt", "query", _ATTEMPT, "default: latest"),
                ],
            )
        },
        "/api/v1/datasets": {
            "get": _op(
                "listDatasets",
                "List datasets, newest first",
                "datasets",
                {
                    "200": _json_body(_ref("DatasetPage"), "A page of datasets."),
                    "400": _problem("A bad parameter or cursor (INVALID_PARAMETER)."),
                },
                parameters=[
                    _param(
                        "state",
                        "query",
                        {"type": "string", "enum": [s.value for s in states.DatasetState]},
                        "only datasets in this state",
                    ),
                    _LIMIT,
                    _CURSOR,
                ],
            )
        },
        "/api/v1/datasets/{datasetId}": {
            "get": _op(
                "getDataset",
                "Get a dataset",
                "datasets",
                {
                    "200": _json_body(_ref("Dataset"), "The dataset."),
                    "404": _NOT_FOUND,
                    "429": _too_many("RATE_LIMITED: verifications running, per user"),
                },
                parameters=[
                    _DATASET_ID_PARAM,
                    _param(
                        "verify",
                        "query",
                        {"type": "boolean"},
                        "hash the files again and add `verification`",
                    ),
                ],
            ),
            "delete": _op(
                "deleteDataset",
                "Mark a dataset for deletion",
                "datasets",
                {
                    "202": _json_body(
                        _ref("Dataset"), "Marked; the deletor removes it when no claim holds it."
                    ),
                    "403": _problem("Neither an admin nor the producer's owner (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                    "409": _problem("A LEAF dataset without ?force=true, or not on disk."),
                },
                parameters=[
                    _DATASET_ID_PARAM,
                    _param("force", "query", {"type": "boolean"}, "required for LEAF datasets"),
                ],
            ),
        },
        "/api/v1/datasets/{datasetId}/lineage": {
            "get": _op(
                "getDatasetLineage",
                "Get a dataset's ancestors",
                "datasets",
                {"200": _json_body(_ref("Lineage"), "The ancestor graph."), "404": _NOT_FOUND},
                parameters=[_DATASET_ID_PARAM],
            )
        },
        "/api/v1/datasets/{datasetId}/pin": {
            "post": _op(
                "pinDataset",
                "Pin a dataset (retention never evicts it)",
                "datasets",
                {
                    "200": _json_body(_ref("Dataset"), "The dataset."),
                    "403": _problem("Neither an admin nor the producer's owner (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                },
                parameters=[_DATASET_ID_PARAM],
            )
        },
        "/api/v1/datasets/{datasetId}/unpin": {
            "post": _op(
                "unpinDataset",
                "Unpin a dataset",
                "datasets",
                {
                    "200": _json_body(_ref("Dataset"), "The dataset."),
                    "403": _problem("Neither an admin nor the producer's owner (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                },
                parameters=[_DATASET_ID_PARAM],
            )
        },
        "/api/v1/storage": {
            "get": _op(
                "getStorage",
                "Storage capacity, usage and retention",
                "datasets",
                {"200": _json_body(_ref("Storage"), "Capacity, usage, policy, decisions.")},
            )
        },
        "/api/v1/callbacks/{callbackId}/{kind}": {
            "post": _op(
                "postCallback",
                "Report an attempt's progress",
                "callbacks",
                {
                    "200": _json_body(_ref("CallbackAnswer"), "Recorded (idempotent)."),
                    "400": _problem("Missing attempt (INVALID_PARAMETER)."),
                    "401": _problem("Missing token (UNAUTHORIZED); nothing changed."),
                    "403": _problem("Forged token (FORBIDDEN); nothing changed."),
                    "404": _NOT_FOUND,
                    "409": _problem("An old attempt (STALE_CALLBACK); nothing changed."),
                },
                description="Signed by `token` (HMAC of callback id and attempt), not by a "
                "bearer token.",
                parameters=[
                    _CALLBACK_ID,
                    _param(
                        "kind",
                        "path",
                        {"type": "string", "enum": ["running", "success", "failed", "killed"]},
                        "what happened",
                    ),
                    *_CALLBACK_AUTH,
                ],
                request_body={
                    "required": False,
                    "content": {JSON: {"schema": _ref("CallbackBody")}},
                },
                public=True,
            )
        },
        "/api/v1/callbacks/{callbackId}": {
            "get": _op(
                "getCallback",
                "Hadoop job-end notification",
                "callbacks",
                {
                    "200": _json_body(_ref("CallbackAnswer"), "Recorded (idempotent)."),
                    "400": _problem("Missing attempt or unknown status (INVALID_PARAMETER)."),
                    "401": _problem("Missing token (UNAUTHORIZED); nothing changed."),
                    "403": _problem("Forged token (FORBIDDEN); nothing changed."),
                    "404": _NOT_FOUND,
                    "409": _problem("An old attempt (STALE_CALLBACK); nothing changed."),
                },
                description="The URL handed to Hadoop ends in `&status=$jobStatus`, which "
                "Hadoop's JobEndNotifier fills in.",
                parameters=[
                    _CALLBACK_ID,
                    *_CALLBACK_AUTH,
                    _param(
                        "status",
                        "query",
                        {"type": "string", "enum": ["RUNNING", "SUCCEEDED", "FAILED", "KILLED"]},
                        "the job's status",
                        True,
                    ),
                ],
                public=True,
            )
        },
        "/api/v1/users": {
            "post": _op(
                "createUser",
                "Create a user (admin)",
                "users",
                {
                    "201": _json_body(_ref("NewUser"), "The user and its token, shown once."),
                    "403": _problem("Not an admin (FORBIDDEN)."),
                    "409": _problem(
                        "The name is taken, or still owns a revoked user's workflows,"
                        ' schedules or events and "reclaim" is not set (CONFLICT).'
                    ),
                    "422": _problem("Invalid name or body (VALIDATION_FAILED)."),
                },
                request_body={
                    "required": True,
                    "content": {JSON: {"schema": _ref("UserRequest")}},
                },
            ),
            "get": _op(
                "listUsers",
                "List users (admin)",
                "users",
                {
                    "200": _json_body(_ref("UserList"), "Every user, by name."),
                    "403": _problem("Not an admin (FORBIDDEN)."),
                },
            ),
        },
        "/api/v1/users/{name}": {
            "delete": _op(
                "deleteUser",
                "Revoke a user (admin)",
                "users",
                {
                    "204": {"description": "Revoked."},
                    "403": _problem("Not an admin (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                    "409": _problem("Revoking yourself (CONFLICT)."),
                },
                parameters=[_USER_NAME],
            ),
            "get": _op(
                "getUser",
                "A user and their limits (admin, or the user themselves)",
                "users",
                {
                    "200": _json_body(_ref("User"), "The user."),
                    "403": _problem("Another user, and not an admin (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                },
                parameters=[_USER_NAME],
            ),
            "patch": _op(
                "updateUser",
                "Change a user's limits (admin)",
                "users",
                {
                    "200": _json_body(_ref("User"), "The user, with the new limits."),
                    "403": _problem("Not an admin, even for oneself (FORBIDDEN)."),
                    "404": _NOT_FOUND,
                    "422": _problem(
                        "A limit that is not an integer from 1 up, or an unknown field "
                        "(INVALID_LIMIT, SCHEMA_VIOLATION); `errors` has a pointer for each."
                    ),
                },
                parameters=[_USER_NAME],
                request_body={"required": True, "content": {JSON: {"schema": _ref("UserUpdate")}}},
            ),
        },
        "/api/v1/me": {
            "get": _op(
                "getMe",
                "The user a token belongs to",
                "users",
                {"200": _json_body(_ref("User"), "The user.")},
            )
        },
        "/healthz": {
            "get": _op(
                "getHealth",
                "Liveness",
                "operations",
                {"200": _json_body(_ref("Status"), "The process answers.")},
                public=True,
            )
        },
        "/readyz": {
            "get": _op(
                "getReadiness",
                "Readiness (the store answers)",
                "operations",
                {
                    "200": _json_body(_ref("Readiness"), "Ready, with the sandbox's state."),
                    "503": _problem("The store is unreachable (STORE_UNAVAILABLE)."),
                },
                public=True,
            )
        },
        "/metrics": {
            "get": _op(
                "getMetrics",
                "Prometheus metrics",
                "operations",
                {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                public=True,
            )
        },
        "/openapi.json": {
            "get": _op(
                "getOpenApi",
                "This document",
                "operations",
                {"200": _json_body({"type": "object"}, "OpenAPI 3.1.")},
                public=True,
            )
        },
        "/docs": {
            "get": _op(
                "getDocs",
                "This document as a page",
                "operations",
                {
                    "200": {
                        "description": "HTML.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
                public=True,
            )
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once; callers must not mutate it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pingo",
            "version": __version__,
            "summary": "A workflow server that identifies datasets by provenance and reuses them.",
            "description": "Every route under /api/v1 but the callbacks needs "
            "`Authorization: Bearer <token>`. Errors are RFC 9457 problem+json with a stable "
            "`code`. A user sees, kills and re-runs only their own workflows; admins see all.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "tags": [
            {"name": "workflows", "description": "Submit, watch, kill and re-run workflows."},
            {
                "name": "schedules",
                "description": "Recurring workflows, fired once per tick across nodes.",
            },
            {"name": "datasets", "description": "Stored datasets, their lineage and storage."},
            {"name": "events", "description": "Your workflows' events; the audit log (admins)."},
            {"name": "callbacks", "description": "Executors report progress (signed)."},
            {"name": "users", "description": "Bearer-token users (admins)."},
            {"name": "operations", "description": "Health, metrics and this documentation."},
        ],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A user's token (`pingo users add NAME` prints one).",
                }
            },
            "schemas": _schemas(),
        },
    }


@functools.cache
def document_bytes() -> bytes:
    """The document, serialized once."""
    return json.dumps(document(), indent=1).encode()


# ----------------------------------------------------------------------------- /docs


_STYLE = """
body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;
color:#1b1b1b;line-height:1.45}
code,pre{font-family:ui-monospace,monospace;font-size:.92em}
pre{background:#f4f4f4;padding:.8em;overflow:auto;border-radius:4px}
.op{border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:.6em 1em}
.m{display:inline-block;min-width:4.5em;font-weight:bold;text-transform:uppercase}
.get{color:#0a6}.post{color:#06c}.delete{color:#c22}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left}
details summary{cursor:pointer}
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _schema_name(schema: Mapping[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return f'<a href="#schema-{_e(name)}">{_e(name)}</a>'
    return f"<code>{_e(json.dumps(schema))}</code>"


def _render_operation(path: str, method: str, op: Mapping[str, Any]) -> str:
    parts = [
        f'<div class="op" id="{_e(op["operationId"])}">',
        f'<span class="m {method}">{method}</span> <code>{_e(path)}</code> — {_e(op["summary"])}',
    ]
    if op.get("security") == []:
        parts.append(" <em>(no bearer token)</em>")
    if op.get("description"):
        parts.append(f"<p>{_e(op['description'])}</p>")
    params = op.get("parameters", [])
    if params:
        rows = "".join(
            f"<tr><td><code>{_e(p['name'])}</code></td><td>{_e(p['in'])}</td>"
            f"<td>{'yes' if p.get('required') else ''}</td><td>{_schema_name(p['schema'])}</td>"
            f"<td>{_e(p.get('description', ''))}</td></tr>"
            for p in params
        )
        parts.append(
            "<table><tr><th>parameter</th><th>in</th><th>required</th><th>schema</th>"
            f"<th></th></tr>{rows}</table>"
        )
    body = op.get("requestBody")
    if body:
        for media, content in body["content"].items():
            parts.append(f"<p>Body ({_e(media)}): {_schema_name(content['schema'])}</p>")
    lines: list[str] = []
    for status, response in op["responses"].items():
        schemas = ", ".join(
            f"{_e(media)} {_schema_name(c['schema'])}"
            for media, c in response.get("content", {}).items()
        )
        lines.append(
            f"<tr><td>{_e(status)}</td><td>{_e(response['description'])}</td>"
            f"<td>{schemas}</td></tr>"
        )
    parts.append(f"<table><tr><th>status</th><th></th><th>body</th></tr>{''.join(lines)}</table>")
    parts.append("</div>")
    return "".join(parts)


def render_html(doc: Mapping[str, Any]) -> str:
    """A self-contained reference page of `doc` (no script, no CDN)."""
    info = doc["info"]
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(info['title'])} API {_e(info['version'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(info['title'])} API <small>{_e(info['version'])}</small></h1>",
        f"<p>{_e(info['description'])}</p>",
        '<p>Machine-readable: <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p>',
        "<h2>Contents</h2><ul>",
    ]
    for tag in doc["tags"]:
        out.append(f'<li><a href="#tag-{_e(tag["name"])}">{_e(tag["name"])}</a></li>')
    out.append('<li><a href="#problems">errors</a></li><li><a href="#schemas">schemas</a></li>')
    out.append("</ul>")
    for tag in doc["tags"]:
        out.append(f'<h2 id="tag-{_e(tag["name"])}">{_e(tag["name"])}</h2>')
        out.append(f"<p>{_e(tag['description'])}</p>")
        for path, item in doc["paths"].items():
            for method, op in item.items():
                if tag["name"] in op.get("tags", []):
                    out.append(_render_operation(path, method, op))
    out.append('<h2 id="problems">Errors</h2><p>Every error is <code>')
    out.append(f"{problems.PROBLEM_JSON}</code> (RFC 9457) with one of these codes:</p><table>")
    for code, meaning in sorted(problems.DOCUMENTED_CODES.items()):
        out.append(
            f'<tr id="{_e(code)}"><td><code>{_e(code)}</code></td><td>{_e(meaning)}</td></tr>'
        )
    out.append('</table><h2 id="schemas">Schemas</h2>')
    for name, schema in doc["components"]["schemas"].items():
        out.append(
            f'<details id="schema-{_e(name)}"><summary><code>{_e(name)}</code></summary>'
            f"<pre>{_e(json.dumps(schema, indent=2))}</pre></details>"
        )
    out.append("</body></html>")
    return "".join(out)


@functools.cache
def docs_html() -> bytes:
    """The /docs page, rendered once."""
    return render_html(document()).encode()

"""`/api/v1/workflows`: submit, list, inspect, kill and re-run workflows; actions and logs."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from pingo import errors, states
from pingo.actions.executors import base as executors_base
from pingo.actions.executors.sandbox import COMMAND_LINE
from pingo.api import auth, bodies, documents, problems, state
from pingo.store.protocol import ActionRecord, WorkflowRecord

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Stripe's header, telling a client that this answer replays an earlier request.
REPLAYED_HEADER = "Idempotent-Replayed"
_MAX_KEY_LENGTH = 255


def workflow_location(workflow_id: str) -> str:
    """The URL path of a workflow."""
    return f"{PREFIX}/workflows/{workflow_id}"


async def visible_workflow(request: web.Request, workflow_id: str) -> WorkflowRecord:
    """The workflow, if the requester may see it; 404 otherwise (never reveal that it exists)."""
    user = auth.current_user(request)
    record = await state.node(request).store.get_workflow(workflow_id)
    if record is None or not auth.may_see(user, record.owner):
        raise errors.NotFound(f"no workflow {workflow_id!r}")
    return record


async def _document(request: web.Request, record: WorkflowRecord) -> dict[str, Any]:
    actions = await state.node(request).store.list_actions(record.id)
    return documents.workflow_document(record, actions)


async def _document_body(request: web.Request, record: WorkflowRecord) -> bytes:
    """The serialized workflow document; cached once SUCCEEDED, when nothing in it can change.

    (A FAILED or KILLED workflow may still see its last running actions stop.)
    """
    cache = state.api_state(request).finished_documents
    succeeded = record.state is states.WorkflowState.SUCCEEDED
    if succeeded:
        cached = cache.get(record.id)
        if cached is not None:
            return cached.body
    body = bodies.encode_json(await _document(request, record))
    if succeeded:
        cache.put(record.id, state.CachedDocument(owner=record.owner, body=body))
    return body


def _missing_executor_issues(
    document: Any, executor_types: frozenset[str], action_types: frozenset[str]
) -> list[errors.ValidationIssue]:
    """Issues for actions of a known type that no executor on this node can run.

    Cheap on purpose (no parse): submission parses anyway, and only documents
    that fail this check pay for a second, full validation.
    """
    if not isinstance(document, Mapping):
        return []
    actions = document.get("actions")
    if not isinstance(actions, list):
        return []
    types = {
        a.get("type") for a in actions if isinstance(a, Mapping) and isinstance(a.get("type"), str)
    }
    if not any(t in action_types and t not in executor_types for t in types):
        return []
    issues: list[errors.ValidationIssue] = []
    for index, action in enumerate(actions):
        if not isinstance(action, Mapping):
            continue
        action_type = action.get("type")
        if (
            isinstance(action_type, str)
            and action_type in action_types
            and action_type not in executor_types
        ):
            issues.append(
                errors.ValidationIssue(
                    "UNKNOWN_EXECUTOR",
                    f"no executor for action type {action_type!r} is configured on this node",
                    f"/actions/{index}/type",
                )
            )
    return issues


def _check_sandbox(request: web.Request, document: Any) -> None:
    """Refuse (403) command-line actions of a non-admin user when the sandbox cannot run."""
    if state.node(request).sandbox != "unavailable" or auth.current_user(request).is_admin:
        return
    actions = document.get("actions") if isinstance(document, Mapping) else None
    if isinstance(actions, list) and any(
        isinstance(a, Mapping) and a.get("type") == COMMAND_LINE for a in actions
    ):
        raise errors.SandboxUnavailable(
            "this server cannot sandbox command-line actions (user namespaces do not work"
            " here), so only admins may run them; see docs/security.md"
        )


def check_executors(request: web.Request, document: Any) -> None:
    """Refuse (422) a document with actions this node cannot run, with every other issue too."""
    shared = state.api_state(request)
    _check_sandbox(request, document)
    issues = _missing_executor_issues(document, shared.executor_types, shared.action_types)
    if not issues:
        return
    from pingo.workflows import language

    others = language.validate(document, max_actions=shared.settings.max_actions)
    if others:
        raise errors.ValidationFailed([*others, *issues])
    raise problems.UnknownExecutor(issues)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not key or len(key) > _MAX_KEY_LENGTH:
        issue = errors.ValidationIssue(
            "INVALID_PARAMETER", f"1 to {_MAX_KEY_LENGTH} characters", "/Idempotency-Key"
        )
        raise problems.BadRequest(f"the {IDEMPOTENCY_HEADER} header is not valid", [issue])
    return key


@routes.post(PREFIX + "/workflows", name="submit_workflow")
async def submit_workflow(request: web.Request) -> web.Response:
    """Submit a workflow (201 + Location), or plan it without running (`?dryRun=true`, 200)."""
    user = auth.current_user(request)
    node = state.node(request)
    dry_run = bodies.query_bool(request, "dryRun")
    key = _idempotency_key(request)
    document = await bodies.read_json(request)
    check_executors(request, document)
    if dry_run:
        plan = await node.workflows.dry_run(document, owner=user.name)
        return bodies.json_response(plan.to_json())
    headers = {}
    if key is not None:
        existing = await node.store.find_workflow_by_idempotency_key(user.name, key)
        if existing is not None:
            if existing.document != document:
                issue = errors.ValidationIssue(
                    "IDEMPOTENCY_KEY_REUSED",
                    f"this key was used for workflow {existing.id} with a different document",
                    "",
                )
                failure = errors.ValidationFailed([issue])
                failure.code = "IDEMPOTENCY_KEY_REUSED"
                raise failure
            # Stripe's convention: a replay gets the same status as the original answer.
            headers[REPLAYED_HEADER] = "true"
    record = await node.workflows.submit(document, owner=user.name, idempotency_key=key)
    headers["Location"] = workflow_location(record.id)
    return bodies.raw_json_response(
        await _document_body(request, record), status=201, headers=headers
    )


@routes.get(PREFIX + "/workflows", name="list_workflows")
async def list_workflows(request: web.Request) -> web.Response:
    """Workflows the requester may see, newest first, filtered and paginated by cursor."""
    user = auth.current_user(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000)
    wanted_state = bodies.query_enum(request, "state", states.WorkflowState)
    name = request.query.get("name") or None
    owner = request.query.get("owner") or None
    if not user.is_admin:
        if owner is not None and owner != user.name:
            # Another user's workflows are invisible, not forbidden.
            return bodies.json_response(documents.page([], None))
        owner = user.name
    try:
        found = await state.node(request).store.list_workflows(
            owner=owner,
            state=wanted_state,
            name=name,
            limit=limit or 100,
            cursor=request.query.get("cursor") or None,
        )
    except errors.ValidationFailed as exc:
        raise problems.InvalidParameter(exc.message, exc.issues) from exc
    items = [documents.workflow_summary(w) for w in found.items]
    return bodies.json_response(documents.page(items, found.next_cursor))


@routes.get(PREFIX + "/workflows/{workflow_id}", name="get_workflow")
async def get_workflow(request: web.Request) -> web.Response:
    """The workflow document."""
    workflow_id = request.match_info["workflow_id"]
    cached = state.api_state(request).finished_documents.get(workflow_id)
    if cached is not None:
        # A SUCCEEDED workflow never changes, nor does its owner: no store read at all.
        if not auth.may_see(auth.current_user(request), cached.owner):
            raise errors.NotFound(f"no workflow {workflow_id!r}")
        return bodies.raw_json_response(cached.body)
    record = await visible_workflow(request, workflow_id)
    return bodies.raw_json_response(await _document_body(request, record))


@routes.post(PREFIX + "/workflows/{workflow_id}/kill", name="kill_workflow")
async def kill_workflow(request: web.Request) -> web.Response:
    """Kill a running workflow: its running actions are stopped, waiting ones never start."""
    record = await visible_workflow(request, request.match_info["workflow_id"])
    killed = await state.node(request).workflows.kill(record.id)
    return bodies.json_response(await _document(request, killed))


def resolve_force(body: Any, definition_actions: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Action ids named by a rerun body `{"force": [name or id, ...]}` (422 for unknown ones)."""
    if body is None:
        return frozenset()
    if not isinstance(body, Mapping):
        raise errors.ValidationFailed(
            [errors.ValidationIssue("SCHEMA_VIOLATION", "the body must be an object", "")]
        )
    issues = [
        errors.ValidationIssue("SCHEMA_VIOLATION", f"unknown field {key!r}", f"/{key}")
        for key in body
        if key != "force"
    ]
    force = body.get("force", [])
    if not isinstance(force, list):
        issues.append(errors.ValidationIssue("SCHEMA_VIOLATION", "force must be a list", "/force"))
        force = []
    by_name: dict[str, list[int]] = {}
    ids: set[int] = set()
    for action in definition_actions:
        action_id = action.get("id")
        if isinstance(action_id, int):
            ids.add(action_id)
            by_name.setdefault(str(action.get("name")), []).append(action_id)
    chosen: set[int] = set()
    for index, item in enumerate(force):
        pointer = f"/force/{index}"
        if isinstance(item, bool) or not isinstance(item, int | str):
            issues.append(
                errors.ValidationIssue(
                    "SCHEMA_VIOLATION", "an action name (string) or id (integer)", pointer
                )
            )
        elif isinstance(item, int):
            if item in ids:
                chosen.add(item)
            else:
                issues.append(
                    errors.ValidationIssue(
                        "UNKNOWN_ACTION_ID", f"no action with id {item}", pointer
                    )
                )
        elif item in by_name:
            # Names are not unique: a name forces every action that bears it.
            chosen.update(by_name[item])
        else:
            issues.append(
                errors.ValidationIssue("UNKNOWN_ACTION_NAME", f"no action named {item!r}", pointer)
            )
    if issues:
        raise errors.ValidationFailed(issues)
    return frozenset(chosen)


async def start_rerun(request: web.Request, record: WorkflowRecord, body: Any) -> WorkflowRecord:
    """Submit `record`'s document again as a new workflow, forcing what `body` names."""
    raw_actions = record.document.get("actions", [])
    force = resolve_force(body, raw_actions if isinstance(raw_actions, list) else [])
    check_executors(request, record.document)
    # The re-run belongs to the original owner: in per-user sharing scopes the
    # owner is part of every dataset id, so this keeps the same provenance.
    return await state.node(request).workflows.submit(
        record.document, owner=record.owner, force=force, rerun_of=record.id
    )


@routes.post(PREFIX + "/workflows/{workflow_id}/rerun", name="rerun_workflow")
async def rerun_workflow(request: web.Request) -> web.Response:
    """Submit the same document again as a NEW workflow, forcing the named actions.

    Provenance makes a fresh plan the natural re-run: whatever is still stored
    is reused, whatever was lost or failed is computed, and `force` recomputes
    chosen actions even when their datasets exist.
    """
    record = await visible_workflow(request, request.match_info["workflow_id"])
    rerun = await start_rerun(request, record, await bodies.read_json(request, optional=True))
    return bodies.raw_json_response(
        await _document_body(request, rerun),
        status=201,
        headers={"Location": workflow_location(rerun.id)},
    )


async def _visible_action(request: web.Request) -> ActionRecord:
    record = await visible_workflow(request, request.match_info["workflow_id"])
    action_id = bodies.path_int(request, "action_id")
    action = await state.node(request).store.get_action(record.id, action_id)
    if action is None:
        raise errors.NotFound(f"workflow {record.id} has no action {action_id}")
    return action


@routes.get(PREFIX + "/workflows/{workflow_id}/actions/{action_id}", name="get_action")
async def get_action(request: web.Request) -> web.Response:
    """One action, with its callback id, external id, definition and error."""
    action = await _visible_action(request)
    return bodies.json_response(documents.action_detail(action))


@routes.get(PREFIX + "/workflows/{workflow_id}/actions/{action_id}/logs", name="get_action_logs")
async def get_action_logs(request: web.Request) -> web.StreamResponse:
    """The local executor's log of one attempt (`?attempt=`, default the latest), as text."""
    action = await _visible_action(request)
    if action.attempts == 0:
        raise errors.NotFound(f"action {action.action_id} has not run (it was {action.reason})")
    attempt = bodies.query_int(request, "attempt", default=action.attempts, minimum=1)
    if attempt is None or attempt > action.attempts:
        # A well-formed attempt number that has not happened: no such log, not a bad request.
        raise errors.NotFound(f"action {action.action_id} has run {action.attempts} attempt(s)")
    path = executors_base.log_path(
        state.settings(request).home, action.workflow_id, action.action_id, attempt
    )
    if not path.is_file():
        raise errors.NotFound(
            f"no log for attempt {attempt} of action {action.action_id} on this node"
        )
    return web.FileResponse(path, headers={"Content-Type": "text/plain; charset=utf-8"})

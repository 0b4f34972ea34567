"""`/api/v1/workflows`: submit, list, inspect, kill and re-run workflows; actions and logs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from pingo import errors, heap, limits, states, untrusted
from pingo.actions.executors import base as executors_base
from pingo.actions.executors import cluster, sandbox
from pingo.api import auth, bodies, documents, models, problems, runtime
from pingo.config import Settings
from pingo.node import BigSubmission
from pingo.store import _cursor, lookup
from pingo.store.protocol import (
    NO_LIMITS,
    ActionRecord,
    UserLimits,
    UserRecord,
    WorkflowRecord,
)
from pingo.webhooks import hooks
from pingo.workflows import planner

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Stripe's header, telling a client that this answer replays an earlier request.
REPLAYED_HEADER = "Idempotent-Replayed"
_MAX_KEY_LENGTH = 255
#: The prefix of the idempotency keys schedules submit with (`pingo.schedules.rules`).
SCHEDULER_KEY_PREFIX = "schedule:"


def workflow_location(workflow_id: str) -> str:
    """The URL path of a workflow."""
    return f"{PREFIX}/workflows/{workflow_id}"


async def visible_workflow(request: web.Request, workflow_id: str) -> WorkflowRecord:
    """The workflow with this id, or the one id prefix (8+ characters) the requester may see.

    404 when the requester may see none (never reveal that another's exists), and
    AMBIGUOUS_ID when several of the requester's own match.
    """
    owner = auth.visible_owner(auth.current_user(request))
    return await lookup.workflow(runtime.node(request).store, workflow_id, owner=owner)


T = TypeVar("T")


async def shared_views(
    request: web.Request, record: WorkflowRecord, actions: Sequence[ActionRecord]
) -> documents.SharedViews:
    """What the workflow's owner may see of the actions its actions share with (never
    another user's workflow id): the document is the owner's view, admins see the same."""
    keys = {a.shared_with for a in actions if a.shared_with is not None}
    if not keys:
        return {}
    return await planner.shared_views(runtime.node(request).store, record.owner, keys)


@contextlib.asynccontextmanager
async def workflow_actions(
    request: web.Request, record: WorkflowRecord
) -> AsyncIterator[list[ActionRecord]]:
    """The workflow's actions, for the block (issue 13).

    A big workflow's records live from the read to the end of the block with no full
    collection walking them (one took 185 ms of the loop's time, with the GIL), and are
    freed a slice at a time off the loop after it: in one go, they would hold the loop.
    """
    with heap.full_collections_deferred(when=untrusted.is_large(record.document)):
        actions = await runtime.node(request).store.list_actions(record.id)
        try:
            yield actions
        finally:
            await heap.dismantled(actions)


async def built_off_loop(request: web.Request, build: Callable[[], T], actions: int) -> T:
    """`build()`, linear in `actions`: in a worker thread for a big workflow (issue 13)."""
    if actions <= untrusted.BIG_ACTIONS:
        return build()
    try:
        with heap.full_collections_deferred():
            return await asyncio.to_thread(build)
    finally:
        # Hundreds of MiB came and go with a workflow this big: give them back after.
        runtime.api_state(request).trimmer.soon()


#: Actions per store read of a big workflow's document. Small, because what a page
#: allocates (its records, rows and summaries) is the server's peak during a big
#: workflow: at 1,000, the new pymalloc arenas it took were kept by a few long-lived
#: objects allocated meanwhile (bench/README.md, "Stall", seventh pass).
DOCUMENT_PAGE = 250


async def _encoded_document(request: web.Request, record: WorkflowRecord) -> bytes:
    """The workflow document, serialized; a big one a page of actions at a time (issue 13)."""
    if _is_big(record):
        return await _paged_document(request, record)
    async with workflow_actions(request, record) as actions:
        return await _encoded_actions(request, record, actions)


async def _encoded_actions(
    request: web.Request, record: WorkflowRecord, actions: Sequence[ActionRecord]
) -> bytes:
    """The workflow document of `record` with these actions (all of them), serialized."""
    views = await shared_views(request, record, actions)
    return await built_off_loop(
        request,
        functools.partial(documents.encode_workflow_document, record, actions, views),
        len(actions),
    )


def _is_big(record: WorkflowRecord) -> bool:
    """Whether the workflow has more than `untrusted.BIG_ACTIONS` actions, without decoding a
    stored document left undecoded (one that long always has)."""
    document = record.document
    if untrusted.is_large(document):
        return True
    actions = document.get("actions")
    return isinstance(actions, Sequence) and len(actions) > untrusted.BIG_ACTIONS


async def _paged_document(request: web.Request, record: WorkflowRecord) -> bytes:
    """A big workflow's document, read and encoded `DOCUMENT_PAGE` actions at a time.

    All of its records at once (1.6 KiB each) took hundreds of MiB that pymalloc could
    not give back: the few long-lived objects allocated meanwhile pinned its arenas. A
    page at a time, only the encoded bytes (one big buffer each) add up. Pages are read
    one after the other, so on a running workflow the document is not one instant's
    snapshot; its counts always match the actions it lists.
    """
    store = runtime.node(request).store
    encoder = documents.DocumentEncoder(record, await store.twin_datasets(record.id))
    after: int | None = None
    while True:
        page = await store.list_actions(record.id, after=after, limit=DOCUMENT_PAGE)
        if page:
            views = await shared_views(request, record, page)
            # In a worker thread, like the store's own reads: its allocations stay out of
            # the main thread's malloc arena, and the GIL passes to the loop meanwhile.
            await asyncio.to_thread(encoder.add, page, views)
            after = page[-1].action_id
        if len(page) < DOCUMENT_PAGE:
            break
    try:
        return await asyncio.to_thread(encoder.finish)
    finally:
        # The pages came and went in worker threads' malloc arenas: give them back.
        runtime.api_state(request).trimmer.soon()


async def _document_body(
    request: web.Request, record: WorkflowRecord, written: Sequence[ActionRecord] | None = None
) -> bytes:
    """The serialized workflow document; cached once SUCCEEDED, when nothing in it can change.

    (A FAILED or KILLED workflow may still see its last running actions stop.)
    `written`: the actions of a workflow that ended at its submission, as it wrote them:
    not read back (a resubmission's 1,000 records took 26 ms to read).
    """
    cache = runtime.api_state(request).finished_documents
    succeeded = record.state is states.WorkflowState.SUCCEEDED
    if succeeded:
        cached = cache.get(record.id)
        if cached is not None:
            return cached.body
    if written is not None and succeeded:
        body = await _encoded_actions(request, record, written)
    else:
        body = await _encoded_document(request, record)
    if succeeded:
        cache.put(record.id, runtime.CachedDocument(owner=record.owner, body=body))
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


@dataclass(frozen=True, slots=True)
class ExecutorCheck:
    """What `check_executors` checks a document against: plain values, so that a big
    submission's child process checks it the same way (`pingo.node.BigSubmission`)."""

    settings: Settings
    #: Why command-line actions are refused (403), if they are: the submitter is not an
    #: admin, and the sandbox cannot run or the server runs as root
    #: (`Node.command_line_refusal`).
    sandbox_refused: str | None
    executor_types: frozenset[str]
    action_types: frozenset[str]
    #: The submitter when they are not an admin (403): their local unmanaged outputs
    #: must lie in their own directory of `Settings.unmanaged_roots`, and no cluster
    #: action may run code on this machine or name a local file its client would read
    #: (`Settings.host_clients`). None for an admin.
    restricted: str | None = None

    @classmethod
    def of(cls, request: web.Request, user: UserRecord) -> ExecutorCheck:
        shared = runtime.api_state(request)
        return cls(
            settings=shared.settings,
            sandbox_refused=None if user.is_admin else runtime.node(request).command_line_refusal,
            executor_types=shared.executor_types,
            action_types=shared.action_types,
            restricted=None if user.is_admin else user.name,
        )

    def __call__(self, document: Any) -> None:
        """Refuse (422) a document with actions this node cannot run, with every other
        issue too; (403) command-line actions when the sandbox cannot run; (422) webhooks
        whose URL may not be a target, before anything runs."""
        if self.sandbox_refused is not None:
            _check_sandbox(document, self.sandbox_refused)
        if self.restricted is not None:
            _check_restricted(document, self.settings, self.restricted)
        if isinstance(document, Mapping) and "webhooks" in document:
            hooks.parse_webhooks(document["webhooks"], "/webhooks", self.settings)
        issues = _missing_executor_issues(document, self.executor_types, self.action_types)
        if not issues:
            return
        from pingo.workflows import language

        others = language.validate(document, max_actions=self.settings.max_actions)
        if others:
            raise errors.ValidationFailed([*others, *issues])
        raise problems.UnknownExecutor(issues)


def _check_sandbox(document: Any, refusal: str) -> None:
    """Refuse (403, for `refusal`) command-line actions (of a non-admin user, when the
    sandbox cannot run or the server runs as root)."""
    actions = document.get("actions") if isinstance(document, Mapping) else None
    if isinstance(actions, list) and any(
        isinstance(a, Mapping) and a.get("type") == sandbox.COMMAND_LINE for a in actions
    ):
        raise errors.SandboxUnavailable(refusal)


def _check_restricted(document: Any, settings: Settings, user: str) -> None:
    """Refuse (403) what `user`, no admin, may not run here: a local unmanaged
    `outputPath` outside their directory of `Settings.unmanaged_roots` (the server moves
    the output there with its own rights), a cluster action whose client would run their
    code on this machine, or one whose client would read and ship a file of this machine
    (`cluster.host_file_refusal`)."""
    listed = document.get("actions") if isinstance(document, Mapping) else None
    actions = [a for a in listed if isinstance(a, Mapping)] if isinstance(listed, list) else []
    by_id = {a["id"]: a for a in actions if isinstance(a.get("id"), int)}
    for action in actions:
        kind, path = action.get("type"), action.get("outputPath")
        refusal = sandbox.host_client_refusal(kind, settings) if isinstance(kind, str) else None
        if refusal is None and action.get("isManaged", True) is False and isinstance(path, str):
            refusal = sandbox.unmanaged_root_refusal(path, settings.unmanaged_roots, user)
        if refusal is None:
            output, inputs = _planned_paths(action, by_id, settings.data_root)
            refusal = cluster.host_file_refusal(action, output, inputs, settings)
        if refusal is not None:
            raise errors.Forbidden(refusal)


def _planned_paths(
    action: Mapping[str, Any], by_id: Mapping[int, Mapping[str, Any]], data_root: str
) -> tuple[str, dict[int, str]]:
    """What `{output}` and `{input:<id>}` of `action` will resolve to, as far as it is known
    before planning: an unmanaged action's own `outputPath`, else a path under the data
    root (where every managed dataset and staging path lies). Only whether each is local
    matters to `cluster.host_file_refusal`, and that is known."""

    def path(of: Mapping[str, Any]) -> str:
        own = of.get("outputPath")
        managed = of.get("isManaged", True) is not False
        return f"{data_root}/dataset" if managed or not isinstance(own, str) else own

    parents = action.get("parentActions")
    inputs: dict[int, str] = {}
    for parent in parents if isinstance(parents, list) else ():
        pid = parent.get("id") if isinstance(parent, Mapping) else None
        if isinstance(pid, int) and pid in by_id:
            inputs[pid] = path(by_id[pid])
    return path(action), inputs


def check_executors(request: web.Request, document: Any) -> None:
    """`ExecutorCheck` of the request and its user on `document`."""
    ExecutorCheck.of(request, auth.current_user(request))(document)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    # Keys of this form are the scheduler's: one taken by hand would stand in for a tick.
    if not key or len(key) > _MAX_KEY_LENGTH or key.startswith(SCHEDULER_KEY_PREFIX):
        issue = errors.ValidationIssue(
            "INVALID_PARAMETER",
            f"1 to {_MAX_KEY_LENGTH} characters, not starting with {SCHEDULER_KEY_PREFIX!r}",
            "/Idempotency-Key",
        )
        raise problems.BadRequest(f"the {IDEMPOTENCY_HEADER} header is not valid", [issue])
    return key


def take_submission(request: web.Request, user: UserRecord) -> None:
    """Use one of the user's submissions a minute, or refuse (429 RATE_LIMITED).

    Taken before the body is read, so a user over their rate costs no parsing.
    """
    shared = runtime.api_state(request)
    per_minute = limits.effective(user.limits, shared.settings).submissions_per_minute
    shared.submission_rate.take(user.name, per_minute)


async def owner_limits(request: web.Request, owner: str) -> UserLimits:
    """`owner`'s own limits, for the planner to apply their workflow cap (429
    TOO_MANY_WORKFLOWS) once it knows the document is valid: a re-run's owner may not be
    the caller."""
    caller = auth.current_user(request)
    record = caller if caller.name == owner else await runtime.node(request).store.get_user(owner)
    return record.limits if record is not None else NO_LIMITS


@routes.post(PREFIX + "/workflows", name="submit_workflow")
async def submit_workflow(request: web.Request) -> web.StreamResponse:
    """Submit a workflow (201 + Location), or plan it without running (`?dryRun=true`, 200)."""
    size = request.content_length or 0
    if size <= untrusted.PIECEWISE_CHARS:
        return await _submit_workflow(request)
    # Hundreds of thousands of objects live until the answer: no full GC pass over them,
    # and they are freed a slice at a time after it (`heap.bury`).
    with heap.full_collections_deferred():
        async with heap.burying():
            return await _submit_workflow(request)


async def _submit_workflow(request: web.Request) -> web.StreamResponse:
    user = auth.current_user(request)
    node = runtime.node(request)
    dry_run = bodies.query_bool(request, "dryRun")
    key = _idempotency_key(request)
    take_submission(request, user)
    if not dry_run and node.detaches and (request.content_length or 0) > _DETACHED_BYTES:
        return await _submit_detached(request, user, key)
    document = await bodies.read_json(request)
    if isinstance(document, dict) and isinstance(document.get("actions"), list):
        heap.bury(document["actions"])
    check_executors(request, document)
    if dry_run:
        plan = await node.workflows.dry_run(document, owner=user.name)
        return bodies.json_response(documents.plan_document(plan))
    submitted = await _whether_the_client_waits(
        node.workflows.submit_once(document, owner=user.name, idempotency_key=key, cap=user.limits)
    )
    return await _created(request, submitted.record, submitted.replayed, submitted.actions)


async def _whether_the_client_waits(work: Coroutine[Any, Any, T]) -> T:
    """`work`, a submission or a re-run, carried to its end even if the request is cancelled.

    What its user expects once the body is read: the workflow is stored and announced
    (the owner's feed, webhooks, wake-ups) like any other, answered or not, and a retry
    with the same `Idempotency-Key` finds it. `serve` never cancels a handler whose
    client left (aiohttp's `handler_cancellation` is off), but aiohttp's test server
    does, and so does a shutdown past its grace: planning in-process would stop half-way
    (nothing stored), and a child's workflow would be stored but never adopted.
    Waiting here, rather than leaving the work behind, keeps the handler's
    `heap.burying()` block open until it is done; a second cancellation (the shutdown's)
    stops the waiting, and the work finishes alone.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_unanswered)
        await asyncio.wait({task})
        raise


def _unanswered(task: asyncio.Future[Any]) -> None:
    """Log how a submission whose client left ended, if it failed (nobody else will)."""
    if task.cancelled():
        return
    failure = task.exception()
    if failure is not None:
        logger.warning(
            "a submission whose client left failed: %s",
            failure,
            extra={"event": "unanswered_submission_failed"},
        )


async def _created(
    request: web.Request,
    record: WorkflowRecord,
    replayed: bool,
    written: Sequence[ActionRecord] | None = None,
) -> web.StreamResponse:
    """The 201 of a submission (`written`: `Submitted.actions`)."""
    # Stripe's convention: a replay gets the same status as the original answer.
    headers = {REPLAYED_HEADER: "true"} if replayed else {}
    headers["Location"] = workflow_location(record.id)
    return await bodies.send_json(
        request, await _document_body(request, record, written), status=201, headers=headers
    )


#: Bodies longer than this are planned in a child process, when the node can
#: (`pingo.node.Node.submit_detached`): their workflows have thousands of actions.
_DETACHED_BYTES = untrusted.PIECEWISE_CHARS


async def _submit_detached(
    request: web.Request, user: UserRecord, key: str | None
) -> web.StreamResponse:
    """A big submission, never decoded in this process (issue 13): the child decodes,
    checks, plans and stores it; this process adopts the stored workflow."""
    node = runtime.node(request)
    raw = await bodies.read_json_bytes(request)
    assert raw is not None
    job = BigSubmission(
        owner=user.name,
        body=raw,
        decode=bodies.decode_json,
        check=ExecutorCheck.of(request, user),
        cap=user.limits,
        idempotency_key=key,
    )
    record, replayed = await _whether_the_client_waits(node.submit_detached(job))
    return await _created(request, record, replayed)


@routes.get(PREFIX + "/workflows", name="list_workflows")
async def list_workflows(request: web.Request) -> web.Response:
    """Workflows the requester may see, newest first, filtered and paginated by cursor."""
    user = auth.current_user(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000)
    wanted_state = bodies.query_enum(request, "state", states.WorkflowState)
    name = request.query.get("name") or None
    owner = request.query.get("owner") or None
    cursor = request.query.get("cursor") or None
    try:
        if cursor is not None:
            # Checked before anything is answered: a bad cursor is a 400 for every caller.
            _cursor.decode_cursor(cursor)
        if not user.is_admin:
            if owner is not None and owner != user.name:
                # Another user's workflows are invisible, not forbidden.
                return bodies.json_response(models.WorkflowPage(items=[], next=None))
            owner = user.name
        found = await runtime.node(request).store.list_workflows(
            owner=owner, state=wanted_state, name=name, limit=limit or 100, cursor=cursor
        )
    except errors.ValidationFailed as exc:
        raise problems.InvalidParameter(exc.message, exc.issues) from exc
    items = [documents.workflow_summary(w) for w in found.items]
    return bodies.json_response(models.WorkflowPage(items=items, next=found.next_cursor))


@routes.get(PREFIX + "/workflows/{workflow_id}", name="get_workflow")
async def get_workflow(request: web.Request) -> web.StreamResponse:
    """The workflow document."""
    workflow_id = request.match_info["workflow_id"]
    cached = runtime.api_state(request).finished_documents.get(workflow_id)
    if cached is not None:
        # A SUCCEEDED workflow never changes, nor does its owner: no store read at all.
        if not auth.may_see(auth.current_user(request), cached.owner):
            raise errors.NotFound(f"no workflow {workflow_id!r}")
        return bodies.raw_json_response(cached.body)
    record = await visible_workflow(request, workflow_id)
    return await bodies.send_json(request, await _document_body(request, record))


@routes.post(PREFIX + "/workflows/{workflow_id}/kill", name="kill_workflow")
async def kill_workflow(request: web.Request) -> web.StreamResponse:
    """Kill a running workflow: its running actions are stopped, waiting ones never start."""
    record = await visible_workflow(request, request.match_info["workflow_id"])
    with heap.full_collections_deferred():
        killed = await runtime.node(request).workflows.kill(record.id)
        body = await _encoded_document(request, killed)
    return await bodies.send_json(request, body)


def force_targets(body: Any) -> tuple[int | str, ...]:
    """What a rerun body `{"force": [name or id, ...]}` names; the planner resolves them."""
    if body is None:
        return ()
    return tuple(bodies.read_model(body, models.RerunRequest).force)


async def start_rerun(request: web.Request, record: WorkflowRecord, body: Any) -> WorkflowRecord:
    """Submit `record`'s document again as a new workflow, forcing what `body` names."""
    force = force_targets(body)
    node = runtime.node(request)
    if node.detaches and _is_big(record):
        # Its stored document is decoded, checked and planned in a child (issue 13).
        job = BigSubmission(
            owner=record.owner,
            body=None,
            decode=bodies.decode_json,
            check=ExecutorCheck.of(request, auth.current_user(request)),
            cap=await owner_limits(request, record.owner),
            force=tuple(force),
            rerun_of=record.id,
        )
        rerun, _ = await _whether_the_client_waits(node.submit_detached(job))
        return rerun
    # A big workflow's stored document is decoded only now, and off the loop.
    document = await asyncio.to_thread(untrusted.plain, record.document)
    check_executors(request, document)
    # The re-run belongs to the original owner: in per-user sharing scopes the
    # owner is part of every dataset id, so this keeps the same provenance.
    cap = await owner_limits(request, record.owner)
    return await _whether_the_client_waits(
        node.workflows.submit(
            document, owner=record.owner, force=force, rerun_of=record.id, cap=cap
        )
    )


@routes.post(PREFIX + "/workflows/{workflow_id}/rerun", name="rerun_workflow")
async def rerun_workflow(request: web.Request) -> web.StreamResponse:
    """Submit the same document again as a NEW workflow, forcing the named actions.

    Provenance makes a fresh plan the natural re-run: whatever is still stored
    is reused, whatever was lost or failed is computed, and `force` recomputes
    chosen actions even when their datasets exist.
    """
    record = await visible_workflow(request, request.match_info["workflow_id"])
    take_submission(request, auth.current_user(request))
    # A big workflow's plan is freed after the answer, off the loop (as in a submission).
    async with heap.burying():
        rerun = await start_rerun(request, record, await bodies.read_json(request, optional=True))
        body = await _document_body(request, rerun)
    return await bodies.send_json(
        request, body, status=201, headers={"Location": workflow_location(rerun.id)}
    )


async def _visible_action(request: web.Request) -> ActionRecord:
    record = await visible_workflow(request, request.match_info["workflow_id"])
    return await _action_of(request, record)


async def _action_of(request: web.Request, record: WorkflowRecord) -> ActionRecord:
    action_id = bodies.path_int(request, "action_id")
    action = await runtime.node(request).store.get_action(record.id, action_id)
    if action is None:
        raise errors.NotFound(f"workflow {record.id} has no action {action_id}")
    return action


@routes.get(PREFIX + "/workflows/{workflow_id}/actions/{action_id}", name="get_action")
async def get_action(request: web.Request) -> web.Response:
    """One action, with its callback id, external id, definition and error."""
    record = await visible_workflow(request, request.match_info["workflow_id"])
    action = await _action_of(request, record)
    dataset = await runtime.node(request).store.get_dataset(action.dataset_id)
    views = await shared_views(request, record, [action])
    return bodies.json_response(documents.action_detail(action, dataset, views))


def _attempt_log(request: web.Request, action: ActionRecord) -> tuple[int, Path]:
    """The attempt `?attempt=` names (default the latest) and its log, if on this node."""
    if action.attempts == 0:
        raise errors.NotFound(_never_ran(action))
    attempt = bodies.query_int(request, "attempt", default=action.attempts, minimum=1)
    if attempt is None or attempt > action.attempts:
        # A well-formed attempt number that has not happened: no such log, not a bad request.
        raise errors.NotFound(f"action {action.action_id} has run {action.attempts} attempt(s)")
    path = executors_base.log_path(
        runtime.settings(request).home, action.workflow_id, action.action_id, attempt
    )
    if not path.is_file():
        raise errors.NotFound(_no_log(action, attempt))
    return attempt, path


@routes.get(PREFIX + "/workflows/{workflow_id}/actions/{action_id}/logs", name="get_action_logs")
async def get_action_logs(request: web.Request) -> web.StreamResponse:
    """The local executor's log of one attempt (`?attempt=`, default the latest), as text."""
    action = await _visible_action(request)
    _, path = _attempt_log(request, action)
    return web.FileResponse(path, headers={"Content-Type": "text/plain; charset=utf-8"})


@routes.get(
    PREFIX + "/workflows/{workflow_id}/actions/{action_id}/cluster-jobs", name="get_cluster_jobs"
)
async def get_action_cluster_jobs(request: web.Request) -> web.Response:
    """Where a cluster action's jobs and their logs are, read from its client's log."""
    action = await _visible_action(request)
    attempt, path = _attempt_log(request, action)
    jobs = await asyncio.to_thread(cluster.scan_log, path)
    return bodies.json_response(documents.cluster_jobs(attempt, jobs))


def _never_ran(action: ActionRecord) -> str:
    """Why an action has no log at all, in the reuse vocabulary."""
    label = f"action {action.action_id} ({action.name})"
    if action.reused:
        word = documents.action_outcome(action).value
        return f"{label} never runs: its dataset was {word}"
    if action.shared_with is not None and action.state is states.ActionState.FINISHED:
        return f"{label} never ran: it shared another workflow's computation of its dataset"
    if action.error:
        return f"{label} never ran ({action.state.value}): {action.error}"
    return f"{label} has not run yet ({action.state.value})"


def _no_log(action: ActionRecord, attempt: int) -> str:
    """Why an attempt that happened has no log here: it failed before it ran, or the
    executor keeps its logs elsewhere."""
    label = f"attempt {attempt} of action {action.action_id} ({action.name})"
    if attempt == action.attempts and action.error:
        # The submission itself failed (no executor, a refused command): its error is the log.
        return f"{label} left no log; it failed: {action.error}"
    if action.type != sandbox.COMMAND_LINE:
        where = f" (external id {action.external_id})" if action.external_id else ""
        return f"{label} ran on the cluster{where}: its log is there, not on this node"
    return f"no log for {label} on this node"

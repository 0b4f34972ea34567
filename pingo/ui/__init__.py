"""The server-rendered web UI: cookie sessions over the API's users, Jinja2 pages.

Pages read through the same store, ownership rules and document builders as the
API (`pingo.api.documents`), so what a user may see is decided in one place.
Sessions live in process memory: a session cookie holds a random id that maps
to the hash of the user's token, so revoking the token ends the session too.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import web

from pingo import errors, limits, states, untrusted
from pingo.actions.executors import base as executors_base
from pingo.api import auth, bodies, documents, problems, runtime
from pingo.api.routes import datasets as dataset_routes
from pingo.api.routes import schedules as schedule_routes
from pingo.api.routes import users as user_routes
from pingo.api.routes import workflows as workflow_routes
from pingo.store.protocol import ActionRecord, PlannedAction, UserRecord, WorkflowRecord
from pingo.ui import dag
from pingo.webhooks import hooks
from pingo.workflows import reuse

logger = logging.getLogger(__name__)

COOKIE = "pingo_session"
SESSION_TTL_S = 8 * 3600.0
#: Only the tail of a long log is shown in the page.
LOG_TAIL_BYTES = 64 * 1024
#: Rows per page of the workflows and datasets lists.
PAGE_SIZE = 50
#: Datasets drawn below one on its page at most (its descendants).
LINEAGE_NODES = 300
#: Workflows a dataset's page looks up, per use (planned it, computed from it).
USED_BY_LIMIT = 50
#: Datasets one page of a dataset search looks through at most (newest first).
DATASET_SEARCH_LIMIT = 1000
#: Every UI answer carries these: no inline script or style runs, nothing frames the UI,
#: forms post only to this origin.
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Session:
    token_hash: str
    csrf: str
    expires_at: float


@dataclass(slots=True)
class Sessions:
    """Live sessions by id, at most `per_user` for one token; expired ones are dropped.

    Every session lives `SESSION_TTL_S`, so creation order is expiry order: `by_id`
    keeps it, and signing in drops expired sessions from its front only (no scan).
    `by_user` holds each token hash's sessions, least recently used first; a sign-in
    beyond `per_user` ends the least recently used one, so sign-ins in a loop keep
    memory bounded by users times `per_user`.
    """

    per_user: int = 16
    by_id: OrderedDict[str, Session] = field(default_factory=OrderedDict)
    by_user: dict[str, OrderedDict[str, None]] = field(default_factory=dict)
    #: Failed sign-ins per peer address.
    throttle: limits.SignInThrottle = field(default_factory=limits.SignInThrottle)

    def open(self, token_hash: str) -> tuple[str, Session]:
        self._drop_expired()
        mine = self.by_user.setdefault(token_hash, OrderedDict())
        while len(mine) >= self.per_user:
            oldest, _ = mine.popitem(last=False)
            self.by_id.pop(oldest, None)
        session_id = secrets.token_urlsafe(32)
        session = Session(token_hash, secrets.token_urlsafe(32), time.time() + SESSION_TTL_S)
        self.by_id[session_id] = session
        mine[session_id] = None
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        session = self.by_id.get(session_id or "")
        if session is None or session_id is None:
            return None
        if session.expires_at < time.time():
            self.close(session_id)
            return None
        mine = self.by_user.get(session.token_hash)
        if mine is not None and session_id in mine:
            mine.move_to_end(session_id)
        return session

    def close(self, session_id: str) -> None:
        """End one session (signing out, expiry, eviction); an unknown id is ignored."""
        session = self.by_id.pop(session_id, None)
        if session is None:
            return
        mine = self.by_user.get(session.token_hash)
        if mine is not None:
            mine.pop(session_id, None)
            if not mine:
                del self.by_user[session.token_hash]

    def _drop_expired(self) -> None:
        # Sessions never looked up again (a closed browser) would otherwise stay forever.
        # Oldest first: the walk stops at the first live one.
        now = time.time()
        while self.by_id:
            session_id, session = next(iter(self.by_id.items()))
            if session.expires_at >= now:
                return
            self.close(session_id)


def _reuse_summary(planned: list[PlannedAction]) -> dict[str, int]:
    """Computed, shared, reused and not needed, as the API's workflow document counts them."""
    twins = reuse.twins((a.action_id, a.dataset_id, not a.reused) for a in planned)
    return reuse.summary(
        reuse.outcome(runs=not a.reused, reason=a.reason, twin=a.action_id in twins)
        for a in planned
    )


@dataclass(slots=True)
class ReuseCounts:
    """Each listed workflow's reuse counts, most recently listed last.

    Planning fixes them for good (which actions run, reuse or are not needed), so the
    list page reads a workflow's actions once; afterwards a row costs only the store's
    per-state counts, which keeps the polled list cheap with many tabs open.
    """

    limit: int = 10_000
    by_id: OrderedDict[str, dict[str, int]] = field(default_factory=OrderedDict)

    def get(self, workflow_id: str) -> dict[str, int] | None:
        found = self.by_id.get(workflow_id)
        if found is not None:
            self.by_id.move_to_end(workflow_id)
        return found

    def put(self, workflow_id: str, counts: dict[str, int]) -> dict[str, int]:
        self.by_id[workflow_id] = counts
        while len(self.by_id) > self.limit:
            self.by_id.popitem(last=False)
        return counts


STATIC_PREFIX = "/ui/static"
STATIC = Path(__file__).parent / "static"
SESSIONS_KEY = web.AppKey("pingo.ui.sessions", Sessions)
REUSE_KEY = web.AppKey("pingo.ui.reuse_counts", ReuseCounts)
routes = web.RouteTableDef()


async def _session_user(request: web.Request) -> tuple[UserRecord, Session]:
    """The signed-in user, or a redirect to the login page."""
    session = request.app[SESSIONS_KEY].get(request.cookies.get(COOKIE))
    if session is not None:
        user = await runtime.node(request).store.get_user_by_token_hash(session.token_hash)
        if user is not None:
            # The API's own visibility helpers read the user from here.
            request[auth.USER_KEY] = user
            return user, session
    raise web.HTTPSeeOther("/login")


async def _form(request: web.Request) -> dict[str, str]:
    """The posted form's text fields; 400 when the body is not UTF-8 form data."""
    try:
        form = await request.post()
    except (UnicodeDecodeError, ValueError) as exc:
        raise web.HTTPBadRequest(text="the form is not valid UTF-8 form data") from exc
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def _check_csrf(request: web.Request, session: Session) -> dict[str, str]:
    """The posted form, once its CSRF token matched the session's (403 otherwise)."""
    form = await _form(request)
    sent = form.get("csrf")
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500).
    if not isinstance(sent, str) or not secrets.compare_digest(
        sent.encode("utf-8", "surrogateescape"), session.csrf.encode()
    ):
        raise web.HTTPForbidden(text="missing or wrong CSRF token")
    return form


def _same_origin(request: web.Request) -> bool:
    """Whether a form post comes from a page of this server (or from no browser at all).

    Browsers send Sec-Fetch-Site (or at least Origin) with every form post and no
    page can forge them; clients that send neither (curl, scripts) are no CSRF
    vector. This is what protects the login form, which has no session yet.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc == request.host


def _context(user: UserRecord, session: Session, **values: object) -> dict[str, object]:
    """A page's template context: what every page shows (user, CSRF token) and its own values."""
    return {"user": user, "csrf": session.csrf, **values}


def _query_enum(request: web.Request, enum_type: type[bodies.E]) -> bodies.E | None:
    """The `state` filter of a list page; an empty one (the form's "any") means none."""
    raw = request.query.get("state") or None
    if raw is None:
        return None
    try:
        return enum_type(raw.upper())
    except ValueError:
        raise web.HTTPBadRequest(text=f"unknown state {raw!r}") from None


def _page_link(path: str, filters: Mapping[str, str], cursor: str | None) -> str | None:
    if cursor is None:
        return None
    return f"{path}?{urlencode({**{k: v for k, v in filters.items() if v}, 'cursor': cursor})}"


def _etag(value: object) -> str:
    return '"' + hashlib.sha256(bodies.encode_json(value)).hexdigest()[:32] + '"'


def _fragment(
    request: web.Request, template: str, context: dict[str, object], etag: str
) -> web.Response:
    """A live fragment polled by `live.js`: 304 when unchanged since the poller's ETag.

    A conditional poll costs a store read and no rendering or transfer while
    nothing moves, and holds no connection open between polls, so many open
    tabs stay cheap; SSE would hold a connection per tab.
    """
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    response = aiohttp_jinja2.render_template(template, request, context)
    response.headers["ETag"] = etag
    # Revalidated at every poll, and kept by no cache but the browser's: it is one user's.
    response.headers["Cache-Control"] = "private, no-cache"
    return response


@routes.get("/")
async def index(request: web.Request) -> web.Response:
    await _session_user(request)
    raise web.HTTPSeeOther("/workflows")


@routes.get("/login")
@aiohttp_jinja2.template("login.html")
async def login_page(request: web.Request) -> dict[str, object]:
    return {"error": None}


@routes.post("/login")
async def login(request: web.Request) -> web.Response:
    # Refused before the form is read: a throttled address gets no answer to its guess.
    address = request.remote or "unknown"
    throttle = request.app[SESSIONS_KEY].throttle
    try:
        throttle.check(address)
    except errors.TooManyRequests as exc:
        refused = _error_page(request, HTTPStatus.TOO_MANY_REQUESTS, exc.message)
        refused.headers["Retry-After"] = exc.retry_after
        return refused
    form = await _form(request)
    token = form.get("token")
    user = None
    if isinstance(token, str) and token:
        user = await runtime.node(request).store.get_user_by_token_hash(auth.hash_token(token))
    if user is None:
        throttle.failed(address)
        # Never the submitted token: it may be a real one typed into the wrong place.
        logger.warning(
            "UI sign-in failed from %s",
            address,
            extra={"event": "ui_login_failed", "remote": address},
        )
        return aiohttp_jinja2.render_template(
            "login.html", request, {"error": "That token is not valid."}, status=401
        )
    session_id, _ = request.app[SESSIONS_KEY].open(user.token_hash)
    response = web.HTTPSeeOther("/workflows")
    response.set_cookie(
        COOKIE,
        session_id,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        max_age=int(SESSION_TTL_S),
        path="/",
    )
    logger.info("UI sign-in by %s", user.name, extra={"event": "ui_login"})
    raise response


@routes.post("/logout")
async def logout(request: web.Request) -> web.Response:
    _, session = await _session_user(request)
    await _check_csrf(request, session)
    request.app[SESSIONS_KEY].close(request.cookies.get(COOKIE, ""))
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


async def _workflows_context(request: web.Request) -> dict[str, object]:
    """The workflows list: the user's (everyone's for admins), filtered, one page, newest first."""
    user, session = await _session_user(request)
    wanted = _query_enum(request, states.WorkflowState)
    filters = {
        "state": wanted.value if wanted else "",
        "name": request.query.get("name", "").strip(),
        "owner": request.query.get("owner", "").strip() if user.is_admin else "",
    }
    store = runtime.node(request).store
    found = await store.list_workflows(
        owner=(filters["owner"] or None) if user.is_admin else user.name,
        state=wanted,
        name=filters["name"] or None,
        limit=PAGE_SIZE,
        cursor=request.query.get("cursor") or None,
    )
    reuse_counts = request.app[REUSE_KEY]
    rows: list[dict[str, Any]] = []
    for record in found.items:
        by_state = await store.count_actions(record.id)
        planned = reuse_counts.get(record.id)
        if planned is None:
            decisions = await store.list_planned_actions(record.id)
            planned = reuse_counts.put(record.id, _reuse_summary(decisions))
        rows.append(
            {
                **documents.as_dict(documents.workflow_summary(record)),
                **planned,
                "actions": sum(by_state.values()),
                "done": sum(n for st, n in by_state.items() if st in states.ACTION_TERMINAL),
                "failed": by_state.get(states.ActionState.FAILED, 0),
            }
        )
    return _context(
        user,
        session,
        workflows=rows,
        filters=filters,
        states=[s.value for s in states.WorkflowState],
        running=any(r["state"] == "RUNNING" for r in rows),
        next_page=_page_link("/workflows", filters, found.next_cursor),
        live_url="/workflows/live?" + request.query_string,
    )


@routes.get("/workflows")
@aiohttp_jinja2.template("workflows.html")
async def workflows_page(request: web.Request) -> dict[str, object]:
    return await _workflows_context(request)


# Registered before /workflows/{workflow_id}: "live" is never a workflow id.
@routes.get("/workflows/live")
async def workflows_live(request: web.Request) -> web.Response:
    """The workflows table, polled by the list page while one of its workflows runs."""
    context = await _workflows_context(request)
    return _fragment(
        request, "workflows_table.html", context, _etag([context["workflows"], context["csrf"]])
    )


@routes.get("/workflows/{workflow_id}")
@aiohttp_jinja2.template("workflow.html")
async def workflow_page(request: web.Request) -> dict[str, object]:
    context, _ = await _workflow_fragment(request)
    return context


@routes.post("/workflows/{workflow_id}/kill")
async def kill_workflow(request: web.Request) -> web.Response:
    _, session = await _session_user(request)
    await _check_csrf(request, session)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    await runtime.node(request).workflows.kill(record.id)
    raise web.HTTPSeeOther(f"/workflows/{record.id}")


def _force_list(text: str) -> list[int | str]:
    """The rerun form's force field: comma-separated action ids or names."""
    items = [item.strip() for item in text.split(",")]
    return [int(item) if item.isdigit() else item for item in items if item]


@routes.post("/workflows/{workflow_id}/rerun")
async def rerun_workflow(request: web.Request) -> web.Response:
    """Submit the workflow again (forcing the actions named in `force`); go to the new one."""
    user, session = await _session_user(request)
    form = await _check_csrf(request, session)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    workflow_routes.take_submission(request, user)
    rerun = await workflow_routes.start_rerun(
        request, record, {"force": _force_list(form.get("force", ""))}
    )
    raise web.HTTPSeeOther(f"/workflows/{rerun.id}")


@routes.get("/workflows/{workflow_id}/definition.json")
async def download_definition(request: web.Request) -> web.Response:
    """The workflow as it was submitted, as a JSON file (to edit and submit again), but
    with its webhooks' secrets left out: the file needs them put back to be submitted."""
    await _session_user(request)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    return bodies.raw_json_response(
        bodies.encode_json(hooks.without_secrets(record.document)),
        headers={"Content-Disposition": f'attachment; filename="{record.id}.json"'},
    )


@routes.get("/workflows/{workflow_id}/status.json")
async def download_status(request: web.Request) -> web.StreamResponse:
    """The API's workflow document (state, counts, every action), as a JSON file."""
    await _session_user(request)
    response = await workflow_routes.get_workflow(request)
    response.headers["Content-Disposition"] = (
        f'attachment; filename="{request.match_info["workflow_id"]}-status.json"'
    )
    return response


def _log_tail(request: web.Request, workflow_id: str, action_id: int, attempt: int) -> str | None:
    path = executors_base.log_path(runtime.settings(request).home, workflow_id, action_id, attempt)
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of an action as its log file shows it (None: no log on this node)."""

    number: int
    log_bytes: int | None
    log_written_at: datetime | None


@dataclass(frozen=True, slots=True)
class Moment:
    """A row of an action's state history: a state it entered, when, and for how long."""

    state: str
    at: datetime
    #: Until the next entry (or now, for the current state); None once it ended.
    lasted_s: float | None


def _attempts(request: web.Request, action: ActionRecord) -> list[Attempt]:
    home = runtime.settings(request).home
    found = []
    for number in range(1, action.attempts + 1):
        path = executors_base.log_path(home, action.workflow_id, action.action_id, number)
        try:
            stat = path.stat()
        except OSError:
            found.append(Attempt(number, None, None))
            continue
        written = datetime.fromtimestamp(stat.st_mtime, UTC)
        found.append(Attempt(number, stat.st_size, written))
    return found


def history(action: ActionRecord, now: datetime) -> list[Moment]:
    """The action's recorded state history (`ActionRecord.history`), oldest first.

    Each state lasted until the next one was entered; the current one lasts until
    `now`, unless it is terminal.
    """
    entries = action.history
    moments = []
    for i, entry in enumerate(entries):
        if i + 1 < len(entries):
            until: datetime | None = entries[i + 1].at
        else:
            until = None if entry.state in states.ACTION_TERMINAL else now
        lasted_s = None if until is None else max(0.0, (until - entry.at).total_seconds())
        moments.append(Moment(entry.state.value, entry.at, lasted_s))
    return moments


def _timings(action: ActionRecord, now: datetime) -> dict[str, float | None]:
    """Seconds waited before the latest attempt was submitted, and its run (so far)."""
    started, finished = action.started_at, action.finished_at
    running_s = None
    if action.runtime_s is not None:
        running_s = action.runtime_s
    elif started is not None:
        running_s = ((finished or now) - started).total_seconds()
    return {
        "waited_s": None if started is None else (started - action.created_at).total_seconds(),
        "running_s": running_s,
        "total_s": None if finished is None else (finished - action.created_at).total_seconds(),
    }


@routes.get("/workflows/{workflow_id}/actions/{action_id}")
@aiohttp_jinja2.template("action.html")
async def action_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    action_id = bodies.path_int(request, "action_id")
    store = runtime.node(request).store
    action = await store.get_action(record.id, action_id)
    if action is None:
        raise errors.NotFound(f"workflow {record.id} has no action {action_id}")
    log = _log_tail(request, record.id, action_id, action.attempts) if action.attempts else None
    attempts = _attempts(request, action)
    return _context(
        user,
        session,
        workflow=documents.as_dict(documents.workflow_summary(record)),
        action=documents.as_dict(
            documents.action_detail(
                action,
                await store.get_dataset(action.dataset_id),
                await workflow_routes.shared_views(request, record, [action]),
            )
        ),
        reason=action.reason,
        runtime_s=action.runtime_s,
        history=history(action, store.clock()),
        attempts=attempts,
        timings=_timings(action, store.clock()),
        log=log,
    )


@routes.get("/workflows/{workflow_id}/actions/{action_id}/log")
async def action_log(request: web.Request) -> web.StreamResponse:
    """The full log of one attempt (`?attempt=`, default the latest), as text: the API's."""
    await _session_user(request)
    return await workflow_routes.get_action_logs(request)


@routes.get("/datasets")
@aiohttp_jinja2.template("datasets.html")
async def datasets_page(request: web.Request) -> dict[str, object]:
    """Datasets the user may see, newest first, searched by id prefix, producer name and state.

    The store filters by state and by the scopes the user may see (so that the cursor
    never names a dataset hidden from them); the prefix and the producer's name are matched here,
    over whole store pages until a page of results is full or DATASET_SEARCH_LIMIT
    datasets were looked at, so the next page's cursor resumes exactly where this
    search stopped.
    """
    user, session = await _session_user(request)
    wanted = _query_enum(request, states.DatasetState)
    filters = {
        "state": wanted.value if wanted else "",
        "prefix": request.query.get("prefix", "").strip().lower(),
        "producer": request.query.get("producer", "").strip(),
    }
    store = runtime.node(request).store
    cursor = request.query.get("cursor") or None
    rows: list[dict[str, Any]] = []
    looked_at = 0
    while True:
        found = await store.list_datasets(
            state=wanted, scopes=auth.visible_scopes(user), limit=PAGE_SIZE, cursor=cursor
        )
        cursor = found.next_cursor
        looked_at += len(found.items)
        matching = [record for record in found.items if record.id.startswith(filters["prefix"])]
        # As the API shows them to this user: another user's dataset names its producing
        # action and type only, never the workflow.
        for found_row in await dataset_routes.dataset_documents(request, matching):
            row = documents.as_dict(found_row)
            row["producerName"] = row["producedBy"].get("name")
            if filters["producer"] and row["producerName"] != filters["producer"]:
                continue
            rows.append(row)
        if cursor is None or len(rows) >= PAGE_SIZE or looked_at >= DATASET_SEARCH_LIMIT:
            break
    return _context(
        user,
        session,
        datasets=rows,
        filters=filters,
        states=[s.value for s in states.DatasetState],
        next_page=_page_link("/datasets", filters, cursor),
    )


@routes.get("/datasets/{dataset_id}")
@aiohttp_jinja2.template("dataset.html")
async def dataset_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    record = await dataset_routes.visible_dataset(request)
    (document,) = await dataset_routes.dataset_documents(request, [record])
    dataset = documents.as_dict(document)
    datasets = runtime.node(request).datasets
    ancestors = await datasets.lineage(record.id)
    below = await datasets.descendants(record.id, limit=LINEAGE_NODES)
    # One lineage shares one sharing scope (ids hash it); checked anyway, as the API does.
    records = {
        k: v
        for k, v in {**below.records, **ancestors.records}.items()
        if v is None or auth.may_see_scope(user, v.scope)
    }
    nodes = [documents.as_dict(n) for n in await dataset_routes.lineage_nodes(request, records)]
    for node in nodes:
        node["relation"] = (
            "this dataset"
            if node["id"] == record.id
            else ("ancestor" if node["id"] in ancestors.records else "descendant")
        )
    labels = {n["id"]: (n.get("actionName") or n["id"][:12], n["state"] or "") for n in nodes}
    graph = dag.lineage_layout(labels, [*ancestors.edges, *below.edges], record.id)
    children = [child for parent, child in below.edges if parent == record.id]
    planned, readers = await datasets.workflows_using(record.id, children, limit=USED_BY_LIMIT)
    return _context(
        user,
        session,
        dataset=dataset,
        lineage={"nodes": nodes, "truncated": below.truncated},
        graph=graph,
        used_by=await _visible_workflows(request, user, planned, readers),
        may_manage=await datasets.may_manage(user, record),
        deletable=record.state in _DELETABLE,
    )


async def _visible_workflows(
    request: web.Request, user: UserRecord, planned: list[str], readers: list[str]
) -> list[dict[str, Any]]:
    """The workflows of a dataset's page the user may see, newest first, with their use."""
    store = runtime.node(request).store
    rows = []
    for workflow_id in sorted({*planned, *readers}, reverse=True):
        record = await store.get_workflow(workflow_id)
        if record is None or not auth.may_see(user, record.owner):
            continue
        uses = [
            *(["planned it"] if workflow_id in planned else []),
            *(["computed from it"] if workflow_id in readers else []),
        ]
        rows.append(
            {**documents.as_dict(documents.workflow_summary(record)), "use": " and ".join(uses)}
        )
    return rows


#: States from which the dataset page offers "Delete" (the service refuses the others).
_DELETABLE = frozenset({states.DatasetState.STORED, states.DatasetState.LEAF})


@routes.post("/datasets/{dataset_id}/{change:pin|unpin|delete}")
async def change_dataset(request: web.Request) -> web.Response:
    """Pin, unpin or delete a dataset from its page: the API's rules, through its service."""
    user, session = await _session_user(request)
    form = await _check_csrf(request, session)
    record = await dataset_routes.visible_dataset(request)
    datasets = runtime.node(request).datasets
    await datasets.check_may_manage(user, record)
    change = request.match_info["change"]
    if change == "delete":
        await datasets.mark_for_deletion(record.id, force=form.get("force") == "yes")
    else:
        await datasets.set_pinned(record.id, change == "pin")
    raise web.HTTPSeeOther(f"/datasets/{quote(record.id, safe='')}")


def _usage_bars(storage: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The storage chart: a segment per on-disk dataset state, as a share of capacity (or use)."""
    on_disk = {s.value for s in states.DATASET_ON_DISK}
    total = max(storage["capacityBytes"] or 0, storage["usedBytes"], 1)
    bars, x = [], 0.0
    for name, size in sorted(storage["bytesByState"].items()):
        if name in on_disk:
            width = 100.0 * size / total
            bars.append({"state": name, "bytes": size, "x": round(x, 2), "width": round(width, 2)})
            x += width
    return bars


@routes.get("/storage")
@aiohttp_jinja2.template("storage.html")
async def storage_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    storage = documents.as_dict(await dataset_routes.storage_document(request))
    on_disk = sorted(s.value for s in states.DATASET_ON_DISK)
    return _context(user, session, storage=storage, bars=_usage_bars(storage), on_disk=on_disk)


@routes.get("/storage/decisions/{seq}")
@aiohttp_jinja2.template("decision.html")
async def decision_page(request: web.Request) -> dict[str, object]:
    """One retention decision: what was evicted, why, and what recomputing it would cost."""
    user, session = await _session_user(request)
    seq = bodies.path_int(request, "seq")
    decision = next(
        (d for d in await dataset_routes.retention_decisions(request) if d.get("seq") == seq), None
    )
    if decision is None:
        raise errors.NotFound(f"no recent retention decision {seq}")
    dataset = await runtime.node(request).store.get_dataset(decision["datasetId"] or "")
    if dataset is not None and not auth.may_see_scope(user, dataset.scope):
        raise errors.NotFound(f"no recent retention decision {seq}")
    document = None
    if dataset is not None:
        # As the API shows it to this user (never another user's workflow, document or env).
        (shown,) = await dataset_routes.dataset_documents(request, [dataset])
        document = documents.as_dict(shown)
    return _context(user, session, decision=decision, dataset=document)


@routes.get("/schedules")
@aiohttp_jinja2.template("schedules.html")
async def schedules_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    store = runtime.node(request).store
    owner = None if user.is_admin else user.name
    found = await store.list_schedules(owner=owner, limit=200)
    schedules = []
    for record in found:
        document = documents.as_dict(schedule_routes.schedule_document(record))
        runs = await store.list_schedule_runs(record.id, limit=1)
        document["lastRun"] = (
            documents.as_dict(schedule_routes.run_document(runs[0])) if runs else None
        )
        schedules.append(document)
    return _context(user, session, schedules=schedules)


async def _change_schedule(request: web.Request, change: str) -> web.Response:
    """Pause, resume or delete a schedule from the schedules page: the API's rules (the
    owner or an admin; another user's schedule is a 404), through its service."""
    _, session = await _session_user(request)
    await _check_csrf(request, session)
    record = await schedule_routes.visible_schedule(request)
    node = runtime.node(request)
    if change == "delete":
        await node.schedules.delete(record.id)
    else:
        await node.schedules.set_paused(record.id, change == "pause")
        node.scheduler.wake()
    raise web.HTTPSeeOther("/schedules")


# One route each, so that the audit log names them as the API's routes are named.
@routes.post("/schedules/{schedule_id}/pause")
async def pause_schedule(request: web.Request) -> web.Response:
    return await _change_schedule(request, "pause")


@routes.post("/schedules/{schedule_id}/resume")
async def resume_schedule(request: web.Request) -> web.Response:
    return await _change_schedule(request, "resume")


@routes.post("/schedules/{schedule_id}/delete")
async def delete_schedule(request: web.Request) -> web.Response:
    return await _change_schedule(request, "delete")


async def _users_context(
    request: web.Request, user: UserRecord, session: Session, **values: object
) -> dict[str, object]:
    settings = runtime.settings(request)
    users = await runtime.node(request).store.list_users()
    return _context(
        user,
        session,
        users=[documents.as_dict(documents.user_document(u, settings)) for u in users],
        **values,
    )


@routes.get("/users")
@aiohttp_jinja2.template("users.html")
async def users_page(request: web.Request) -> dict[str, object]:
    """Every user (admins only: anyone else gets the API's 403)."""
    user, session = await _session_user(request)
    auth.require_admin(request)
    return await _users_context(request, user, session, added=None)


@routes.post("/users")
async def add_user(request: web.Request) -> web.Response:
    """Add a user; the answer shows its token this once (never stored, never cached)."""
    user, session = await _session_user(request)
    form = await _check_csrf(request, session)
    caller = auth.require_admin(request)
    name, admin = form.get("name", "").strip(), form.get("admin") == "yes"
    try:
        added, token = await user_routes.add_user(
            request, caller, name, admin, reclaim=form.get("reclaim") == "yes"
        )
    except errors.Conflict as exc:
        # The users page again, with why and the form as it was sent: a name a revoked
        # user still owns may be reclaimed by ticking Reclaim (a taken one may not).
        revoked = await runtime.node(request).store.get_user(name) is None
        refused = {"message": exc.message, "reclaimable": revoked}
        context = await _users_context(
            request, user, session, added=None, refused=refused, name=name
        )
        return aiohttp_jinja2.render_template("users.html", request, context, status=409)
    context = await _users_context(
        request, user, session, added={"name": added.name, "token": token}
    )
    response = aiohttp_jinja2.render_template("users.html", request, context, status=201)
    response.headers["Cache-Control"] = "no-store"
    # What was created, as the API's answer names it (the audit log records it).
    response.headers["Location"] = user_routes.user_location(added.name)
    return response


@routes.post("/users/{name}/revoke")
async def revoke_user(request: web.Request) -> web.Response:
    _, session = await _session_user(request)
    await _check_csrf(request, session)
    caller = auth.require_admin(request)
    await user_routes.revoke_user(request, caller, request.match_info["name"])
    raise web.HTTPSeeOther("/users")


def summarize(actions: list[ActionRecord]) -> dict[str, int]:
    """What happened to a workflow's actions: computed, reused, shared, not needed, failed,
    killed."""
    result = {"computed": 0, "reused": 0, "shared": 0, "notNeeded": 0, "failed": 0, "killed": 0}
    for action in actions:
        if action.reused:
            result["reused" if action.reason == "reused" else "notNeeded"] += 1
        elif action.state is states.ActionState.FINISHED:
            # Another workflow's computation stored its dataset: it never ran.
            shared = action.shared_with is not None and action.attempts == 0
            result["shared" if shared else "computed"] += 1
        elif action.state is states.ActionState.FAILED:
            result["failed"] += 1
        elif action.state is states.ActionState.KILLED:
            result["killed"] += 1
    return result


#: Workflows with more actions than this are not drawn, and their table lists only the
#: first `LISTED_ACTIONS`: a page of 100,000 actions would be tens of MB, and building
#: it would stop the server for seconds (issue 13). status.json has every action.
DRAWN_ACTIONS = 2_000
LISTED_ACTIONS = 500


@dataclass(frozen=True, slots=True)
class _WorkflowView:
    document: dict[str, Any]
    summary: dict[str, int]
    total: int
    layout: dag.Layout | None
    #: Actions per state over the whole workflow (the ETag's part a short list misses).
    states: dict[str, int]


def _workflow_view(record: WorkflowRecord, actions: list[ActionRecord]) -> _WorkflowView:
    """What a workflow page shows; a big workflow's without the drawing and most rows."""
    big = len(actions) > DRAWN_ACTIONS
    listed = actions[:LISTED_ACTIONS] if big else actions
    counts: dict[str, int] = {}
    for action in actions:
        counts[action.state.value] = counts.get(action.state.value, 0) + 1
    return _WorkflowView(
        document=documents.as_dict(documents.workflow_document(record, listed)),
        summary=summarize(actions),
        total=len(actions),
        layout=None if big else dag.layout(actions),
        states=counts,
    )


async def _workflow_fragment(request: web.Request) -> tuple[dict[str, object], str]:
    """The live part of a workflow page and its ETag (state, counts, actions' states)."""
    user, session = await _session_user(request)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    async with workflow_routes.workflow_actions(request, record) as actions:
        view = await workflow_routes.built_off_loop(
            request, functools.partial(_workflow_view, record, actions), len(actions)
        )
    context = _context(
        user,
        session,
        workflow=view.document,
        summary=view.summary,
        total=view.total,
        listed=LISTED_ACTIONS if view.layout is None else view.total,
        rerun_of=record.rerun_of,
        dag=view.layout,
    )
    return context, _etag([view.document, view.states, session.csrf])


@routes.get("/workflows/{workflow_id}/live")
async def workflow_live(request: web.Request) -> web.Response:
    """The workflow's live fragment, polled by the page while the workflow runs."""
    context, etag = await _workflow_fragment(request)
    return _fragment(request, "workflow_live.html", context, etag)


def is_ui_route(route: web.AbstractRoute) -> bool:
    """Whether a route of the app is the UI's (pages, not API: OpenAPI leaves them out)."""
    if isinstance(route.resource, web.StaticResource):
        return route.resource.canonical.startswith(STATIC_PREFIX)
    return getattr(route.handler, "__module__", "") == __name__


def _is_ui_request(request: web.Request) -> bool:
    """A UI route, or a path no route matched that a browser asked for as a page."""
    route = request.match_info.route
    if route.resource is None:
        accepts_html = "text/html" in request.headers.get("Accept", "")
        return accepts_html and not request.path.startswith("/api/")
    return is_ui_route(route)


def _error_page(request: web.Request, status: int, message: str) -> web.Response:
    """An HTML error page: the UI never answers a browser with problem+json."""
    response = aiohttp_jinja2.render_template(
        "error.html",
        request,
        {"user": None, "status": status, "title": HTTPStatus(status).phrase, "message": message},
        status=status,
    )
    return response


def _http_message(exc: web.HTTPException) -> str:
    # aiohttp's default body is "404: Not Found"; the page shows its own title already.
    text = exc.text or ""
    return "" if text.startswith(f"{exc.status}: ") else text


@web.middleware
async def ui_middleware(request: web.Request, handler: problems.Handler) -> web.StreamResponse:
    """HTML error pages, same-origin form posts and the security headers, for the UI only."""
    if not _is_ui_request(request):
        return await handler(request)
    try:
        if request.method == "POST" and not _same_origin(request):
            raise web.HTTPForbidden(text="a form of another site may not post here")
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            exc.headers.update(SECURITY_HEADERS)
            raise
        response = _error_page(request, exc.status, _http_message(exc))
    except errors.ValidationFailed as exc:
        details = "; ".join(f"{i.pointer or '/'}: {i.message}" for i in exc.issues)
        response = _error_page(request, problems.status_for(exc), details or exc.message)
    except errors.PingoError as exc:
        response = _error_page(request, problems.status_for(exc), exc.message)
    response.headers.update(SECURITY_HEADERS)
    if response.content_type == "text/html" and "Cache-Control" not in response.headers:
        # A page shows one user's data and carries their session's CSRF token: no cache
        # (a shared proxy, the browser's back button after sign-out) keeps it.
        response.headers["Cache-Control"] = "no-store"
    return response


def _bidi_escaped(value: object) -> object:
    """What a template prints of `value`: its bidirectional controls as escapes.

    The templates' `finalize`, so it runs on every `{{ … }}` of every page, fragment
    and drawing (before HTML escaping): names, paths, errors and logs are untrusted
    wherever a template prints them, and no template has to remember it.
    """
    return value.translate(untrusted.BIDI_ESCAPES) if isinstance(value, str) else value


def setup(app: web.Application) -> None:
    """Register the UI's routes, template loader and middleware on the API's app."""
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("pingo.ui", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
        finalize=_bidi_escaped,
    )
    app[SESSIONS_KEY] = Sessions()
    app[REUSE_KEY] = ReuseCounts()
    app.middlewares.append(ui_middleware)
    app.add_routes(routes)
    app.router.add_static(STATIC_PREFIX, STATIC)

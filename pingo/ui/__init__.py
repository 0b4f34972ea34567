"""The server-rendered web UI: cookie sessions over the API's users, Jinja2 pages.

Pages read through the same store, ownership rules and document builders as the
API (`pingo.api.documents`), so what a user may see is decided in one place.
Sessions live in process memory: a session cookie holds a random id that maps
to the hash of the user's token, so revoking the token ends the session too.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from pingo.actions.executors import base as executors_base
from pingo.api import auth, bodies, documents, state
from pingo.api.routes import datasets as dataset_routes
from pingo.api.routes import schedules as schedule_routes
from pingo.api.routes import workflows as workflow_routes
from pingo.store.protocol import UserRecord
from pingo.ui import dag

logger = logging.getLogger(__name__)

COOKIE = "pingo_session"
SESSION_TTL_S = 8 * 3600.0
#: Only the tail of a long log is shown in the page.
LOG_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Session:
    token_hash: str
    csrf: str
    expires_at: float


@dataclass(slots=True)
class Sessions:
    """Live sessions by id; expired ones are dropped when looked up."""

    by_id: dict[str, Session] = field(default_factory=dict)

    def open(self, token_hash: str) -> tuple[str, Session]:
        session_id = secrets.token_urlsafe(32)
        session = Session(token_hash, secrets.token_urlsafe(32), time.time() + SESSION_TTL_S)
        self.by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        session = self.by_id.get(session_id or "")
        if session is not None and session.expires_at < time.time():
            del self.by_id[session_id or ""]
            return None
        return session


STATIC_PREFIX = "/ui/static"
STATIC = Path(__file__).parent / "static"
SESSIONS_KEY = web.AppKey("pingo.ui.sessions", Sessions)
routes = web.RouteTableDef()


async def _session_user(request: web.Request) -> tuple[UserRecord, Session]:
    """The signed-in user, or a redirect to the login page."""
    session = request.app[SESSIONS_KEY].get(request.cookies.get(COOKIE))
    if session is not None:
        user = await state.node(request).store.get_user_by_token_hash(session.token_hash)
        if user is not None:
            # The API's own visibility helpers read the user from here.
            request[auth.USER_KEY] = user
            return user, session
    raise web.HTTPSeeOther("/login")


async def _check_csrf(request: web.Request, session: Session) -> None:
    form = await request.post()
    sent = form.get("csrf")
    if not isinstance(sent, str) or not secrets.compare_digest(sent, session.csrf):
        raise web.HTTPForbidden(text="missing or wrong CSRF token")


def _context(user: UserRecord, session: Session, **values: object) -> dict[str, object]:
    """A page's template context: what every page shows (user, CSRF token) and its own values."""
    return {"user": user, "csrf": session.csrf, **values}


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
    form = await request.post()
    token = form.get("token")
    user = None
    if isinstance(token, str) and token:
        user = await state.node(request).store.get_user_by_token_hash(auth.hash_token(token))
    if user is None:
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
    request.app[SESSIONS_KEY].by_id.pop(request.cookies.get(COOKIE, ""), None)
    response = web.HTTPSeeOther("/login")
    response.del_cookie(COOKIE, path="/")
    raise response


@routes.get("/workflows")
@aiohttp_jinja2.template("workflows.html")
async def workflows_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    owner = None if user.is_admin else user.name
    found = await state.node(request).store.list_workflows(owner=owner, limit=200)
    return _context(user, session, workflows=[documents.workflow_summary(w) for w in found.items])


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
    await state.node(request).workflows.kill(record.id)
    raise web.HTTPSeeOther(f"/workflows/{record.id}")


def _log_tail(request: web.Request, workflow_id: str, action_id: int, attempt: int) -> str | None:
    path = executors_base.log_path(state.settings(request).home, workflow_id, action_id, attempt)
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


@routes.get("/workflows/{workflow_id}/actions/{action_id}")
@aiohttp_jinja2.template("action.html")
async def action_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    action_id = bodies.path_int(request, "action_id")
    action = await state.node(request).store.get_action(record.id, action_id)
    if action is None:
        raise web.HTTPNotFound(text="no such action")
    log = _log_tail(request, record.id, action_id, action.attempts) if action.attempts else None
    return _context(
        user,
        session,
        workflow=documents.workflow_summary(record),
        action=documents.action_detail(
            action, await state.node(request).store.get_dataset(action.dataset_id)
        ),
        log=log,
    )


@routes.get("/datasets")
@aiohttp_jinja2.template("datasets.html")
async def datasets_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    found = await state.node(request).store.list_datasets(limit=200)
    visible = [d for d in found.items if auth.may_see_scope(user, d.scope)]
    items = await dataset_routes.dataset_documents(request, visible)
    return _context(user, session, datasets=items)


@routes.get("/datasets/{dataset_id}")
@aiohttp_jinja2.template("dataset.html")
async def dataset_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    record = await dataset_routes.visible_dataset(request)
    (dataset,) = await dataset_routes.dataset_documents(request, [record])
    lineage = await dataset_routes.lineage_document(request, record.id)
    return _context(user, session, dataset=dataset, lineage=lineage)


@routes.get("/storage")
@aiohttp_jinja2.template("storage.html")
async def storage_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    return _context(user, session, storage=await dataset_routes.storage_document(request))


@routes.get("/schedules")
@aiohttp_jinja2.template("schedules.html")
async def schedules_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    store = state.node(request).store
    owner = None if user.is_admin else user.name
    found = await store.list_schedules(owner=owner, limit=200)
    schedules = []
    for record in found:
        document = schedule_routes.schedule_document(record)
        runs = await store.list_schedule_runs(record.id, limit=1)
        document["lastRun"] = schedule_routes.run_document(runs[0]) if runs else None
        schedules.append(document)
    return _context(user, session, schedules=schedules)


@routes.get("/users")
@aiohttp_jinja2.template("users.html")
async def users_page(request: web.Request) -> dict[str, object]:
    user, session = await _session_user(request)
    # Like the API, only an admin lists users; anyone else sees themselves.
    users = await state.node(request).store.list_users() if user.is_admin else [user]
    settings = state.settings(request)
    return _context(user, session, users=[documents.user_document(u, settings) for u in users])


async def _workflow_fragment(request: web.Request) -> tuple[dict[str, object], str]:
    """The live part of a workflow page and its ETag (state, counts, actions' states)."""
    user, session = await _session_user(request)
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    actions = await state.node(request).store.list_actions(record.id)
    document = documents.workflow_document(record, actions)
    digest = hashlib.sha256(bodies.encode_json(document)).hexdigest()[:32]
    context = _context(user, session, workflow=document, dag=dag.layout(actions))
    return context, f'"{digest}"'


@routes.get("/workflows/{workflow_id}/live")
async def workflow_live(request: web.Request) -> web.Response:
    """The workflow's live fragment, polled by the page; 304 when nothing changed.

    A conditional poll costs one store read and no rendering or transfer while a
    workflow sits still, and holds no connection open between polls, so many
    open tabs stay cheap; SSE would hold a connection per tab.
    """
    context, etag = await _workflow_fragment(request)
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers={"ETag": etag})
    response = aiohttp_jinja2.render_template("workflow_live.html", request, context)
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "no-cache"
    return response


def is_ui_route(route: web.AbstractRoute) -> bool:
    """Whether a route of the app is the UI's (pages, not API: OpenAPI leaves them out)."""
    if isinstance(route.resource, web.StaticResource):
        return route.resource.canonical.startswith(STATIC_PREFIX)
    return getattr(route.handler, "__module__", "") == __name__


def setup(app: web.Application) -> None:
    """Register the UI's routes and template loader on the API's app."""
    aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("pingo.ui", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
    )
    app[SESSIONS_KEY] = Sessions()
    app.add_routes(routes)
    app.router.add_static(STATIC_PREFIX, STATIC)

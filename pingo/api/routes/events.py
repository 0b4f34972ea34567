"""`/api/v1/events`: each user's feed of their workflows' events (JSON pages or SSE);
`/api/v1/audit`: the admins' log of every user action (`pingo.api.audit` records it)."""

from __future__ import annotations

import asyncio
import logging
import re

from aiohttp import web

from pingo import errors, events, limits
from pingo.api import auth, bodies, documents, models, problems, runtime
from pingo.store.protocol import EventRecord, Store, UserRecord

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

SSE = "text/event-stream"
#: How often a stream asks the store for new events.
_STREAM_POLL_S = 0.5
#: A comment line this often keeps proxies from closing an idle stream.
_KEEP_ALIVE_S = 15.0
#: Set when the app shuts down: open streams end, rather than hold up the shutdown.
STOPPING = web.AppKey("pingo.events.stopping", asyncio.Event)
#: The streams open on this app, by user: each holds a descriptor and polls the store,
#: so a cap per user and one in total keep one user from taking the server.
STREAMS = web.AppKey("pingo.events.streams", limits.Slots)
#: Retry-After for a refused stream: a hint, since nobody knows when another one ends.
STREAM_RETRY_S = 5
#: A sequence number: what cursors and `Last-Event-ID` hold.
_SEQ = re.compile(r"[0-9]{1,18}")


def setup(app: web.Application) -> None:
    """Cap the app's open event streams, and end them when it shuts down."""
    app[STOPPING] = asyncio.Event()
    settings = app[runtime.STATE_KEY].settings
    app[STREAMS] = limits.Slots(
        "event streams",
        per_user=settings.user_max_event_streams,
        total=settings.max_event_streams,
        retry_after_s=STREAM_RETRY_S,
    )

    async def stop_streams(app: web.Application) -> None:
        app[STOPPING].set()

    app.on_shutdown.append(stop_streams)


def _position(raw: str | None, name: str) -> int | None:
    """A cursor or an event id (digits only), or None when absent (400 when malformed)."""
    if raw is None or raw == "":
        return None
    if not _SEQ.fullmatch(raw) or not raw.isascii():
        issue = errors.ValidationIssue("INVALID_CURSOR", "not a valid event position", f"/{name}")
        raise problems.InvalidParameter(f"{name}: not a valid event position", [issue])
    return int(raw)


def _kind(request: web.Request) -> str | None:
    kind = request.query.get("kind")
    if kind is None:
        return None
    if kind not in events.FEED_KINDS:
        allowed = ", ".join(events.FEED_KINDS)
        issue = errors.ValidationIssue("INVALID_PARAMETER", f"one of {allowed}", "/kind")
        raise problems.InvalidParameter(f"query parameter 'kind': one of {allowed}", [issue])
    return kind


def _wants_stream(request: web.Request) -> bool:
    return any(part.split(";")[0].strip() == SSE for part in request.headers.getall("Accept", []))


@routes.get(PREFIX + "/events", name="list_events")
async def list_events(request: web.Request) -> web.StreamResponse:
    """The requester's own events, newest first by cursor; with `Accept: text/event-stream`,
    a stream of new ones (resumed after `Last-Event-ID`)."""
    user = auth.current_user(request)
    kind = _kind(request)
    # Checked on every request, though only a stream reads it: a malformed one is refused.
    after = _position(request.headers.get("Last-Event-ID"), "Last-Event-ID")
    if _wants_stream(request):
        return await _stream(request, user, kind, after)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    before = _position(request.query.get("cursor"), "cursor")
    found = await runtime.node(request).store.list_events(
        owner=user.name, kind=kind, before_seq=before, limit=limit + 1
    )
    page, more = found[:limit], len(found) > limit
    next_cursor = str(page[-1].seq) if more else None
    return bodies.json_response(
        models.EventPage(items=[documents.event_document(e) for e in page], next=next_cursor)
    )


async def _stream(
    request: web.Request, user: UserRecord, kind: str | None, after: int | None
) -> web.StreamResponse:
    """Server-sent events, within the user's and the server's caps on open streams (429
    beyond them): the slot is taken before anything is sent and given back however the
    stream ends (client gone, token revoked, app stopping, store down, a bug)."""
    streams = request.app[STREAMS]
    with streams.held(user.name):
        return await _follow(request, user, kind, after)


async def _follow(
    request: web.Request, user: UserRecord, kind: str | None, after: int | None
) -> web.StreamResponse:
    """Each new event once, as `id`, `event` and `data` lines, until the client leaves,
    the app stops or the token is revoked."""
    store = runtime.node(request).store
    owner = user.name
    if after is None:
        # A new follower starts now: what happened before is in the JSON pages.
        latest = await store.list_events(owner=owner, kind=kind, limit=1)
        after = latest[0].seq if latest else 0
    follower = events.Follower(store, owner, after, kind)
    response = web.StreamResponse(
        headers={"Content-Type": SSE, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    try:
        await response.write(b"retry: 2000\n\n")
        quiet_since = loop.time()
        while True:
            fresh = await follower.poll(store.clock())
            for event in fresh:
                await response.write(_frame(event))
            if fresh:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= _KEEP_ALIVE_S:
                await response.write(b": keep-alive\n\n")
                quiet_since = loop.time()
            if await _ended(request):
                break
            # The token was checked once, when the stream opened: a revoked user (or a
            # stranger given the name since) must not go on reading the name's feed.
            if not await _still_valid(store, user):
                logger.info(
                    "event stream of %s ended: its token was revoked",
                    owner,
                    extra={"event": "event_stream_revoked", "user": owner},
                )
                break
    except (ConnectionResetError, errors.StoreUnavailable):
        # The client went away, or the node is stopping: the client resumes elsewhere.
        logger.debug("event stream of %s ended", owner, extra={"event": "event_stream_ended"})
    return response


async def _ended(request: web.Request) -> bool:
    """Wait one poll interval; True when the client left or the app is shutting down."""
    stopping = request.app[STOPPING]
    try:
        await asyncio.wait_for(stopping.wait(), _STREAM_POLL_S)
    except TimeoutError:
        pass
    transport = request.transport
    return stopping.is_set() or transport is None or transport.is_closing()


async def _still_valid(store: Store, user: UserRecord) -> bool:
    """Whether the stream's token still belongs to the user it was opened for."""
    current = await store.get_user_by_token_hash(user.token_hash)
    return (
        current is not None and current.name == user.name and current.created_at == user.created_at
    )


def _frame(event: EventRecord) -> bytes:
    """One SSE message; the JSON has no raw newline, so it is one `data` line."""
    data = documents.encode(documents.event_document(event)).decode()
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n".encode()


@routes.get(PREFIX + "/audit", name="list_audit")
async def list_audit(request: web.Request) -> web.Response:
    """Every user action (who, what, when, from where), newest first (admin only)."""
    auth.require_admin(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    before = _position(request.query.get("cursor"), "cursor")
    found = await runtime.node(request).store.list_events(
        kind=events.AUDIT, before_seq=before, limit=limit + 1
    )
    page, more = found[:limit], len(found) > limit
    next_cursor = str(page[-1].seq) if more else None
    return bodies.json_response(
        models.AuditPage(items=[documents.audit_document(e) for e in page], next=next_cursor)
    )

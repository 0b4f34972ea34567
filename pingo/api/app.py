"""`create_app(settings)`: the aiohttp application, and `serve(settings)`, which runs it.

The app owns the node's lifetime through aiohttp's `cleanup_ctx`: on start it
opens the store and starts the node (scraper, submitters, reaper, deletor),
creates the first admin if there is no user, and on shutdown stops the node
(stop claiming, hand back or finish running work) before closing the store.
Tests pass their own started node instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from pingo import errors, ui
from pingo.api import audit, auth, problems, runtime
from pingo.api.routes import setup_routes
from pingo.config import Settings

if TYPE_CHECKING:
    from pingo.node import Node

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1/"
#: Signed by their own per-attempt token, not by a bearer token.
CALLBACK_PREFIX = "/api/v1/callbacks/"


@web.middleware
async def auth_middleware(request: web.Request, handler: problems.Handler) -> web.StreamResponse:
    """Every /api/v1 route but the callbacks needs a user's bearer token."""
    # Decided by the route that matched, not by the raw path, so that no spelling of a
    # URL can reach a protected handler as if it were a callback.
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else request.path
    if path.startswith(API_PREFIX) and not path.startswith(CALLBACK_PREFIX):
        store = runtime.node(request).store
        request[auth.USER_KEY] = await auth.authenticate(
            store, request.headers.get("Authorization")
        )
    return await handler(request)


def _action_types() -> frozenset[str]:
    from pingo.workflows import action_types

    return frozenset(action_types.load_action_types())


async def _attach(app: web.Application, node: Node) -> None:
    shared = app[runtime.STATE_KEY]
    # Before the heap is trimmed after big work, the store's caches go back to it too.
    shared.trimmer.release = node.store.release_memory
    shared.executor_types = frozenset(node.executors)
    shared.action_types = _action_types()
    await auth.ensure_admin(node.store, shared.settings)
    shared.node = node


def create_app(settings: Settings, *, node: Node | None = None) -> web.Application:
    """The Pingo HTTP application.

    With `node=None` the app opens the store at `settings.store_url` and runs
    its own node for as long as it runs; with a node, it serves that node's
    services and leaves starting and stopping it to the caller.
    """
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[problems.problem_middleware, auth_middleware, audit.audit_middleware],
    )
    app[runtime.STATE_KEY] = runtime.ApiState(settings=settings)

    async def engine(app: web.Application) -> AsyncIterator[None]:
        try:
            if node is not None:
                await _attach(app, node)
                yield
                return
            from pingo.node import running_node

            async with running_node(settings) as own:
                try:
                    await _attach(app, own)
                    yield
                finally:
                    app[runtime.STATE_KEY].node = None
        finally:
            await app[runtime.STATE_KEY].trimmer.close()

    app.cleanup_ctx.append(engine)
    setup_routes(app)
    ui.setup(app)
    return app


async def _until_stopped(app: web.Application, stop: asyncio.Event) -> None:
    """Return on a stop signal; raise if the node's loops died (the supervisor stopped them)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        node = app[runtime.STATE_KEY].node
        if node is not None and not node.running:
            raise errors.PingoError("the node's background loops stopped; see the log above")


async def serve(settings: Settings, *, shutdown_timeout_s: float = 30.0) -> None:
    """Run the API and the node on `settings.host:port` until SIGTERM or SIGINT."""
    app = create_app(settings)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout_s
    )
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        try:
            await site.start()
        except OSError as exc:
            raise errors.ConfigurationError(
                f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
            ) from exc
        logger.info(
            "Pingo listening on http://%s:%d (store %s, data root %s)",
            settings.host,
            settings.port,
            settings.store_url,
            settings.data_root,
            extra={"event": "server_started"},
        )
        await _until_stopped(app, stop)
        logger.info("shutting down", extra={"event": "server_stopping"})
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
        # Stops accepting requests, then the cleanup context stops the node and closes the store.
        await runner.cleanup()

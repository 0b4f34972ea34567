"""The API's routes, one module per resource; `setup_routes` registers them all."""

from __future__ import annotations

from aiohttp import web

from pingo.api.routes import callbacks, datasets, events, schedules, system, users, workflows


def setup_routes(app: web.Application) -> None:
    """Add every route of the API to `app`."""
    for module in (workflows, schedules, datasets, callbacks, users, events, system):
        app.router.add_routes(module.routes)
    events.setup(app)
    datasets.setup(app)

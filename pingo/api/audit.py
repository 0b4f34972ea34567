"""The audit log: every user action, recorded in one place (this middleware).

An action is a request to one of the routes of `AUDITED` (the API's and the web
UI's) that succeeded; it is recorded with who (the authenticated user), when
(the store's clock), from where (the peer address) and on what (the route's path
parameters, and the `Location` of what it created). Handlers do nothing for it:
a new route that changes something is audited by adding it to the table.
Admins read the log at `GET /api/v1/audit` (`pingo.api.routes.events`).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from pingo import events
from pingo.api import auth, problems, runtime

#: (method, route) -> the action's name in the log. A name may be filled from one of the
#: route's parameters (the web UI's dataset form says pin, unpin or delete in its path);
#: that parameter is then the action, not part of the target.
AUDITED: Mapping[tuple[str, str], str] = {
    ("POST", "/api/v1/workflows"): "workflow.submit",
    ("POST", "/api/v1/workflows/{workflow_id}/kill"): "workflow.kill",
    ("POST", "/api/v1/workflows/{workflow_id}/rerun"): "workflow.rerun",
    ("POST", "/workflows/{workflow_id}/kill"): "workflow.kill",
    ("POST", "/workflows/{workflow_id}/rerun"): "workflow.rerun",
    ("POST", "/datasets/{dataset_id}/{change}"): "dataset.{change}",
    ("POST", "/users"): "user.add",
    ("POST", "/users/{name}/revoke"): "user.revoke",
    ("DELETE", "/api/v1/datasets/{dataset_id}"): "dataset.delete",
    ("POST", "/api/v1/datasets/{dataset_id}/pin"): "dataset.pin",
    ("POST", "/api/v1/datasets/{dataset_id}/unpin"): "dataset.unpin",
    ("POST", "/api/v1/users"): "user.add",
    ("DELETE", "/api/v1/users/{name}"): "user.revoke",
    ("PATCH", "/api/v1/users/{name}"): "user.limits",
    ("POST", "/api/v1/schedules"): "schedule.add",
    ("POST", "/api/v1/schedules/{schedule_id}/pause"): "schedule.pause",
    ("POST", "/api/v1/schedules/{schedule_id}/resume"): "schedule.resume",
    ("DELETE", "/api/v1/schedules/{schedule_id}"): "schedule.rm",
    ("POST", "/schedules/{schedule_id}/pause"): "schedule.pause",
    ("POST", "/schedules/{schedule_id}/resume"): "schedule.resume",
    ("POST", "/schedules/{schedule_id}/delete"): "schedule.rm",
}


#: Where a handler leaves what its entry should say beyond the route (`note`).
_NOTES_KEY = web.RequestKey("pingo.audit.notes", dict[str, str])


def note(request: web.Request, **fields: str) -> None:
    """Add `fields` to the target of the audit entry `request` will make, if it makes one:
    for what only the body says, such as a user added to reclaim a revoked name."""
    request[_NOTES_KEY] = {**request.get(_NOTES_KEY, {}), **fields}


def _audited(request: web.Request) -> str | None:
    """The action `request` performs (its `AUDITED` name), if it is one the log records."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    return AUDITED.get((request.method, resource.canonical))


async def _record(request: web.Request, named: str, response: web.StreamResponse) -> None:
    user = request.get(auth.USER_KEY)
    if user is None or response.status >= 400:
        return
    if request.query.get("dryRun", "").strip().lower() in ("true", "1", "yes"):
        return  # a plan shown, nothing changed
    # The router matched the parameters a name may use against the route's own pattern
    # (`pin|unpin|delete`), so filling it in names only actions of the table.
    action = named.format_map(request.match_info)
    target = {k: v for k, v in request.match_info.items() if f"{{{k}}}" not in named}
    location = response.headers.get("Location")
    if location is not None:
        target["location"] = location
    target.update(request.get(_NOTES_KEY, {}))
    await events.audit(
        runtime.node(request).store,
        actor=user.name,
        action=action,
        remote=request.remote,
        target=target,
        status=response.status,
    )


@web.middleware
async def audit_middleware(request: web.Request, handler: problems.Handler) -> web.StreamResponse:
    """Record each successful user action (an answer below 400) in the audit log."""
    action = _audited(request)
    if action is None:
        return await handler(request)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        # The web UI answers a kill or a re-run with a redirect, raised.
        if exc.status < 400:
            await _record(request, action, exc)
        raise
    await _record(request, action, response)
    return response

"""`/api/v1/users`: admins create, list and revoke users and their bearer tokens."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web

from pingo import errors, limits, untrusted
from pingo.api import auth, bodies, documents, models, runtime
from pingo.store.protocol import UserRecord

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

_FIELDS = {"name": str, "admin": bool}


def _user_request(body: object) -> tuple[str, bool]:
    """`{"name": str, "admin": bool?}`, every issue reported (422)."""
    if not isinstance(body, Mapping):
        raise errors.ValidationFailed(
            [errors.ValidationIssue("SCHEMA_VIOLATION", "the body must be an object", "")]
        )
    issues = [
        errors.ValidationIssue("SCHEMA_VIOLATION", f"unknown field {key!r}", f"/{key}")
        for key in body
        if key not in _FIELDS
    ]
    name = body.get("name")
    admin = body.get("admin", False)
    if not isinstance(name, str):
        issues.append(errors.ValidationIssue("SCHEMA_VIOLATION", "name must be a string", "/name"))
    if not isinstance(admin, bool):
        issues.append(
            errors.ValidationIssue("SCHEMA_VIOLATION", "admin must be true or false", "/admin")
        )
    if issues:
        raise errors.ValidationFailed(issues)
    assert isinstance(name, str) and isinstance(admin, bool)
    return name, admin


async def add_user(
    request: web.Request, caller: UserRecord, name: str, admin: bool
) -> tuple[UserRecord, str]:
    """Create a user and its token (the caller is an admin): the API's and the UI's way."""
    auth.check_user_name(name)
    store = runtime.node(request).store
    token = auth.generate_token()
    user = await store.create_user(
        UserRecord(
            name=name, token_hash=auth.hash_token(token), is_admin=admin, created_at=store.clock()
        )
    )
    logger.info(
        "%s created user %s (admin: %s)",
        caller.name,
        name,
        admin,
        extra={"event": "user_created", "user": name},
    )
    return user, token


async def revoke_user(request: web.Request, caller: UserRecord, name: str) -> None:
    """Revoke a user and its token (the caller is an admin, never revoking themselves)."""
    if name == caller.name:
        # Keeps at least one admin able to log in: nobody can lock the server out by accident.
        raise errors.Conflict("you cannot revoke yourself; ask another admin")
    if not await runtime.node(request).store.delete_user(name):
        raise errors.NotFound(f"no user {name!r}")
    runtime.api_state(request).submission_rate.forget(name)
    logger.info(
        "%s revoked user %s", caller.name, name, extra={"event": "user_revoked", "user": name}
    )


@routes.post(PREFIX + "/users", name="create_user")
async def create_user(request: web.Request) -> web.Response:
    """Create a user (admin only); the answer holds its token, shown this once."""
    caller = auth.require_admin(request)
    name, admin = _user_request(await bodies.read_json(request))
    user, token = await add_user(request, caller, name, admin)
    return bodies.json_response(
        documents.new_user_document(user, runtime.settings(request), token),
        status=201,
        headers={"Location": f"{PREFIX}/users/{name}"},
    )


@routes.get(PREFIX + "/users", name="list_users")
async def list_users(request: web.Request) -> web.Response:
    """Every user, by name (admin only)."""
    auth.require_admin(request)
    users = await runtime.node(request).store.list_users()
    settings = runtime.settings(request)
    return bodies.json_response(
        models.UserList(items=[documents.user_document(u, settings) for u in users])
    )


@routes.delete(PREFIX + "/users/{name}", name="delete_user")
async def delete_user(request: web.Request) -> web.Response:
    """Revoke a user and its token (admin only; 204)."""
    caller = auth.require_admin(request)
    await revoke_user(request, caller, request.match_info["name"])
    return web.Response(status=204)


@routes.get(PREFIX + "/me", name="get_me")
async def get_me(request: web.Request) -> web.Response:
    """The user the bearer token belongs to."""
    return bodies.json_response(
        documents.user_document(auth.current_user(request), runtime.settings(request))
    )


@routes.get(PREFIX + "/users/{name}", name="get_user")
async def get_user(request: web.Request) -> web.Response:
    """One user and their limits (an admin, or the user themselves)."""
    caller = auth.current_user(request)
    name = request.match_info["name"]
    if name != caller.name:
        auth.require_admin(request)
    user = await runtime.node(request).store.get_user(name)
    if user is None:
        raise errors.NotFound(f"no user {name!r}")
    return bodies.json_response(documents.user_document(user, runtime.settings(request)))


@routes.patch(PREFIX + "/users/{name}", name="update_user")
async def update_user(request: web.Request) -> web.Response:
    """Change a user's limits (admin only; nobody else, not even for themselves)."""
    caller = auth.require_admin(request)
    name = request.match_info["name"]
    changes = _limits_request(await bodies.read_json(request))
    store = runtime.node(request).store
    user = await store.get_user(name)
    if user is None:
        raise errors.NotFound(f"no user {name!r}")
    updated = await store.set_user_limits(name, limits.merge(user.limits, changes))
    if updated is None:  # revoked meanwhile
        raise errors.NotFound(f"no user {name!r}")
    logger.info(
        "%s set the limits of %s: %s",
        caller.name,
        name,
        changes,
        extra={"event": "user_limits_changed", "user": name},
    )
    return bodies.json_response(documents.user_document(updated, runtime.settings(request)))


def _limits_request(body: object) -> dict[str, int | None]:
    """`{"limits": {field: positive int or null, …}}` → `UserLimits` changes (422 otherwise).

    A null resets that limit to the server's default; an absent field is kept.
    """
    if not isinstance(body, Mapping):
        raise _invalid("the body must be an object", "")
    issues = [
        errors.ValidationIssue("SCHEMA_VIOLATION", f"unknown field {key!r}", f"/{key}")
        for key in body
        if key != "limits"
    ]
    wanted = body.get("limits")
    if not isinstance(wanted, Mapping):
        issues.append(
            errors.ValidationIssue("SCHEMA_VIOLATION", "limits must be an object", "/limits")
        )
        raise errors.ValidationFailed(issues)
    changes: dict[str, int | None] = {}
    for key, raw in wanted.items():
        pointer = "/limits/" + _pointer_token(key)
        attr = documents.LIMIT_FIELDS.get(key)
        # JSON Schema's integer: 3.0 is one, as the OpenAPI document promises.
        value = None if raw is None else untrusted.json_integer(raw)
        if attr is None:
            issues.append(
                errors.ValidationIssue("SCHEMA_VIOLATION", f"unknown limit {key!r}", pointer)
            )
        elif raw is not None and (value is None or not 1 <= value <= limits.MAX_LIMIT):
            issues.append(
                errors.ValidationIssue(
                    "INVALID_LIMIT",
                    f"{key} must be an integer from 1 to {limits.MAX_LIMIT}, or null for the "
                    "server's default",
                    pointer,
                )
            )
        else:
            changes[attr] = value
    if issues:
        raise errors.ValidationFailed(issues)
    return changes


def _pointer_token(key: str) -> str:
    """`key` escaped as one RFC 6901 reference token."""
    return key.replace("~", "~0").replace("/", "~1")


def _invalid(message: str, pointer: str) -> errors.ValidationFailed:
    return errors.ValidationFailed([errors.ValidationIssue("SCHEMA_VIOLATION", message, pointer)])

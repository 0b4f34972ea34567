"""`/api/v1/users`: admins create, list and revoke users and their bearer tokens."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web

from pingo import errors
from pingo.api import auth, bodies, documents, state
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
    auth.check_user_name(name)
    return name, admin


@routes.post(PREFIX + "/users", name="create_user")
async def create_user(request: web.Request) -> web.Response:
    """Create a user (admin only); the answer holds its token, shown this once."""
    caller = auth.require_admin(request)
    name, admin = _user_request(await bodies.read_json(request))
    store = state.node(request).store
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
    return bodies.json_response(
        {**documents.user_document(user), "token": token},
        status=201,
        headers={"Location": f"{PREFIX}/users/{name}"},
    )


@routes.get(PREFIX + "/users", name="list_users")
async def list_users(request: web.Request) -> web.Response:
    """Every user, by name (admin only)."""
    auth.require_admin(request)
    users = await state.node(request).store.list_users()
    return bodies.json_response({"items": [documents.user_document(u) for u in users]})


@routes.delete(PREFIX + "/users/{name}", name="delete_user")
async def delete_user(request: web.Request) -> web.Response:
    """Revoke a user and its token (admin only; 204)."""
    caller = auth.require_admin(request)
    name = request.match_info["name"]
    if name == caller.name:
        # Keeps at least one admin able to log in: nobody can lock the server out by accident.
        raise errors.Conflict("you cannot revoke yourself; ask another admin")
    if not await state.node(request).store.delete_user(name):
        raise errors.NotFound(f"no user {name!r}")
    logger.info(
        "%s revoked user %s", caller.name, name, extra={"event": "user_revoked", "user": name}
    )
    return web.Response(status=204)


@routes.get(PREFIX + "/me", name="get_me")
async def get_me(request: web.Request) -> web.Response:
    """The user the bearer token belongs to."""
    return bodies.json_response(documents.user_document(auth.current_user(request)))

"""`/api/v1/users`: admins create, list and revoke users and their bearer tokens."""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiohttp import web

from pingo import errors, limits
from pingo.api import audit, auth, bodies, documents, models, runtime
from pingo.store.protocol import Store, UserRecord

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()


async def add_user(
    request: web.Request, caller: UserRecord, name: str, admin: bool, *, reclaim: bool = False
) -> tuple[UserRecord, str]:
    """Create a user and its token (the caller is an admin): the API's and the UI's way.

    Everything is owned by a user's name, and revoking a user keeps what they owned: a
    name that still owns anything is refused (`Conflict`) unless `reclaim` says that the
    same person is coming back to it.
    """
    auth.check_user_name(name)
    store = runtime.node(request).store
    # A taken name is left to the store's own refusal (which also settles a race).
    if not reclaim and await store.get_user(name) is None:
        owned = await owned_by(store, name)
        if owned:
            raise errors.Conflict(
                f"the name {name!r} still owns a revoked user's {' and '.join(owned)}: a new "
                "user of that name would get them; choose another name, or reclaim it "
                '("reclaim": true) if the same person is coming back'
            )
    if reclaim:
        audit.note(request, reclaim="true")
    token = auth.generate_token()
    user = await store.create_user(
        UserRecord(
            name=name, token_hash=auth.hash_token(token), is_admin=admin, created_at=store.clock()
        )
    )
    logger.info(
        "%s created user %s (admin: %s, reclaim: %s)",
        caller.name,
        name,
        admin,
        reclaim,
        extra={"event": "user_created", "user": name, "reclaim": reclaim},
    )
    return user, token


async def owned_by(store: Store, name: str) -> list[str]:
    """What `name` owns in the store (workflows, schedules, feed events), as words; [] for
    none. Revoking a user deletes the user alone: the rest stays under the name (and a
    revoked owner's schedule fails its ticks rather than run them)."""
    workflows, schedules, feed = await asyncio.gather(
        store.list_workflows(owner=name, limit=1),
        store.list_schedules(owner=name, limit=1),
        store.list_events(owner=name, limit=1),
    )
    found = {"workflows": workflows.items, "schedules": schedules, "events": feed}
    return [what for what, items in found.items() if items]


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


def user_location(name: str) -> str:
    """Where a user's document is (the `Location` of what adding them created)."""
    return f"{PREFIX}/users/{name}"


@routes.post(PREFIX + "/users", name="create_user")
async def create_user(request: web.Request) -> web.Response:
    """Create a user (admin only); the answer holds its token, shown this once."""
    caller = auth.require_admin(request)
    wanted = bodies.read_model(await bodies.read_json(request), models.UserRequest)
    name = wanted.name
    user, token = await add_user(request, caller, name, wanted.admin, reclaim=wanted.reclaim)
    return bodies.json_response(
        documents.new_user_document(user, runtime.settings(request), token),
        status=201,
        headers={"Location": user_location(name)},
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
    changes = _limit_changes(bodies.read_model(await bodies.read_json(request), models.UserUpdate))
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


def _limit_changes(update: models.UserUpdate) -> dict[str, int | None]:
    """The `UserLimits` fields a request sets: null resets one, an absent one is kept."""
    wanted = update.limits
    return {
        field: value
        for field in wanted.__struct_fields__
        if (value := getattr(wanted, field)) is not msgspec.UNSET
    }

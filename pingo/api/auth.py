"""Bearer-token users: hashing, the first admin, and the per-request identity.

Tokens are random strings shown once; the store keeps only their sha256
(`UserRecord.token_hash`), so a leaked database does not leak credentials. A
sha256 (not a slow password hash) is right here: tokens carry 256 bits of
entropy, and every request looks one up by hash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import sys
from pathlib import Path

from aiohttp import web

from pingo import errors, untrusted
from pingo.api import models
from pingo.config import Settings
from pingo.datasets.storage import open_own
from pingo.store.protocol import Store, UserRecord

logger = logging.getLogger(__name__)

ADMIN_NAME = "admin"
ADMIN_TOKEN_FILE = "admin.token"
USER_KEY = web.RequestKey("pingo.user", UserRecord)
_NAME_RE = re.compile(models.USER_NAME_PATTERN)


def hash_token(token: str) -> str:
    """The sha256 hex digest the store keeps instead of the token.

    A token that is not valid Unicode (a header byte like 0xFF arrives as a lone
    surrogate) is refused as not valid, like any unknown token.
    """
    raw = untrusted.to_bytes(token)
    if raw is None:
        raise errors.Unauthorized("the bearer token is not valid")
    return hashlib.sha256(raw).hexdigest()


def generate_token() -> str:
    """A new bearer token (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_user_name(name: str) -> None:
    """Raise `ValidationFailed` unless `name` is a valid user name."""
    # fullmatch: `$` would also match before a trailing newline.
    if not _NAME_RE.fullmatch(name) or name.startswith("user:"):
        raise errors.ValidationFailed(
            [
                errors.ValidationIssue(
                    "INVALID_USER_NAME",
                    "a user name is 1-64 letters, digits, '.', '_' or '-', starting with a "
                    "letter or digit",
                    "/name",
                )
            ]
        )


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path`, readable by its owner only (mode 0600), never through a link.

    A link planted at `path` would have the token written into (and the mode set on)
    whatever it names: `open_own` opens with O_NOFOLLOW and replaces such a link by a
    new file, and the mode is set on the open descriptor, not by name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created with 0600 from the start: a chmod after writing would leave a window.
    fd = open_own(str(path))
    with os.fdopen(fd, "w") as f:
        # An existing file keeps its mode through its truncation: make it 0600 before writing.
        os.fchmod(f.fileno(), 0o600)
        f.write(token + "\n")


async def ensure_admin(store: Store, settings: Settings) -> str | None:
    """On first start (no users at all), create the admin; return its token, or None.

    The token is `settings.admin_token` when set, else generated and printed
    once; either way it is written to `$PINGO_HOME/admin.token` (mode 0600),
    where the CLI finds it.
    """
    if await store.list_users():
        return None
    token = settings.admin_token or generate_token()
    user = UserRecord(
        name=ADMIN_NAME, token_hash=hash_token(token), is_admin=True, created_at=store.clock()
    )
    try:
        await store.create_user(user)
    except errors.Conflict:
        # Another node sharing the store created it first; its token is the one.
        return None
    path = settings.home / ADMIN_TOKEN_FILE
    write_token_file(path, token)
    logger.info(
        "created the first admin user %r; token written to %s",
        ADMIN_NAME,
        path,
        extra={"event": "admin_created"},
    )
    if not settings.admin_token:
        # Printed once, on purpose to stdout: the operator needs it and logs may be shipped.
        sys.stdout.write(f"Pingo admin token (also in {path}): {token}\n")
        sys.stdout.flush()
    return token


async def authenticate(store: Store, authorization: str | None) -> UserRecord:
    """The user a `Bearer` Authorization header names; `Unauthorized` otherwise."""
    if not authorization:
        raise errors.Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise errors.Unauthorized("the Authorization header must be 'Bearer <token>'")
    # The lookup is by hash: no comparison of secrets ever happens in Python.
    user = await store.get_user_by_token_hash(hash_token(token))
    if user is None:
        raise errors.Unauthorized("the bearer token is not valid")
    return user


def current_user(request: web.Request) -> UserRecord:
    """The authenticated user of this request (set by the auth middleware)."""
    if USER_KEY not in request:
        raise errors.Unauthorized()
    return request[USER_KEY]


def require_admin(request: web.Request) -> UserRecord:
    """The authenticated user, who must be an admin (`Forbidden` otherwise)."""
    user = current_user(request)
    if not user.is_admin:
        raise errors.Forbidden("only an admin may do this")
    return user


def visible_owner(user: UserRecord) -> str | None:
    """The owner whose workflows `user` may see; None for admins, who see all."""
    return None if user.is_admin else user.name


def visible_scopes(user: UserRecord) -> frozenset[str] | None:
    """The sharing scopes whose datasets `user` may see; None for admins, who see all."""
    return None if user.is_admin else frozenset({"server", f"user:{user.name}"})


def may_see(user: UserRecord, owner: str) -> bool:
    """Whether `user` may see a workflow owned by `owner` (admins see all)."""
    allowed = visible_owner(user)
    return allowed is None or allowed == owner


def may_see_scope(user: UserRecord, scope: str) -> bool:
    """Whether `user` may see a dataset computed in sharing scope `scope`."""
    allowed = visible_scopes(user)
    return allowed is None or scope in allowed

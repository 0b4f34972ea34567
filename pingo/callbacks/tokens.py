"""Signed callback tokens: an HMAC of the callback id and attempt under a server secret."""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from pingo import errors, untrusted

SECRET_FILE = "callback.secret"


def load_or_create_secret(home: Path) -> bytes:
    """The server secret kept in `home`, created (mode 0600) on first use.

    Every node that receives callbacks for the same store needs the same secret:
    share this file (or `PINGO_HOME`) between them.
    """
    path = home / SECRET_FILE
    try:
        return _read_own_secret(path)
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    # O_EXCL: when two processes race to create it, one wins and the other reads.
    # O_NOFOLLOW: a link planted there is refused, not written through.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_own_secret(path)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex())
    return secret


def _read_own_secret(path: Path) -> bytes:
    """The secret in `path`, which must be a regular file of this process's effective uid.

    Another user's file (or a link to one) there holds a secret they know: they could
    sign callbacks for any action. Checked on the open descriptor, so nothing can be
    swapped in between the check and the read.
    """
    remedy = f"remove it (after checking what it is), or chown {os.geteuid()} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise errors.ConfigurationError(
            f"refusing to start: {path} is a symbolic link, which the server will not "
            f"follow; {remedy}"
        ) from None
    with os.fdopen(fd, "rb") as f:
        found = os.fstat(f.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise errors.ConfigurationError(
                f"refusing to start: {path} is not a regular file; {remedy}"
            )
        if found.st_uid != os.geteuid():
            raise errors.ConfigurationError(
                f"refusing to start: {path} is owned by uid {found.st_uid}, not by the "
                f"server's uid {os.geteuid()}; {remedy}"
            )
        return bytes.fromhex(f.read(4096).decode("ascii", "replace").strip())


def sign(secret: bytes, callback_id: str, attempt: int) -> str:
    """The token for one attempt of one action's callbacks."""
    message = f"{callback_id}:{attempt}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def verify(secret: bytes, callback_id: str, attempt: int, token: str) -> bool:
    """Whether `token` was signed for this callback id and attempt (constant time).

    Both sides are compared as bytes: `compare_digest` refuses non-ASCII str,
    and the token and id come from the URL, where anyone can put anything.
    """
    given = untrusted.to_bytes(token)
    if given is None or untrusted.to_bytes(callback_id) is None:
        return False
    return hmac.compare_digest(sign(secret, callback_id, attempt).encode(), given)

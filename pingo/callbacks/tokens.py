"""Signed callback tokens: an HMAC of the callback id and attempt under a server secret."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from pingo import untrusted

SECRET_FILE = "callback.secret"


def load_or_create_secret(home: Path) -> bytes:
    """The server secret kept in `home`, created (mode 0600) on first use.

    Every node that receives callbacks for the same store needs the same secret:
    share this file (or `PINGO_HOME`) between them.
    """
    path = home / SECRET_FILE
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    # O_EXCL: when two processes race to create it, one wins and the other reads.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex())
    return secret


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

"""Opaque pagination cursors, shared by every store backend.

Lists are newest first, ordered by `(created_at, id)` descending. A cursor is
the position of the last item of a page: the next page holds the items
strictly after it in that order, so rows added meanwhile (which are newer)
never shift or repeat items. The encoding is base64url JSON so it survives
URLs; callers must treat it as opaque.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime, timedelta

from pingo import errors, untrusted

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(at: datetime) -> int:
    """Whole microseconds since the epoch (exact, unlike a float)."""
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The aware UTC datetime `micros` microseconds after the epoch."""
    return _EPOCH + timedelta(microseconds=micros)


def encode_cursor(created_at: datetime, item_id: str) -> str:
    """The cursor pointing just after the item created at `created_at` with id `item_id`."""
    raw = json.dumps([to_micros(created_at), item_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """`(created_at, id)` of the position `cursor` points after; `ValidationFailed` if bad."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = untrusted.loads(base64.urlsafe_b64decode(padded.encode()))
        micros, item_id = value
        if not isinstance(micros, int) or not isinstance(item_id, str):
            raise ValueError(cursor)
        return from_micros(micros), item_id
    except (ValueError, TypeError, binascii.Error, OverflowError) as exc:
        issue = errors.ValidationIssue("INVALID_CURSOR", "the cursor is not valid", "/cursor")
        raise errors.ValidationFailed([issue]) from exc


def is_after(created_at: datetime, item_id: str, position: tuple[datetime, str]) -> bool:
    """Whether an item comes after `position` in newest-first order."""
    at, pid = position
    return created_at < at or (created_at == at and item_id < pid)

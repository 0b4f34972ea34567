"""Opaque pagination cursors, shared by every store backend.

Lists are newest first, ordered by `(created_at, id)` descending. A cursor is
the position of the last item of a page: the next page holds the items
strictly after it in that order, so rows added meanwhile (which are newer)
never shift or repeat items. The encoding is plain URL-safe text
(`CURSOR_PATTERN`); callers must treat it as opaque.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from pingo import errors

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(at: datetime) -> int:
    """Whole microseconds since the epoch (exact, unlike a float).

    Every backend stores times through this one codec. A naive datetime is
    refused rather than guessed at: no store clock makes one, so it is a bug.
    """
    delta = require_aware(at) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def require_aware(at: datetime) -> datetime:
    """`at`, if it has a time zone; a naive one raises `ValueError` in every backend."""
    if at.tzinfo is None:
        raise ValueError(f"a naive datetime has no time zone: {at.isoformat()}")
    return at


def from_micros(micros: int) -> datetime:
    """The aware UTC datetime `micros` microseconds after the epoch."""
    return _EPOCH + timedelta(microseconds=micros)


#: Every string of this shape is a valid cursor (and the OpenAPI document says so):
#: `<microseconds since the epoch>.<item id>`. Seventeen digits reach the year
#: 5138, inside both `datetime` and a signed 64-bit integer; ids are
#: `wf-…` names and hex digests, so they need no escaping.
CURSOR_PATTERN = r"[0-9]{1,17}\.[A-Za-z0-9_-]{1,128}"
_CURSOR = re.compile(CURSOR_PATTERN)


def encode_cursor(created_at: datetime, item_id: str) -> str:
    """The cursor pointing just after the item created at `created_at` with id `item_id`."""
    cursor = f"{to_micros(created_at)}.{item_id}"
    if not _CURSOR.fullmatch(cursor):
        raise ValueError(f"no cursor can name item {item_id!r} created at {created_at}")
    return cursor


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """`(created_at, id)` of the position `cursor` points after; `ValidationFailed` if bad."""
    # fullmatch, and ASCII digits only: `$` would allow a newline, `int` other digits.
    if not _CURSOR.fullmatch(cursor) or not cursor.isascii():
        issue = errors.ValidationIssue("INVALID_CURSOR", "the cursor is not valid", "/cursor")
        raise errors.ValidationFailed([issue])
    micros, _, item_id = cursor.partition(".")
    return from_micros(int(micros)), item_id


def is_after(created_at: datetime, item_id: str, position: tuple[datetime, str]) -> bool:
    """Whether an item comes after `position` in newest-first order."""
    at, pid = position
    return created_at < at or (created_at == at and item_id < pid)

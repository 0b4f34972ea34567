"""State stores. Only this package talks to a database."""

from __future__ import annotations

from datetime import UTC, datetime

from pingo import errors
from pingo.store.protocol import Clock, Store


def utcnow() -> datetime:
    """The default store clock."""
    return datetime.now(UTC)


def open_store(
    url: str,
    *,
    clock: Clock = utcnow,
    sqlite_synchronous: str = "NORMAL",
    sqlite_cache_mb: int | None = None,
    mongo_write_concern: str = "majority",
) -> Store:
    """A store for `url` (`sqlite:///…`, `mongodb://…`, `memory://`); enter it with `async with`."""
    if url.startswith("sqlite://"):
        from pingo.store import sqlite

        return sqlite.SQLiteStore.from_url(
            url, clock=clock, synchronous=sqlite_synchronous, cache_mb=sqlite_cache_mb
        )
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from pingo.store import mongo

        return mongo.MongoStore.from_url(url, clock=clock, write_concern=mongo_write_concern)
    if url.startswith("memory://"):
        from pingo.store import memory

        return memory.MemoryStore(clock=clock)
    raise errors.ConfigurationError(
        f"unsupported store URL {url!r}: use sqlite:///path, mongodb://host or memory://"
    )

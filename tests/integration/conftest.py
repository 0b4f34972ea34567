"""Fixtures of the integration tests: a store URL per backend that several processes can open."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


def database_url(base: str, database: str) -> str:
    """`base` (a mongodb:// URL) naming `database` instead, its options kept."""
    scheme, rest = base.split("://", 1)
    hosts, _, query = rest.partition("?")
    return f"{scheme}://{hosts.split('/', 1)[0]}/{database}" + (f"?{query}" if query else "")


@pytest.fixture(params=["sqlite", "wire"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh SQLite file, or a fresh database on the wire server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pingo.db'}"
    base: str = request.getfixturevalue("wire_url")
    return database_url(base, f"pingo_test_{uuid.uuid4().hex[:12]}")

"""Fixtures of the integration tests: a store URL per backend that several processes can open."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def wire_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A MongoDB wire server for the session: `PINGO_TEST_MONGODB_URI`, or nx-27017."""
    external = os.environ.get("PINGO_TEST_MONGODB_URI")
    if external:
        yield external
        return
    from pingo import testing

    with testing.wire_server(tmp_path_factory.mktemp("wire")) as server:
        yield server.url


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

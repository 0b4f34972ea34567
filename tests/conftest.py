"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: ../shared beside the repository: benchmark workflows and WfCommons traces.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not present")
    return SHARED


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

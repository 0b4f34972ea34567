"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: What every Pingo server a test starts is told beyond its own settings. CI runs the
#: suite as root, where a server runs no non-admin's command-line action unless
#: PINGO_ROOT_ACTIONS=everyone (docs/security.md); the suite's actions are its own test
#: commands. tests/api/test_sandbox_policy.py tests the refusal itself.
SERVER_ENVIRONMENT = {"PINGO_ROOT_ACTIONS": "everyone"}

#: ../shared beside the repository: benchmark workflows and WfCommons traces.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def server_environ() -> dict[str, str]:
    """The environment for a server process a test starts: this one's without any
    PINGO_ variable (the test sets those it means), plus `SERVER_ENVIRONMENT`."""
    own = {k: v for k, v in os.environ.items() if not k.startswith("PINGO_")}
    return {**own, **SERVER_ENVIRONMENT}


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

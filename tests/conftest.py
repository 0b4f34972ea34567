"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest

#: ../shared beside the repository: benchmark workflows and WfCommons traces.
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not present")
    return SHARED

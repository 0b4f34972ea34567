"""Fixtures of the engine's unit tests: a store per backend on a manual clock, settings, storage.

Modules with other needs define their own fixture of the same name, which wins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from tests.unit._engine_support import (
    BACKENDS,
    ManualClock,
    make_settings,
    make_storage,
    open_backend,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Any]:
    async for s in open_backend(request.param, tmp_path, clock):
        yield s


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def storage(settings: Settings) -> DatasetStorage:
    return make_storage(settings)

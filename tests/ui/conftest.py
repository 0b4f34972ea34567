"""The UI tests reuse the API tests' real app (SQLite file, node, local executor)."""

from __future__ import annotations

from tests.api.conftest import api, settings, users_api

__all__ = ["api", "settings", "users_api"]

"""The UI tests reuse the API tests' real app (SQLite file, node, local executor), and
their client, which checks every API answer against the OpenAPI document."""

from __future__ import annotations

from tests.api.conftest import aiohttp_client, api, response_check, settings, users_api

__all__ = ["aiohttp_client", "api", "response_check", "settings", "users_api"]

"""Caps on open event streams (`GET /api/v1/events` as SSE), per user and per node, over
real HTTP: beyond them a 429 with Retry-After, and a slot given back when a stream ends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from pingo.api import problems
from pingo.api.routes import events
from pingo.config import Settings

from .conftest import Api, make_settings

pytestmark = pytest.mark.timeout(60)

SSE = {"Accept": "text/event-stream"}
PER_USER = 2
TOTAL = 3


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, user_max_event_streams=PER_USER, max_event_streams=TOTAL)


async def open_stream(api: Api, user: str) -> ClientResponse:
    return await api.client.get("/api/v1/events", headers={**api.auth(user), **SSE})


async def opened(api: Api, user: str) -> ClientResponse:
    """A stream that is open: its first line (`retry:`) has arrived."""
    response = await open_stream(api, user)
    assert response.status == 200, await response.text()
    line = await asyncio.wait_for(response.content.readline(), 10)
    assert line == b"retry: 2000\n"
    return response


async def refused(api: Api, user: str) -> dict[str, Any]:
    """A stream refused with 429, Retry-After and a problem: the problem."""
    response = await open_stream(api, user)
    assert response.status == 429, response.status
    assert response.headers["Retry-After"] == str(events.STREAM_RETRY_S)
    assert response.content_type == problems.PROBLEM_JSON
    problem: dict[str, Any] = await response.json()
    assert problem["code"] == "RATE_LIMITED" and problem["status"] == 429
    return problem


async def eventually_opened(api: Api, user: str, timeout_s: float = 10.0) -> ClientResponse:
    """Retry until a stream opens (a slot is given back within a poll of the stream's end)."""
    async with asyncio.timeout(timeout_s):
        while True:
            response = await open_stream(api, user)
            if response.status == 200:
                return response
            assert response.status == 429, response.status
            response.release()
            await asyncio.sleep(0.05)


async def test_a_user_past_their_cap_is_refused_while_another_user_opens_theirs(
    users_api: Api,
) -> None:
    api = users_api
    bobs = [await opened(api, "bob") for _ in range(PER_USER)]
    problem = await refused(api, "bob")
    assert "bob already has 2 event streams open" in problem["detail"]
    alices = await opened(api, "alice")
    # The cap is on streams only: bob's JSON pages of the same feed still answer.
    page = await api.client.get("/api/v1/events", headers=api.auth("bob"))
    assert page.status == 200
    for response in (*bobs, alices):
        response.close()


async def test_the_servers_cap_refuses_every_user_once_reached(users_api: Api) -> None:
    api = users_api
    streams = [await opened(api, "alice") for _ in range(PER_USER)]
    streams.append(await opened(api, "bob"))
    for user in ("bob", "admin"):
        problem = await refused(api, user)
        assert f"this server already has {TOTAL} event streams open" in problem["detail"]
    for response in streams:
        response.close()


async def test_a_client_that_leaves_gives_its_slot_back(users_api: Api) -> None:
    api = users_api
    first, second = [await opened(api, "bob") for _ in range(PER_USER)]
    await refused(api, "bob")
    first.close()
    third = await eventually_opened(api, "bob")
    # Back at the cap: the refusals meanwhile took nothing, the closed one is gone.
    await refused(api, "bob")
    for response in (second, third):
        response.close()
    slots = api.app[events.STREAMS]
    async with asyncio.timeout(10):
        while True:
            if slots.count == 0:
                break
            await asyncio.sleep(0.05)


async def test_a_revoked_users_streams_give_their_slots_back(users_api: Api) -> None:
    api = users_api
    streams = [await opened(api, "bob") for _ in range(PER_USER)]
    deleted = await api.client.delete("/api/v1/users/bob", headers=api.auth("admin"))
    assert deleted.status == 204, await deleted.text()
    # The name is given again: its streams ended with the old token, so the slots are free.
    await api.add_user("bob")
    fresh = [await eventually_opened(api, "bob") for _ in range(PER_USER)]
    await refused(api, "bob")
    for response in (*streams, *fresh):
        response.close()

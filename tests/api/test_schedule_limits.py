"""Schedules within their owner's limits, over real HTTP: a per-user cap on schedules
(admins exempt), ticks that respect the owner's `maxWorkflows` (skipped at the cap), and
data triggers that never starve another user's cron ticks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pingo.api.app import create_app
from pingo.config import Settings
from pingo.schedules import service

from .conftest import ADMIN_TOKEN, Api, command_workflow, make_settings
from .test_schedules import create, every_second, runs

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, user_max_schedules=3)


def tiny(tag: str) -> dict[str, Any]:
    """A quick action whose identity holds the tick (each tick computes anew)."""
    return command_workflow(
        {1: ["sh", "-c", f'echo {tag} "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"]}, name=tag
    )


def long(tag: str) -> dict[str, Any]:
    """An action that stays RUNNING for a minute, computed anew on every tick."""
    return command_workflow(
        {1: ["sh", "-c", f'sleep 60; echo {tag} "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"]},
        name=tag,
    )


def never(i: int) -> dict[str, Any]:
    """A schedule on a path that never appears: its watermark is always due."""
    return {"name": f"never-{i}", "trigger": {"path": f"never/{i}"}, "workflow": tiny("t")}


async def post(api: Api, body: Any, user: str) -> Any:
    return await api.client.post("/api/v1/schedules", json=body, headers=api.auth(user))


async def running(api: Api, user: str) -> int:
    response = await api.client.get(
        "/api/v1/workflows?state=RUNNING&limit=1000", headers=api.auth(user)
    )
    assert response.status == 200, await response.text()
    return len((await response.json())["items"])


async def test_a_user_may_have_at_most_the_cap_of_schedules_admins_more(users_api: Api) -> None:
    api = users_api
    made = [await create(api, every_second(tiny("c"), paused=True), user="bob") for _ in range(3)]
    refused = await post(api, every_second(tiny("c"), paused=True), "bob")
    assert refused.status == 403, await refused.text()
    problem = await refused.json()
    assert problem["code"] == "TOO_MANY_SCHEDULES"
    assert "3" in problem["detail"]
    # A data trigger counts as a schedule too.
    assert (await post(api, never(0), "bob")).status == 403
    # Another user's count is their own; admins are exempt.
    await create(api, every_second(tiny("c"), paused=True), user="alice")
    for _ in range(5):
        await create(api, every_second(tiny("c"), paused=True), user="admin")
    # Deleting one makes room.
    deleted = await api.client.delete(f"/api/v1/schedules/{made[0]['id']}", headers=api.auth("bob"))
    assert deleted.status == 204
    await create(api, never(1), user="bob")
    assert (await post(api, never(2), "bob")).status == 403


async def test_ticks_beyond_max_workflows_are_skipped(users_api: Api) -> None:
    api = users_api
    response = await api.client.patch(
        "/api/v1/users/bob", json={"limits": {"maxWorkflows": 2}}, headers=api.auth("admin")
    )
    assert response.status == 200, await response.text()
    skipped_before = await api.metric('pingo_schedule_ticks_total{outcome="skipped"}')
    schedule = await create(api, every_second(long("capped")), user="bob")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    most = 0
    while True:
        most = max(most, await running(api, "bob"))
        assert most <= 2, f"{most} RUNNING workflows, maxWorkflows is 2"
        found = await runs(api, schedule["id"], user="bob")
        capped = [r for r in found if r["outcome"] == "skipped"]
        if len([r for r in found if r["outcome"] == "submitted"]) >= 2 and len(capped) >= 3:
            break
        assert loop.time() < deadline, found
        await asyncio.sleep(0.2)
    assert all(r["reason"] == "maxWorkflows" for r in capped), capped
    assert not [r for r in found if r["outcome"] == "failed"], found
    # A little longer: the cap still holds.
    for _ in range(10):
        assert await running(api, "bob") <= 2
        await asyncio.sleep(0.2)
    skipped = await api.metric('pingo_schedule_ticks_total{outcome="skipped"}')
    assert skipped - skipped_before >= len(capped)


async def test_ticks_of_a_user_over_their_storage_quota_fail_with_the_reason(
    users_api: Api,
) -> None:
    api = users_api
    response = await api.client.patch(
        "/api/v1/users/bob", json={"limits": {"maxStorageBytes": 1}}, headers=api.auth("admin")
    )
    assert response.status == 200, await response.text()
    schedule = await create(api, every_second(tiny("quota")), user="bob")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        found = await runs(api, schedule["id"], user="bob")
        if any(r["outcome"] == "failed" for r in found):
            break
        assert loop.time() < deadline, found
        await asyncio.sleep(0.2)
    # The first tick stored a dataset, which took bob to his quota; the next are refused.
    assert found[-1]["outcome"] == "submitted", found
    failed = [r for r in found if r["outcome"] == "failed"]
    assert "quota" in failed[0]["reason"], failed


@pytest.mark.parametrize("page", [None, 7])
async def test_never_firing_triggers_do_not_starve_another_users_cron(
    tmp_path: Path, aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch, page: int | None
) -> None:
    if page is not None:
        # Small pages, few of them per pass: the next pass goes on where one stopped.
        monkeypatch.setattr(service, "DUE_PAGE", page)
        monkeypatch.setattr(service, "DUE_PAGES", 2)
    app = create_app(make_settings(tmp_path))
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    # Bob's whole allowance (the default cap, a full page of the store's due
    # schedules) of data triggers that never fire, made before alice's schedule.
    count = 100 if page is None else 40
    for i in range(count):
        response = await post(api, never(i), "bob")
        assert response.status == 201, await response.text()
    await asyncio.sleep(1.5)  # every watermark is now older than alice's ticks
    schedule = await create(api, every_second(tiny("alice")), user="alice")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while len(found := await runs(api, schedule["id"], user="alice")) < 3:
        assert loop.time() < deadline, f"alice's schedule ran {len(found)} times"
        await asyncio.sleep(0.2)
    assert all(r["outcome"] == "submitted" for r in found), found

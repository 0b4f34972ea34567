"""A revoked user's name over real HTTP: what it owned is never handed to a new user of
the same name without `reclaim`, their schedules do not fire as anyone, and their open
event stream ends."""

from __future__ import annotations

import asyncio
import html
import re
from typing import Any

import pytest

from tests.ui.test_pages import sign_in

from .conftest import Api, bearer, chain, command_workflow
from .test_events import SSE, read_frames
from .test_schedules import create, every_second, runs

pytestmark = pytest.mark.timeout(60)

SCRIPT = "<script>alert(1)</script>"


async def revoke(api: Api, name: str) -> None:
    response = await api.client.delete(f"/api/v1/users/{name}", headers=api.auth("admin"))
    assert response.status == 204, await response.text()


async def post_user(api: Api, name: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    response = await api.client.post(
        "/api/v1/users", json={"name": name, **extra}, headers=api.auth("admin")
    )
    body: dict[str, Any] = await response.json()
    if response.status == 201:
        api.tokens[name] = body["token"]
    return response.status, body


async def owner_runs(
    api: Api, schedule_id: str, outcome: str, after: int = 0, timeout_s: float = 15.0
) -> list[dict[str, Any]]:
    """The schedule's runs (as the admin sees them) once more than `after` have `outcome`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        found = [r for r in await runs(api, schedule_id) if r["outcome"] == outcome]
        if len(found) > after:
            return found
        assert loop.time() < deadline, f"no new {outcome} run: {await runs(api, schedule_id)}"
        await asyncio.sleep(0.1)


async def test_a_revoked_name_is_not_given_to_a_new_user(users_api: Api) -> None:
    api = users_api
    old = api.tokens["alice"]
    submitted = await api.submit(chain("revoked-alice", 1), user="alice")
    assert (await api.wait(submitted["id"]))["state"] == "SUCCEEDED"
    workflow = f"/api/v1/workflows/{submitted['id']}"
    await revoke(api, "alice")
    assert (await api.client.get("/api/v1/me", headers=bearer(old))).status == 401

    # Someone else under the same name: refused, saying why and what to do.
    status, problem = await post_user(api, "alice")
    assert status == 409, problem
    assert problem["code"] == "CONFLICT"
    assert "workflows" in problem["detail"] and "events" in problem["detail"]
    assert '"reclaim": true' in problem["detail"]
    assert (await api.client.get("/api/v1/users/alice", headers=api.auth("admin"))).status == 404
    status, problem = await post_user(api, "alice", reclaim="yes")
    assert status == 422
    assert [(i["pointer"], i["code"]) for i in problem["errors"]] == [
        ("/reclaim", "SCHEMA_VIOLATION")
    ]
    # A name that never owned anything is free again, as before.
    await revoke(api, "bob")
    assert (await post_user(api, "bob"))[0] == 201
    assert (await post_user(api, "bob", reclaim=True))[0] == 409  # taken: reclaim is no key

    # The same person coming back: the new token gets the old user's work and feed.
    status, reclaimed = await post_user(api, "alice", reclaim=True)
    assert status == 201, reclaimed
    assert reclaimed["name"] == "alice" and reclaimed["token"] != old
    assert (await api.client.get(workflow, headers=api.auth("alice"))).status == 200
    logs = await api.client.get(f"{workflow}/actions/1/logs", headers=api.auth("alice"))
    assert logs.status == 200
    feed = await api.client.get("/api/v1/events", headers=api.auth("alice"))
    assert submitted["id"] in {e["workflowId"] for e in (await feed.json())["items"]}
    assert (await api.client.get("/api/v1/me", headers=bearer(old))).status == 401
    # The audit log tells a reclaim from a plain add.
    log = await api.client.get("/api/v1/audit?limit=100", headers=api.auth("admin"))
    added = [e["target"] for e in (await log.json())["items"] if e["action"] == "user.add"]
    assert {"location": "/api/v1/users/alice", "reclaim": "true"} in added
    assert {"location": "/api/v1/users/bob"} in added


async def test_a_name_that_owns_only_a_schedule_is_refused(users_api: Api) -> None:
    api = users_api
    yearly = {"name": "yearly", "cron": "0 3 1 1 *", "workflow": chain("yearly", 1)}
    await create(api, yearly, user="alice")
    await revoke(api, "alice")
    status, problem = await post_user(api, "alice")
    assert status == 409, problem
    assert "schedules" in problem["detail"]
    assert "workflows" not in problem["detail"] and "events" not in problem["detail"]


async def test_a_revoked_owners_schedule_fails_its_ticks_until_reclaimed(
    users_api: Api,
) -> None:
    api = users_api
    failed_before = await api.metric('pingo_schedule_ticks_total{outcome="failed"}')
    # The tick's time in the argv: every tick is a new computation, never a reuse.
    argv = ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"]
    workflow = command_workflow({1: argv})
    created = await create(api, every_second(workflow), user="alice")
    sid = created["id"]
    await owner_runs(api, sid, "submitted")
    await revoke(api, "alice")
    await asyncio.sleep(0.3)  # a tick claimed before the revocation settles
    submitted = len(await owner_runs(api, sid, "submitted"))
    failed = await owner_runs(api, sid, "failed")
    assert failed[0]["reason"] == "the owner no longer exists"
    assert failed[0]["workflowId"] is None
    assert await api.metric('pingo_schedule_ticks_total{outcome="failed"}') > failed_before
    # Nobody else gets the name, hence the schedule; it goes on failing meanwhile.
    assert (await post_user(api, "alice"))[0] == 409
    await owner_runs(api, sid, "failed", after=len(failed))
    assert len(await owner_runs(api, sid, "submitted")) == submitted

    # Reclaimed: the schedule runs again, as the (same) alice.
    assert (await post_user(api, "alice", reclaim=True))[0] == 201
    again = await owner_runs(api, sid, "submitted", after=submitted)
    workflow_id = again[0]["workflowId"]
    document = await api.client.get(f"/api/v1/workflows/{workflow_id}", headers=api.auth("alice"))
    assert document.status == 200
    assert (await document.json())["owner"] == "alice"
    paused = await api.client.post(f"/api/v1/schedules/{sid}/pause", headers=api.auth("alice"))
    assert paused.status == 200


async def test_the_users_form_shows_the_refusal_and_reclaims(users_api: Api) -> None:
    api = users_api
    await api.submit(chain("ui-revoked", 1), user="alice")
    await revoke(api, "alice")
    csrf = await sign_in(api, "admin")
    refused = await api.client.post("/users", data={"csrf": csrf, "name": "alice"})
    assert refused.status == 409
    page = await refused.text()
    found = re.search(r'<div id="refused" role="alert">(.*?)</div>', page, re.S)
    assert found is not None, page
    assert "still owns a revoked user&#39;s workflows" in found.group(1)
    assert 'id="new-name"' in page and 'value="alice"' in page
    assert "Tick <strong>Reclaim</strong> only for the same person" in found.group(1)
    assert 'name="reclaim" value="yes"' in page
    assert 'id="new-token"' not in page
    # A taken name is refused on the same page, with no word of reclaiming it.
    taken = await api.client.post("/users", data={"csrf": csrf, "name": "bob"})
    assert taken.status == 409
    assert "already exists" in await taken.text() and "Tick" not in await taken.text()
    # A hostile name is refused before any of this, and never shown raw.
    hostile = await api.client.post("/users", data={"csrf": csrf, "name": SCRIPT})
    assert hostile.status == 422 and SCRIPT not in await hostile.text()
    added = await api.client.post(
        "/users", data={"csrf": csrf, "name": "alice", "reclaim": "yes"}, allow_redirects=False
    )
    assert added.status == 201
    token = re.search(r'id="new-token" readonly value="([^"]+)"', await added.text())
    assert token is not None
    me = await api.client.get("/api/v1/me", headers=bearer(html.unescape(token.group(1))))
    assert (await me.json())["name"] == "alice"


async def test_an_event_stream_ends_when_its_token_is_revoked(users_api: Api) -> None:
    api = users_api
    async with api.client.get("/api/v1/events", headers={**api.auth("alice"), **SSE}) as stream:
        assert stream.status == 200
        submitted = await api.submit(chain("sse-before", 1), user="alice")
        await read_frames(stream, until="workflow.finished")
        await revoke(api, "alice")
        # Nothing but the end (or keep-alives) from now on, within a poll or two.
        async with asyncio.timeout(5):
            rest = await stream.content.read()
        assert b"event:" not in rest
    # The stream of a user of the same name, reclaimed with a new token, goes on.
    assert (await post_user(api, "alice", reclaim=True))[0] == 201
    async with api.client.get("/api/v1/events", headers={**api.auth("alice"), **SSE}) as stream:
        again = await api.submit(chain("sse-after", 1), user="alice")
        frames = await read_frames(stream, until="workflow.finished")
    assert {f["data"]["workflowId"] for f in frames} == {again["id"]} != {submitted["id"]}

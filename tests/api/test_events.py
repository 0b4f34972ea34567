"""The events feed (`GET /api/v1/events`, JSON pages and SSE) and the admins' audit log
(`GET /api/v1/audit`), over real HTTP on a real node, with the attacker's requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import ClientResponse

from .conftest import Api, chain, command_workflow, sleeper

pytestmark = pytest.mark.timeout(60)

SSE = {"Accept": "text/event-stream"}


async def feed(api: Api, user: str, **query: str) -> dict[str, Any]:
    response = await api.client.get("/api/v1/events", headers=api.auth(user), params=query)
    assert response.status == 200, await response.text()
    assert response.content_type == "application/json"
    page: dict[str, Any] = await response.json()
    return page


async def whole_feed(api: Api, user: str, limit: int = 2) -> list[dict[str, Any]]:
    """Every page, following `next`; asserts pages never overlap."""
    items: list[dict[str, Any]] = []
    query = {"limit": str(limit)}
    while True:
        page = await feed(api, user, **query)
        assert len(page["items"]) <= limit
        items.extend(page["items"])
        if page["next"] is None:
            break
        query["cursor"] = page["next"]
    ids = [int(i["id"]) for i in items]
    assert ids == sorted(set(ids), reverse=True)
    return items


async def audit(api: Api, user: str = "admin", **query: str) -> ClientResponse:
    return await api.client.get("/api/v1/audit", headers=api.auth(user), params=query)


async def read_frames(
    response: ClientResponse, until: str, timeout_s: float = 20.0
) -> list[dict[str, Any]]:
    """SSE frames (`id`, `event`, `data`) until one whose event is `until`."""
    frames: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with asyncio.timeout(timeout_s):
        while True:
            line = (await response.content.readline()).decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if line == "":
                if "event" in current:
                    frames.append(current)
                    if current["event"] == until:
                        return frames
                current = {}
            elif line.startswith(("id: ", "event: ")):
                key, _, value = line.partition(": ")
                current[key] = value
            elif line.startswith("data: "):
                assert "data" not in current, "one data line per event"
                current["data"] = json.loads(line[len("data: ") :])


async def test_feed_holds_the_owners_workflow_events(users_api: Api) -> None:
    api = users_api
    submitted = await api.submit(chain("feed", 2, name="feed-chain"), user="alice")
    await api.wait(submitted["id"])

    items = await whole_feed(api, "alice")
    kinds = [i["kind"] for i in reversed(items)]
    assert kinds == [
        "workflow.submitted",
        "dataset.stored",
        "dataset.stored",
        "workflow.finished",
    ]
    assert {i["workflowId"] for i in items} == {submitted["id"]}
    finished = items[0]
    assert finished["data"]["state"] == "SUCCEEDED"
    assert finished["data"]["name"] == "feed-chain"
    assert finished["at"].endswith("Z")
    stored = [i for i in items if i["kind"] == "dataset.stored"]
    assert {s["data"]["actionId"] for s in stored} == {1, 2}
    assert all(s["datasetId"] for s in stored)
    only = await feed(api, "alice", kind="workflow.finished")
    assert [i["id"] for i in only["items"]] == [finished["id"]]
    metrics = await (await api.client.get("/metrics")).text()
    assert 'pingo_events_recorded_total{kind="workflow.finished",outcome="recorded"}' in metrics
    # Another user's feed never shows them, nor does the admin's own feed.
    assert (await feed(api, "bob"))["items"] == []
    assert (await feed(api, "admin"))["items"] == []
    # The same workflow again: every dataset reused, it ends at submission, and says so.
    again = await api.submit(chain("feed", 2, name="feed-chain"), user="alice")
    assert again["state"] == "SUCCEEDED"
    latest = (await feed(api, "alice", limit="2"))["items"]
    assert [(i["kind"], i["workflowId"]) for i in latest] == [
        ("workflow.finished", again["id"]),
        ("workflow.submitted", again["id"]),
    ]


async def test_action_failure_is_in_the_feed(users_api: Api) -> None:
    api = users_api
    failing = command_workflow({1: ["sh", "-c", "exit 3"]}, extra={1: {"maxAttempts": 1}})
    submitted = await api.submit(failing, user="alice")
    assert (await api.wait(submitted["id"]))["state"] == "FAILED"
    items = (await feed(api, "alice"))["items"]
    failed = [i for i in items if i["kind"] == "action.failed"]
    assert len(failed) == 1
    assert failed[0]["data"]["actionId"] == 1
    assert failed[0]["data"]["attempts"] == 1
    assert failed[0]["data"]["error"]
    assert items[0]["kind"] == "workflow.finished"
    assert items[0]["data"]["state"] == "FAILED"


async def test_sse_streams_new_events_and_resumes_after_last_event_id(users_api: Api) -> None:
    api = users_api
    # Before the stream opens: a follower starts now, so this one is not streamed.
    earlier = await api.submit(chain("before", 1), user="alice")
    await api.wait(earlier["id"])
    async with api.client.get("/api/v1/events", headers={**api.auth("alice"), **SSE}) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        # HTML and an SSE frame in the name: it must stay inside one JSON data line.
        name = "<script>alert(1)</script>\n\nevent: workflow.finished\ndata: {}"
        submitted = await api.submit(chain("streamed", 2, name=name), user="alice")
        frames = await read_frames(response, until="workflow.finished")
    assert [f["event"] for f in frames] == [
        "workflow.submitted",
        "dataset.stored",
        "dataset.stored",
        "workflow.finished",
    ]
    assert {f["data"]["workflowId"] for f in frames} == {submitted["id"]}
    assert frames[0]["data"]["data"]["name"] == name
    assert frames[-1]["data"]["data"]["state"] == "SUCCEEDED"
    assert [f["id"] for f in frames] == [f["data"]["id"] for f in frames]

    # Resumed after the first: the rest again, in order, and nothing of before.
    async with api.client.get(
        "/api/v1/events",
        headers={**api.auth("alice"), **SSE, "Last-Event-ID": frames[0]["id"]},
    ) as response:
        again = await read_frames(response, until="workflow.finished")
    assert [f["id"] for f in again] == [f["id"] for f in frames[1:]]

    # Bob's stream shows none of it: his own submission is the first he sees.
    async with api.client.get("/api/v1/events", headers={**api.auth("bob"), **SSE}) as response:
        await asyncio.sleep(0.2)
        own = await api.submit(chain("bob", 1), user="bob")
        bobs = await read_frames(response, until="workflow.finished")
    assert {f["data"]["workflowId"] for f in bobs} == {own["id"]}


async def test_audit_log_records_who_what_and_from_where(users_api: Api) -> None:
    api = users_api
    dry = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=chain("dry"), headers=api.auth("alice")
    )
    assert dry.status == 200, await dry.text()
    submitted = await api.submit(sleeper("audited", 30), user="alice")
    killed = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/kill", headers=api.auth("alice")
    )
    assert killed.status == 200, await killed.text()
    # Refused requests are not actions: bob cannot see alice's workflow.
    denied = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/rerun", headers=api.auth("bob")
    )
    assert denied.status == 404
    response = await api.client.patch(
        "/api/v1/users/bob", json={"limits": {"maxWorkflows": 3}}, headers=api.auth("admin")
    )
    assert response.status == 200, await response.text()
    revoked = await api.client.delete("/api/v1/users/bob", headers=api.auth("admin"))
    assert revoked.status in (200, 204)

    response = await audit(api)
    assert response.status == 200
    entries = (await response.json())["items"]
    seen = [(e["actor"], e["action"]) for e in reversed(entries)]
    assert seen == [
        ("admin", "user.add"),
        ("admin", "user.add"),
        ("alice", "workflow.submit"),
        ("alice", "workflow.kill"),
        ("admin", "user.limits"),
        ("admin", "user.revoke"),
    ]
    by_action = {e["action"]: e for e in entries}
    assert by_action["workflow.kill"]["target"] == {"workflow_id": submitted["id"]}
    assert by_action["workflow.submit"]["target"]["location"].endswith(submitted["id"])
    assert by_action["user.revoke"]["target"] == {"name": "bob"}
    assert all(e["remote"] == "127.0.0.1" and e["at"].endswith("Z") for e in entries)
    assert all(200 <= e["status"] < 300 for e in entries)

    # Paged by cursor, newest first, no repeats.
    first = await (await audit(api, limit="4")).json()
    second = await (await audit(api, limit="4", cursor=first["next"])).json()
    assert [e["id"] for e in first["items"] + second["items"]] == [e["id"] for e in entries]
    assert second["next"] is None
    # No user's feed shows the audit log.
    assert all(i["kind"] != "audit" for i in (await feed(api, "alice"))["items"])


async def test_the_audit_log_is_for_admins_only(users_api: Api) -> None:
    api = users_api
    assert (await audit(api, "alice")).status == 403
    assert (await api.client.get("/api/v1/audit")).status == 401
    assert (await api.client.get("/api/v1/events")).status == 401
    assert (await api.client.get("/api/v1/events", headers=SSE)).status == 401
    wrong = {"Authorization": "Bearer not-a-token"}
    assert (await api.client.get("/api/v1/events", headers=wrong)).status == 401
    assert (await api.client.get("/api/v1/audit", headers=wrong)).status == 401


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ({"cursor": "abc"}, {}),
        ({"cursor": "-1"}, {}),
        ({"cursor": "1" * 40}, {}),
        ({"cursor": "١٢"}, {}),
        ({"cursor": "1\x00"}, {}),
        ({"limit": "0"}, {}),
        ({"limit": "1e3"}, {}),
        ({"kind": "audit"}, {}),
        ({"kind": "<script>"}, {}),
        ({}, {**SSE, "Last-Event-ID": "x'; DROP TABLE events"}),
        ({}, {**SSE, "Last-Event-ID": "-5"}),
        ({"kind": "nope"}, SSE),
        # A malformed position is refused even where only a stream would read it.
        ({}, {"Last-Event-ID": "12a"}),
    ],
)
async def test_bad_bytes_are_refused(
    users_api: Api, query: dict[str, str], headers: dict[str, str]
) -> None:
    response = await users_api.client.get(
        "/api/v1/events", params=query, headers={**users_api.auth("alice"), **headers}
    )
    assert response.status == 400, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert "<script>" not in json.dumps(problem.get("title", ""))
    if "cursor" in query or "limit" in query:
        audit_response = await audit(users_api, "admin", **query)
        assert audit_response.status == 400

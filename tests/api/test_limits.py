"""Per-user limits over HTTP, tried as an attacker would: raise your own, exhaust another's.

The in-flight cap runs through the real engine (SQLite, scraper, bubblewrap
sandbox when it works here): capped work waits READY, nothing is refused.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from typing import Any

import pytest

from pingo.config import Settings

from .conftest import AiohttpClient, Api, command_workflow, make_settings, sleeper

USERS = "/api/v1/users"


async def _patch(api: Api, name: str, body: Any, user: str = "admin") -> Any:
    return await api.client.patch(f"{USERS}/{name}", json=body, headers=api.auth(user))


async def _set_limits(api: Api, name: str, **limits: int | None) -> dict[str, Any]:
    response = await _patch(api, name, {"limits": limits})
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    return document


async def _post(api: Api, document: Any, user: str, key: str | None = None, **kwargs: Any) -> Any:
    headers = api.auth(user) | ({"Idempotency-Key": key} if key else {})
    return await api.client.post("/api/v1/workflows", json=document, headers=headers, **kwargs)


async def _expect_429(response: Any, code: str) -> dict[str, Any]:
    assert response.status == 429, await response.text()
    assert response.content_type == "application/problem+json"
    retry_after = response.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    problem: dict[str, Any] = await response.json()
    assert problem["code"] == code and problem["status"] == 429
    return problem


async def test_users_read_their_own_limits_and_nobody_elses(users_api: Api) -> None:
    api = users_api
    await _set_limits(api, "alice", maxWorkflows=7)
    me = await (await api.client.get("/api/v1/me", headers=api.auth("alice"))).json()
    assert me["limits"] == {"maxWorkflows": 7, "maxInFlightActions": 1000,
                            "submissionsPerMinute": 600, "maxStorageBytes": None}  # fmt: skip
    assert me["ownLimits"] == {"maxWorkflows": 7, "maxInFlightActions": None,
                               "submissionsPerMinute": None, "maxStorageBytes": None}  # fmt: skip
    own = await api.client.get(f"{USERS}/alice", headers=api.auth("alice"))
    assert own.status == 200 and await own.json() == me
    for name in ("bob", "admin", "nobody"):
        other = await api.client.get(f"{USERS}/{name}", headers=api.auth("alice"))
        # The same answer whether the user exists or not: nothing to probe.
        assert other.status == 403, name
        assert (await other.json())["code"] == "FORBIDDEN"
    missing = await api.client.get(f"{USERS}/nobody", headers=api.auth("admin"))
    assert missing.status == 404


async def test_a_user_cannot_raise_their_own_or_anothers_limits(users_api: Api) -> None:
    api = users_api
    await _set_limits(api, "alice", maxWorkflows=1, submissionsPerMinute=5)
    before = await (await api.client.get(USERS, headers=api.auth("admin"))).json()
    for target in ("alice", "bob", "admin", "nobody"):
        for body in (
            {"limits": {"maxWorkflows": 1000}},
            {"limits": {"maxWorkflows": None, "submissionsPerMinute": None}},
            {"admin": True},
            "not even an object",
        ):
            response = await _patch(api, target, body, user="alice")
            assert response.status == 403, (target, body)
            assert (await response.json())["code"] == "FORBIDDEN"
    after = await (await api.client.get(USERS, headers=api.auth("admin"))).json()
    assert after == before


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"limits": {"maxWorkflows": 0}}, "/limits/maxWorkflows"),
        ({"limits": {"maxWorkflows": -1}}, "/limits/maxWorkflows"),
        ({"limits": {"maxInFlightActions": "5"}}, "/limits/maxInFlightActions"),
        ({"limits": {"maxInFlightActions": True}}, "/limits/maxInFlightActions"),
        ({"limits": {"submissionsPerMinute": 1.5}}, "/limits/submissionsPerMinute"),
        ({"limits": {"submissionsPerMinute": 2**31}}, "/limits/submissionsPerMinute"),
        ({"limits": {"submissionsPerMinute": 2**64}}, "/limits/submissionsPerMinute"),
        ({"limits": {"maxStorageBytes": 0}}, "/limits/maxStorageBytes"),
        ({"limits": {"maxStorageBytes": 2**53}}, "/limits/maxStorageBytes"),
        ({"limits": {"maxStorageBytes": "10GiB"}}, "/limits/maxStorageBytes"),
        ({"limits": {"maxWorkflows": [1]}}, "/limits/maxWorkflows"),
        ({"limits": {"max/workflows~": 3}}, "/limits/max~1workflows~0"),
        ({"limits": {"\u00e9\u0000": 3}}, "/limits/\u00e9\u0000"),
        ({"limits": [1]}, "/limits"),
        ({"limits": None}, "/limits"),
        ({}, "/limits"),
        ({"limits": {}, "admin": True}, "/admin"),
        ([], ""),
        (3, ""),
    ],
)
async def test_bad_limits_are_422_with_a_pointer(users_api: Api, body: Any, pointer: str) -> None:
    api = users_api
    response = await _patch(api, "alice", body)
    assert response.status == 422, await response.text()
    problem = await response.json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert pointer in [issue["pointer"] for issue in problem["errors"]]
    me = await (await api.client.get("/api/v1/me", headers=api.auth("alice"))).json()
    assert set(me["ownLimits"].values()) == {None}


async def test_admins_set_and_reset_limits(users_api: Api) -> None:
    api = users_api
    changed = await _set_limits(api, "alice", maxWorkflows=3, maxInFlightActions=2**31 - 1)
    assert changed["ownLimits"] == {"maxWorkflows": 3, "maxInFlightActions": 2**31 - 1,
                                    "submissionsPerMinute": None,
                                    "maxStorageBytes": None}  # fmt: skip
    # An absent limit is kept; null resets to the server's default.
    changed = await _set_limits(api, "alice", maxWorkflows=None, submissionsPerMinute=4)
    assert changed["ownLimits"] == {"maxWorkflows": None, "maxInFlightActions": 2**31 - 1,
                                    "submissionsPerMinute": 4, "maxStorageBytes": None}  # fmt: skip
    assert changed["limits"]["maxWorkflows"] == 100
    missing = await _patch(api, "nobody", {"limits": {"maxWorkflows": 1}})
    assert missing.status == 404
    # An admin may lower their own limits too (and only an admin may change any).
    mine = await _set_limits(api, "admin", maxWorkflows=50)
    assert mine["limits"]["maxWorkflows"] == 50


async def test_the_workflow_cap_is_429_and_does_not_touch_other_users(users_api: Api) -> None:
    api = users_api
    await _set_limits(api, "alice", maxWorkflows=1)
    first = await _post(api, sleeper("cap-1"), "alice", key="k1")
    assert first.status == 201
    running = await first.json()
    problem = await _expect_429(await _post(api, sleeper("cap-2"), "alice"), "TOO_MANY_WORKFLOWS")
    assert "1" in problem["detail"]
    # A retry of the accepted submission is a replay, not a second workflow.
    replay = await _post(api, sleeper("cap-1"), "alice", key="k1")
    assert replay.status == 201 and (await replay.json())["id"] == running["id"]
    # Re-running counts against the owner too.
    rerun = await api.client.post(
        f"/api/v1/workflows/{running['id']}/rerun", headers=api.auth("alice")
    )
    await _expect_429(rerun, "TOO_MANY_WORKFLOWS")
    # Alice being full costs bob nothing.
    for i in range(3):
        await api.submit(sleeper(f"bob-{i}"), user="bob")
    listing = await (await api.client.get("/api/v1/workflows", headers=api.auth("alice"))).json()
    assert [w["id"] for w in listing["items"]] == [running["id"]]
    # Once hers has finished, she may submit again.
    killed = await api.client.post(
        f"/api/v1/workflows/{running['id']}/kill", headers=api.auth("alice")
    )
    assert killed.status == 200
    assert (await _post(api, sleeper("cap-3"), "alice")).status == 201


async def test_the_submission_rate_is_429_with_retry_after(users_api: Api) -> None:
    api = users_api
    await _set_limits(api, "alice", submissionsPerMinute=2)
    doc = command_workflow({1: ["true"]})
    for _ in range(2):
        assert (await _post(api, doc, "alice")).status == 201
    problem = await _expect_429(await _post(api, doc, "alice"), "RATE_LIMITED")
    assert "2 workflows a minute" in problem["detail"]
    response = await _post(api, doc, "alice", params={"dryRun": "true"})
    # Two a minute: the next token is about 30 s away.
    assert 1 <= int(response.headers["Retry-After"]) <= 30
    # A body that is not even JSON is refused by the rate limit before it is read.
    garbage = await api.client.post(
        "/api/v1/workflows",
        data=b"\xff" * 1000,
        headers={**api.auth("alice"), "Content-Type": "application/json"},
    )
    await _expect_429(garbage, "RATE_LIMITED")
    # Alice's bucket is hers: bob submits as usual.
    for _ in range(3):
        assert (await _post(api, doc, "bob")).status == 201
    exposed = await (await api.client.get("/metrics")).text()
    assert 'pingo_workflow_submissions_total{outcome="rate_limited"}' in exposed


@pytest.fixture
def capped_settings(tmp_path: Any) -> Settings:
    return make_settings(tmp_path, user_max_in_flight_actions=1, local_slots=4)


@pytest.fixture
async def capped_api(aiohttp_client: AiohttpClient, capped_settings: Settings) -> Api:
    from pingo.api.app import create_app

    from .conftest import ADMIN_TOKEN

    app = create_app(capped_settings)
    client = await aiohttp_client(app)
    api = Api(client=client, app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    return api


def _parallel(tag: str, count: int, seconds: float) -> dict[str, Any]:
    """`count` independent actions that each sleep, then a last one that joins them."""
    commands = {
        i: ["sh", "-c", f'sleep {seconds}; echo {tag}-{i} > "$PINGO_OUTPUT"']
        for i in range(1, count + 1)
    }
    commands[count + 1] = ["sh", "-c", 'echo joined > "$PINGO_OUTPUT"']
    return command_workflow(commands, {count + 1: list(range(1, count + 1))}, name=tag)


async def test_the_in_flight_cap_throttles_dispatch_and_refuses_nothing(capped_api: Api) -> None:
    api = capped_api
    alice = await api.submit(_parallel("alice", 3, 0.5), user="alice")
    await api.wait_action(alice["id"], 1, {"SUBMITTED", "RUNNING", "FINISHED"})
    # Bob has his own budget: his work runs while alice's waits.
    bob = await api.submit(_parallel("bob", 1, 0.1), user="bob")
    seen: list[dict[str, int]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        document = await api.workflow(alice["id"])
        seen.append(document["counts"])
        if document["state"] != "RUNNING":
            break
        assert loop.time() < deadline, document["counts"]
        await asyncio.sleep(0.05)
    assert document["state"] == "SUCCEEDED"
    assert (await api.wait(bob["id"]))["state"] == "SUCCEEDED"
    in_flight = [sum(c.get(s, 0) for s in ("PROCESSING", "SUBMITTED", "RUNNING")) for c in seen]
    assert max(in_flight) == 1
    assert any(c.get("READY", 0) >= 1 for c in seen)
    # One at a time: each sleeper started after the one before had finished.
    spans = sorted(
        (_at(a["startedAt"]), _at(a["finishedAt"]))
        for a in document["actions"]
        if a["actionId"] <= 3
    )
    for (_, finished), (started, _) in itertools.pairwise(spans):
        assert started >= finished, spans


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.parametrize("name", ["%00", "%FF", "%ED%A0%80", "a%2Fb", "x" * 300, "%F0%9F%98%80"])
async def test_bad_bytes_in_a_user_name_are_404_not_500(users_api: Api, name: str) -> None:
    api = users_api
    for method, body in (("GET", None), ("PATCH", {"limits": {"maxWorkflows": 2}})):
        response = await api.client.request(
            method, f"{USERS}/{name}", json=body, headers=api.auth("admin")
        )
        assert response.status == 404, (method, name, await response.text())
        # Another user gets the same 403 whatever the name holds.
        other = await api.client.request(
            method, f"{USERS}/{name}", json=body, headers=api.auth("alice")
        )
        assert other.status == 403, (method, name)


def _writes(tag: str, size: int) -> dict[str, Any]:
    """Two actions, an intermediate and a leaf, each writing `size` bytes."""
    write = f'head -c {size} /dev/zero > "$PINGO_OUTPUT"; echo {tag} >/dev/null'
    return command_workflow(
        {1: ["sh", "-c", write], 2: ["sh", "-c", write + " 2"]}, {2: [1]}, name=tag
    )


async def _storage(api: Api, user: str) -> dict[str, Any]:
    response = await api.client.get("/api/v1/storage", headers=api.auth(user))
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    return document


async def _wait_own_bytes(api: Api, user: str, expected: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (own := (await _storage(api, user))["ownBytes"]) != expected:
        assert loop.time() < deadline, own
        await asyncio.sleep(0.1)


async def _expect_over_quota(response: Any) -> dict[str, Any]:
    assert response.status == 403, await response.text()
    problem: dict[str, Any] = await response.json()
    assert problem["code"] == "STORAGE_QUOTA_EXCEEDED"
    return problem


async def test_the_storage_quota_refuses_new_work_until_the_owner_deletes(users_api: Api) -> None:
    """A user who filled their quota may not submit, nor re-run, until they delete
    datasets; others, even reusing what the user stored, are charged nothing."""
    api = users_api
    await _set_limits(api, "alice", maxStorageBytes=3000)
    first = await api.submit(_writes("quota", 2000), user="alice")
    assert (await api.wait(first["id"]))["state"] == "SUCCEEDED"
    mine = await _storage(api, "alice")
    assert (mine["ownBytes"], mine["quotaBytes"]) == (4000, 3000)

    problem = await _expect_over_quota(await _post(api, _writes("more", 10), "alice"))
    assert "4000" in problem["detail"] and "3000" in problem["detail"]
    rerun = await api.client.post(
        f"/api/v1/workflows/{first['id']}/rerun", headers=api.auth("alice")
    )
    await _expect_over_quota(rerun)
    # Another user reusing alice's datasets stores nothing of theirs: not charged, not
    # refused (and alice stays charged: the producer is).
    reused = await api.submit(_writes("quota", 2000), user="bob")
    assert (await api.wait(reused["id"]))["state"] == "SUCCEEDED"
    assert all(a["reused"] for a in (await api.workflow(reused["id"]))["actions"])
    assert (await _storage(api, "bob"))["ownBytes"] == 0
    assert (await _storage(api, "bob"))["quotaBytes"] is None
    # Bob may not free alice's quota by deleting her datasets.
    document = await api.workflow(first["id"])
    leaf = next(a["datasetId"] for a in document["actions"] if a["actionId"] == 2)
    theirs = await api.client.delete(
        f"/api/v1/datasets/{leaf}", params={"force": "true"}, headers=api.auth("bob")
    )
    assert theirs.status in (403, 404)
    assert (await _storage(api, "alice"))["ownBytes"] == 4000

    deleted = await api.client.delete(
        f"/api/v1/datasets/{leaf}", params={"force": "true"}, headers=api.auth("alice")
    )
    assert deleted.status == 202, await deleted.text()
    # Charged until the deletor removed the files (within its interval: no reader).
    await _wait_own_bytes(api, "alice", 2000)
    assert (await _post(api, _writes("after", 10), "alice")).status == 201
    exposed = await (await api.client.get("/metrics")).text()
    assert 'pingo_workflow_submissions_total{outcome="storage_quota_exceeded"}' in exposed


async def test_an_admitted_workflow_stops_starting_actions_past_the_quota(users_api: Api) -> None:
    """Under the quota at submission, past it once its first action stored: the next
    actions fail to start (the check before each spawn), and others' work goes on."""
    api = users_api
    await _set_limits(api, "alice", maxStorageBytes=1000)
    # The first action sleeps past the gate's one-second memory of its "under" verdict.
    first = 'head -c 2000 /dev/zero > "$PINGO_OUTPUT"; sleep 1.5'
    document = command_workflow(
        {1: ["sh", "-c", first], 2: ["sh", "-c", 'echo two > "$PINGO_OUTPUT"']},
        {2: [1]},
        name="past-quota",
        extra={2: {"maxAttempts": 1}},
    )
    workflow = await api.submit(document, user="alice")
    done = await api.wait(workflow["id"])
    assert done["state"] == "FAILED"
    second = next(a for a in done["actions"] if a["actionId"] == 2)
    assert second["state"] == "FAILED" and "quota" in second["error"], second
    bob = await api.submit(_writes("bob-goes-on", 2000), user="bob")
    assert (await api.wait(bob["id"]))["state"] == "SUCCEEDED"


async def test_the_servers_storage_quota_applies_unless_a_user_has_their_own(
    aiohttp_client: AiohttpClient, tmp_path: Any
) -> None:
    from pingo.api.app import create_app

    from .conftest import ADMIN_TOKEN

    app = create_app(make_settings(tmp_path, user_max_storage_bytes=100))
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    await _set_limits(api, "bob", maxStorageBytes=10**6)
    for user in ("alice", "bob"):
        done = await api.submit(_writes(user, 500), user=user)
        assert (await api.wait(done["id"]))["state"] == "SUCCEEDED"
    await _expect_over_quota(await _post(api, _writes("again", 1), "alice"))
    assert (await _post(api, _writes("again", 1), "bob")).status == 201
    assert (await _storage(api, "alice"))["quotaBytes"] == 100

"""Schedules over real HTTP: the contract, ticks that run workflows, parameters, pause,
resume, delete, another user's schedule, and hostile input."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pingo.config import Settings
from pingo.node import BigSubmission
from pingo.schedules import service as schedule_service
from pingo.store.protocol import ScheduleRecord

from .conftest import Api, command_workflow, make_settings

pytestmark = pytest.mark.timeout(60)


def dated(tag: str, placeholder: str = "{schedule.date}") -> dict[str, Any]:
    """One action whose argv holds a schedule placeholder (so it is part of its identity)."""
    return command_workflow(
        {1: ["sh", "-c", f'echo {tag} "$1" > "$PINGO_OUTPUT"', "x", placeholder]}, name=tag
    )


def every_second(workflow: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "tick", "cron": "* * * * * *", "timezone": "UTC", "workflow": workflow, **extra}


async def create(api: Api, body: Any, user: str = "admin") -> dict[str, Any]:
    response = await api.client.post("/api/v1/schedules", json=body, headers=api.auth(user))
    assert response.status == 201, await response.text()
    document: dict[str, Any] = await response.json()
    assert response.headers["Location"] == f"/api/v1/schedules/{document['id']}"
    return document


async def runs(api: Api, schedule_id: str, user: str = "admin") -> list[dict[str, Any]]:
    response = await api.client.get(f"/api/v1/schedules/{schedule_id}/runs", headers=api.auth(user))
    assert response.status == 200, await response.text()
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def wait_runs(api: Api, schedule_id: str, count: int, timeout_s: float = 20) -> list[Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        found = await runs(api, schedule_id)
        if len(found) >= count:
            return found
        assert loop.time() < deadline, f"only {len(found)} runs"
        await asyncio.sleep(0.1)


async def test_a_schedule_fires_each_second_and_reuses_the_same_days_output(api: Api) -> None:
    submitted_before = await api.metric('pingo_schedule_ticks_total{outcome="submitted"}')
    lags_before = await api.metric("pingo_schedule_fire_lag_seconds_count")
    created = await create(api, every_second(dated("daily")))
    assert created["id"].startswith("sch-")
    assert created["nextFireAt"].endswith("Z")
    assert len(created["nextFireTimes"]) == 5
    found = await wait_runs(api, created["id"], 3)
    assert all(set(r) >= {"tickAt", "workflowId"} for r in found)
    ticks = [r["tickAt"] for r in found]
    assert ticks == sorted(ticks, reverse=True)
    assert len(set(ticks)) == len(ticks)
    submitted = [r for r in found if r["outcome"] == "submitted"]
    assert len({r["workflowId"] for r in submitted}) == len(submitted) >= 3
    documents = [await api.wait(r["workflowId"]) for r in submitted]
    assert all(d["state"] == "SUCCEEDED" for d in documents)
    # Same date in the argv: one dataset, computed once and reused by the later ticks.
    assert len({d["actions"][0]["datasetId"] for d in documents}) == 1
    assert sum(not d["actions"][0]["reused"] for d in documents) == 1
    # /metrics counts each tick submitted, and its lag from due time to submission.
    ticks = await api.metric('pingo_schedule_ticks_total{outcome="submitted"}')
    assert ticks - submitted_before >= len(submitted)
    assert await api.metric("pingo_schedule_fire_lag_seconds_count") - lags_before >= len(submitted)


async def test_the_tick_time_makes_each_run_a_new_computation(api: Api) -> None:
    created = await create(api, every_second(dated("timed", "{schedule.time}")))
    found = await wait_runs(api, created["id"], 2)
    documents = [await api.wait(r["workflowId"]) for r in found if r["workflowId"]]
    assert len({d["actions"][0]["datasetId"] for d in documents}) == len(documents)
    assert not any(d["actions"][0]["reused"] for d in documents)


async def test_user_parameters_are_substituted(api: Api) -> None:
    workflow = command_workflow(
        {1: ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", "{param.region}"]}
    )
    created = await create(api, every_second(workflow, parameters={"region": "eu-west"}))
    found = await wait_runs(api, created["id"], 1)
    document = await api.wait(found[-1]["workflowId"])
    dataset_id = document["actions"][0]["datasetId"]
    response = await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth("admin"))
    path = Path((await response.json())["path"])
    assert (await asyncio.to_thread(path.read_text)).strip() == "eu-west"


async def test_pause_resume_and_delete(api: Api) -> None:
    created = await create(api, every_second(dated("pausing")))
    await wait_runs(api, created["id"], 1)
    paused = await api.client.post(
        f"/api/v1/schedules/{created['id']}/pause", headers=api.auth("admin")
    )
    assert paused.status == 200
    assert (await paused.json())["paused"] is True
    await asyncio.sleep(0.5)  # a tick claimed before the pause settles
    before = len(await runs(api, created["id"]))
    await asyncio.sleep(2)
    assert len(await runs(api, created["id"])) == before
    listed = await api.client.get("/api/v1/schedules", headers=api.auth("admin"))
    assert [s["paused"] for s in (await listed.json())["items"]] == [True]
    resumed = await api.client.post(
        f"/api/v1/schedules/{created['id']}/resume", headers=api.auth("admin")
    )
    assert resumed.status == 200
    assert (await resumed.json())["paused"] is False
    await wait_runs(api, created["id"], before + 1)
    deleted = await api.client.delete(
        f"/api/v1/schedules/{created['id']}", headers=api.auth("admin")
    )
    assert deleted.status == 204
    for path in ("", "/runs"):
        gone = await api.client.get(
            f"/api/v1/schedules/{created['id']}{path}", headers=api.auth("admin")
        )
        assert gone.status == 404


async def test_another_users_schedule_is_a_404_everywhere(users_api: Api) -> None:
    api = users_api
    created = await create(
        api,
        {"name": "mine", "cron": "0 3 * * *", "workflow": dated("alice")},
        user="alice",
    )
    sid = created["id"]
    for method, path in (
        ("GET", f"/api/v1/schedules/{sid}"),
        ("GET", f"/api/v1/schedules/{sid}/runs"),
        ("GET", f"/api/v1/schedules/{sid}/deliveries"),
        ("POST", f"/api/v1/schedules/{sid}/pause"),
        ("POST", f"/api/v1/schedules/{sid}/resume"),
        ("DELETE", f"/api/v1/schedules/{sid}"),
    ):
        response = await api.client.request(method, path, headers=api.auth("bob"))
        assert response.status == 404, (method, path)
        # Exactly what a schedule that does not exist answers: nothing tells them apart.
        missing = await api.client.request(
            method, path.replace(sid, "sch-0000000000000000"), headers=api.auth("bob")
        )
        assert (await response.text()).replace(sid, "X") == (await missing.text()).replace(
            "sch-0000000000000000", "X"
        )
    listed = await api.client.get("/api/v1/schedules", headers=api.auth("bob"))
    assert (await listed.json())["items"] == []
    spied = await api.client.get("/api/v1/schedules?owner=alice", headers=api.auth("bob"))
    assert (await spied.json())["items"] == []
    # The admin sees it; alice still has it.
    seen = await api.client.get(f"/api/v1/schedules/{sid}", headers=api.auth("admin"))
    assert seen.status == 200
    mine = await api.client.get("/api/v1/schedules", headers=api.auth("alice"))
    assert [s["id"] for s in (await mine.json())["items"]] == [sid]
    unauthenticated = await api.client.get("/api/v1/schedules")
    assert unauthenticated.status == 401
    # A stored workflow of another user cannot be scheduled by reference.
    workflow = await api.submit(dated("bobs"), user="bob")
    response = await api.client.post(
        "/api/v1/schedules",
        json={"name": "steal", "cron": "* * * * *", "workflow": workflow["id"]},
        headers=api.auth("alice"),
    )
    assert response.status == 404


async def test_a_stored_workflow_can_be_scheduled_by_id(api: Api) -> None:
    workflow = await api.submit(dated("by-id"))
    created = await create(api, {"name": "ref", "cron": "0 0 1 1 *", "workflow": workflow["id"]})
    assert created["workflow"]["name"] == "by-id"


@pytest.mark.parametrize(
    ("body", "pointer", "code"),
    [
        ({"cron": "61 * * * *"}, "/cron", "INVALID_CRON"),
        ({"cron": "* * *"}, "/cron", "INVALID_CRON"),
        ({"cron": "* * * * * * * *"}, "/cron", "INVALID_CRON"),
        ({"cron": "* * * * *\x00"}, "/cron", "SCHEMA_VIOLATION"),
        ({"timezone": "Mars/Olympus"}, "/timezone", "UNKNOWN_TIMEZONE"),
        ({"timezone": "../../etc/passwd"}, "/timezone", "UNKNOWN_TIMEZONE"),
        ({"catchUp": "sometimes"}, "/catchUp", "SCHEMA_VIOLATION"),
        ({"catchUpLimit": 0}, "/catchUpLimit", "SCHEMA_VIOLATION"),
        ({"maxConcurrent": True}, "/maxConcurrent", "SCHEMA_VIOLATION"),
        ({"overlap": "pile"}, "/overlap", "SCHEMA_VIOLATION"),
        ({"start": "yesterday"}, "/start", "SCHEMA_VIOLATION"),
        ({"name": ""}, "/name", "SCHEMA_VIOLATION"),
        ({"name": 7}, "/name", "SCHEMA_VIOLATION"),
        ({"surprise": 1}, "/surprise", "SCHEMA_VIOLATION"),
        ({"parameters": {"a": 1}}, "/parameters/a", "SCHEMA_VIOLATION"),
        ({"workflow": dated("x", "{param.missing}")}, "/workflow/actions/0/command/4",
         "UNKNOWN_PARAMETER"),
        ({"workflow": {"name": "no actions"}}, "/workflow", "SCHEMA_VIOLATION"),
        ({"webhooks": [{"url": "http://127.0.0.1:9/x", "secret": "s"}]}, "/webhooks/0/url",
         "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "http://[::ffff:10.0.0.1]/", "secret": "s"}]}, "/webhooks/0/url",
         "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "http://169.254.169.254/latest", "secret": "s"}]},
         "/webhooks/0/url", "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "http://localhost/", "secret": "s"}]}, "/webhooks/0/url",
         "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "file:///etc/passwd", "secret": "s"}]}, "/webhooks/0/url",
         "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "https://user:pw@example.org/", "secret": "s"}]},
         "/webhooks/0/url", "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "https://example.org/", "secret": ""}]}, "/webhooks/0/secret",
         "INVALID_WEBHOOK"),
        ({"webhooks": [{"url": "https://example.org/", "secret": "s", "events": ["boom"]}]},
         "/webhooks/0/events", "INVALID_WEBHOOK"),
    ],
)  # fmt: skip
async def test_bad_definitions_are_refused_with_a_pointer(
    api: Api, body: dict[str, Any], pointer: str, code: str
) -> None:
    full = {"name": "bad", "cron": "* * * * *", "workflow": dated("bad"), **body}
    response = await api.client.post("/api/v1/schedules", json=full, headers=api.auth("admin"))
    assert response.status == 422, await response.text()
    problem = await response.json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert any(e["pointer"].startswith(pointer) and e["code"] == code for e in problem["errors"]), (
        problem
    )
    listed = await api.client.get("/api/v1/schedules", headers=api.auth("admin"))
    assert (await listed.json())["items"] == []


#: Definitions from which no tick can be computed (a security review found each answered
#: 500): a cron that never fires, a start or end past the calendar (datetime ends with the
#: year 9999), in UTC or in the schedule's zone.
NO_TICK = [
    ({"cron": "0 0 30 2 *"}, "/cron", "INVALID_CRON"),
    ({"cron": "0 0 31 2 *"}, "/cron", "INVALID_CRON"),
    ({"cron": "0 0 0 31 4 *"}, "/cron", "INVALID_CRON"),
    ({"start": "9999-12-31T23:59:59Z"}, "/start", "SCHEMA_VIOLATION"),
    # Its next UTC midnight is in the year 10000.
    ({"cron": "0 0 * * *", "start": "9999-12-31T23:59:59+14:00"}, "/start", "SCHEMA_VIOLATION"),
    # A local time whose UTC instant is in the year 10000.
    ({"timezone": "Etc/GMT+12", "start": "9999-12-31T20:00:00"}, "/start", "SCHEMA_VIOLATION"),
    ({"timezone": "Etc/GMT+12", "cron": "0 0 1 1 *", "start": "9999-06-01T00:00:00"}, "/start",
     "SCHEMA_VIOLATION"),
    ({"timezone": "Etc/GMT+12", "end": "9999-12-31T23:59:59"}, "/end", "SCHEMA_VIOLATION"),
    ({"trigger": {"path": "in/_SUCCESS"}, "timezone": "Etc/GMT+12",
      "start": "9999-12-31T20:00:00"}, "/start", "SCHEMA_VIOLATION"),
]  # fmt: skip


def no_tick(body: dict[str, Any]) -> dict[str, Any]:
    """A whole definition with `body`'s fields (a trigger instead of the cron if it has one)."""
    full = {"name": "no-tick", "cron": "* * * * *", "workflow": dated("no-tick"), **body}
    if "trigger" in body:
        del full["cron"]
    return full


async def refused_at(response: Any, pointer: str, code: str) -> None:
    """The answer is a 422 with exactly one issue, `code` at `pointer`."""
    assert response.status == 422, await response.text()
    problem = await response.json()
    assert problem["code"] == "VALIDATION_FAILED"
    assert [(e["pointer"], e["code"]) for e in problem["errors"]] == [(pointer, code)], problem


@pytest.mark.parametrize(("body", "pointer", "code"), NO_TICK)
async def test_a_definition_without_a_tick_is_refused_with_a_pointer(
    users_api: Api, body: dict[str, Any], pointer: str, code: str
) -> None:
    api = users_api
    response = await api.client.post(
        "/api/v1/schedules", json=no_tick(body), headers=api.auth("alice")
    )
    await refused_at(response, pointer, code)
    listed = await api.client.get("/api/v1/schedules", headers=api.auth("alice"))
    assert (await listed.json())["items"] == []


async def store_directly(api: Api, body: dict[str, Any], *, paused: bool) -> str:
    """A schedule written to the store as it was before the checks refused its definition
    (the API would not make it now); due now unless paused."""
    now = api.node.store.clock()
    record = await api.node.store.create_schedule(
        ScheduleRecord(
            id=schedule_service.new_schedule_id(),
            owner="alice",
            name="no-tick",
            spec=no_tick(body),
            paused=paused,
            next_fire_at=now,
            pending_tick_at=None,
            claimed_by=None,
            claim_expires_at=None,
            created_at=now,
            updated_at=now,
        )
    )
    return record.id


@pytest.mark.parametrize(("body", "pointer", "code"), NO_TICK)
async def test_resuming_a_stored_definition_without_a_tick_is_refused_with_a_pointer(
    users_api: Api, body: dict[str, Any], pointer: str, code: str
) -> None:
    api = users_api
    schedule_id = await store_directly(api, body, paused=True)
    response = await api.client.post(
        f"/api/v1/schedules/{schedule_id}/resume", headers=api.auth("alice")
    )
    await refused_at(response, pointer, code)
    kept = await api.node.store.get_schedule(schedule_id)
    assert kept is not None and kept.paused


async def test_the_scheduler_ends_a_stored_definition_without_a_tick_and_goes_on(
    users_api: Api,
) -> None:
    """Such a schedule, stored unpaused and due, made the scheduler loop raise and the
    node stop. Now its tick is recorded as failed, with why, it is due no more, and the
    other schedules keep firing; viewing or listing it still answers."""
    api = users_api
    broken = [
        await store_directly(api, {"cron": "0 0 30 2 *"}, paused=False),
        await store_directly(api, {"start": "9999-12-31T23:59:59Z"}, paused=False),
    ]
    created = await create(api, every_second(dated("still-firing")), user="alice")
    await wait_runs(api, created["id"], 2)
    for schedule_id, pointer in zip(broken, ("/cron", "/start"), strict=True):
        [run] = await wait_runs(api, schedule_id, 1)
        assert run["outcome"] == "failed" and run["workflowId"] is None
        assert f"at '{pointer}'" in run["reason"], run
        shown = await api.client.get(f"/api/v1/schedules/{schedule_id}", headers=api.auth("alice"))
        assert shown.status == 200
        view = await shown.json()
        assert (view["nextFireAt"], view["nextFireTimes"], view["paused"]) == (None, [], False)
    listed = await api.client.get("/api/v1/schedules", headers=api.auth("alice"))
    assert listed.status == 200 and len((await listed.json())["items"]) == 3


async def test_the_secret_is_never_echoed(tmp_path: Any, aiohttp_client: Any) -> None:
    from pingo.api.app import create_app

    from .conftest import ADMIN_TOKEN

    settings: Settings = make_settings(tmp_path, webhook_private_targets="allow")
    client = await aiohttp_client(create_app(settings))
    api = Api(client=client, app=client.app, tokens={"admin": ADMIN_TOKEN})
    secret = "s3cr3t-never-shown"
    hook = {"url": "http://127.0.0.1:9/hook", "secret": secret, "events": ["workflow.finished"]}
    workflow = {**dated("secret"), "webhooks": [hook]}
    created = await create(api, {**every_second(workflow), "webhooks": [hook]})
    assert secret not in str(created)
    assert created["webhooks"] == [{"url": hook["url"], "events": ["workflow.finished"]}]
    for path in (f"/api/v1/schedules/{created['id']}", "/api/v1/schedules"):
        response = await api.client.get(path, headers=api.auth("admin"))
        assert secret not in await response.text()
    found = await wait_runs(api, created["id"], 1)
    wid = found[-1]["workflowId"]
    await api.wait(wid)
    for path in (
        f"/api/v1/workflows/{wid}",
        f"/api/v1/workflows/{wid}/actions/1",
        f"/api/v1/workflows/{wid}/deliveries",
        f"/api/v1/schedules/{created['id']}/deliveries",
        "/api/v1/workflows",
    ):
        response = await api.client.get(path, headers=api.auth("admin"))
        assert response.status == 200, path
        assert secret not in await response.text(), path


async def test_a_tick_fires_when_due_not_at_the_schedulers_next_poll(
    tmp_path: Any, aiohttp_client: Any
) -> None:
    """The scheduler sleeps until the next tick it knows of, not a whole interval: with
    a 60 s interval, a tick two seconds away runs then (and none is skipped), where a
    node that only polled would find it a minute late, past the catch-up grace."""
    from pingo.api.app import create_app

    from .conftest import ADMIN_TOKEN

    settings: Settings = make_settings(tmp_path, schedule_interval_s=60.0)
    client = await aiohttp_client(create_app(settings))
    api = Api(client=client, app=client.app, tokens={"admin": ADMIN_TOKEN})
    body = {**every_second(dated("on-time")), "cron": "*/2 * * * * *", "catchUp": "none"}
    created = await create(api, body)
    found = await wait_runs(api, created["id"], 3, timeout_s=30)
    assert {r["outcome"] for r in found} == {"submitted"}, found
    ticks = sorted(r["tickAt"] for r in found)
    assert ticks[0] == created["nextFireAt"]


async def test_a_scheduler_idempotency_key_cannot_be_taken_by_hand(api: Api) -> None:
    response = await api.client.post(
        "/api/v1/workflows",
        json=dated("by-hand"),
        headers={**api.auth("admin"), "Idempotency-Key": "schedule:sch-1:2026-01-01T00:00:00"},
    )
    assert response.status == 400
    problem = await response.json()
    assert problem["errors"][0]["pointer"] == "/Idempotency-Key"
    assert (await api.client.get("/api/v1/workflows", headers=api.auth("admin"))).status == 200
    listed = await (await api.client.get("/api/v1/workflows", headers=api.auth("admin"))).json()
    assert listed["items"] == []


async def test_a_big_ticks_workflow_is_planned_in_a_child_process(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like a big submission over the API (tests/api/test_big_submissions.py), a tick
    whose workflow has more than `DETACHED_ACTIONS` actions is planned and stored by a
    child process; "big" is made small here by lowering the threshold."""
    monkeypatch.setattr(schedule_service, "DETACHED_ACTIONS", 2)
    node = api.node
    assert node.detaches
    detached: list[str] = []
    submit_detached = node.submit_detached

    async def counting(job: BigSubmission) -> tuple[Any, bool]:
        detached.append(job.owner)
        return await submit_detached(job)

    monkeypatch.setattr(node, "submit_detached", counting)
    await api.add_user("alice")
    chain = command_workflow(
        {
            1: ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"],
            2: ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"'],
            3: ["sh", "-c", 'cat "$PINGO_INPUT_2" > "$PINGO_OUTPUT"'],
        },
        {2: [1], 3: [2]},
        name="big-tick",
    )
    created = await create(api, every_second(chain), user="alice")
    workflow_id = await first_submitted(api, created["id"])
    await api.client.post(f"/api/v1/schedules/{created['id']}/pause", headers=api.auth("alice"))
    document = await api.wait(workflow_id)
    assert document["state"] == "SUCCEEDED" and document["owner"] == "alice"
    assert detached and set(detached) == {"alice"}
    # At the threshold, a tick is planned here as before.
    monkeypatch.setattr(schedule_service, "DETACHED_ACTIONS", 3)
    small = await create(api, every_second({**chain, "name": "small-tick"}))
    assert (await api.wait(await first_submitted(api, small["id"])))["state"] == "SUCCEEDED"
    assert "admin" not in detached


async def first_submitted(api: Api, schedule_id: str, timeout_s: float = 20) -> str:
    """The workflow of the schedule's first submitted tick. A tick that comes while the
    scheduler is late is skipped (`catch-up latest`), so the first run may not be it."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = [r for r in await runs(api, schedule_id) if r["outcome"] == "submitted"]
            if found:
                workflow_id: str = found[-1]["workflowId"]
                return workflow_id
            await asyncio.sleep(0.1)


async def test_a_local_start_is_answered_as_given_and_within_the_contract(api: Api) -> None:
    """A start without an offset is a local time in the schedule's zone (docs/schedules.md);
    the answer shows it as given, and every answer is checked against the OpenAPI document
    (which once said `date-time`, which such a time is not)."""
    body = every_second(dated("local"), start="2026-01-01T00:00:00", timezone="Europe/Paris")
    created = await create(api, {**body, "paused": True})
    assert created["start"] == "2026-01-01T00:00:00"
    shown = await api.client.get(f"/api/v1/schedules/{created['id']}", headers=api.auth("admin"))
    assert shown.status == 200 and (await shown.json())["start"] == "2026-01-01T00:00:00"

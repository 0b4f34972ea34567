"""The auth matrix: no token, wrong token, another user, admin — on every protected route.

Refused requests must change nothing: the test snapshots workflows, datasets and
users before them and compares after.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import pytest

from pingo.api.app import create_app
from pingo.config import Settings

from .conftest import ADMIN_TOKEN, AiohttpClient, Api, bearer, chain, make_settings, sleeper


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    #: Expected status for another (non-admin) user, then for an admin.
    other: int
    admin: int
    body: Any = None


# Placeholders: {wf} alice's finished workflow, {run} her running one, {ds} her LEAF
# dataset, {mid} a STORED intermediate of it.
SCHEDULE = {"name": "matrix", "cron": "0 3 1 1 *", "workflow": chain("matrix-schedule")}

MATRIX: dict[str, Case] = {
    "submit_workflow": Case("POST", "/api/v1/workflows", 201, 201, body=chain("matrix")),
    "list_workflows": Case("GET", "/api/v1/workflows", 200, 200),
    "get_workflow": Case("GET", "/api/v1/workflows/{wf}", 404, 200),
    "kill_workflow": Case("POST", "/api/v1/workflows/{run}/kill", 404, 200),
    "rerun_workflow": Case("POST", "/api/v1/workflows/{wf}/rerun", 404, 201),
    "get_action": Case("GET", "/api/v1/workflows/{wf}/actions/1", 404, 200),
    "get_action_logs": Case("GET", "/api/v1/workflows/{wf}/actions/1/logs", 404, 200),
    "get_cluster_jobs": Case("GET", "/api/v1/workflows/{wf}/actions/1/cluster-jobs", 404, 200),
    "list_datasets": Case("GET", "/api/v1/datasets", 200, 200),
    "get_dataset": Case("GET", "/api/v1/datasets/{ds}", 200, 200),
    "get_dataset_lineage": Case("GET", "/api/v1/datasets/{ds}/lineage", 200, 200),
    "delete_dataset": Case("DELETE", "/api/v1/datasets/{mid}", 403, 202),
    "pin_dataset": Case("POST", "/api/v1/datasets/{ds}/pin", 403, 200),
    "unpin_dataset": Case("POST", "/api/v1/datasets/{ds}/unpin", 403, 200),
    "get_storage": Case("GET", "/api/v1/storage", 200, 200),
    "create_user": Case("POST", "/api/v1/users", 403, 201, body={"name": "dave"}),
    "list_users": Case("GET", "/api/v1/users", 403, 200),
    "delete_user": Case("DELETE", "/api/v1/users/carol", 403, 204),
    "get_user": Case("GET", "/api/v1/users/carol", 403, 200),
    "update_user": Case(
        "PATCH", "/api/v1/users/carol", 403, 200, body={"limits": {"maxWorkflows": 1}}
    ),
    "get_me": Case("GET", "/api/v1/me", 200, 200),
    "create_schedule": Case("POST", "/api/v1/schedules", 201, 201, body=SCHEDULE),
    "list_schedules": Case("GET", "/api/v1/schedules", 200, 200),
    "get_schedule": Case("GET", "/api/v1/schedules/{sch}", 404, 200),
    "delete_schedule": Case("DELETE", "/api/v1/schedules/{sch}", 404, 204),
    "pause_schedule": Case("POST", "/api/v1/schedules/{sch}/pause", 404, 200),
    "resume_schedule": Case("POST", "/api/v1/schedules/{sch}/resume", 404, 200),
    "list_schedule_runs": Case("GET", "/api/v1/schedules/{sch}/runs", 404, 200),
    "list_schedule_deliveries": Case("GET", "/api/v1/schedules/{sch}/deliveries", 404, 200),
    "list_workflow_deliveries": Case("GET", "/api/v1/workflows/{wf}/deliveries", 404, 200),
    "list_events": Case("GET", "/api/v1/events", 200, 200),
    "list_audit": Case("GET", "/api/v1/audit", 403, 200),
}

PUBLIC = {"post_callback", "get_callback", "healthz", "readyz", "metrics", "openapi", "docs"}


def test_the_matrix_covers_every_protected_route(tmp_path: Any) -> None:
    app = create_app(make_settings(tmp_path))
    names = {r.name for r in app.router.resources() if r.name}
    assert names == set(MATRIX) | PUBLIC
    for resource in app.router.resources():
        path = resource.canonical
        protected = path.startswith("/api/v1/") and not path.startswith("/api/v1/callbacks/")
        assert protected == (resource.name in MATRIX), path


async def _alice_world(api: Api) -> dict[str, str]:
    await api.add_user("alice")
    await api.add_user("bob")
    await api.add_user("carol")
    finished = await api.wait((await api.submit(chain("alice"), user="alice"))["id"])
    assert finished["state"] == "SUCCEEDED"
    running = await api.submit(sleeper("alice"), user="alice")
    await api.wait_action(running["id"], 1, {"SUBMITTED", "RUNNING"})
    schedule = await api.client.post("/api/v1/schedules", json=SCHEDULE, headers=api.auth("alice"))
    assert schedule.status == 201, await schedule.text()
    return {
        "sch": (await schedule.json())["id"],
        "wf": finished["id"],
        "run": running["id"],
        "ds": finished["endDatasetId"],
        "mid": finished["actions"][0]["datasetId"],
    }


async def _snapshot(api: Api, ids: dict[str, str]) -> Any:
    admin = api.auth("admin")
    get = api.client.get
    return (
        await (await get("/api/v1/workflows", headers=admin)).json(),
        await (await get(f"/api/v1/workflows/{ids['run']}", headers=admin)).json(),
        await (await get(f"/api/v1/datasets/{ids['ds']}", headers=admin)).json(),
        await (await get(f"/api/v1/datasets/{ids['mid']}", headers=admin)).json(),
        await (await get("/api/v1/users", headers=admin)).json(),
    )


@pytest.mark.parametrize("route", sorted(MATRIX))
async def test_auth_matrix(api: Api, route: str) -> None:
    case = MATRIX[route]
    ids = await _alice_world(api)
    path = case.path.format(**ids)

    async def call(headers: dict[str, str]) -> Any:
        return await api.client.request(case.method, path, json=case.body, headers=headers)

    before = await _snapshot(api, ids)
    for headers in ({}, bearer("not-a-token"), {"Authorization": "Basic YWRtaW46YWRtaW4="}):
        response = await call(headers)
        assert response.status == 401, (route, headers)
        assert response.content_type == "application/problem+json"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await response.json())["code"] == "UNAUTHORIZED"
    other = await call(api.auth("bob"))
    assert other.status == case.other, await other.text()
    if other.status >= 400:
        problem = await other.json()
        assert problem["code"] == {403: "FORBIDDEN", 404: "NOT_FOUND"}[other.status]
        assert await _snapshot(api, ids) == before
        if other.status == 404:
            # Another user's workflow is invisible: the answer is the one for no workflow at all.
            ghost = {**ids, "wf": "wf-ghost", "run": "wf-ghost"}
            missing = await api.client.request(
                case.method, case.path.format(**ghost), json=case.body, headers=api.auth("bob")
            )
            expected = (await missing.json())["detail"].replace("wf-ghost", "{id}")
            for real in (ids["wf"], ids["run"]):
                problem["detail"] = problem["detail"].replace(real, "{id}")
            assert problem["detail"] == expected
    elif route == "list_workflows":
        assert (await other.json())["items"] == []
    admin = await call(api.auth("admin"))
    assert admin.status == case.admin, await admin.text()
    if route == "list_workflows":
        assert {w["id"] for w in (await admin.json())["items"]} == {ids["wf"], ids["run"]}
    if route == "kill_workflow":
        assert (await admin.json())["state"] == "KILLED"
    else:
        await api.client.post(f"/api/v1/workflows/{ids['run']}/kill", headers=api.auth("admin"))


async def test_owners_see_kill_and_rerun_their_own_workflows(api: Api) -> None:
    ids = await _alice_world(api)
    alice = api.auth("alice")
    for path in (
        f"/api/v1/workflows/{ids['wf']}",
        f"/api/v1/workflows/{ids['wf']}/actions/1",
        f"/api/v1/workflows/{ids['wf']}/actions/1/logs",
        f"/api/v1/workflows/{ids['wf']}/actions/1/cluster-jobs",
    ):
        assert (await api.client.get(path, headers=alice)).status == 200, path
    rerun = await api.client.post(f"/api/v1/workflows/{ids['wf']}/rerun", headers=alice)
    assert rerun.status == 201
    assert (await rerun.json())["owner"] == "alice"
    listing = await (await api.client.get("/api/v1/workflows", headers=alice)).json()
    assert len(listing["items"]) == 3
    # Asking for another owner's list shows nothing rather than an error.
    others = await (await api.client.get("/api/v1/workflows?owner=admin", headers=alice)).json()
    assert others["items"] == []
    killed = await api.client.post(f"/api/v1/workflows/{ids['run']}/kill", headers=alice)
    assert killed.status == 200
    pinned = await api.client.post(f"/api/v1/datasets/{ids['ds']}/pin", headers=alice)
    assert pinned.status == 200


async def test_users_create_list_revoke(api: Api) -> None:
    token = await api.add_user("erin")
    me = await api.client.get("/api/v1/me", headers=bearer(token))
    default_limits = {"maxWorkflows": 100, "maxInFlightActions": 1000,
                      "submissionsPerMinute": 600, "maxStorageBytes": None}  # fmt: skip
    assert await me.json() == {
        "name": "erin",
        "admin": False,
        "createdAt": (await me.json())["createdAt"],
        "limits": default_limits,
        "ownLimits": dict.fromkeys(default_limits),
    }
    users = await (await api.client.get("/api/v1/users", headers=api.auth("admin"))).json()
    assert [u["name"] for u in users["items"]] == ["admin", "erin"]
    assert all(
        set(u) == {"name", "admin", "createdAt", "limits", "ownLimits"} for u in users["items"]
    )

    taken = await api.client.post("/api/v1/users", json={"name": "erin"}, headers=api.auth("admin"))
    assert taken.status == 409
    for body in (
        {"name": "bad name"},
        {"name": ""},
        {"name": 3},
        {"name": "x", "admin": "yes"},
        {"name": "x", "role": "admin"},
        ["x"],
    ):
        response = await api.client.post("/api/v1/users", json=body, headers=api.auth("admin"))
        assert response.status == 422, body
        assert (await response.json())["errors"]

    revoked = await api.client.delete("/api/v1/users/erin", headers=api.auth("admin"))
    assert revoked.status == 204
    assert (await api.client.get("/api/v1/me", headers=bearer(token))).status == 401
    again = await api.client.delete("/api/v1/users/erin", headers=api.auth("admin"))
    assert again.status == 404
    myself = await api.client.delete("/api/v1/users/admin", headers=api.auth("admin"))
    assert myself.status == 409

    admin_token = await api.add_user("frank", admin=True)
    listed = await api.client.get("/api/v1/users", headers=bearer(admin_token))
    assert listed.status == 200


async def test_first_start_creates_an_admin_once(
    aiohttp_client: AiohttpClient, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(tmp_path, admin_token=None)
    client = await aiohttp_client(create_app(settings))
    printed = capsys.readouterr().out
    token_file = settings.home / "admin.token"
    token = token_file.read_text().strip()
    assert token and token in printed
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert (await client.get("/api/v1/me", headers=bearer(token))).status == 200
    await client.close()

    # A second start on the same store keeps the admin and prints nothing.
    again = await aiohttp_client(create_app(settings))
    assert token not in capsys.readouterr().out
    assert token_file.read_text().strip() == token
    assert (await again.get("/api/v1/me", headers=bearer(token))).status == 200


async def test_configured_admin_token_is_used(aiohttp_client: AiohttpClient, tmp_path: Any) -> None:
    settings: Settings = make_settings(tmp_path)
    client = await aiohttp_client(create_app(settings))
    assert (settings.home / "admin.token").read_text().strip() == ADMIN_TOKEN
    me = await client.get("/api/v1/me", headers=bearer(ADMIN_TOKEN))
    assert (await me.json())["admin"] is True


async def test_user_sharing_scope_keeps_datasets_private(
    aiohttp_client: AiohttpClient, tmp_path: Any
) -> None:
    app = create_app(make_settings(tmp_path, sharing_scope="user"))
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    alice = await api.wait((await api.submit(chain("private"), user="alice"))["id"])
    bob = await api.submit(chain("private"), user="bob")
    # The same document in another user's scope is another computation: nothing reused.
    assert not any(a["reused"] for a in bob["actions"])
    assert alice["endDatasetId"] != bob["endDatasetId"]
    hidden = await api.client.get(
        f"/api/v1/datasets/{alice['endDatasetId']}", headers=api.auth("bob")
    )
    assert hidden.status == 404
    mine = await api.client.get(
        f"/api/v1/datasets/{alice['endDatasetId']}", headers=api.auth("alice")
    )
    assert mine.status == 200
    listed = await (await api.client.get("/api/v1/datasets", headers=api.auth("bob"))).json()
    assert alice["endDatasetId"] not in {d["id"] for d in listed["items"]}
    await api.wait(bob["id"])


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/callbacks/x/../../workflows",
        "/api/v1/callbacks/%2e%2e/%2e%2e/workflows",
        "/api/v1/callbacks/..%2F..%2Fworkflows",
        "/api/v1//workflows",
    ],
)
async def test_no_spelling_of_a_path_skips_authentication(api: Api, path: str) -> None:
    await api.submit(chain("hidden"))
    response = await api.client.get(path)
    assert response.status in {400, 401, 404}, path
    assert "hidden" not in await response.text()

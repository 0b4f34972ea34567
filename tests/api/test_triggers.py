"""Data triggers (Oozie coordinators) over real HTTP: a schedule that runs when a dataset
of the owner's workflow is stored, or when a path under the data root appears; another
user's data never fires it; hostile trigger definitions are refused."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Api, chain, command_workflow
from .test_schedules import create, runs, wait_runs

pytestmark = pytest.mark.timeout(60)


def consumer(tag: str) -> dict[str, Any]:
    """A workflow whose identity holds the tick, so each firing computes anew."""
    return command_workflow(
        {1: ["sh", "-c", f'echo {tag} "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"]},
        name=f"consumer-{tag}",
    )


def on_stored(workflow: str, action: str, tag: str) -> dict[str, Any]:
    return {
        "name": f"on-{tag}",
        "trigger": {"dataset": {"workflow": workflow, "action": action}},
        "workflow": consumer(tag),
    }


async def produce(api: Api, tag: str, user: str) -> str:
    submitted = await api.submit(chain(tag, 2, name="producer"), user=user)
    assert (await api.wait(submitted["id"]))["state"] == "SUCCEEDED"
    return str(submitted["id"])


async def test_a_stored_dataset_fires_the_owners_schedule_once(users_api: Api) -> None:
    api = users_api
    # Stored before the schedule existed: not a firing.
    await produce(api, "early", "alice")
    schedule = await create(api, on_stored("producer", "step2", "ds"), user="alice")
    assert schedule["nextFireAt"] is None
    assert schedule["nextFireTimes"] == []
    assert schedule["trigger"] == {"dataset": {"workflow": "producer", "action": "step2"}}
    # Bob's workflow of the same names is not alice's data.
    await produce(api, "bobs", "bob")
    await asyncio.sleep(1.0)
    assert await runs(api, schedule["id"], user="alice") == []

    await produce(api, "first", "alice")
    [run] = await wait_runs(api, schedule["id"], 1)
    assert run["workflowId"]
    assert (await api.wait(run["workflowId"]))["state"] == "SUCCEEDED"
    fired = await api.workflow(run["workflowId"])
    assert fired["name"] == "consumer-ds"
    assert fired["owner"] == "alice"

    metrics = await (await api.client.get("/metrics")).text()
    assert 'pingo_schedule_triggers_total{kind="dataset"}' in metrics
    await produce(api, "second", "alice")
    both = await wait_runs(api, schedule["id"], 2)
    assert len({r["workflowId"] for r in both}) == 2
    await asyncio.sleep(1.0)
    assert len(await runs(api, schedule["id"], user="alice")) == 2


async def test_a_computation_shared_with_another_users_run_fires_the_owners_schedule(
    users_api: Api,
) -> None:
    """A red-team review's suppression: Bob starts Alice's exact command first, so her
    action shares his computation instead of running it. The dataset is still new to
    her, computed during her run: her trigger fires, once."""
    api = users_api
    schedule = await create(api, on_stored("daily", "step1", "shared"), user="alice")
    command = {1: ["sh", "-c", 'sleep 1; echo "$1" > "$PINGO_OUTPUT"', "x", str(time.time())]}
    bobs = await api.submit(command_workflow(command, name="anything"), user="bob")
    alices = await api.submit(command_workflow(command, name="daily"), user="alice")
    assert alices["actions"][0]["reuse"] == "shared"
    assert (await api.wait(alices["id"]))["state"] == "SUCCEEDED"
    assert (await api.wait(bobs["id"]))["state"] == "SUCCEEDED"
    [run] = await wait_runs(api, schedule["id"], 1)
    assert (await api.workflow(run["workflowId"]))["owner"] == "alice"
    # Her own workflows sharing her own computation fire it once, not once each.
    mine = {1: ["sh", "-c", 'sleep 1; echo "$1" > "$PINGO_OUTPUT"', "x", str(time.time())]}
    first = await api.submit(command_workflow(mine, name="daily"), user="alice")
    second = await api.submit(command_workflow(mine, name="daily"), user="alice")
    assert second["actions"][0]["reuse"] == "shared"
    for workflow in (first, second):
        assert (await api.wait(workflow["id"]))["state"] == "SUCCEEDED"
    await wait_runs(api, schedule["id"], 2)
    await asyncio.sleep(1.5)
    assert len(await runs(api, schedule["id"], user="alice")) == 2


async def test_a_first_reuse_of_another_users_dataset_fires_the_owners_schedule_once(
    users_api: Api,
) -> None:
    """Bob ran Alice's command to its end before her run: her action reuses his dataset.
    New to her, it fires her trigger, once; her later reuses of it do not."""
    api = users_api
    command = {1: ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", str(time.time())]}
    bobs = await api.submit(command_workflow(command, name="anything"), user="bob")
    assert (await api.wait(bobs["id"]))["state"] == "SUCCEEDED"
    schedule = await create(api, on_stored("daily", "step1", "reused"), user="alice")
    for _ in range(2):
        alices = await api.submit(command_workflow(command, name="daily"), user="alice")
        assert alices["actions"][0]["reuse"] == "reused"
        assert (await api.wait(alices["id"]))["state"] == "SUCCEEDED"
    [run] = await wait_runs(api, schedule["id"], 1)
    assert (await api.workflow(run["workflowId"]))["owner"] == "alice"
    await asyncio.sleep(1.5)
    assert len(await runs(api, schedule["id"], user="alice")) == 1
    # Her own dataset, reused by her again, told her when it was stored: no firing.
    mine = {1: ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "y", str(time.time())]}
    for _ in range(2):
        done = await api.wait(
            (await api.submit(command_workflow(mine, name="daily"), user="alice"))["id"]
        )
        assert done["state"] == "SUCCEEDED"
    await wait_runs(api, schedule["id"], 2)
    await asyncio.sleep(1.5)
    assert len(await runs(api, schedule["id"], user="alice")) == 2


async def test_a_path_under_the_data_root_fires_when_it_appears(users_api: Api) -> None:
    api = users_api
    root = Path(api.node.settings.data_root)
    body = {
        "name": "on-path",
        "trigger": {"path": "incoming/day/_SUCCESS"},
        "workflow": consumer("path"),
    }
    schedule = await create(api, body, user="alice")
    await asyncio.sleep(1.5)
    assert await runs(api, schedule["id"], user="alice") == []

    marker = root / "incoming" / "day" / "_SUCCESS"
    marker.parent.mkdir(parents=True)
    marker.write_text("done\n")
    [run] = await wait_runs(api, schedule["id"], 1)
    assert run["workflowId"]
    await asyncio.sleep(2.5)  # more polls of the same file: no second run
    assert len(await runs(api, schedule["id"], user="alice")) == 1

    later = time.time() + 5
    os.utime(marker, (later, later))
    assert len(await wait_runs(api, schedule["id"], 2)) == 2


@pytest.mark.parametrize(
    "trigger",
    [
        {"path": "../etc/passwd"},
        {"path": "/etc/passwd"},
        {"path": "incoming/../../x"},
        {"path": ".staging/x"},
        {"path": "ab/abcdef"},
        {"path": "4A/abcdef"},  # a data root on a case-insensitive filesystem
        {"path": "in\x00coming"},
        {"path": "a//b"},
        {"path": "x" * 501},
        {"path": 7},
        {"dataset": {"workflow": "w"}},
        {"dataset": {"workflow": "w", "action": 1}},
        {"dataset": {"workflow": "", "action": "a"}},
        {"dataset": {"workflow": "w", "action": "a", "extra": "<script>"}},
        {"dataset": "w/a"},
        {"path": "a", "dataset": {"workflow": "w", "action": "a"}},
        {},
        "incoming",
        None,
    ],
)
async def test_hostile_triggers_are_refused(users_api: Api, trigger: Any) -> None:
    body = {"name": "bad", "trigger": trigger, "workflow": consumer("bad")}
    response = await users_api.client.post(
        "/api/v1/schedules", json=body, headers=users_api.auth("alice")
    )
    assert response.status == 422, await response.text()
    problem = await response.json()
    assert any(i["pointer"].startswith("/trigger") for i in problem["errors"])


async def test_a_cron_and_a_trigger_together_are_refused(users_api: Api) -> None:
    body = {
        "name": "both",
        "cron": "* * * * *",
        "trigger": {"path": "incoming/x"},
        "workflow": consumer("both"),
    }
    response = await users_api.client.post(
        "/api/v1/schedules", json=body, headers=users_api.auth("alice")
    )
    assert response.status == 422
    no_way = {"name": "neither", "workflow": consumer("neither")}
    response = await users_api.client.post(
        "/api/v1/schedules", json=no_way, headers=users_api.auth("alice")
    )
    assert response.status == 422


async def test_another_users_trigger_schedule_is_invisible(users_api: Api) -> None:
    api = users_api
    schedule = await create(api, on_stored("producer", "step1", "mine"), user="alice")
    for method, path in [
        ("GET", f"/api/v1/schedules/{schedule['id']}"),
        ("GET", f"/api/v1/schedules/{schedule['id']}/runs"),
        ("POST", f"/api/v1/schedules/{schedule['id']}/pause"),
        ("DELETE", f"/api/v1/schedules/{schedule['id']}"),
    ]:
        response = await api.client.request(method, path, headers=api.auth("bob"))
        assert response.status == 404, (method, path)
        response = await api.client.request(method, path)
        assert response.status == 401, (method, path)

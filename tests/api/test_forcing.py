"""Forcing the computation of a stored dataset, over real HTTP (security finding 5).

A forced computation replaces the stored files and makes its workflow the dataset's
producer: forcing a dataset whose files are on disk is for those who may manage it
(an admin, or the owner of the workflow that produced it), so Bob can neither choose
the bytes of Alice's dataset that everyone reuses nor take over pinning and deleting
it. A dataset with no files may be forced by anyone.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pingo.config import Settings
from tests.api.conftest import Api, command_workflow, make_settings

pytestmark = pytest.mark.timeout(60)

#: Alice's workflow's name: never in an answer to Bob.
ALICES_NAME = "alices-private-pipeline"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A quick deletor, for the test that deletes a dataset before forcing it.
    return make_settings(tmp_path, deletor_interval_s=0.05)


def _document() -> dict[str, Any]:
    """One action whose output differs on each run (the bytes a forced run would choose)."""
    return command_workflow(
        {1: ["sh", "-c", 'date +%s%N > "$PINGO_OUTPUT"']},
        name=ALICES_NAME,
        extra={1: {"name": "extract"}},
    )


def _forced(document: dict[str, Any]) -> dict[str, Any]:
    forced = copy.deepcopy(document)
    forced["actions"][0]["forceComputation"] = True
    return forced


async def _dataset(api: Api, dataset_id: str, user: str = "alice") -> dict[str, Any]:
    response = await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth(user))
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    return document


async def _post(api: Api, url: str, user: str, body: Any = None) -> tuple[int, Any]:
    response = await api.client.post(url, json=body, headers=api.auth(user))
    return response.status, await response.json()


async def _alices(api: Api) -> tuple[str, str]:
    """Alice's finished workflow and its (LEAF) dataset, pinned by her."""
    alices = await api.wait((await api.submit(_document(), user="alice"))["id"])
    assert alices["state"] == "SUCCEEDED"
    dataset_id: str = alices["actions"][0]["datasetId"]
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/pin", "alice"))[0] == 200
    return alices["id"], dataset_id


def _assert_refusal(status: int, problem: dict[str, Any], alices_id: str, dataset_id: str) -> None:
    assert status == 403, problem
    assert problem["code"] == "FORBIDDEN"
    detail = problem["detail"]
    # It names the action and the dataset, says why and what to do...
    assert "'extract' (id 1)" in detail
    assert dataset_id in detail
    assert f"/api/v1/datasets/{dataset_id}?verify=true" in detail
    assert "admin" in detail
    # ...and nothing of Alice's workflow.
    assert alices_id not in str(problem) and ALICES_NAME not in str(problem)


async def test_bob_may_not_force_alices_stored_dataset_and_nothing_changes(
    users_api: Api,
) -> None:
    api = users_api
    alices_id, dataset_id = await _alices(api)
    before = await _dataset(api, dataset_id)
    delete = f"/api/v1/datasets/{dataset_id}?force=true"
    bob_deletes = await api.client.delete(delete, headers=api.auth("bob"))
    assert bob_deletes.status == 403

    status, problem = await _post(api, "/api/v1/workflows", "bob", _forced(_document()))
    _assert_refusal(status, problem, alices_id, dataset_id)
    # The dry run says the same, and stores nothing either.
    status, dry = await _post(api, "/api/v1/workflows?dryRun=true", "bob", _forced(_document()))
    _assert_refusal(status, dry, alices_id, dataset_id)
    assert dry["detail"] == problem["detail"]
    listed = await api.client.get("/api/v1/workflows", headers=api.auth("bob"))
    assert (await listed.json())["items"] == []

    # Nothing moved: Alice still manages her dataset, Bob still does not.
    after = await _dataset(api, dataset_id)
    assert after["producedBy"]["workflowId"] == alices_id
    assert (after["digest"], after["state"]) == (before["digest"], "LEAF")
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/unpin", "bob"))[0] == 403
    assert (await api.client.delete(delete, headers=api.auth("bob"))).status == 403
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/unpin", "alice"))[0] == 200
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/pin", "alice"))[0] == 200


async def test_bobs_rerun_may_not_force_alices_stored_dataset(users_api: Api) -> None:
    api = users_api
    alices_id, dataset_id = await _alices(api)
    # Bob's own workflow of the same provenance reuses Alice's dataset...
    bobs = await api.submit(_document(), user="bob")
    assert bobs["state"] == "SUCCEEDED" and bobs["actions"][0]["reuse"] == "reused"
    # ...and re-running it with that action forced is refused, by name or by id.
    for force in (["extract"], [1]):
        url = f"/api/v1/workflows/{bobs['id']}/rerun"
        status, problem = await _post(api, url, "bob", {"force": force})
        _assert_refusal(status, problem, alices_id, dataset_id)
        assert "the re-run forces it" in problem["detail"]
        # The re-run belongs to Bob, whoever asks: the workflow that would take the
        # dataset over is his, so an admin's re-run of it is refused too.
        assert (await _post(api, url, "admin", {"force": force}))[0] == 403
    assert (await _dataset(api, dataset_id))["producedBy"]["workflowId"] == alices_id
    # Without the force, the re-run reuses it.
    status, rerun = await _post(api, f"/api/v1/workflows/{bobs['id']}/rerun", "bob")
    assert status == 201 and rerun["actions"][0]["reuse"] == "reused"


async def test_a_schedules_tick_may_not_force_another_users_stored_dataset(
    users_api: Api,
) -> None:
    api = users_api
    alices_id, dataset_id = await _alices(api)
    body = {
        "name": "forcing",
        "cron": "* * * * * *",
        "timezone": "UTC",
        "workflow": _forced(_document()),
    }
    status, created = await _post(api, "/api/v1/schedules", "bob", body)
    assert status == 201, created
    runs_url = f"/api/v1/schedules/{created['id']}/runs"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        response = await api.client.get(runs_url, headers=api.auth("bob"))
        runs = (await response.json())["items"]
        if runs:
            break
        assert loop.time() < deadline, "no tick"
        await asyncio.sleep(0.1)
    await api.client.delete(f"/api/v1/schedules/{created['id']}", headers=api.auth("bob"))
    assert runs[-1]["outcome"] == "failed" and runs[-1]["workflowId"] is None
    assert "may not be forced" in runs[-1]["reason"]
    assert alices_id not in runs[-1]["reason"] and ALICES_NAME not in runs[-1]["reason"]
    assert (await _dataset(api, dataset_id))["producedBy"]["workflowId"] == alices_id


async def test_alice_may_force_her_own_dataset(users_api: Api) -> None:
    api = users_api
    _, dataset_id = await _alices(api)
    before = await _dataset(api, dataset_id)
    again = await api.wait((await api.submit(_forced(_document()), user="alice"))["id"])
    assert again["state"] == "SUCCEEDED" and again["actions"][0]["reuse"] == "computed"
    after = await _dataset(api, dataset_id)
    assert after["producedBy"]["workflowId"] == again["id"]
    assert after["digest"] != before["digest"]  # her new bytes
    # So may her re-run, and she still manages it.
    status, rerun = await _post(
        api, f"/api/v1/workflows/{again['id']}/rerun", "alice", {"force": ["extract"]}
    )
    assert status == 201, rerun
    await api.wait(rerun["id"])
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/unpin", "alice"))[0] == 200


async def test_an_admin_may_force_anyones_dataset(users_api: Api) -> None:
    api = users_api
    _, dataset_id = await _alices(api)
    status, plan = await _post(api, "/api/v1/workflows?dryRun=true", "admin", _forced(_document()))
    assert status == 200 and plan["actions"][0]["reason"] == "forced"
    forced = await api.wait((await api.submit(_forced(_document()), user="admin"))["id"])
    assert forced["state"] == "SUCCEEDED" and forced["actions"][0]["reuse"] == "computed"
    assert (await _dataset(api, dataset_id, "admin"))["producedBy"]["workflowId"] == forced["id"]


async def test_anyone_may_force_a_dataset_that_is_not_stored(users_api: Api) -> None:
    api = users_api
    # Never computed: nothing to replace.
    fresh = _forced(command_workflow({1: ["sh", "-c", 'echo fresh > "$PINGO_OUTPUT"']}))
    assert (await api.wait((await api.submit(fresh, user="bob"))["id"]))["state"] == "SUCCEEDED"
    # Deleted by its producer: its files are gone, a forced computation stores new ones.
    _, dataset_id = await _alices(api)
    delete = f"/api/v1/datasets/{dataset_id}?force=true"
    assert (await api.client.delete(delete, headers=api.auth("alice"))).status == 202
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while (await _dataset(api, dataset_id))["state"] != "DELETED":
        assert loop.time() < deadline, "never deleted"
        await asyncio.sleep(0.05)
    bobs = await api.wait((await api.submit(_forced(_document()), user="bob"))["id"])
    assert bobs["state"] == "SUCCEEDED" and bobs["actions"][0]["reuse"] == "computed"
    assert (await _dataset(api, dataset_id, "bob"))["producedBy"]["workflowId"] == bobs["id"]


async def test_bobs_forced_run_does_not_replace_what_alice_stored_while_it_ran(
    users_api: Api,
) -> None:
    """Planned while Alice's computation was in flight (no files: anyone may force), Bob's
    forced run ends after hers stored the dataset: hers stays, producer and bytes."""
    api = users_api
    # Read by the command, outside its identity; not in /tmp, which the sandbox replaces.
    scratch = Path(tempfile.mkdtemp(prefix="pingo-forcing-", dir="/var/tmp"))
    delay = scratch / "delay"
    delay.write_text("1")
    document = command_workflow(
        {1: ["sh", "-c", f'd=$(cat {delay}); echo read; sleep "$d"; date +%s%N > "$PINGO_OUTPUT"']},
        name=ALICES_NAME,
    )
    alices = await api.submit(document, user="alice")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    logs = f"/api/v1/workflows/{alices['id']}/actions/1/logs"
    # Once her command has read its delay (1 s), Bob's reads 3 s: hers stores first.
    while "read" not in await (await api.client.get(logs, headers=api.auth("alice"))).text():
        assert loop.time() < deadline, "alice's action did not start"
        await asyncio.sleep(0.02)
    delay.write_text("3")
    bobs = await api.submit(_forced(document), user="bob")
    assert (await api.wait(alices["id"]))["state"] == "SUCCEEDED"
    dataset_id = (await api.workflow(alices["id"], user="alice"))["actions"][0]["datasetId"]
    stored = await _dataset(api, dataset_id)
    assert (await api.wait(bobs["id"]))["state"] == "SUCCEEDED"
    after = await _dataset(api, dataset_id)
    assert after["digest"] == stored["digest"]
    assert after["producedBy"]["workflowId"] == alices["id"]
    assert (await _post(api, f"/api/v1/datasets/{dataset_id}/pin", "bob"))[0] == 403
    shutil.rmtree(scratch, ignore_errors=True)

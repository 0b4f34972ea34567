"""`pingo.client.Client` (synchronous, urllib) against the real app over HTTP.

The client blocks, so each call runs in a worker thread while the test's event
loop serves the requests.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pingo import cli
from pingo import client as pingo_client
from pingo.api import runtime
from pingo.retention.policy import DECLINE_EVENT

from .conftest import ADMIN_TOKEN, REPO, Api, command_workflow


def _client(api: Api, token: str | None = ADMIN_TOKEN) -> pingo_client.Client:
    return pingo_client.Client(base_url=str(api.client.make_url("")).rstrip("/"), token=token)


async def test_submit_wait_and_browse(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    client = _client(api)
    raw = (REPO / "examples" / "wordcount.json").read_bytes()
    plan = await asyncio.to_thread(client.submit, raw, dry_run=True)
    assert plan["summary"]["computed"] == 5
    submitted = await asyncio.to_thread(client.submit, raw, idempotency_key="k1")
    seen: list[str] = []
    done = await asyncio.to_thread(
        client.wait, submitted["id"], timeout_s=60, poll_s=0.05,
        on_update=lambda d: seen.append(d["state"]),
    )  # fmt: skip
    assert done["state"] == "SUCCEEDED" and seen[-1] == "SUCCEEDED"
    again = await asyncio.to_thread(client.submit, raw, idempotency_key="k1")
    assert again["id"] == submitted["id"]
    reused = await asyncio.to_thread(client.submit, json.loads(raw))
    assert reused["state"] == "SUCCEEDED"

    listed = await asyncio.to_thread(lambda: list(client.iter_workflows(limit=1)))
    assert [w["id"] for w in listed] == [reused["id"], submitted["id"]]
    action = await asyncio.to_thread(client.action, done["id"], 1)
    assert action["name"] == "tokenize"
    log = await asyncio.to_thread(client.logs, done["id"], 1)
    assert "tokenize:" in log
    dataset = await asyncio.to_thread(client.dataset, done["endDatasetId"])
    assert dataset["state"] == "LEAF"
    lineage = await asyncio.to_thread(client.lineage, done["endDatasetId"])
    assert len(lineage["nodes"]) == 5
    storage = await asyncio.to_thread(client.storage)
    assert storage["usedBytes"] > 0
    # `pingo storage` names each decision's kind; a decline has no size yet.
    store = api.app[runtime.STATE_KEY].node
    assert store is not None
    await store.store.append_event(
        DECLINE_EVENT, dataset_id=dataset["id"], payload={"policy": "p", "reason": "why"}
    )
    lines = cli.storage_lines(await asyncio.to_thread(client.storage))
    assert f"yours     {storage['ownBytes']:,} B (no quota)" in lines
    assert cli.storage_lines({"ownBytes": 250, "quotaBytes": 1000})[3] == (
        "yours     250 B of a 1,000 B quota (25.0%)"
    )
    assert lines[-2:] == [
        "recent decisions (1):",
        f"  {lines[-1].split()[0]}  decline  {dataset['id']}  0 B  p: why",
    ]
    rerun = await asyncio.to_thread(client.rerun, done["id"], ["count"])
    assert rerun["id"] != done["id"]


async def test_errors_carry_the_problem(api: Api) -> None:
    client = _client(api)
    with pytest.raises(pingo_client.ApiError) as invalid:
        await asyncio.to_thread(client.submit, {"name": 5})
    assert invalid.value.status == 422
    assert invalid.value.code == "VALIDATION_FAILED"
    assert any(i.pointer == "/name" for i in invalid.value.issues)
    assert "/name" in invalid.value.describe()
    with pytest.raises(pingo_client.ApiError) as missing:
        await asyncio.to_thread(client.workflow, "wf-nope")
    assert (missing.value.status, missing.value.code) == (404, "NOT_FOUND")
    anonymous = _client(api, token=None)
    with pytest.raises(pingo_client.ApiError) as unauthorized:
        await asyncio.to_thread(anonymous.workflows)
    assert unauthorized.value.code == "UNAUTHORIZED"
    assert await asyncio.to_thread(anonymous.health)


async def test_users_through_the_client(api: Api) -> None:
    client = _client(api)
    created = await asyncio.to_thread(client.create_user, "gina")
    gina = pingo_client.Client(base_url=client.base_url, token=created["token"])
    assert (await asyncio.to_thread(gina.me))["name"] == "gina"
    assert [u["name"] for u in await asyncio.to_thread(client.users)] == ["admin", "gina"]
    await asyncio.to_thread(gina.submit, command_workflow({1: ["true"]}, name="ginas"))
    await asyncio.to_thread(client.delete_user, "gina")
    with pytest.raises(pingo_client.ApiError):
        await asyncio.to_thread(gina.me)
    # Her name still owns her workflow: given back only on purpose.
    with pytest.raises(pingo_client.ApiError) as taken:
        await asyncio.to_thread(client.create_user, "gina")
    assert taken.value.status == 409 and "reclaim" in taken.value.detail
    back = await asyncio.to_thread(lambda: client.create_user("gina", reclaim=True))
    again = pingo_client.Client(base_url=client.base_url, token=back["token"])
    assert [w["name"] for w in (await asyncio.to_thread(again.workflows))["items"]] == ["ginas"]


def test_configuration_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text("from-file\n")
    env = {"PINGO_HOME": str(tmp_path), "PINGO_HOST": "0.0.0.0", "PINGO_PORT": "9999"}
    client = pingo_client.Client.from_env(env)
    assert client.base_url == "http://127.0.0.1:9999"
    assert client.token == "from-file"
    explicit = pingo_client.Client.from_env(
        {**env, "PINGO_URL": "http://pingo.example:80/", "PINGO_TOKEN": "t"}
    )
    assert (explicit.base_url, explicit.token) == ("http://pingo.example:80", "t")
    assert pingo_client.Client.from_env({"PINGO_HOME": str(tmp_path / "none")}).token is None


def test_unreachable_server_is_a_client_error(tmp_path: Path) -> None:
    client = pingo_client.Client(base_url="http://127.0.0.1:9", token="x", timeout_s=5)
    with pytest.raises(pingo_client.Unreachable, match="cannot reach Pingo"):
        client.workflows()
    assert not client.health()

"""Signed callbacks over HTTP: missing, forged and stale ones change nothing; valid ones count."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from pingo.callbacks import tokens

from .conftest import Api, command_workflow, sleeper


async def _running_action(api: Api, document: dict[str, Any]) -> dict[str, Any]:
    submitted = await api.submit(document)
    action = await api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"})
    action["workflowId"] = submitted["id"]
    return action


async def _state(api: Api, action: dict[str, Any]) -> tuple[Any, ...]:
    current = await api.wait_action(action["workflowId"], 1, {*_ALL})
    workflow = await api.workflow(action["workflowId"])
    return current["state"], current["attempts"], current["error"], workflow["state"]


_ALL = {"WAITING", "READY", "PROCESSING", "SUBMITTED", "RUNNING", "FINISHED", "FAILED", "KILLED"}


async def _kill(api: Api, action: dict[str, Any]) -> None:
    await api.client.post(
        f"/api/v1/workflows/{action['workflowId']}/kill", headers=api.auth("admin")
    )


async def test_missing_and_forged_tokens_change_nothing(api: Api) -> None:
    action = await _running_action(api, sleeper("forged"))
    cid, attempt = action["callbackId"], action["attempts"]
    assert attempt == 1
    before = await _state(api, action)
    good = tokens.sign(api.node.secret, cid, attempt)
    urls = [
        f"/api/v1/callbacks/{cid}/{kind}" for kind in ("running", "success", "failed", "killed")
    ]
    for url in urls:
        missing = await api.client.post(f"{url}?attempt={attempt}")
        assert missing.status == 401
        assert (await missing.json())["code"] == "UNAUTHORIZED"
        for forged in (
            secrets.token_hex(32),
            tokens.sign(secrets.token_bytes(32), cid, attempt),  # another server's secret
            tokens.sign(api.node.secret, "another-callback", attempt),
            # A neighbour's: an id of the same planning time, valid for its own action.
            tokens.sign(api.node.secret, cid[:-32] + secrets.token_hex(16), attempt),
            good[:-1] + ("0" if good[-1] != "0" else "1"),
        ):
            response = await api.client.post(f"{url}?attempt={attempt}&token={forged}")
            assert response.status == 403, forged
            assert response.content_type == "application/problem+json"
            assert (await response.json())["code"] == "FORBIDDEN"
        # The right token for the wrong attempt is forged too.
        other = tokens.sign(api.node.secret, cid, attempt + 1)
        shifted = await api.client.post(f"{url}?attempt={attempt}&token={other}")
        assert shifted.status == 403
        no_attempt = await api.client.post(f"{url}?token={good}")
        assert no_attempt.status == 400
    hadoop = f"/api/v1/callbacks/{cid}?attempt={attempt}&status=FAILED"
    assert (await api.client.get(hadoop)).status == 401
    assert (await api.client.get(f"{hadoop}&token={secrets.token_hex(32)}")).status == 403
    assert await _state(api, action) == before
    await _kill(api, action)


async def test_stale_attempt_is_409_and_changes_nothing(api: Api, tmp_path: Path) -> None:
    # The first attempt fails at once; the second one runs for a while. (The staging
    # output's name ends with the attempt number.)
    script = 'case "$PINGO_OUTPUT" in *.1) exit 1;; esac; sleep 30'
    document = command_workflow({1: ["sh", "-c", script]}, extra={1: {"maxAttempts": 3}})
    submitted = await api.submit(document)
    while True:
        action = await api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"})
        if action["attempts"] == 2:
            break
    action["workflowId"] = submitted["id"]
    before = await _state(api, action)
    cid = action["callbackId"]
    old = tokens.sign(api.node.secret, cid, 1)
    for kind in ("running", "success", "failed", "killed"):
        response = await api.client.post(f"/api/v1/callbacks/{cid}/{kind}?attempt=1&token={old}")
        assert response.status == 409, kind
        assert (await response.json())["code"] == "STALE_CALLBACK"
    hadoop = await api.client.get(f"/api/v1/callbacks/{cid}?attempt=1&token={old}&status=SUCCEEDED")
    assert hadoop.status == 409
    assert await _state(api, action) == before
    await _kill(api, action)


async def test_hadoop_style_notification_is_accepted_and_idempotent(api: Api) -> None:
    action = await _running_action(api, sleeper("hadoop", seconds=2, maxAttempts=1))
    cid, attempt = action["callbackId"], action["attempts"]
    token = tokens.sign(api.node.secret, cid, attempt)
    base = f"/api/v1/callbacks/{cid}?attempt={attempt}&token={token}"
    unknown = await api.client.get(f"{base}&status=$jobStatus")
    assert unknown.status == 400
    first = await api.client.get(f"{base}&status=FAILED")
    assert first.status == 200
    answer = await first.json()
    assert answer == {"callbackId": cid, "attempt": 1, "state": "FAILED"}
    again = await api.client.get(f"{base}&status=FAILED")
    assert again.status == 200
    assert await again.json() == answer
    state = await _state(api, action)
    assert state[0] == "FAILED" and state[3] == "FAILED"
    assert "FAILED" in state[2]


async def test_post_callbacks_with_bodies(api: Api) -> None:
    action = await _running_action(api, sleeper("post", seconds=2, maxAttempts=1))
    cid, attempt = action["callbackId"], action["attempts"]
    query = f"?attempt={attempt}&token={tokens.sign(api.node.secret, cid, attempt)}"
    running = await api.client.post(f"/api/v1/callbacks/{cid}/running{query}", json={})
    assert running.status == 200
    assert (await running.json())["state"] == "RUNNING"
    bad_kind = await api.client.post(f"/api/v1/callbacks/{cid}/exploded{query}")
    assert bad_kind.status == 404
    failed = await api.client.post(
        f"/api/v1/callbacks/{cid}/failed{query}", json={"error": "disk full on node 7"}
    )
    assert failed.status == 200
    detail = await api.client.get(
        f"/api/v1/workflows/{action['workflowId']}/actions/1", headers=api.auth("admin")
    )
    assert "disk full on node 7" in (await detail.json())["error"]
    unknown = await api.client.post(f"/api/v1/callbacks/nope/running{query}")
    assert unknown.status == 403  # the token is for another callback id
    token = tokens.sign(api.node.secret, "nope", attempt)
    missing = await api.client.post(f"/api/v1/callbacks/nope/running?attempt=1&token={token}")
    assert missing.status == 404

"""In-flight deduplication over real HTTP, with the real local executor and a SQLite file.

Alice and Bob submit workflows that need the same dataset at once: it is computed
once (each run appends a line to a marker file), and Bob's workflow waits for
Alice's computation instead of starting its own. Her computation failing, or her
killing her workflow, makes Bob's compute it himself, and never kills his work. Bob
sees only the name of the action he shared with, never Alice's workflow.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pingo.config import Settings
from tests.api.conftest import AiohttpClient, Api, command_workflow, make_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The commands append to a marker file outside their output: no sandbox around them.
    return make_settings(tmp_path, sandbox="off")


@pytest.fixture
async def two_users(aiohttp_client: AiohttpClient, settings: Settings) -> Api:
    from pingo.api.app import create_app

    app = create_app(settings)
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": "admin-token-for-tests"})
    await api.add_user("alice")
    await api.add_user("bob")
    return api


def _needing(first: str, *, reader: bool, name: str = "extract") -> dict[str, Any]:
    """A workflow whose action 1 runs `first` (the shared one); with `reader`, action 2
    reads its output."""
    commands = {1: ["sh", "-c", first]}
    parents: dict[int, list[int]] = {}
    if reader:
        commands[2] = ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"']
        parents[2] = [1]
    return command_workflow(
        commands, parents, name="needs-extract", extra={1: {"name": name, "maxAttempts": 1}}
    )


def _runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


async def _submit_together(api: Api, alices: Any, bobs: Any) -> tuple[str, str]:
    alice = await api.submit(alices, user="alice")
    bob = await api.submit(bobs, user="bob")
    return alice["id"], bob["id"]


async def test_two_users_needing_one_dataset_compute_it_once(
    two_users: Api, tmp_path: Path
) -> None:
    api = two_users
    marker = tmp_path / "runs"
    first = f'echo run >> {marker}; sleep 1; echo shared > "$PINGO_OUTPUT"'
    alice_id, bob_id = await _submit_together(
        api,
        _needing(first, reader=False, name="<b>extract</b>"),
        _needing(first, reader=True, name="<b>extract</b>"),
    )
    bobs = await api.workflow(bob_id, user="bob")
    assert bobs["actions"][0]["reuse"] == "shared"
    assert bobs["actions"][0]["sharedWith"] == {"name": "<b>extract</b>"}
    # The web UI's action page says the same, escaped, and never names Alice's workflow.
    signed_in = await api.client.post(
        "/login", data={"token": api.tokens["bob"]}, allow_redirects=False
    )
    assert signed_in.status == 303
    page = await (await api.client.get(f"/workflows/{bob_id}/actions/1")).text()
    assert "shared with &lt;b&gt;extract&lt;/b&gt;" in page
    assert "<b>extract</b>" not in page and alice_id not in page
    assert (await api.wait(alice_id))["state"] == "SUCCEEDED"
    done = await api.wait(bob_id)
    assert done["state"] == "SUCCEEDED"
    assert _runs(marker) == 1
    shared = done["actions"][0]
    assert (shared["state"], shared["attempts"], shared["reuse"]) == ("FINISHED", 0, "shared")
    assert done["reuse"]["shared"] == 1
    logs = await api.client.get(
        f"/api/v1/workflows/{bob_id}/actions/1/logs", headers=api.auth("bob")
    )
    assert logs.status == 404
    assert "shared another workflow's computation" in (await logs.json())["detail"]
    # Bob's views name Alice's action, never her workflow.
    for url in (f"/api/v1/workflows/{bob_id}", f"/api/v1/workflows/{bob_id}/actions/1"):
        response = await api.client.get(url, headers=api.auth("bob"))
        assert response.status == 200
        assert alice_id not in await response.text()
    # And her workflow stays hers.
    response = await api.client.get(f"/api/v1/workflows/{alice_id}", headers=api.auth("bob"))
    assert response.status == 404
    # Alice sharing with herself sees which workflow and action.
    again = f'echo run >> {marker}; sleep 1; echo again > "$PINGO_OUTPUT"'
    own_first, own_second = (
        await api.submit(_needing(again, reader=False), user="alice"),
        await api.submit(_needing(again, reader=True), user="alice"),
    )
    own = await api.workflow(own_second["id"], user="alice")
    assert own["actions"][0]["sharedWith"] == {
        "name": "extract",
        "workflowId": own_first["id"],
        "actionId": 1,
    }
    assert (await api.wait(own_second["id"]))["state"] == "SUCCEEDED"
    assert _runs(marker) == 2


async def test_the_producer_failing_makes_the_consumer_compute_it(
    two_users: Api, tmp_path: Path
) -> None:
    api = two_users
    marker = tmp_path / "failed-once"
    # Fails the first time it runs, succeeds after: Alice's run fails, Bob's own succeeds.
    first = (
        f'if [ -e {marker} ]; then echo ok > "$PINGO_OUTPUT"; '
        f"else echo run > {marker}; sleep 1; exit 3; fi"
    )
    alice_id, bob_id = await _submit_together(
        api, _needing(first, reader=False), _needing(first, reader=True)
    )
    assert (await api.workflow(bob_id, user="bob"))["actions"][0]["reuse"] == "shared"
    assert (await api.wait(alice_id))["state"] == "FAILED"
    done = await api.wait(bob_id)
    assert done["state"] == "SUCCEEDED"
    own = done["actions"][0]
    assert (own["attempts"], own["reuse"]) == (1, "computed")


async def test_killing_the_producers_workflow_does_not_kill_the_consumers(
    two_users: Api, tmp_path: Path
) -> None:
    api = two_users
    marker = tmp_path / "started"
    first = (
        f'if [ -e {marker} ]; then echo ok > "$PINGO_OUTPUT"; '
        f'else touch {marker}; sleep 30; echo late > "$PINGO_OUTPUT"; fi'
    )
    alice_id, bob_id = await _submit_together(
        api, _needing(first, reader=False), _needing(first, reader=True)
    )
    # Alice's command has started (the local executor may not report RUNNING first).
    await api.wait_action(alice_id, 1, {"SUBMITTED", "RUNNING"})
    for _ in range(300):
        if marker.exists():
            break
        await asyncio.sleep(0.05)
    assert marker.exists()
    killed = await api.client.post(f"/api/v1/workflows/{alice_id}/kill", headers=api.auth("alice"))
    assert killed.status == 200, await killed.text()
    done = await api.wait(bob_id)
    assert done["state"] == "SUCCEEDED"
    assert [a["state"] for a in done["actions"]] == ["FINISHED", "FINISHED"]
    assert (await api.workflow(alice_id))["state"] == "KILLED"
    # Bob cannot kill Alice's workflow, nor learn that it exists.
    response = await api.client.post(f"/api/v1/workflows/{alice_id}/kill", headers=api.auth("bob"))
    assert response.status == 404


async def test_workflows_submitted_at_the_same_moment_compute_their_dataset_once(
    two_users: Api, tmp_path: Path
) -> None:
    """Two (then three) POSTs at once, each needing the same dataset: every planning
    reads it absent, and the store decides which one computes it; the others share."""
    api = two_users
    for round_, users in enumerate((("alice", "bob"), ("alice", "bob", "alice"))):
        marker = tmp_path / f"runs-{round_}"
        first = f'echo run >> {marker}; sleep 1; echo round {round_} > "$PINGO_OUTPUT"'
        documents = [_needing(first, reader=i > 0) for i in range(len(users))]
        submitted = await asyncio.gather(
            *(api.submit(d, user=u) for d, u in zip(documents, users, strict=True))
        )
        ids = [s["id"] for s in submitted]
        done = [await api.wait(i) for i in ids]
        assert [d["state"] for d in done] == ["SUCCEEDED"] * len(ids)
        assert _runs(marker) == 1
        firsts = [d["actions"][0] for d in done]
        assert sorted(a["attempts"] for a in firsts) == [0] * (len(ids) - 1) + [1]
        computed = ids[[a["attempts"] for a in firsts].index(1)]
        for (workflow_id, user), action in zip(zip(ids, users, strict=True), firsts, strict=True):
            if workflow_id == computed:
                assert action["reuse"] == "computed" and action["sharedWith"] is None
                continue
            assert action["reuse"] == "shared"
            # Its owner sees the producer's workflow only when it is theirs too.
            owner = users[ids.index(computed)]
            expected: dict[str, Any] = {"name": "extract"}
            if owner == user:
                expected.update(workflowId=computed, actionId=1)
            assert action["sharedWith"] == expected

"""A big submission is planned in a child process (`pingo.node.Node.submit_detached`,
issue 13): the same workflow, the same answers, the same errors as in-process, and a
child that dies is a clear 503 that leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pingo import untrusted
from pingo.api.app import create_app
from pingo.api.routes import workflows as workflow_routes
from pingo.node import BigSubmission, Node
from pingo.store import protocol
from tests.contract.conftest import with_database

from .conftest import ADMIN_TOKEN, AiohttpClient, Api, command_workflow, make_settings

#: Past the detached body size (256 KiB).
ACTIONS = 2_600
SEED = ["sh", "-c", 'echo seed > "$PINGO_OUTPUT"']


def _big(*, padding: str = "", actions: int = ACTIONS) -> dict[str, Any]:
    """Action 1 is `SEED` (reused once a small workflow stored it); 2 sleeps; a chain after."""
    commands = {1: SEED, 2: ["sh", "-c", 'sleep 60; echo > "$PINGO_OUTPUT"']}
    commands.update({i: ["true", f"big-{i}{padding}"] for i in range(3, actions + 1)})
    return command_workflow(commands, {i: [i - 1] for i in range(2, actions + 1)}, name="big")


def _body(document: dict[str, Any]) -> bytes:
    body = json.dumps(document).encode()
    assert len(body) > 1 << 18
    return body


class _Calls:
    """Counts `Node.submit_detached` calls of one node (the path taken, not a stub)."""

    def __init__(self, node: Node) -> None:
        self.count = 0
        detached = node.submit_detached

        async def counting(job: BigSubmission) -> Any:
            self.count += 1
            return await detached(job)

        node.submit_detached = counting  # type: ignore[method-assign]


def _comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The document without what differs between two servers running the same workflow:
    ids, times, and how far the sleeping action 2 got."""
    document = {k: v for k, v in document.items() if k not in ("id", "createdAt", "counts")}
    actions = []
    for action in document.pop("actions"):
        action = {k: v for k, v in action.items() if k not in ("startedAt", "finishedAt")}
        if action["actionId"] == 2:
            action.pop("state")
            action.pop("attempts")
        actions.append(action)
    return {**document, "actions": actions}


async def _seeded(api: Api) -> None:
    """Action 1's dataset stored, so that the big workflow reuses it."""
    seed = await api.submit(command_workflow({1: SEED}, name="seed"))
    assert (await api.wait(seed["id"]))["state"] == "SUCCEEDED"


async def _post(api: Api, body: bytes, **headers: str) -> tuple[int, bytes, Any]:
    response = await api.client.post(
        "/api/v1/workflows",
        data=body,
        headers={**api.auth("admin"), "Content-Type": "application/json", **headers},
    )
    return response.status, await response.read(), response.headers


async def test_a_big_submission_in_a_child_is_the_workflow_in_process_would_be(
    api: Api, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = create_app(make_settings(tmp_path / "in-process"))
    in_process = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    in_process.node.detaches = False
    detached = _Calls(api.node)
    not_detached = _Calls(in_process.node)
    await _seeded(api)
    await _seeded(in_process)
    body = _body(_big())

    status, raw, headers = await _post(api, body, **{"Idempotency-Key": "big-1"})
    assert status == 201, raw[:500]
    child = json.loads(raw)
    status, raw, _ = await _post(in_process, body)
    assert status == 201, raw[:500]
    here = json.loads(raw)
    assert (detached.count, not_detached.count) == (1, 0)

    assert headers["Location"] == f"/api/v1/workflows/{child['id']}"
    assert child["reuse"] == {"computed": ACTIONS - 1, "shared": 0, "reused": 1, "notNeeded": 0}
    assert child["actions"][0]["reuse"] == "reused"
    assert _comparable(child) == _comparable(here)
    # What the parent does with the small result: the owner's feed, a wake-up (action 2 runs).
    await api.wait_action(child["id"], 2, {"SUBMITTED", "RUNNING"}, timeout_s=60)
    response = await api.client.get("/api/v1/events", headers=api.auth("admin"))
    events = (await response.json())["items"]
    assert any(e.get("workflowId") == child["id"] for e in events)

    # The same key again: the same workflow, replayed (through the child as well).
    status, raw, headers = await _post(api, body, **{"Idempotency-Key": "big-1"})
    assert status == 201
    assert headers["Idempotent-Replayed"] == "true"
    assert json.loads(raw)["id"] == child["id"]
    # And a different document under that key is refused, from the child.
    status, raw, _ = await _post(api, _body(_big(padding="x")), **{"Idempotency-Key": "big-1"})
    assert status == 422
    assert json.loads(raw)["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert detached.count == 3


#: The MongoDB test's workflow: "big" made small by lowering the detached body size.
SMALL_BIG = 40


async def test_a_big_submission_in_a_child_on_mongodb_is_the_workflow_in_process_would_be(
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    wire_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workflow_routes, "_DETACHED_BYTES", 4096)
    servers = []
    for name in ("child", "in-process"):
        database = f"pingo_big_{uuid.uuid4().hex[:12]}"
        url = with_database(wire_url, database)
        app = create_app(make_settings(tmp_path / name, store_url=url))
        servers.append(
            Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
        )
    child, in_process = servers
    in_process.node.detaches = False
    assert child.node.detaches
    detached = _Calls(child.node)
    await _seeded(child)
    await _seeded(in_process)
    body = json.dumps(_big(actions=SMALL_BIG)).encode()
    assert len(body) > 4096

    status, raw, headers = await _post(child, body, **{"Idempotency-Key": "big-mongo"})
    assert status == 201, raw[:500]
    stored = json.loads(raw)
    status, raw, _ = await _post(in_process, body)
    assert status == 201, raw[:500]
    assert detached.count == 1
    assert headers["Location"] == f"/api/v1/workflows/{stored['id']}"
    assert stored["reuse"] == {"computed": SMALL_BIG - 1, "shared": 0, "reused": 1, "notNeeded": 0}
    assert stored["actions"][0]["reuse"] == "reused"
    assert _comparable(stored) == _comparable(json.loads(raw))
    # Adopted by the server: the reused dataset's use is counted, action 2 runs.
    seed = await child.node.store.get_dataset(stored["actions"][0]["datasetId"])
    assert seed is not None and seed.use_count == 1
    await child.wait_action(stored["id"], 2, {"SUBMITTED", "RUNNING"}, timeout_s=60)
    # The same key again: replayed, through the child, from MongoDB.
    status, raw, headers = await _post(child, body, **{"Idempotency-Key": "big-mongo"})
    assert status == 201
    assert headers["Idempotent-Replayed"] == "true"
    assert json.loads(raw)["id"] == stored["id"]
    assert detached.count == 2
    await child.client.post(f"/api/v1/workflows/{stored['id']}/kill", headers=child.auth("admin"))


async def test_a_big_submission_refused_in_the_child_is_refused_as_in_process(api: Api) -> None:
    document = _big()
    document["actions"][2000]["maxAttempts"] = 0
    status, raw, headers = await _post(api, _body(document))
    assert status == 422
    assert headers["Content-Type"] == "application/problem+json"
    problem = json.loads(raw)
    assert problem["code"] == "VALIDATION_FAILED"
    assert [e["pointer"] for e in problem["errors"]] == ["/actions/2000/maxAttempts"]

    status, raw, _ = await _post(api, _body(_big())[:-1])
    assert status == 400
    assert json.loads(raw)["code"] == "MALFORMED_JSON"
    assert not (await api.node.store.list_workflows()).items


def _children() -> Iterator[int]:
    """This process's children that run a multiprocessing spawn (not its resource tracker)."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me and b"spawn_main" in command:
            yield int(entry.name)


async def test_a_killed_child_is_a_503_and_stores_nothing(api: Api) -> None:
    before = set(_children())
    posting = asyncio.create_task(_post(api, _body(_big())))
    killed: set[int] = set()
    for _ in range(600):
        killed = set(_children()) - before
        if killed or posting.done():
            break
        await asyncio.sleep(0.01)
    assert killed, "no child process was started"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    status, raw, headers = await posting

    assert status == 503
    assert headers["Content-Type"] == "application/problem+json"
    problem = json.loads(raw)
    assert problem["code"] == "SUBMISSION_INTERRUPTED"
    assert "Idempotency-Key" in problem["detail"]
    assert not (await api.node.store.list_workflows()).items
    # The server goes on: the next big submission is planned in a new child.
    status, raw, _ = await _post(api, _body(_big()))
    assert status == 201, raw[:500]


async def test_a_user_at_their_cap_gets_the_same_answers_for_any_size(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation first, then the workflow cap: a document that can never be accepted is
    422 (or 400) whatever the cap, in-process and in a child alike; only a valid one is 429."""
    monkeypatch.setattr(workflow_routes, "_DETACHED_BYTES", 4096)
    monkeypatch.setattr(untrusted, "BIG_ACTIONS", SMALL_BIG // 2)
    detached = _Calls(api.node)
    response = await api.client.patch(
        "/api/v1/users/admin", json={"limits": {"maxWorkflows": 1}}, headers=api.auth("admin")
    )
    assert response.status == 200
    first = json.dumps(_big(actions=SMALL_BIG, padding="-first")).encode()
    status, raw, _ = await _post(api, first, **{"Idempotency-Key": "first"})
    assert status == 201, raw[:500]
    running = json.loads(raw)
    small, big = _big(actions=2), _big(actions=SMALL_BIG)
    invalid_small, invalid_big = _big(actions=2), _big(actions=SMALL_BIG)
    invalid_small["actions"][1]["maxAttempts"] = 0
    invalid_big["actions"][1]["maxAttempts"] = 0
    bodies = {
        "small": json.dumps(small).encode(),
        "big": json.dumps(big).encode(),
        "invalid small": json.dumps(invalid_small).encode(),
        "invalid big": json.dumps(invalid_big).encode(),
        "malformed small": json.dumps(small).encode()[:-1],
        "malformed big": json.dumps(big).encode()[:-1],
    }
    capped = 'pingo_workflow_submissions_total{outcome="too_many_workflows"}'
    refused_before = await api.metric(capped)
    codes = {}
    for name, body in bodies.items():
        status, raw, _ = await _post(api, body)
        codes[name] = (status, json.loads(raw)["code"])
    rerun = f"/api/v1/workflows/{running['id']}/rerun"
    for name, body in {"big rerun": {}, "invalid big rerun": {"force": ["nope"]}}.items():
        response = await api.client.post(rerun, json=body, headers=api.auth("admin"))
        codes[name] = (response.status, (await response.json())["code"])
    assert codes == {
        "small": (429, "TOO_MANY_WORKFLOWS"),
        "big": (429, "TOO_MANY_WORKFLOWS"),
        "invalid small": (422, "VALIDATION_FAILED"),
        "invalid big": (422, "VALIDATION_FAILED"),
        "malformed small": (400, "MALFORMED_JSON"),
        "malformed big": (400, "MALFORMED_JSON"),
        "big rerun": (429, "TOO_MANY_WORKFLOWS"),
        "invalid big rerun": (422, "VALIDATION_FAILED"),
    }
    assert detached.count == 6
    # Counted by the server, for the children's refusals too (small, big, big re-run).
    assert await api.metric(capped) == refused_before + 3
    # A replay is no new workflow: never capped, in a child as well.
    status, raw, headers = await _post(api, first, **{"Idempotency-Key": "first"})
    assert (status, json.loads(raw)["id"]) == (201, running["id"])
    assert headers["Idempotent-Replayed"] == "true"
    assert detached.count == 7
    assert [w.id for w in (await api.node.store.list_workflows()).items] == [running["id"]]
    # Every child exited once it answered, and none was spawned to replace it.
    for _ in range(500):
        if not list(_children()):
            break
        await asyncio.sleep(0.02)
    assert not list(_children())


async def test_a_user_over_their_storage_quota_is_refused_by_a_child_too(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_routes, "_DETACHED_BYTES", 4096)
    monkeypatch.setattr(untrusted, "BIG_ACTIONS", SMALL_BIG // 2)
    detached = _Calls(api.node)
    seeded = await api.submit(command_workflow({1: SEED}, name="seed"))
    assert (await api.wait(seeded["id"]))["state"] == "SUCCEEDED"
    response = await api.client.patch(
        "/api/v1/users/admin", json={"limits": {"maxStorageBytes": 1}}, headers=api.auth("admin")
    )
    assert response.status == 200
    refused = 'pingo_workflow_submissions_total{outcome="storage_quota_exceeded"}'
    before = await api.metric(refused)
    status, raw, _ = await _post(api, json.dumps(_big(actions=SMALL_BIG)).encode())
    assert (status, json.loads(raw)["code"]) == (403, "STORAGE_QUOTA_EXCEEDED"), raw[:500]
    assert detached.count == 1
    # Counted by the server, though the child refused it.
    assert await api.metric(refused) == before + 1
    assert [w.id for w in (await api.node.store.list_workflows()).items] == [seeded["id"]]


async def test_claims_of_a_child_killed_mid_planning_are_swept_after_its_deadline(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """A child killed after claiming the dataset it reuses and before its workflow is
    stored leaves that claim; the deletor's sweep releases it once the planning is older
    than its deadline and a lease (no sooner: a slow planning is never robbed)."""
    settings = make_settings(tmp_path, plan_deadline_s=4.0, lease_s=1.0)
    app = create_app(settings)
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    seed = await api.submit(command_workflow({1: SEED}, name="seed"))
    assert (await api.wait(seed["id"]))["state"] == "SUCCEEDED"
    seed_id = seed["actions"][0]["datasetId"]
    store = api.node.store
    database = settings.store_url.removeprefix("sqlite:///")
    body = _body(_big())
    leaked: list[str] = []
    for _ in range(5):
        before = set(_children())
        posting = asyncio.create_task(_post(api, body))
        record = await store.get_dataset(seed_id)
        while not posting.done():
            record = await store.get_dataset(seed_id)
            assert record is not None
            if record.claims:
                break
            await asyncio.sleep(0.002)
        # The write lock, taken from here, keeps the child from committing its plan
        # (unless it is committing it right now: then it may get its 201, and we retry).
        lock = sqlite3.connect(database, timeout=0, isolation_level=None)
        try:
            with contextlib.suppress(sqlite3.OperationalError):
                lock.execute("BEGIN IMMEDIATE")
            for pid in set(_children()) - before:
                os.kill(pid, signal.SIGKILL)
            status, raw, _ = await posting
        finally:
            lock.close()
        if status == 503:
            assert record is not None
            leaked = [c for c in record.claims if not await _stored(api, c)]
            break
        # Planned and stored before the kill: its claim is its own; end it, and again.
        assert status == 201, raw[:500]
        await api.client.post(
            f"/api/v1/workflows/{json.loads(raw)['id']}/kill", headers=api.auth("admin")
        )
    assert leaked, "no child was killed between its claim and its commit"
    [claim] = leaked
    started = protocol.planning_started_at(protocol.parse_claim_key(claim)[0])
    assert started is not None
    deletor = api.node.deletor
    # Before the deadline and a lease: the planning may still be under way, kept.
    assert await deletor.release_orphan_claims() == 0
    record = await store.get_dataset(seed_id)
    assert record is not None and claim in record.claims
    due = started + timedelta(seconds=settings.plan_deadline_s + settings.lease_s)
    await asyncio.sleep(max(0.0, (due - store.clock()).total_seconds()) + 0.1)
    # Released by this sweep, or by the node's own deletor loop if its sweep came first.
    await deletor.release_orphan_claims()
    record = await store.get_dataset(seed_id)
    assert record is not None and claim not in record.claims


async def _stored(api: Api, claim: str) -> bool:
    """Whether the workflow of `claim` is in the store."""
    return await api.node.store.get_workflow(protocol.parse_claim_key(claim)[0]) is not None


async def test_a_client_that_leaves_mid_planning_still_gets_its_workflow_stored_and_adopted(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the body is read the server finishes the submission, whether the client waits
    or not, in-process and in a child alike: the workflow is stored and announced (the
    owner's feed), and a retry with the same Idempotency-Key finds it. (aiohttp's test
    server cancels the handler of a client that left, as `serve` does not.)"""
    monkeypatch.setattr(workflow_routes, "_DETACHED_BYTES", 4096)
    detached = _Calls(api.node)
    await _seeded(api)
    # In-process, a workflow big enough to still be planning when the client leaves.
    for key, detaches, actions in (("left-in-process", False, ACTIONS), ("left-child", True, 40)):
        api.node.detaches = detaches
        body = json.dumps(_big(actions=actions, padding=key)).encode()
        with pytest.raises(TimeoutError):
            await api.client.post(
                "/api/v1/workflows",
                data=body,
                headers={
                    **api.auth("admin"),
                    "Content-Type": "application/json",
                    "Idempotency-Key": key,
                },
                timeout=aiohttp.ClientTimeout(total=0.15),
            )
        found = None
        for _ in range(500):
            found = await api.node.store.find_workflow_by_idempotency_key("admin", key)
            if found is not None:
                break
            await asyncio.sleep(0.02)
        assert found is not None, key
        # Announced by the server's process: the owner's feed has it.
        for _ in range(500):
            response = await api.client.get("/api/v1/events", headers=api.auth("admin"))
            events = (await response.json())["items"]
            if any(e.get("workflowId") == found.id for e in events):
                break
            await asyncio.sleep(0.02)
        assert any(e.get("workflowId") == found.id for e in events), key
        status, raw, headers = await _post(api, body, **{"Idempotency-Key": key})
        assert (status, json.loads(raw)["id"], headers["Idempotent-Replayed"]) == (
            201,
            found.id,
            "true",
        )
    assert detached.count == 2

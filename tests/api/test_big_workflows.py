"""One user's big workflow does not stop the server answering others (issue 13).

Not timed (bench/bench_stall.py measures the gaps): these check that /healthz keeps
answering while a workflow past every chunk size is submitted and killed over HTTP,
and that the submission and the kill are right.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pingo import untrusted
from pingo.api import documents
from pingo.api.routes import workflows
from pingo.store.protocol import ActionRecord

from .conftest import Api, command_workflow

#: Past the piecewise body size, the off-loop planning and encoding sizes, and three
#: kill batches.
ACTIONS = 2_500


def _big_chain() -> dict[str, Any]:
    """A chain whose first action sleeps, so nothing past it runs before the kill."""
    commands = {1: ["sh", "-c", 'sleep 60; echo > "$PINGO_OUTPUT"']}
    commands.update({i: ["true", f"big-{i}"] for i in range(2, ACTIONS + 1)})
    return command_workflow(commands, {i: [i - 1] for i in range(2, ACTIONS + 1)}, name="big")


class _Poller:
    """/healthz back to back, counting the answers."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.answers = 0
        self.answered = asyncio.Event()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            response = await self.api.client.get("/healthz")
            assert response.status == 200
            await response.read()
            self.answers += 1
            self.answered.set()
            await asyncio.sleep(0)

    async def stop(self, task: asyncio.Task[None]) -> None:
        self._stop.set()
        await task


async def test_healthz_answers_while_a_big_workflow_is_submitted_and_killed(api: Api) -> None:
    body = json.dumps(_big_chain()).encode()
    assert len(body) > untrusted.PIECEWISE_CHARS
    poller = _Poller(api)
    polling = asyncio.create_task(poller.run())
    await asyncio.wait_for(poller.answered.wait(), timeout=30)

    before = poller.answers
    response = await api.client.post(
        "/api/v1/workflows",
        data=body,
        headers={**api.auth("admin"), "Content-Type": "application/json"},
    )
    assert response.status == 201, await response.text()
    # Streamed (see bodies.send_json), with every header a small answer has.
    raw = await response.read()
    assert len(raw) == int(response.headers["Content-Length"]) > 1 << 18
    submitted = json.loads(raw)
    assert response.headers["Location"] == f"/api/v1/workflows/{submitted['id']}"
    during_submission = poller.answers - before
    assert [a["actionId"] for a in submitted["actions"]] == list(range(1, ACTIONS + 1))
    assert submitted["counts"]["WAITING"] + submitted["counts"]["READY"] >= ACTIONS - 1
    await api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"}, timeout_s=60)

    before = poller.answers
    response = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/kill", headers=api.auth("admin")
    )
    assert response.status == 200, await response.text()
    killed = await response.json()
    during_kill = poller.answers - before
    await poller.stop(polling)

    assert during_submission > 0 and during_kill > 0
    assert killed["state"] == "KILLED"
    assert killed["counts"]["KILLED"] == ACTIONS
    # A document this big is streamed (nothing of it is kept after the answer).
    response = await api.client.get(
        f"/api/v1/workflows/{submitted['id']}", headers=api.auth("admin")
    )
    assert response.status == 200
    assert response.content_type == "application/json"
    raw = await response.read()
    assert len(raw) == int(response.headers["Content-Length"]) > 1 << 18
    again = json.loads(raw)
    assert again["counts"]["KILLED"] == ACTIONS
    # Read and encoded a page at a time: the bytes of every record encoded at once.
    record = await api.node.store.get_workflow(submitted["id"])
    assert record is not None
    every = await api.node.store.list_actions(submitted["id"])
    assert raw == documents.encode_workflow_document(record, every, {})
    # Its datasets were given up, all of them.
    node = api.node
    actions = await node.store.list_actions(submitted["id"])
    datasets = await node.store.get_datasets({a.dataset_id for a in actions})
    assert {d.state.value for d in datasets.values()} == {"DELETED"}


def _settled(document: dict[str, Any]) -> dict[str, Any]:
    """The document but for how far action 1 got (and the counts that follow from it)."""
    first, *others = document["actions"]
    first = {k: v for k, v in first.items() if k not in ("state", "attempts", "startedAt")}
    rest = {k: v for k, v in document.items() if k not in ("counts", "actions")}
    return {**rest, "actions": [first, *others]}


async def test_a_big_document_read_a_page_at_a_time_is_the_same_bytes(api: Api) -> None:
    """The 201, `GET` and the kill of a big workflow read its actions a page at a time
    (`workflows.DOCUMENT_PAGE`): the bytes are those of the whole list, encoded at once,
    twins (found across pages) included."""
    # Actions 2k and 2k + 1 are twins (the same command, the same parent): a pair
    # straddles each page boundary.
    commands = {1: ["sh", "-c", 'sleep 60; echo > "$PINGO_OUTPUT"']}
    # (The padding puts the stored document past `untrusted.PIECEWISE_CHARS`.)
    commands.update({i: ["true", f"twin-{i // 2}", "p" * 40] for i in range(2, ACTIONS + 1)})
    document = command_workflow(
        commands, {i: [1] for i in range(2, ACTIONS + 1)}, name="twins", end=1
    )
    store = api.node.store
    # Which reads the server makes: the whole list, or pages.
    reads: list[int | None] = []
    list_actions = store.list_actions

    async def listing(workflow_id: str, **page: Any) -> list[ActionRecord]:
        reads.append(page.get("limit"))
        return await list_actions(workflow_id, **page)

    store.list_actions = listing  # type: ignore[method-assign]
    response = await api.client.post(
        "/api/v1/workflows",
        data=json.dumps(document).encode(),
        headers={**api.auth("admin"), "Content-Type": "application/json"},
    )
    assert response.status == 201, await response.text()
    created = await response.read()
    workflow_id = json.loads(created)["id"]
    assert reads == [workflows.DOCUMENT_PAGE] * (ACTIONS // workflows.DOCUMENT_PAGE + 1)

    async def whole() -> bytes:
        """The document from every record at once (the small workflows' path)."""
        record = await store.get_workflow(workflow_id)
        assert record is not None
        actions = await list_actions(workflow_id)
        return documents.encode_workflow_document(record, actions, {})

    # Action 1 is picked up meanwhile: the bytes are compared once it is killed.
    assert _settled(json.loads(created)) == _settled(json.loads(await whole()))
    assert json.loads(created)["reuse"]["shared"] == (ACTIONS - 1) // 2
    reads.clear()
    response = await api.client.get(f"/api/v1/workflows/{workflow_id}", headers=api.auth("admin"))
    assert _settled(json.loads(await response.read())) == _settled(json.loads(await whole()))
    assert set(reads) == {workflows.DOCUMENT_PAGE}

    await api.wait_action(workflow_id, 1, {"SUBMITTED", "RUNNING"}, timeout_s=60)
    response = await api.client.post(
        f"/api/v1/workflows/{workflow_id}/kill", headers=api.auth("admin")
    )
    assert response.status == 200
    killed = await response.read()
    # The kill's sweep and its answer, both a page at a time.
    assert None not in reads
    assert killed == await whole()
    response = await api.client.get(f"/api/v1/workflows/{workflow_id}", headers=api.auth("admin"))
    assert await response.read() == killed
    assert json.loads(killed)["counts"]["KILLED"] == ACTIONS


async def test_a_big_workflow_reruns(api: Api) -> None:
    document = _big_chain()
    submitted = await api.submit(document)
    await api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"}, timeout_s=60)
    response = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/kill", headers=api.auth("admin")
    )
    assert response.status == 200
    # The stored document (too big to keep decoded) is read back for the re-run.
    response = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/rerun", headers=api.auth("admin")
    )
    assert response.status == 201, await response.text()
    rerun = await response.json()
    assert len(rerun["actions"]) == ACTIONS
    response = await api.client.post(
        f"/api/v1/workflows/{rerun['id']}/kill", headers=api.auth("admin")
    )
    assert response.status == 200

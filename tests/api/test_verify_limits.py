"""`GET /api/v1/datasets/{id}?verify=true` over real HTTP: at most
`PINGO_USER_MAX_VERIFICATIONS` per user at once (429 beyond), hashed on the storage's own
threads, so a flood of verifications never takes the threads the rest of the server needs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from pingo.api.routes import datasets
from pingo.datasets import integrity, storage

from .conftest import Api, chain

pytestmark = pytest.mark.timeout(60)


@dataclass
class Gate:
    """Holds the hashing of the datasets named in `held` until `release` is set, and
    records the name of every thread that hashes."""

    held: set[str] = field(default_factory=set)
    release: threading.Event = field(default_factory=threading.Event)
    entered: list[str] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    found = Gate()
    hash_again = integrity.DigestCache.verify

    def gated(self: integrity.DigestCache, path: str, expected: str) -> integrity.Verdict:
        found.threads.append(threading.current_thread().name)
        held = [d for d in found.held if d in path]
        if held:
            found.entered.extend(held)
            # Bounded, so that a server without the fix fails its test rather than hangs.
            found.release.wait(20)
        return hash_again(self, path, expected)

    monkeypatch.setattr(integrity.DigestCache, "verify", gated)
    yield found
    found.release.set()


async def stored_datasets(api: Api, tag: str) -> list[str]:
    """The ids of a finished two-action workflow's datasets (alice's)."""
    submitted = await api.submit(chain(tag, 2), user="alice")
    finished = await api.wait(submitted["id"])
    assert finished["state"] == "SUCCEEDED", finished
    return [action["datasetId"] for action in finished["actions"]]


async def verify(api: Api, user: str, dataset_id: str) -> tuple[int, dict[str, Any], str | None]:
    response = await api.client.get(
        f"/api/v1/datasets/{dataset_id}", params={"verify": "true"}, headers=api.auth(user)
    )
    return response.status, await response.json(), response.headers.get("Retry-After")


async def until_entered(gate: Gate, count: int) -> None:
    async with asyncio.timeout(10):
        while True:
            if len(gate.entered) >= count:
                return
            await asyncio.sleep(0.01)


async def test_a_user_past_their_verifications_is_refused_while_another_verifies(
    users_api: Api, gate: Gate
) -> None:
    api = users_api
    first, second = await stored_datasets(api, "verify-cap")
    gate.held.add(first)
    alices = asyncio.create_task(verify(api, "alice", first))
    await until_entered(gate, 1)

    # Alice's one verification (the default cap) is hashing: a second is refused at once.
    status, problem, retry_after = await verify(api, "alice", second)
    assert status == 429, problem
    assert retry_after == str(datasets.VERIFY_RETRY_S)
    assert problem["code"] == "RATE_LIMITED"
    assert "alice already has 1 verifications open" in problem["detail"]
    # Bob's is hashed meanwhile, on the verification thread alice does not hold.
    status, document, _ = await verify(api, "bob", second)
    assert status == 200 and document["verification"]["status"] == "match"
    assert not alices.done()

    gate.release.set()
    status, document, _ = await alices
    assert status == 200 and document["verification"]["status"] == "match"
    # Her slot was given back with the answer.
    status, document, _ = await verify(api, "alice", second)
    assert status == 200 and document["verification"]["status"] == "match"


async def test_verifications_hash_on_their_own_threads(users_api: Api, gate: Gate) -> None:
    api = users_api
    (dataset_id, _) = await stored_datasets(api, "verify-thread")
    status, document, _ = await verify(api, "bob", dataset_id)
    assert status == 200 and document["verification"]["status"] == "match"
    assert gate.threads and all(
        name.startswith(storage.VERIFY_THREAD_PREFIX + "_") for name in gate.threads
    ), gate.threads


async def test_held_verifications_leave_the_default_pool_to_the_rest(
    users_api: Api, gate: Gate
) -> None:
    """With asyncio's default pool as small as the verification threads, and every
    verification thread held, a workflow (planned, promoted in that pool) still runs."""
    api = users_api
    first, second = await stored_datasets(api, "verify-pool")
    loop = asyncio.get_running_loop()
    small = ThreadPoolExecutor(storage.VERIFY_THREADS, thread_name_prefix="default-pool")
    loop.set_default_executor(small)
    gate.held.update((first, second))
    held = [
        asyncio.create_task(verify(api, "alice", first)),
        asyncio.create_task(verify(api, "bob", second)),
    ]
    await until_entered(gate, 2)

    async with asyncio.timeout(15):
        other = await api.wait((await api.submit(chain("while-verifying", 2)))["id"])
    assert other["state"] == "SUCCEEDED", other
    assert not any(task.done() for task in held)

    gate.release.set()
    for status, document, _ in await asyncio.gather(*held):
        assert status == 200 and document["verification"]["status"] == "match"


async def test_a_stopped_node_leaves_no_verification_thread(users_api: Api) -> None:
    api = users_api
    (dataset_id, _) = await stored_datasets(api, "verify-stop")
    status, document, _ = await verify(api, "bob", dataset_id)
    assert status == 200 and document["verification"]["status"] == "match"
    assert _verify_threads()
    await api.client.close()  # the app's cleanup stops its node
    async with asyncio.timeout(10):
        while True:
            if not _verify_threads():
                return
            await asyncio.sleep(0.02)


def _verify_threads() -> list[str]:
    prefix = storage.VERIFY_THREAD_PREFIX + "_"
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]

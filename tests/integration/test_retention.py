"""Retention on a live node: a real Node on a SQLite file, real subprocesses, a small budget.

Many small workflows share prefixes. Every action reads its inputs byte for
byte before writing its output, so an input deleted under a running action
fails it (and its workflow): "all succeed" is also "no claimed dataset was
deleted".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pingo import states
from pingo.config import Settings
from pingo.node import Node
from pingo.retention.loop import RetentionLoop
from pingo.retention.policy import recent_decisions
from pingo.store import open_store

D = states.DatasetState
W = states.WorkflowState

CAPACITY = 6_000
BIG = 1_000  # bytes written by an intermediate action
SMALL = 10  # bytes written by a leaf


def action(action_id: int, tag: str, size: int, parent: int | None = None) -> dict[str, Any]:
    """Read the input whole (exit 7 if it vanished), then write `size` bytes."""
    script = f'head -c {size} /dev/zero > "$PINGO_OUTPUT"'
    argv = ["sh", "-c", script, tag]
    if parent is not None:
        argv = ["sh", "-c", f'cat "$1" > /dev/null || exit 7; {script}', tag, f"{{input:{parent}}}"]
    document: dict[str, Any] = {"id": action_id, "name": tag, "type": "command-line"}
    document["command"] = argv
    if parent is not None:
        document["parentActions"] = [{"id": parent}]
    return document


def workflow(i: int) -> dict[str, Any]:
    """root → shared-(i % 3) → own-i → leaf-i: a shared prefix, then a private tail."""
    return {
        "name": f"prefix-{i}",
        "startActionId": 1,
        "endActionId": 4,
        "actions": [
            action(1, "root", BIG),
            action(2, f"shared-{i % 3}", BIG, 1),
            action(3, f"own-{i}", BIG, 2),
            action(4, f"leaf-{i}", SMALL, 3),
        ],
    }


POLICIES = ["cost-benefit", "lru", "gdsf"]


@contextlib.asynccontextmanager
async def running_node(
    tmp_path: Path, policy: str, *, retention_interval_s: float
) -> AsyncIterator[Node]:
    settings = Settings(
        home=tmp_path / "home",
        store_url=f"sqlite:///{tmp_path / 'pingo.db'}",
        storage_capacity_bytes=CAPACITY,
        retention_policy=policy,
        high_water=0.9,
        low_water=0.6,
        retention_interval_s=retention_interval_s,
        deletor_interval_s=0.05,
        poll_interval_s=0.1,
        local_slots=4,
        lease_s=10.0,
        root_actions="everyone",  # CI runs as root (tests/conftest.py)
    )
    settings.home.mkdir(parents=True)
    async with open_store(settings.store_url) as store:
        node = Node(settings, store)
        await node.start()
        try:
            yield node
        finally:
            await node.stop()


@pytest.fixture(params=POLICIES)
async def node(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path, request.param, retention_interval_s=0.05) as started:
        yield started


@pytest.fixture(params=POLICIES)
async def hand_driven(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Node]:
    """A node whose retention loop makes its first pass at start, then sleeps an hour:
    the test makes the passes, so that what a pass measures does not hang on timing."""
    async with running_node(tmp_path, request.param, retention_interval_s=3600) as started:
        yield started


def bytes_in(root: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".staging"]
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in filenames)
    return total


def exists(path: str) -> bool:
    return os.path.exists(path)


async def settle(node: Node, timeout_s: float) -> None:
    """Until retention is under its high mark and the deletor has removed what it marked."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for _ in itertools.count():
        by_state = await node.store.bytes_by_state()
        used = sum(by_state.get(s, 0) for s in states.DATASET_ON_DISK)
        if used <= 0.9 * CAPACITY and not by_state.get(D.STORED_TO_DELETE):
            return
        if loop.time() > deadline:
            return
        await asyncio.sleep(0.05)


async def on_disk(node: Node) -> int:
    by_state = await node.store.bytes_by_state()
    return sum(by_state.get(s, 0) for s in states.DATASET_ON_DISK)


async def test_live_node_keeps_storage_under_its_budget(node: Node) -> None:
    # A first workflow, and one of its intermediates pinned by a user.
    first = await node.workflows.submit(workflow(0), owner="alice")
    done = await node.wait_workflow(first.id, timeout_s=60)
    assert done.state is W.SUCCEEDED, done.error
    actions = {a.action_id: a for a in await node.store.list_actions(first.id)}
    pinned_id = actions[3].dataset_id
    assert await node.store.set_dataset_pinned(pinned_id, True) is not None

    # Then many more, four at a time, sharing the root and three middles.
    leaves = {actions[4].dataset_id}
    for start in range(1, 25, 4):
        submitted = [
            await node.workflows.submit(workflow(i), owner="alice") for i in range(start, start + 4)
        ]
        for record in submitted:
            finished = await node.wait_workflow(record.id, timeout_s=60)
            assert finished.state is W.SUCCEEDED, finished.error
            last = await node.store.get_action(record.id, 4)
            assert last is not None
            leaves.add(last.dataset_id)

    # Storage settles under the budget (the deletor removes what retention marked).
    await settle(node, timeout_s=20)
    assert await on_disk(node) <= 0.9 * CAPACITY
    assert not (await node.store.bytes_by_state()).get(D.STORED_TO_DELETE)
    assert bytes_in(Path(node.storage.root)) <= 0.9 * CAPACITY

    decisions = await recent_decisions(node.store, limit=100)
    assert decisions, "the budget was exceeded, so something must have been evicted"
    assert {d["policy"] for d in decisions} == {node.settings.retention_policy}
    evicted = {d["datasetId"] for d in decisions}
    # Never a LEAF, never the pinned dataset.
    assert not evicted & leaves
    assert pinned_id not in evicted
    pinned = await node.store.get_dataset(pinned_id)
    assert pinned is not None and pinned.state is D.STORED and exists(pinned.path)
    for record in (await node.store.get_datasets(leaves)).values():
        assert record.state is D.LEAF and exists(record.path)
    for dataset_id in evicted:
        record = await node.store.get_dataset(dataset_id)
        assert record is not None
        # Evicted and gone, or recomputed by a later workflow.
        assert record.state in (D.DELETED, D.STORED, D.STORED_TO_DELETE)
        if record.state is D.DELETED:
            assert not exists(record.path)

    # An evicted dataset is simply recomputed: a workflow needing it succeeds.
    again = await node.workflows.submit(workflow(5), owner="bob")
    finished = await node.wait_workflow(again.id, timeout_s=60)
    assert finished.state is W.SUCCEEDED, finished.error


def private(i: int) -> dict[str, Any]:
    """own-i → leaf-i: 1,010 bytes more on disk per workflow, nothing shared."""
    return {
        "name": f"private-{i}",
        "startActionId": 1,
        "endActionId": 2,
        "actions": [action(1, f"own-{i}", BIG), action(2, f"leaf-{i}", SMALL, 1)],
    }


async def test_a_live_pass_evicts_what_is_over_the_high_mark_not_down_to_the_low_one(
    hand_driven: Node,
) -> None:
    node = hand_driven
    assert isinstance(node.retention, RetentionLoop)
    # Five workflows fill 5,050 bytes (high mark 5,400, low 3,600), and a pass looks.
    for i in range(5):
        await succeed(node, private(i))
    assert await node.retention.enforce() == []
    # The sixth takes it to 6,060: 1,010 bytes written within one interval. A pass
    # down to the low mark would evict three of the 1,000-byte intermediates; sized
    # to need it evicts the 660 over the mark plus room for one interval's writes at
    # the rate it measured (1,010 bytes): 1,670 bytes, two intermediates.
    await succeed(node, private(5))
    evicted = await node.retention.enforce()
    assert [e.size_bytes for e in evicted] == [BIG, BIG]
    decisions = await recent_decisions(node.store, limit=100)
    assert {d["datasetId"] for d in decisions} == {e.dataset_id for e in evicted}
    await settle(node, timeout_s=20)
    by_state = await node.store.bytes_by_state()
    staying = by_state.get(D.STORED, 0) + by_state.get(D.LEAF, 0)
    assert staying == 6 * (BIG + SMALL) - 2 * BIG
    assert bytes_in(Path(node.storage.root)) == staying


async def succeed(node: Node, document: dict[str, Any]) -> None:
    record = await node.workflows.submit(document, owner="alice")
    finished = await node.wait_workflow(record.id, timeout_s=60)
    assert finished.state is W.SUCCEEDED, finished.error


DROP_NEW_PLUGIN = '''
class DropNew:
    """Keeps nothing new: every intermediate is deleted once its readers finished."""

    name = "drop-new"

    def select_evictions(self, candidates, bytes_to_free, now):
        return []

    def keep_new(self, dataset, now):
        return False

    def explain_decline(self, dataset, now):
        return f"drop-new: {len(dataset.parents)} parent(s), <b>never kept</b>"
'''


async def test_a_plugin_declining_new_intermediates_makes_them_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real plug-in, registered through an entry point of an installed distribution.
    plugins = tmp_path / "plugins"
    (plugins / "dropnew-0.1.dist-info").mkdir(parents=True)
    (plugins / "pingo_test_dropnew.py").write_text(DROP_NEW_PLUGIN)
    (plugins / "dropnew-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dropnew\nVersion: 0.1\n"
    )
    (plugins / "dropnew-0.1.dist-info" / "entry_points.txt").write_text(
        "[pingo.retention_policies]\ndrop-new = pingo_test_dropnew:DropNew\n"
    )
    monkeypatch.syspath_prepend(str(plugins))
    settings = Settings(
        home=tmp_path / "home",
        store_url=f"sqlite:///{tmp_path / 'pingo.db'}",
        storage_capacity_bytes=10**9,
        retention_policy="drop-new",
        deletor_interval_s=0.05,
        poll_interval_s=0.1,
        root_actions="everyone",  # CI runs as root (tests/conftest.py)
    )
    settings.home.mkdir(parents=True)
    async with open_store(settings.store_url) as store:
        node = Node(settings, store)
        await node.start()
        try:
            document = workflow(0)
            record = await node.workflows.submit(document, owner="alice")
            done = await node.wait_workflow(record.id, timeout_s=60)
            assert done.state is W.SUCCEEDED, done.error
            actions = {a.action_id: a for a in await node.store.list_actions(record.id)}
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            intermediates = [actions[i].dataset_id for i in (1, 2, 3)]
            for _ in itertools.count():
                found = await node.store.get_datasets(intermediates)
                if {d.state for d in found.values()} == {D.DELETED} or loop.time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert {d.state for d in found.values()} == {D.DELETED}
            assert not any(exists(d.path) for d in found.values())
            leaf = await node.store.get_dataset(actions[4].dataset_id)
            assert leaf is not None and leaf.state is D.LEAF and exists(leaf.path)
            # Each decline is a decision with the plug-in's own reason; the leaf was not asked.
            decisions = await recent_decisions(node.store)
            assert sorted(
                (d["kind"], d["datasetId"], d["policy"], d["reason"]) for d in decisions
            ) == sorted(
                (
                    "decline",
                    actions[i].dataset_id,
                    "drop-new",
                    f"drop-new: {n} parent(s), <b>never kept</b>",
                )
                for i, n in ((1, 0), (2, 1), (3, 1))
            )
        finally:
            await node.stop()
    sys.modules.pop("pingo_test_dropnew", None)

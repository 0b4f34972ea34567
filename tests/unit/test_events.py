"""`pingo.events.Follower`: what an SSE stream hands out, on a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pingo import events
from pingo.store import open_store
from pingo.store.protocol import Store
from tests.contract.conftest import FakeClock

START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with open_store(f"sqlite:///{tmp_path / 'pingo.db'}", clock=clock) as opened:
        yield opened


async def test_each_event_once_in_order_across_polls_and_full_pages(
    store: Store, clock: FakeClock
) -> None:
    before = await store.append_event(events.WORKFLOW_SUBMITTED, owner="alice")
    follower = events.Follower(store, "alice", after_seq=before.seq)
    assert await follower.poll(clock()) == []
    appended = []
    for i in range(25):
        appended.append(await store.append_event(events.DATASET_STORED, owner="alice"))
        await store.append_event(events.DATASET_STORED, owner="bob")
        if i % 5 == 0:
            await store.append_event(events.AUDIT, payload={"actor": "root"})
    seen = []
    # Pages of 10 while nothing has settled yet: still every event, once.
    for _ in range(5):
        seen.extend(await follower.poll(clock(), limit=10))
    assert [e.seq for e in seen] == [e.seq for e in appended]
    # Later polls, settled or not, repeat nothing.
    assert await follower.poll(clock()) == []
    clock.advance(events.SETTLE_S + 1)
    assert await follower.poll(clock()) == []
    late = await store.append_event(events.WORKFLOW_FINISHED, owner="alice")
    assert await follower.poll(clock()) == [late]
    assert await follower.poll(clock()) == []


async def test_a_kind_filter_and_a_resumed_position(store: Store, clock: FakeClock) -> None:
    first = await store.append_event(events.WORKFLOW_SUBMITTED, owner="alice")
    failed = await store.append_event(events.ACTION_FAILED, owner="alice")
    ended = await store.append_event(events.WORKFLOW_FINISHED, owner="alice")
    resumed = events.Follower(store, "alice", after_seq=first.seq)
    assert await resumed.poll(clock()) == [failed, ended]
    only = events.Follower(store, "alice", after_seq=0, kind=events.ACTION_FAILED)
    assert await only.poll(clock()) == [failed]

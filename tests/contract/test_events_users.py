"""Usage events and users."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pingo import errors
from pingo.store.protocol import Store
from tests.contract.conftest import Factory, FakeClock


async def test_events_newest_first_with_filters(store: Store, clock: FakeClock) -> None:
    assert await store.list_events() == []
    first = await store.append_event("dataset_used", dataset_id="ds-1", workflow_id="wf-1")
    clock.advance(1)
    second = await store.append_event(
        "retention_decision", dataset_id="ds-2", payload={"policy": "lru", "evicted": ["ds-2"]}
    )
    clock.advance(1)
    third = await store.append_event("dataset_used", dataset_id="ds-2")

    assert first.seq < second.seq < third.seq
    assert third.at - second.at == second.at - first.at == timedelta(seconds=1)
    assert second.payload == {"policy": "lru", "evicted": ["ds-2"]}
    assert (first.kind, first.dataset_id, first.workflow_id, first.payload) == (
        "dataset_used",
        "ds-1",
        "wf-1",
        None,
    )
    assert await store.list_events() == [third, second, first]
    assert await store.list_events(kind="dataset_used") == [third, first]
    assert await store.list_events(dataset_id="ds-2") == [third, second]
    assert await store.list_events(kind="dataset_used", dataset_id="ds-2") == [third]
    assert await store.list_events(limit=1) == [third]
    assert await store.list_events(kind="nothing") == []


async def test_events_by_owner_page_by_sequence(store: Store) -> None:
    """A user's feed: only their events, newest first by `before_seq`, forward by `after_seq`."""
    a1 = await store.append_event("workflow.submitted", workflow_id="wf-a1", owner="alice")
    b1 = await store.append_event("workflow.submitted", workflow_id="wf-b1", owner="bob")
    server = await store.append_event("audit", payload={"actor": "root"})
    a2 = await store.append_event(
        "workflow.finished", workflow_id="wf-a1", owner="alice", payload={"state": "SUCCEEDED"}
    )
    a3 = await store.append_event("action.failed", workflow_id="wf-a2", owner="alice")

    assert (a1.owner, server.owner, a2.payload) == ("alice", None, {"state": "SUCCEEDED"})
    assert await store.list_events(owner="alice") == [a3, a2, a1]
    assert await store.list_events(owner="bob") == [b1]
    assert await store.list_events(owner="carol") == []
    # Newest first, one page at a time, each page strictly older than the last item.
    assert await store.list_events(owner="alice", limit=2) == [a3, a2]
    assert await store.list_events(owner="alice", before_seq=a2.seq, limit=2) == [a1]
    assert await store.list_events(owner="alice", before_seq=a1.seq) == []
    # Forward from a position (an SSE client's Last-Event-ID): oldest first.
    assert await store.list_events(owner="alice", after_seq=a1.seq) == [a2, a3]
    assert await store.list_events(owner="alice", after_seq=a1.seq, limit=1) == [a2]
    assert await store.list_events(owner="alice", after_seq=a3.seq) == []
    assert await store.list_events(owner="alice", after_seq=0) == [a1, a2, a3]
    assert await store.list_events(after_seq=b1.seq, before_seq=a3.seq) == [server, a2]
    assert await store.list_events(kind="audit") == [server]
    assert await store.list_events(owner="alice", kind="action.failed") == [a3]
    assert await store.list_events(owner="alice", limit=0) == []


async def test_event_is_stamped_with_the_store_clock(store: Store, clock: FakeClock) -> None:
    now = clock.advance(42)
    event = await store.append_event("tick")
    assert event.at == now


async def test_users(store: Store, make: Factory) -> None:
    assert await store.list_users() == []
    bob = await store.create_user(make.user(name="bob", is_admin=True))
    alice = await store.create_user(make.user(name="alice"))

    assert await store.get_user("bob") == bob
    assert await store.get_user_by_token_hash(alice.token_hash) == alice
    assert await store.list_users() == [alice, bob]
    assert await store.get_user("carol") is None
    assert await store.get_user_by_token_hash("0" * 64) is None

    with pytest.raises(errors.Conflict):
        await store.create_user(make.user(name="bob"))
    assert await store.get_user("bob") == bob

    assert await store.delete_user("bob") is True
    assert await store.delete_user("bob") is False
    assert await store.get_user_by_token_hash(bob.token_hash) is None
    assert await store.list_users() == [alice]
    # The name is free again.
    again = await store.create_user(make.user(name="bob"))
    assert await store.get_user("bob") == again


async def test_ping(store: Store) -> None:
    await store.ping()

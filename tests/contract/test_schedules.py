"""Schedules, their runs, and webhook deliveries: the same contract on every backend."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from pingo import errors
from pingo.store.protocol import (
    DeliveryChanges,
    ScheduleChanges,
    ScheduleRecord,
    ScheduleRunRecord,
    Store,
    WebhookDeliveryRecord,
)
from tests.contract.conftest import FakeClock, unique


def make_schedule(clock: FakeClock, **overrides: object) -> ScheduleRecord:
    values: dict[str, object] = {
        "id": unique("sch"),
        "owner": "alice",
        "name": "nightly",
        "spec": {"cron": "* * * * * *", "workflow": {"name": "x", "actions": []}},
        "paused": False,
        "next_fire_at": clock() + timedelta(seconds=1),
        "pending_tick_at": None,
        "claimed_by": None,
        "claim_expires_at": None,
        "created_at": clock(),
        "updated_at": clock(),
    }
    values.update(overrides)
    return ScheduleRecord(**values)  # type: ignore[arg-type]


def make_delivery(clock: FakeClock, **overrides: object) -> WebhookDeliveryRecord:
    values: dict[str, object] = {
        "id": unique("dl"),
        "owner": "alice",
        "workflow_id": "wf-1",
        "schedule_id": None,
        "url": "https://example.org/hook",
        "event": "workflow.finished",
        "body": b'{"event":"workflow.finished","state":"SUCCEEDED"}',
        "state": "pending",
        "attempts": 0,
        "next_attempt_at": clock(),
        "created_at": clock(),
        "updated_at": clock(),
    }
    values.update(overrides)
    return WebhookDeliveryRecord(**values)  # type: ignore[arg-type]


async def test_schedule_round_trip_and_listing(store: Store, clock: FakeClock) -> None:
    first = await store.create_schedule(make_schedule(clock))
    clock.advance(1)
    second = await store.create_schedule(make_schedule(clock, owner="bob", paused=True))
    assert await store.get_schedule(first.id) == first
    assert await store.get_schedule("nope") is None
    assert await store.list_schedules() == [second, first]
    assert await store.list_schedules(owner="alice") == [first]
    assert await store.list_schedules(limit=1) == [second]
    with pytest.raises(errors.Conflict):
        await store.create_schedule(first)


async def test_update_is_a_compare_and_set_on_the_version(store: Store, clock: FakeClock) -> None:
    created = await store.create_schedule(make_schedule(clock))
    clock.advance(2)
    tick = created.next_fire_at
    assert tick is not None
    claimed = await store.update_schedule(
        created.id,
        created.version,
        ScheduleChanges(
            next_fire_at=tick + timedelta(seconds=1),
            pending_tick_at=tick,
            claimed_by="node-a",
            claim_expires_at=clock() + timedelta(seconds=10),
        ),
    )
    assert claimed is not None
    assert claimed.version == created.version + 1
    assert claimed.pending_tick_at == tick
    assert claimed.claimed_by == "node-a"
    assert claimed.updated_at == clock()
    assert claimed.spec == created.spec
    # The same expected version again: someone else already moved it.
    assert await store.update_schedule(created.id, created.version, ScheduleChanges()) is None
    cleared = await store.update_schedule(
        created.id, claimed.version, ScheduleChanges(pending_tick_at=None, claimed_by=None)
    )
    assert cleared is not None
    assert (cleared.pending_tick_at, cleared.claimed_by) == (None, None)
    assert cleared.claim_expires_at == claimed.claim_expires_at
    assert await store.update_schedule("nope", 0, ScheduleChanges(paused=True)) is None


async def test_two_claimers_of_one_tick_one_wins(store: Store, clock: FakeClock) -> None:
    created = await store.create_schedule(make_schedule(clock))
    tick = created.next_fire_at
    assert tick is not None
    results = await asyncio.gather(
        *(
            store.update_schedule(
                created.id,
                created.version,
                ScheduleChanges(pending_tick_at=tick, claimed_by=f"node-{i}"),
            )
            for i in range(2)
        )
    )
    assert sum(r is not None for r in results) == 1


async def test_due_schedules(store: Store, clock: FakeClock) -> None:
    now = clock()
    due = await store.create_schedule(make_schedule(clock, next_fire_at=now))
    await store.create_schedule(make_schedule(clock, next_fire_at=now + timedelta(seconds=5)))
    await store.create_schedule(make_schedule(clock, next_fire_at=now, paused=True))
    await store.create_schedule(make_schedule(clock, next_fire_at=None))
    mine = await store.create_schedule(
        make_schedule(
            clock,
            next_fire_at=now + timedelta(seconds=5),
            pending_tick_at=now,
            claimed_by="me",
            claim_expires_at=now + timedelta(seconds=30),
        )
    )
    others = await store.create_schedule(
        make_schedule(
            clock,
            pending_tick_at=now,
            claimed_by="other",
            claim_expires_at=now + timedelta(seconds=30),
        )
    )
    found = await store.list_due_schedules(now, "me")
    assert {s.id for s in found} == {due.id, mine.id}
    # Once the other node's claim expired, its pending tick is up for taking over.
    later = now + timedelta(seconds=31)
    found = await store.list_due_schedules(later, "me")
    assert others.id in {s.id for s in found}
    assert len(await store.list_due_schedules(later, "me", limit=1)) == 1


async def test_due_schedules_page_on_after_a_cursor(store: Store, clock: FakeClock) -> None:
    """`after` pages through the due schedules without a pending tick, by (next_fire_at,
    id), ties included: a pass reads them all, whatever sorts first."""
    now = clock()
    earlier = now - timedelta(seconds=5)
    due = [
        await store.create_schedule(make_schedule(clock, id=f"sch-{name}", next_fire_at=at))
        for name, at in (("b", earlier), ("a", earlier), ("c", now), ("d", earlier))
    ]
    await store.create_schedule(make_schedule(clock, next_fire_at=earlier, paused=True))
    await store.create_schedule(
        make_schedule(clock, next_fire_at=earlier, pending_tick_at=now, claimed_by="me")
    )
    ordered = sorted(due, key=lambda s: (s.next_fire_at, s.id))
    seen: list[str] = []
    cursor = (earlier - timedelta(seconds=1), "")
    while page := await store.list_due_schedules(now, "me", limit=2, after=cursor):
        seen += [s.id for s in page]
        last = page[-1]
        assert last.next_fire_at is not None
        cursor = (last.next_fire_at, last.id)
    assert seen == [s.id for s in ordered] == ["sch-a", "sch-b", "sch-d", "sch-c"]


async def test_runs_are_recorded_once_per_tick(store: Store, clock: FakeClock) -> None:
    schedule = await store.create_schedule(make_schedule(clock))
    tick = clock() + timedelta(seconds=1)
    first = ScheduleRunRecord(schedule.id, tick, "submitted", clock(), workflow_id="wf-1")
    assert await store.record_schedule_run(first) == first
    again = replace(first, workflow_id="wf-2", outcome="skipped")
    assert await store.record_schedule_run(again) == first
    other = ScheduleRunRecord(
        schedule.id, tick + timedelta(seconds=1), "skipped", clock(), None, "x"
    )
    await store.record_schedule_run(other)
    assert await store.list_schedule_runs(schedule.id) == [other, first]
    assert await store.list_schedule_runs(schedule.id, limit=1) == [other]
    assert await store.delete_schedule(schedule.id) is True
    assert await store.delete_schedule(schedule.id) is False
    assert await store.get_schedule(schedule.id) is None
    assert await store.list_schedule_runs(schedule.id) == []


async def test_deliveries_claimed_once_then_updated(store: Store, clock: FakeClock) -> None:
    now = clock()
    due = make_delivery(clock)
    later = make_delivery(clock, next_attempt_at=now + timedelta(seconds=60), owner="bob")
    await store.create_deliveries([due, later])
    await store.create_deliveries([replace(due, url="https://changed.example")])  # idempotent
    claimed = await store.claim_deliveries("node-a", now, 10, lease_s=30)
    assert [d.id for d in claimed] == [due.id]
    assert claimed[0].url == due.url
    assert claimed[0].body == due.body
    assert claimed[0].claimed_by == "node-a"
    assert await store.claim_deliveries("node-b", now, 10, lease_s=30) == []
    done = await store.update_delivery(
        due.id,
        claimed[0].version,
        DeliveryChanges(state="delivered", attempts=1, last_status=204, claimed_by=None),
    )
    assert done is not None
    assert (done.state, done.attempts, done.last_status) == ("delivered", 1, 204)
    assert await store.update_delivery(due.id, claimed[0].version, DeliveryChanges()) is None
    # An expired claim is taken over; a delivered one never again.
    clock.advance(61)
    assert [d.id for d in await store.claim_deliveries("node-b", clock(), 10, 30)] == [later.id]
    assert [d.id for d in await store.list_deliveries(owner="alice")] == [due.id]
    assert {d.id for d in await store.list_deliveries(workflow_id="wf-1")} == {due.id, later.id}
    assert await store.list_deliveries(schedule_id="nope") == []


async def test_update_schedules_claims_many_at_once_each_by_compare_and_set(
    store: Store, clock: FakeClock
) -> None:
    first = await store.create_schedule(make_schedule(clock))
    second = await store.create_schedule(make_schedule(clock))
    tick = clock() + timedelta(seconds=1)
    claim = ScheduleChanges(pending_tick_at=tick, claimed_by="node-a")
    # The second is claimed with a stale version: it loses, the first wins.
    won = await store.update_schedules(
        [(first.id, first.version, claim), (second.id, second.version + 7, claim)]
    )
    assert won[1] is None
    assert won[0] is not None
    assert (won[0].pending_tick_at, won[0].claimed_by) == (tick, "node-a")
    assert won[0].version == first.version + 1
    assert await store.get_schedule(first.id) == won[0]
    assert await store.get_schedule(second.id) == second
    # Another node's batch with the versions it read before loses every claim.
    again = await store.update_schedules([(first.id, first.version, claim)])
    assert again == [None]
    assert await store.update_schedules([]) == []

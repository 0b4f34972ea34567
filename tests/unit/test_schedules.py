"""Schedule rules (cron with seconds, time zones and DST, catch-up) and the settling of
ticks on a real SQLite store with a clock the test moves: a node that dies after
claiming a tick, or after submitting it, loses nothing and doubles nothing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pingo import errors, events, states
from pingo.config import Settings
from pingo.node import Node
from pingo.schedules import rules
from pingo.store import open_store
from pingo.store.protocol import ScheduleRecord, Store, UserRecord
from tests.contract.conftest import FakeClock

START = datetime(2026, 1, 1, tzinfo=UTC)


def spec(**overrides: Any) -> rules.ScheduleSpec:
    body = {"name": "s", "cron": "* * * * * *", "workflow": workflow(), **overrides}
    return rules.parse_spec(body)


def workflow(arg: str = "{schedule.time}") -> dict[str, Any]:
    return {
        "name": "scheduled",
        "startActionId": 1,
        "endActionId": 1,
        "actions": [
            {"id": 1, "name": "a", "type": "command-line", "command": ["echo", arg]},
        ],
    }


# ------------------------------------------------------------------------ rules


def test_six_fields_put_the_seconds_first() -> None:
    every_ten = spec(cron="*/10 * * * * *")
    assert rules.next_tick(every_ten, START) == START + timedelta(seconds=10)
    minutely = spec(cron="* * * * *")
    assert rules.next_tick(minutely, START) == START + timedelta(minutes=1)


def test_time_zones_and_daylight_saving() -> None:
    daily = spec(cron="30 2 * * *", timezone="America/New_York")
    # 2:30 does not exist on 2026-03-08 (spring forward): it fires at 3:00 local.
    ticks = []
    at = datetime(2026, 3, 7, 8, tzinfo=UTC)
    for _ in range(3):
        tick = rules.next_tick(daily, at)
        assert tick is not None
        ticks.append(tick.astimezone(daily.zone).strftime("%d %H:%M %z"))
        at = tick
    assert ticks == ["08 03:00 -0400", "09 02:30 -0400", "10 02:30 -0400"]
    # 1:30 happens twice on 2026-11-01 (fall back): it fires once.
    night = spec(cron="30 1 * * *", timezone="America/New_York")
    at = datetime(2026, 10, 31, 12, tzinfo=UTC)
    fired = []
    for _ in range(2):
        tick = rules.next_tick(night, at)
        assert tick is not None
        fired.append(tick)
        at = tick
    assert fired[1] - fired[0] >= timedelta(hours=24)


def test_start_and_end_bound_the_ticks() -> None:
    bounded = spec(start="2026-01-01T00:00:05+00:00", end="2026-01-01T00:00:07+00:00")
    assert rules.next_tick(bounded, START) == START + timedelta(seconds=5)
    assert rules.next_tick(bounded, START + timedelta(seconds=6)) == START + timedelta(seconds=7)
    assert rules.next_tick(bounded, START + timedelta(seconds=7)) is None


@pytest.mark.parametrize(
    ("policy", "limit", "run", "skipped"),
    [
        ("none", 100, None, 10),  # every due tick is over 2 s late: all missed
        ("latest", 100, 10, 9),
        ("all", 100, 1, 0),
        ("all", 3, 8, 7),
    ],
)
def test_catch_up_after_ten_ticks_were_missed(
    policy: str, limit: int, run: int | None, skipped: int
) -> None:
    # Ticks 1..10 (it ends at 10) are due at 12.5 s; the latest is 2.5 s late (grace 2 s).
    s = spec(catchUp=policy, catchUpLimit=limit, end="2026-01-01T00:00:10+00:00")
    first = START + timedelta(seconds=1)
    decision = rules.decide(s, first, START + timedelta(seconds=12.5), 2.0)
    expected_run = None if run is None else START + timedelta(seconds=run)
    assert decision.run == expected_run
    assert len(decision.skipped) == skipped
    assert len(set(decision.skipped)) == skipped
    if expected_run is not None:
        assert all(t < expected_run for t in decision.skipped)
        following = expected_run + timedelta(seconds=1)
        assert decision.next_fire_at == (following if run != 10 else None)


def test_none_runs_a_tick_that_is_on_time() -> None:
    s = spec(catchUp="none")
    first = START + timedelta(seconds=1)
    decision = rules.decide(s, first, START + timedelta(seconds=1, milliseconds=300), 2.0)
    assert decision.run == first
    assert decision.skipped == ()


def test_the_ticks_end_with_the_calendar() -> None:
    """A tick past the year 9999 cannot be computed: the schedule ends there, as past
    its `end`, instead of raising in the scheduler."""
    last = spec(cron="* * * * *", start="9999-12-31T23:57:30Z")
    ticks = [rules.first_due(last, START)]
    while ticks[-1] is not None:
        ticks.append(rules.next_tick(last, ticks[-1]))
    end = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    assert ticks == [end - timedelta(minutes=1), end, None]
    decision = rules.decide(last, end, end + timedelta(seconds=1), 2.0)
    assert (decision.run, decision.next_fire_at) == (end, None)
    # West of UTC, local ticks late on 31 December 9999 are already in the year 10000 in UTC.
    west = spec(cron="0 * * * *", timezone="Etc/GMT+12", start="9999-12-31T10:00:00")
    last_hour = datetime(9999, 12, 31, 23, tzinfo=UTC)  # 11:00 local; noon is in 10000 in UTC
    assert rules.next_tick(west, last_hour - timedelta(minutes=30)) == last_hour
    assert rules.next_tick(west, last_hour) is None
    # A data trigger's occurrence must have a local time, and a watermark after it.
    east = spec(timezone="Etc/GMT-14")
    assert rules.in_calendar(east, datetime(9999, 12, 31, 9, tzinfo=UTC))
    assert not rules.in_calendar(east, datetime(9999, 12, 31, 10, tzinfo=UTC))
    assert not rules.in_calendar(spec(), datetime.max.replace(tzinfo=UTC))


@pytest.mark.parametrize(
    ("body", "pointer", "code"),
    [
        ({"cron": "0 0 30 2 *"}, "/cron", rules.INVALID_CRON),
        ({"cron": "0 0 0 31 4 *"}, "/cron", rules.INVALID_CRON),
        ({"start": "9999-12-31T23:59:59Z"}, "/start", rules.SCHEMA_VIOLATION),
        ({"timezone": "Etc/GMT+12", "start": "9999-12-31T20:00:00"}, "/start",
         rules.SCHEMA_VIOLATION),
        ({"timezone": "Etc/GMT-14", "start": "0001-01-01T00:00:00"}, "/start",
         rules.SCHEMA_VIOLATION),
        ({"timezone": "Etc/GMT+12", "end": "9999-12-31T23:59:59"}, "/end",
         rules.SCHEMA_VIOLATION),
    ],
)  # fmt: skip
def test_a_definition_without_a_tick_is_refused_where_it_is_parsed(
    body: dict[str, Any], pointer: str, code: str
) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        spec(**body)
    assert [(i.pointer, i.code) for i in refused.value.issues] == [(pointer, code)]


def test_rare_but_real_dates_and_distant_starts_are_accepted() -> None:
    assert rules.next_tick(spec(cron="0 0 29 2 *"), START) == datetime(2028, 2, 29, tzinfo=UTC)
    # A start long past bounds nothing: ticks are computed from now.
    ancient = spec(cron="* * * * *", timezone="America/New_York", start="0001-01-01T00:00:00Z")
    assert rules.first_due(ancient, START) == START + timedelta(minutes=1)


def test_render_replaces_placeholders_everywhere_but_leaves_others() -> None:
    s = spec(
        timezone="Europe/Paris",
        parameters={"region": "eu"},
        workflow=workflow("{schedule.date}/{param.region}/{schedule.time}/{output}"),
    )
    document = rules.render(s, datetime(2026, 6, 30, 22, 30, tzinfo=UTC))
    assert document["actions"][0]["command"][1] == (
        "2026-07-01/eu/2026-07-01T00:30:00+02:00/{output}"
    )


def test_idempotency_keys_name_their_schedule() -> None:
    key = rules.idempotency_key("sch-1", START)
    assert rules.schedule_of(key) == "sch-1"
    assert rules.schedule_of("user-key") is None
    assert rules.schedule_of(None) is None


# -------------------------------------------------------------- settling ticks


class Crash(BaseException):
    """Stands for the process dying at that point (nothing after it runs)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with open_store(f"sqlite:///{tmp_path / 'pingo.db'}", clock=clock) as opened:
        await opened.create_user(UserRecord("alice", "hash", False, START))
        yield opened


def make_node(tmp_path: Path, store: Store, name: str) -> Node:
    settings = Settings(
        home=tmp_path / name,
        store_url=f"sqlite:///{tmp_path / 'pingo.db'}",
        data_root=str(tmp_path / "data"),
        node_id=name,
        schedule_lease_s=5.0,
        schedule_grace_s=2.0,
    )
    return Node(settings, store, executors={}, secret=b"x" * 32)


async def workflows_of(store: Store) -> list[Any]:
    return list((await store.list_workflows(owner="alice", limit=1000)).items)


async def test_a_node_dying_between_claim_and_submit_loses_nothing(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    a, b = make_node(tmp_path, store, "a"), make_node(tmp_path, store, "b")
    created = await a.schedules.create(
        {"name": "s", "cron": "* * * * * *", "workflow": workflow()}, owner="alice"
    )
    clock.advance(1)

    async def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    a.workflows.submit = die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await a.schedules.fire_due()
    pending = await store.get_schedule(created.id)
    assert pending is not None and pending.pending_tick_at == created.next_fire_at
    assert pending.claimed_by == "a"
    # The claim holds: b neither submits nor claims the next tick meanwhile.
    clock.advance(2)
    await b.schedules.fire_due()
    assert await workflows_of(store) == []
    # Once it expired, b takes the tick over and submits it.
    clock.advance(4)
    await b.schedules.fire_due()
    runs = await store.list_schedule_runs(created.id)
    assert created.next_fire_at in {r.tick_at for r in runs}
    assert [r.outcome for r in runs if r.tick_at == created.next_fire_at] == ["submitted"]
    submitted = await workflows_of(store)
    keys = [w.idempotency_key for w in submitted]
    assert len(keys) == len(set(keys)) == len(runs)


async def test_a_node_dying_after_submitting_never_doubles_the_run(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    a, b = make_node(tmp_path, store, "a"), make_node(tmp_path, store, "b")
    created = await a.schedules.create(
        {"name": "s", "cron": "* * * * * *", "workflow": workflow(), "catchUp": "all"},
        owner="alice",
    )
    clock.advance(1)

    async def die(*args: Any, **kwargs: Any) -> None:
        raise Crash

    a.schedules._record = die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await a.schedules.fire_due()
    [first] = await workflows_of(store)
    assert await store.list_schedule_runs(created.id) == []
    clock.advance(6)
    while await b.schedules.fire_due():
        pass
    runs = {r.tick_at: r for r in await store.list_schedule_runs(created.id)}
    assert runs[created.next_fire_at].workflow_id == first.id
    submitted = await workflows_of(store)
    assert len(submitted) == len(runs)  # the takeover made no second workflow
    assert sorted(r.workflow_id or "" for r in runs.values()) == sorted(w.id for w in submitted)


async def test_the_schedules_date_in_a_document_computes_once_a_day(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    """`{schedule.date}` is part of the action's provenance: the ticks of one day share a
    dataset, and the first tick of the next day makes a new one; a user parameter too."""
    node = make_node(tmp_path, store, "a")
    created = await node.schedules.create(
        {
            "name": "daily",
            "cron": "0 */8 * * *",
            "timezone": "Europe/Paris",
            "parameters": {"region": "eu"},
            "workflow": workflow("{schedule.date} {param.region}"),
        },
        owner="alice",
    )
    # Ticks at 00:00, 08:00 and 16:00 Paris time: 23:00, 07:00 and 15:00 UTC.
    assert created.next_fire_at == datetime(2026, 1, 1, 7, tzinfo=UTC)
    for _ in range(4):
        clock.now = await _next_fire(store, created.id)
        assert await node.schedules.fire_due()
    runs = sorted(await store.list_schedule_runs(created.id), key=lambda r: r.tick_at)
    assert [r.tick_at.hour for r in runs] == [7, 15, 23, 7]
    datasets = []
    for run in runs:
        assert run.workflow_id is not None
        [action] = await store.list_actions(run.workflow_id)
        assert action.definition["command"][1].endswith(" eu")
        datasets.append(action.dataset_id)
    # 1 January (07:00, 15:00 UTC), then 2 January in Paris (23:00, 07:00 UTC).
    assert datasets[0] == datasets[1] != datasets[2] == datasets[3]


async def _next_fire(store: Store, schedule_id: str) -> datetime:
    schedule = await store.get_schedule(schedule_id)
    assert schedule is not None and schedule.next_fire_at is not None
    return schedule.next_fire_at


async def test_the_scheduler_sleeps_until_the_next_tick_and_no_less_on_a_store_error(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    settings = Settings(
        home=tmp_path / "a",
        store_url=f"sqlite:///{tmp_path / 'pingo.db'}",
        node_id="a",
        schedule_interval_s=5.0,
    )
    node = Node(settings, store, executors={}, secret=b"x" * 32)
    await node.schedules.create(
        {"name": "s", "cron": "*/2 * * * * *", "workflow": workflow()}, owner="alice"
    )
    clock.advance(0.5)  # the first tick is at START + 2 s
    assert not await node.schedules.fire_due()
    assert node.scheduler.wait_s() == pytest.approx(1.5)
    clock.advance(1.5)
    await node.schedules.fire_due()  # runs it, and knows the next one
    assert node.scheduler.wait_s() == pytest.approx(2.0)
    clock.advance(10)  # what the last pass knew is now past

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise errors.StoreUnavailable("down")

    node.schedules.store.list_due_schedules = unavailable  # type: ignore[method-assign]
    with pytest.raises(errors.StoreUnavailable):
        await node.schedules.fire_due()
    # Retried at the interval, not at once (a past instant would spin the loop).
    assert node.scheduler.wait_s() == 5.0


async def test_two_nodes_racing_on_every_tick_submit_each_once(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    nodes = [make_node(tmp_path, store, f"n{i}") for i in range(3)]
    created = await nodes[0].schedules.create(
        {"name": "s", "cron": "* * * * * *", "workflow": workflow(), "catchUp": "all"},
        owner="alice",
    )
    for _ in range(5):
        clock.advance(1)
        await asyncio.gather(*(n.schedules.fire_due() for n in nodes))
    runs = await store.list_schedule_runs(created.id)
    assert [r.tick_at for r in reversed(runs)] == [
        START + timedelta(seconds=i) for i in range(1, 6)
    ]
    assert len(await workflows_of(store)) == 5


async def test_max_concurrent_skips_or_queues(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    node = make_node(tmp_path, store, "a")  # not started: submitted workflows stay RUNNING
    skip = await node.schedules.create(
        {"name": "skip", "cron": "* * * * * *", "workflow": workflow("skip {schedule.time}"),
         "maxConcurrent": 1},
        owner="alice",
    )  # fmt: skip
    queue = await node.schedules.create(
        {"name": "queue", "cron": "* * * * * *", "workflow": workflow("queue {schedule.time}"),
         "maxConcurrent": 1, "overlap": "queue"},
        owner="alice",
    )  # fmt: skip
    for _ in range(3):
        clock.advance(1)
        await node.schedules.fire_due()
    skipped = await store.list_schedule_runs(skip.id)
    assert [r.outcome for r in reversed(skipped)] == ["submitted", "skipped", "skipped"]
    assert skipped[0].reason == "maxConcurrent"
    queued = await store.get_schedule(queue.id)
    assert queued is not None and queued.pending_tick_at == START + timedelta(seconds=2)
    [running] = [r for r in await store.list_schedule_runs(queue.id)]
    assert running.workflow_id is not None
    await node.outcomes.kill_workflow(running.workflow_id)
    clock.advance(0.1)
    await node.schedules.fire_due()
    after = await store.list_schedule_runs(queue.id)
    assert after[0].tick_at == START + timedelta(seconds=2)
    assert after[0].outcome == "submitted"


async def test_pause_resume_and_a_deleted_owner(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    node = make_node(tmp_path, store, "a")
    created = await node.schedules.create(
        {"name": "s", "cron": "* * * * * *", "workflow": workflow()}, owner="alice"
    )
    paused = await node.schedules.set_paused(created.id, True)
    assert paused.paused
    clock.advance(5)
    await node.schedules.fire_due()
    assert await store.list_schedule_runs(created.id) == []
    resumed = await node.schedules.set_paused(created.id, False)
    assert resumed.next_fire_at == clock() + timedelta(seconds=1)  # nothing caught up
    await store.delete_user("alice")
    clock.advance(1)
    await node.schedules.fire_due()
    [run] = await store.list_schedule_runs(created.id)
    assert run.outcome == "failed"
    with pytest.raises(errors.NotFound):
        await node.schedules.set_paused("sch-missing", True)
    assert states.WorkflowState.RUNNING  # the enum the service counts on


@pytest.mark.parametrize(
    ("stored", "pointer"),
    [
        ({"cron": "0 0 30 2 *"}, "/cron"),
        ({"cron": "* * * * *", "start": "9999-12-31T23:59:59Z"}, "/start"),
        ({"cron": "* * * * *", "timezone": "Etc/GMT+12", "start": "9999-12-31T20:00:00"},
         "/start"),
    ],
)  # fmt: skip
async def test_a_stored_definition_without_a_tick_ends_and_the_others_fire(
    tmp_path: Path, store: Store, clock: FakeClock, stored: dict[str, Any], pointer: str
) -> None:
    """A definition stored before the checks that refuse it (which made croniter or
    datetime raise in the scheduler loop, stopping the node) is ended: its due tick is
    recorded as failed with the reason, it is due no more, and the loop goes on firing
    the other schedules. Resuming it says what is wrong."""
    node = make_node(tmp_path, store, "a")
    good = await node.schedules.create(
        {"name": "good", "cron": "* * * * * *", "workflow": workflow()}, owner="alice"
    )
    due = START + timedelta(seconds=1)
    broken = await store.create_schedule(
        ScheduleRecord(
            id="sch-0123456789abcdef",
            owner="alice",
            name="broken",
            spec={"name": "broken", "workflow": workflow(), **stored},
            paused=False,
            next_fire_at=due,
            pending_tick_at=None,
            claimed_by=None,
            claim_expires_at=None,
            created_at=START,
            updated_at=START,
        )
    )
    for _ in range(3):
        clock.advance(1)
        await node.schedules.fire_due()
    [run] = await store.list_schedule_runs(broken.id)
    assert (run.tick_at, run.outcome) == (due, "failed")
    assert run.reason is not None and f"at '{pointer}'" in run.reason
    ended = await store.get_schedule(broken.id)
    assert ended is not None and ended.next_fire_at is None and ended.pending_tick_at is None
    fired = await store.list_schedule_runs(good.id)
    assert [r.outcome for r in fired] == ["submitted"] * 3
    await node.schedules.set_paused(broken.id, True)
    with pytest.raises(errors.ValidationFailed) as refused:
        await node.schedules.set_paused(broken.id, False)
    assert [i.pointer for i in refused.value.issues] == [pointer]


# ------------------------------------------------------------------ data triggers


async def store_dataset_event(store: Store, workflow_name: str, action_name: str) -> None:
    """What the callback service appends when an action of alice's stores its dataset."""
    await store.append_event(
        events.DATASET_STORED,
        owner="alice",
        workflow_id="wf-producer",
        dataset_id="d" * 64,
        payload={"workflowName": workflow_name, "actionName": action_name, "actionId": 2},
    )


async def test_nodes_racing_on_a_dataset_trigger_run_each_store_once(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    nodes = [make_node(tmp_path, store, f"n{i}") for i in range(3)]
    body = {
        "name": "on-count",
        "trigger": {"dataset": {"workflow": "clicks", "action": "count"}},
        "workflow": workflow(),
    }
    created = await nodes[0].schedules.create(body, owner="alice")
    stored_at = []
    for _ in range(4):
        clock.advance(1)
        await store_dataset_event(store, "clicks", "count")
        stored_at.append(clock())
        # Neither another action nor another workflow of the same action's name fires it.
        await store_dataset_event(store, "clicks", "extract")
        await store_dataset_event(store, "views", "count")
    for _ in range(6):
        await asyncio.gather(*(n.schedules.fire_due() for n in nodes))
    runs = await store.list_schedule_runs(created.id)
    assert sorted(r.tick_at for r in runs) == stored_at
    assert all(r.outcome == "submitted" for r in runs)
    submitted = await workflows_of(store)
    assert len(submitted) == 4
    assert len({w.idempotency_key for w in submitted}) == 4


async def test_a_dataset_trigger_misses_no_store_among_many_others(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    """The owner's other dataset stores, however many between two passes, hide no store
    of the watched action: from a node that has followed the feed, or one just started."""
    a, b = make_node(tmp_path, store, "a"), make_node(tmp_path, store, "b")
    body = {
        "name": "on-count",
        "trigger": {"dataset": {"workflow": "clicks", "action": "count"}},
        "workflow": workflow(),
    }
    created = await a.schedules.create(body, owner="alice")
    assert not await a.schedules.fire_due()  # a follows the feed from here
    stored_at = []
    for _ in range(2):
        clock.advance(1)
        await store_dataset_event(store, "clicks", "count")
        stored_at.append(clock())
        for _ in range(1200):
            await store_dataset_event(store, "clicks", "extract")
    await a.schedules.fire_due()
    await b.schedules.fire_due()  # b reads the feed for the first time
    for _ in range(4):
        await asyncio.gather(a.schedules.fire_due(), b.schedules.fire_due())
    runs = await store.list_schedule_runs(created.id)
    assert sorted(r.tick_at for r in runs) == stored_at
    assert len(await workflows_of(store)) == 2


async def test_a_node_dying_after_claiming_a_trigger_loses_nothing(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    a, b = make_node(tmp_path, store, "a"), make_node(tmp_path, store, "b")
    body = {
        "name": "on-count",
        "trigger": {"dataset": {"workflow": "clicks", "action": "count"}},
        "workflow": workflow(),
    }
    created = await a.schedules.create(body, owner="alice")
    clock.advance(1)
    await store_dataset_event(store, "clicks", "count")
    fired_at = clock()

    async def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    a.workflows.submit = die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await a.schedules.fire_due()
    pending = await store.get_schedule(created.id)
    assert pending is not None and pending.pending_tick_at == fired_at
    await b.schedules.fire_due()  # the claim holds
    assert await workflows_of(store) == []
    clock.advance(6)
    await b.schedules.fire_due()
    runs = await store.list_schedule_runs(created.id)
    assert [(r.tick_at, r.outcome) for r in runs] == [(fired_at, "submitted")]
    for _ in range(3):
        await b.schedules.fire_due()
    assert len(await workflows_of(store)) == 1


async def test_a_path_trigger_polls_a_remote_data_root_through_fsspec(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    """A data root that is not a local directory (fsspec's memory filesystem standing for
    HDFS or S3) is polled through fsspec: the marker fires once when it appears, and
    again when it is written anew."""
    import fsspec

    root = f"memory://pingo-trigger-{os.getpid()}-{id(store)}"
    settings = Settings(
        home=tmp_path / "remote",
        store_url=f"sqlite:///{tmp_path / 'pingo.db'}",
        data_root=root,
        node_id="remote",
    )
    node = Node(settings, store, executors={}, secret=b"x" * 32)
    clock.now = datetime.now(UTC)  # the filesystem's modification times are real ones
    body = {"name": "on-drop", "trigger": {"path": "in/_SUCCESS"}, "workflow": workflow()}
    created = await node.schedules.create(body, owner="alice")
    memory = fsspec.filesystem("memory")
    marker = memory._strip_protocol(f"{root}/in/_SUCCESS")
    assert not await node.schedules.fire_due()  # nothing there yet
    written = []
    for content in (b"1", b"2"):
        await asyncio.sleep(0.01)  # a later modification time
        memory.pipe(marker, content)
        written.append(memory.modified(marker))
        clock.now = datetime.now(UTC)
        for _ in range(2):
            node.schedules._polled.clear()  # look again now, not a second later
            await node.schedules.fire_due()
    runs = await store.list_schedule_runs(created.id)
    assert sorted(r.tick_at for r in runs) == [at.astimezone(UTC) for at in written]
    assert {r.outcome for r in runs} == {"submitted"}
    memory.rm(marker)


async def test_nodes_racing_on_a_path_trigger_run_each_change_once(
    tmp_path: Path, store: Store, clock: FakeClock
) -> None:
    nodes = [make_node(tmp_path, store, f"n{i}") for i in range(3)]
    body = {"name": "on-drop", "trigger": {"path": "in/_SUCCESS"}, "workflow": workflow()}
    created = await nodes[0].schedules.create(body, owner="alice")
    clock.advance(60)  # the changes below happened after the schedule was made, before now
    marker = tmp_path / "data" / "in" / "_SUCCESS"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    changes = []
    for seconds in (10, 20):
        at = START + timedelta(seconds=seconds)
        os.utime(marker, (at.timestamp(), at.timestamp()))
        changes.append(at)
        for node in nodes:
            node.schedules._polled.clear()  # each node looks again now
        await asyncio.gather(*(n.schedules.fire_due() for n in nodes))
        for node in nodes:
            node.schedules._polled.clear()
        await asyncio.gather(*(n.schedules.fire_due() for n in nodes))
    runs = await store.list_schedule_runs(created.id)
    assert sorted(r.tick_at for r in runs) == changes
    assert len(await workflows_of(store)) == 2

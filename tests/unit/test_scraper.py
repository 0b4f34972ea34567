"""The scraper claims into a bounded queue, wakes at once, and never over-claims."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pingo import errors, states
from pingo.actions.executors.noop import NoopExecutor
from pingo.actions.leases import HeldActions
from pingo.actions.scraper import ActionQueue, Scraper
from pingo.actions.submitter import Submitter
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store import open_store, protocol
from pingo.workflows.planner import WorkflowManager

A = states.ActionState


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> AsyncIterator[protocol.Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'pingo.db'}"
    async with open_store(url, clock=clock) as store:
        yield store


def settings_for(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"home": tmp_path / "home", "node_id": "node-a", "lease_s": 30.0}
    values.update(overrides)
    return Settings(**values)


def independent(n: int, tag: str = "") -> dict[str, Any]:
    """`n` actions with no parents: all READY at once."""
    actions = [
        {"id": i, "name": f"a{i}", "type": "command-line", "command": ["step", str(i), tag]}
        for i in range(1, n + 1)
    ]
    return {"name": "flat", "startActionId": 1, "endActionId": n, "actions": actions}


async def submit(
    store: protocol.Store, settings: Settings, document: dict[str, Any], **kwargs: Any
) -> protocol.WorkflowRecord:
    manager = WorkflowManager(
        store, DatasetStorage(str(settings.home / "data")), settings, **kwargs
    )
    return await manager.submit(document, owner="alice")


def make_scraper(
    store: protocol.Store,
    settings: Settings,
    capacities: dict[str, int] | None = None,
    held: HeldActions | None = None,
) -> tuple[Scraper, ActionQueue, HeldActions]:
    queue: ActionQueue = asyncio.Queue()
    held = HeldActions() if held is None else held
    return Scraper(store, settings, queue, held, capacities), queue, held


def _storage(settings: Settings) -> DatasetStorage:
    return DatasetStorage(str(settings.home / "data"))


def make_submitter(
    store: protocol.Store,
    settings: Settings,
    scraper: Scraper,
    queue: ActionQueue,
    held: HeldActions,
    callbacks: OutcomeService,
    executor: NoopExecutor,
) -> Submitter:
    """A submitter taking from `queue` into `executor`, reporting to `callbacks`."""
    return Submitter(
        0,
        store=store,
        settings=settings,
        queue=queue,
        scraper=scraper,
        held=held,
        executors={"command-line": executor},
        staging_path=_storage(settings).staging_path,
        submit_failed=callbacks.submit_failed,
        secret=b"s" * 32,
    )


async def test_claims_no_more_than_the_queue_has_room_for(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=3, claim_batch=64)
    workflow = await submit(store, settings, independent(10))
    scraper, queue, held = make_scraper(store, settings)

    assert await scraper.run_once() is True  # a full batch: there may be more
    assert queue.qsize() == 3 and len(held) == 3
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 3, A.READY: 7}

    # Full queue: nothing claimed, nothing made unavailable to other nodes.
    assert await scraper.run_once() is False
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 3, A.READY: 7}

    item = queue.get_nowait()
    assert item is not None
    assert item.action.state is A.PROCESSING and item.action.owner == "node-a"
    scraper.room_freed()
    await scraper.run_once()
    assert queue.qsize() == 3
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 4, A.READY: 6}


async def test_wakes_at_once_and_claims_batch_after_batch(
    store: protocol.Store, tmp_path: Path
) -> None:
    # A poll interval far beyond the test: only wake() can explain a prompt claim.
    settings = settings_for(tmp_path, poll_interval_s=60.0, claim_batch=2, queue_size=100)
    scraper, queue, _ = make_scraper(store, settings)
    task = asyncio.create_task(scraper.run())
    try:
        await asyncio.sleep(0.05)  # the first pass found nothing and sleeps
        assert queue.empty()
        before = time.perf_counter()
        workflow = await submit(store, settings, independent(7), on_ready=scraper.wake)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while queue.qsize() < 7:
            assert loop.time() < deadline, queue.qsize()
            await asyncio.sleep(0.005)
        assert await store.count_actions(workflow.id) == {A.PROCESSING: 7}
        # Every batch of that backlog dates from the wake, not from its own claim.
        items = [queue.get_nowait() for _ in range(7)]
        ready_at = {item.ready_at for item in items if item is not None}
        assert len(ready_at) == 1 and ready_at.pop() >= before
    finally:
        scraper.stop()
        await task
    assert scraper.finished.is_set()


async def test_reclaims_processing_actions_whose_lease_expired(
    store: protocol.Store, tmp_path: Path, clock: Clock
) -> None:
    dead = settings_for(tmp_path, node_id="dead", lease_s=2.0)
    workflow = await submit(store, dead, independent(2))
    dead_scraper, _, _ = make_scraper(store, dead)
    await dead_scraper.run_once()
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 2}

    alive = settings_for(tmp_path, node_id="alive")
    scraper, queue, _ = make_scraper(store, alive)
    await scraper.run_once()
    assert queue.empty()  # the dead node's leases still hold

    clock.advance(3)
    await scraper.run_once()
    assert queue.qsize() == 2
    for action in await store.list_actions(workflow.id):
        assert action.state is A.PROCESSING and action.owner == "alive"


async def test_claims_by_capacity_and_claims_again_when_work_ends(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=100, claim_batch=64)
    workflow = await submit(store, settings, independent(5, "capacity"))
    scraper, queue, held = make_scraper(store, settings, {"command-line": 2, "spark": 4})
    held.on_release = scraper.capacity_freed

    assert await scraper.run_once() is False  # fewer than the batch: nothing more now
    assert held.count("command-line") == 2
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 2, A.READY: 3}
    # Full for its only type: no claim, the rest stays READY for other nodes.
    assert await scraper.run_once() is False
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 2, A.READY: 3}

    item = queue.get_nowait()
    assert item is not None
    scraper._woken.clear()
    held.remove(item.action.key)  # its work ended
    assert scraper._woken.is_set()  # ...which wakes the next pass
    await scraper.run_once()
    assert held.count("command-line") == 2
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 3, A.READY: 2}


def _ran(held: HeldActions, item: Any, runtime_s: float) -> None:
    """`item`'s work was submitted `runtime_s` ago and has just ended."""
    key = item.action.key
    held.submitted(key, 1, f"ext-{key}")
    entry = held.get(key)
    assert entry is not None and entry.submitted_at is not None
    entry.submitted_at -= runtime_s
    held.remove(key)


async def test_short_actions_are_claimed_ahead_in_batches(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=100, claim_batch=64)
    workflow = await submit(store, settings, independent(12, "ahead"))
    scraper, queue, held = make_scraper(
        store, settings, {"command-line": 2}, HeldActions(ahead_s=0.026)
    )

    await scraper.run_once()
    assert held.count("command-line") == 2  # no runtime known yet: by capacity only
    _ran(held, queue.get_nowait(), 0.01)  # 2 slots finish 5 such within 0.026 s
    assert held.ahead("command-line", 2) == 5
    await scraper.run_once()
    assert held.count("command-line") == 7  # 2 running, 5 ahead
    _ran(held, queue.get_nowait(), 0.01)
    await scraper.run_once()
    assert held.count("command-line") == 6  # one missing: 4 ahead keep the slots busy
    _ran(held, queue.get_nowait(), 0.01)
    await scraper.run_once()
    # Half the ahead missing: claimed now, while 3 ahead still cover the claim's time.
    assert held.count("command-line") == 7
    # Claims of 2, 6 and 2 (the ended ones stay PROCESSING here: nothing reported).
    assert await store.count_actions(workflow.id) == {A.PROCESSING: 10, A.READY: 2}


def test_the_actions_held_ahead_are_bounded_per_slot() -> None:
    """However short a type's actions, a node holds at most 8 per slot ahead."""
    held = HeldActions(ahead_s=0.25)
    held._ran("command-line", 0.0)  # 2 slots would finish 500 such within 0.25 s
    assert held.ahead("command-line", 2) == 16
    assert held.quotas({"command-line": 2}) == {"command-line": 18}


async def test_long_actions_are_claimed_by_capacity_only(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=100, claim_batch=64)
    await submit(store, settings, independent(8, "long"))
    scraper, queue, held = make_scraper(
        store, settings, {"command-line": 2}, HeldActions(ahead_s=0.25)
    )
    await scraper.run_once()
    _ran(held, queue.get_nowait(), 0.6)  # 2 slots finish fewer than one in 0.25 s
    assert held.ahead("command-line", 2) == 0
    await scraper.run_once()
    assert held.count("command-line") == 2


async def test_a_type_found_exhausted_is_not_asked_for_until_news_of_it(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=100, idle_poll_s=3600.0)
    await submit(store, settings, independent(6, "exhausted"))
    asked: list[dict[str, int]] = []
    claim = store.claim_actions

    async def recording(*args: Any, **kwargs: Any) -> list[protocol.ActionRecord]:
        asked.append(dict(kwargs["quotas"]))
        return await claim(*args, **kwargs)

    store.claim_actions = recording  # type: ignore[method-assign]
    scraper, queue, held = make_scraper(store, settings, {"command-line": 1, "spark": 4})
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 4}  # no spark READY: spark exhausted
    held.remove(queue.get_nowait().action.key)
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 0}
    held.remove(queue.get_nowait().action.key)
    scraper.wake({"command-line"})
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 0}
    held.remove(queue.get_nowait().action.key)
    scraper.wake({"spark"})  # news of spark work (None, or another node's, alike)
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 4}
    held.remove(queue.get_nowait().action.key)
    scraper.ready_elsewhere()
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 4}
    held.remove(queue.get_nowait().action.key)
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 0}
    held.remove(queue.get_nowait().action.key)
    scraper.timed_out = True  # a poll, for what other nodes made READY
    await scraper.run_once()
    assert asked[-1] == {"command-line": 1, "spark": 4}


async def test_news_during_a_claim_keeps_its_type_wanted(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, queue_size=100, idle_poll_s=3600.0)
    asked: list[dict[str, int]] = []
    claim = store.claim_actions
    scraper = Scraper(store, settings, asyncio.Queue(), HeldActions(), {"command-line": 4})

    async def racing(*args: Any, **kwargs: Any) -> list[protocol.ActionRecord]:
        asked.append(dict(kwargs["quotas"]))
        got = await claim(*args, **kwargs)
        if len(asked) == 1:
            scraper.wake({"command-line"})  # made READY after the claim's read
        return got

    store.claim_actions = racing  # type: ignore[method-assign]
    await scraper.run_once()  # finds nothing, but news came meanwhile
    await scraper.run_once()
    assert asked == [{"command-line": 4}, {"command-line": 4}]


async def test_no_executor_for_a_type_means_no_claim_of_it(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path)
    workflow = await submit(store, settings, independent(3, "other"))
    scraper = Scraper(store, settings, asyncio.Queue(), HeldActions(), {"spark": 8})
    assert await scraper.run_once() is False
    assert await store.count_actions(workflow.id) == {A.READY: 3}


async def test_polls_fast_while_it_finds_work_and_backs_off_when_idle(
    store: protocol.Store, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, fast_poll_s=0.01, idle_poll_s=0.05, poll_interval_s=5.0)
    scraper, _, _ = make_scraper(store, settings)
    intervals = []
    for _ in range(5):
        await scraper.run_once()
        intervals.append(scraper.interval_s)
    assert intervals == [0.02, 0.04, 0.05, 0.05, 0.05]  # doubling to the idle ceiling
    await submit(store, settings, independent(2, "poll"))
    await scraper.run_once()
    assert scraper.interval_s == 0.01  # found work: look again soon
    # With the store pushing READY events, polling is only the slow safety net.
    scraper.pushed = True
    await scraper.run_once()
    assert scraper.interval_s == 5.0


async def test_a_stale_claim_losing_its_submit_leaves_the_held_claim_alone(
    store: protocol.Store, tmp_path: Path, clock: Clock
) -> None:
    # The node claims the action, its lease lapses before a submitter takes it, and the
    # same node claims it again: two claims of one key in the queue, one hold.
    settings = settings_for(tmp_path, lease_s=2.0)
    workflow = await submit(store, settings, independent(1))
    scraper, queue, held = make_scraper(store, settings)
    await scraper.run_once()
    clock.advance(3)
    await scraper.run_once()
    assert queue.qsize() == 2 and len(held) == 1
    callbacks = OutcomeService(store, _storage(settings), settings)
    executor = NoopExecutor(callbacks)
    submitter = make_submitter(store, settings, scraper, queue, held, callbacks, executor)
    # The first claim submits it; the second loses its compare-and-set. Before the fix,
    # that loss dropped the hold of the running attempt (its lease then went unrenewed
    # and another node's reaper ran it again).
    assert await submitter.run_once() and await submitter.run_once()
    await executor.close()
    action = await store.get_action(workflow.id, 1)
    assert action is not None and action.attempts == 1
    assert executor.submitted == 1
    assert action.key in held


def test_claim_ahead_is_read_from_the_environment_and_checked(tmp_path: Path) -> None:
    home = {"PINGO_HOME": str(tmp_path)}
    assert Settings.from_env(home).claim_ahead_s == 0.1
    assert Settings.from_env({**home, "PINGO_CLAIM_AHEAD_S": "0"}).claim_ahead_s == 0
    for bad in ("-1", "inf", "nan", "soon"):
        with pytest.raises(errors.ConfigurationError, match="PINGO_CLAIM_AHEAD_S"):
            Settings.from_env({**home, "PINGO_CLAIM_AHEAD_S": bad})


class _OutOfProcesses(NoopExecutor):
    """The spawn's EAGAIN (the server's user out of processes), which cannot be made
    here on purpose without starving the machine (tests/integration/test_sandbox.py
    reaches the process limits themselves)."""

    async def submit(self, submission: Any) -> str:
        raise BlockingIOError(11, "Resource temporarily unavailable")


async def test_a_spawn_out_of_processes_defers_the_action_without_spending_an_attempt(
    store: protocol.Store, tmp_path: Path, clock: Clock
) -> None:
    """A red-team review's fork bombs, each within its own limit, used up the server
    user's processes: another user's action failed its three attempts in three seconds."""
    settings = settings_for(tmp_path, retry_backoff_s=5.0)
    workflow = await submit(store, settings, independent(1))
    scraper, queue, held = make_scraper(store, settings)
    await scraper.run_once()
    callbacks = OutcomeService(store, _storage(settings), settings)
    executor = _OutOfProcesses(callbacks)
    submitter = make_submitter(store, settings, scraper, queue, held, callbacks, executor)
    assert await submitter.run_once()
    action = await store.get_action(workflow.id, 1)
    assert action is not None
    assert (action.state, action.attempts, action.owner) == (A.READY, 0, None)
    assert action.not_before == clock.now + timedelta(seconds=5)
    assert action.key not in held
    assert await scraper.run_once() is False and queue.empty()  # not before its time

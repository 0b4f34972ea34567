"""Schedules as a resource, and the settling of their ticks.

Exactly once across nodes: a node *claims* a tick by a compare-and-set that
moves the schedule's `next_fire_at` past the tick and records it as the
`pending_tick_at`, with the node's id and a claim expiry. It then submits the
workflow with an idempotency key made of the schedule id and the tick, records
the run, and clears the pending tick (another compare-and-set). A node that dies
anywhere in between leaves the pending tick in the store: once the claim
expired, another node takes it over and submits it again, and the idempotency
key turns that second submission into the first one's workflow. So a tick is
never lost (it is pending until settled) and never doubled (one key, one workflow).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from pingo import errors, events, metrics, states, untrusted
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.schedules import rules
from pingo.store.protocol import (
    ScheduleChanges,
    ScheduleRecord,
    ScheduleRunRecord,
    Store,
    UserLimits,
    WorkflowRecord,
)
from pingo.webhooks import hooks
from pingo.workflows import language
from pingo.workflows.planner import WorkflowManager

logger = logging.getLogger(__name__)

#: Due schedules read from the store at a time.
DUE_PAGE = 100
#: Pages of due schedules one pass reads at most. A pass reads on, page after page, until
#: it saw every due schedule, so that no schedule is hidden behind others that sort
#: first (a data trigger's watermark is always due); past this many pages the next pass
#: goes on where this one stopped (after the first page again), a rotation.
DUE_PAGES = 20
#: How many schedules one scheduler pass handles at once.
_PARALLEL = 50
#: How many due cron ticks one pass claims (in one store call).
_CLAIM_BATCH = _PARALLEL
#: Parsed schedule definitions kept per node.
_SPEC_CACHE = 10_000
#: Retries of a pause or resume that lost a compare-and-set to the scheduler.
_CAS_RETRIES = 20
#: A path trigger is looked at this often per node (a remote data root is slow to ask).
_PATH_POLL_S = 1.0
#: A page of the owner's dataset stores, as a dataset trigger reads them.
_TRIGGER_PAGE = 500
#: Pages one pass reads for one dataset trigger (more wait for the next pass).
_TRIGGER_PAGES = 20
#: The watermark moves just past the occurrence that fired.
_AFTER = timedelta(microseconds=1)
#: The shortest wait between passes while a tick is about to be due (no busy loop on a
#: clock that reads a hair before the tick).
_MIN_WAIT_S = 0.001
#: A tick whose workflow has more actions than this is planned in a child process when
#: the node can (`Node.submit_detached`), as a big submission over the API is: planning
#: 20,000 actions here would hold the event loop, and their memory, for seconds.
DETACHED_ACTIONS = untrusted.BIG_ACTIONS


class DetachedSubmit(Protocol):
    """Plans and stores a tick's big workflow in a child process (`Node.submit_tick`)."""

    def __call__(
        self,
        document: dict[str, Any],
        *,
        owner: str,
        idempotency_key: str,
        cap: UserLimits | None,
    ) -> Awaitable[WorkflowRecord]: ...


def new_schedule_id() -> str:
    return f"sch-{secrets.token_hex(8)}"


@dataclass(slots=True)
class _StoreWatch:
    """What one node knows of a dataset trigger's occurrences: the owner's feed of
    dataset stores followed from before the watermark, and the watched action's stores
    found in it (their times), however many other stores came between two passes."""

    follower: events.Follower
    occurrences: set[datetime] = field(default_factory=set)


class ScheduleService:
    """Create, pause, resume and delete schedules; claim and settle their ticks."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        workflows: WorkflowManager,
        storage: DatasetStorage | None = None,
        detached: DetachedSubmit | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.workflows = workflows
        #: Where a big tick's workflow is planned, when not here (`DETACHED_ACTIONS`).
        self.detached = detached
        #: The data root that path triggers watch.
        self.storage = storage
        #: When this node last looked at each path trigger (monotonic seconds).
        self._polled: dict[str, float] = {}
        #: The feed each dataset trigger follows on this node, by schedule id.
        self._watches: OrderedDict[str, _StoreWatch] = OrderedDict()
        self._parallel = asyncio.Semaphore(_PARALLEL)
        #: Parsed definitions by schedule id (a schedule's definition never changes).
        self._specs: OrderedDict[str, rules.ScheduleSpec] = OrderedDict()
        #: The soonest instant the last pass saw something become due (a tick, or another
        #: node's claim expiring): the scheduler wakes then rather than at its next poll.
        self._soonest: datetime | None = None
        #: Where the next pass goes on reading due schedules, when the last one stopped
        #: after `DUE_PAGES` pages (None: it saw them all).
        self._resume: tuple[datetime, str] | None = None

    def spec(self, schedule: ScheduleRecord) -> rules.ScheduleSpec:
        """The schedule's parsed definition (cached: parsing checks the cron every time)."""
        spec = self._specs.get(schedule.id)
        if spec is None:
            spec = self._specs[schedule.id] = rules.parse_spec(schedule.spec)
            if len(self._specs) > _SPEC_CACHE:
                self._specs.popitem(last=False)
        return spec

    # ---------------------------------------------------------------- resource

    async def create(self, body: Any, *, owner: str) -> ScheduleRecord:
        """Check the definition (and its workflow, as a tick would submit it) and store it."""
        spec = rules.parse_spec(body)
        now = self.store.clock()
        self.check_workflow(spec, now)
        hooks.parse_webhooks(spec.webhooks, "/webhooks", self.settings)
        await self.check_schedule_cap(owner)
        record = ScheduleRecord(
            id=new_schedule_id(),
            owner=owner,
            name=spec.name,
            spec=dict(body),
            paused=bool(body.get("paused", False)),
            next_fire_at=rules.first_due(spec, now),
            pending_tick_at=None,
            claimed_by=None,
            claim_expires_at=None,
            created_at=now,
            updated_at=now,
        )
        created = await self.store.create_schedule(record)
        logger.info(
            "schedule %s (%s) created for %s: %s in %s, next at %s",
            created.id,
            created.name,
            owner,
            spec.cron,
            spec.timezone,
            created.next_fire_at,
            extra={"event": "schedule_created", "schedule_id": created.id},
        )
        return created

    async def check_schedule_cap(self, owner: str) -> None:
        """Refuse (403) a new schedule of `owner` when they have `user_max_schedules`.

        Counted in the store, so every node sharing it sees the same number; admins are
        exempt. Two creations at the same instant may both pass the count. Not a 429:
        waiting does not help, only deleting a schedule does.
        """
        cap = self.settings.user_max_schedules
        if cap is None:
            return
        user = await self.store.get_user(owner)
        if user is not None and user.is_admin:
            return
        held = len(await self.store.list_schedules(owner=owner, limit=cap))
        if held >= cap:
            raise errors.TooManySchedules(
                f"{owner} has {held} schedules, the most allowed ({cap}); "
                "delete one to make another"
            )

    def check_workflow(self, spec: rules.ScheduleSpec, now: datetime) -> None:
        """Validate the workflow document as a tick at `now` would submit it."""
        issues = language.validate(rules.render(spec, now), max_actions=self.settings.max_actions)
        hooks.parse_webhooks(spec.workflow.get("webhooks", []), "/workflow/webhooks", self.settings)
        if issues:
            raise errors.ValidationFailed(
                [errors.ValidationIssue(i.code, i.message, "/workflow" + i.pointer) for i in issues]
            )

    async def set_paused(self, schedule_id: str, paused: bool) -> ScheduleRecord:
        """Pause (no tick is claimed), or resume from the next tick after now (none caught up)."""
        for _ in range(_CAS_RETRIES):
            current = await self.store.get_schedule(schedule_id)
            if current is None:
                raise errors.NotFound(f"no schedule {schedule_id!r}")
            if current.paused == paused:
                return current
            changes = ScheduleChanges(paused=paused)
            if not paused:
                spec = rules.parse_spec(current.spec)
                changes = ScheduleChanges(
                    paused=False, next_fire_at=rules.first_due(spec, self.store.clock())
                )
            updated = await self.store.update_schedule(schedule_id, current.version, changes)
            if updated is not None:
                logger.info(
                    "schedule %s %s",
                    schedule_id,
                    "paused" if paused else "resumed",
                    extra={"event": "schedule_paused" if paused else "schedule_resumed"},
                )
                return updated
        raise errors.Conflict(f"schedule {schedule_id!r} kept changing; try again")

    async def delete(self, schedule_id: str) -> None:
        if not await self.store.delete_schedule(schedule_id):
            raise errors.NotFound(f"no schedule {schedule_id!r}")
        logger.info(
            "schedule %s deleted",
            schedule_id,
            extra={"event": "schedule_deleted", "schedule_id": schedule_id},
        )

    # ------------------------------------------------------------------- ticks

    async def fire_due(self) -> bool:
        """One scheduler pass: act on every due schedule; True when more may be due now.

        The pass also reads what becomes due within one scheduler interval, so that the
        loop sleeps until then (`wait_s`): a tick is submitted when due, not up to an
        interval later at the next poll.
        """
        # Forgotten first: a pass that fails on the store must not leave a past instant
        # behind, which would make the loop retry at once instead of at its interval.
        self._soonest = None
        now = self.store.clock()
        horizon = now + timedelta(seconds=self.settings.schedule_interval_s)
        found = await self._list_due(horizon)
        due = [s for s in found if self._due_now(s, now)]
        self._soonest = min(
            (at for s in found if (at := self._due_next(s, now)) is not None), default=None
        )
        if not due:
            return False
        # Nodes walk the due schedules in different orders, so that they mostly claim
        # different ticks instead of all racing for the same ones first.
        random.shuffle(due)
        ticking = [s for s in due if self._claimable_tick(s)]
        others = [s for s in due if not self._claimable_tick(s)]
        # A share at a time: claiming every due tick at once would hand them all to the
        # first node to look, which then submits them alone while the others idle.
        claimed = await self._claim_ticks(ticking[:_CLAIM_BATCH], now)
        for _, decision in claimed:
            self._expect(decision.next_fire_at)
        progressed = await asyncio.gather(
            *(self._guarded(s, now) for s in others),
            *(self._guarded_settle(c, d, now) for c, d in claimed),
        )
        return any(progressed) or len(ticking) > _CLAIM_BATCH

    async def _list_due(self, horizon: datetime) -> list[ScheduleRecord]:
        """The schedules due by `horizon`: the first page (pending ticks and the soonest),
        then page after page of the others, at most `DUE_PAGES` in all; a pass that
        stopped there makes the next one go on after the last it read."""
        node_id = self.settings.node_id
        found = await self.store.list_due_schedules(horizon, node_id, limit=DUE_PAGE)
        if len(found) < DUE_PAGE:
            self._resume = None
            return found
        # Schedules without a pending tick come in (next_fire_at, id) order on every
        # page, those of the first page before any other: go on after its last one.
        cursor = max(
            (
                (at, s.id)
                for s in found
                if s.pending_tick_at is None and (at := s.next_fire_at) is not None
            ),
            default=(datetime.min.replace(tzinfo=horizon.tzinfo), ""),
        )
        if self._resume is not None and self._resume > cursor:
            cursor = self._resume
        seen = {s.id for s in found}
        for _ in range(DUE_PAGES - 1):
            page = await self.store.list_due_schedules(
                horizon, node_id, limit=DUE_PAGE, after=cursor
            )
            found += [s for s in page if s.id not in seen]
            seen.update(s.id for s in page)
            if len(page) < DUE_PAGE:
                self._resume = None
                return found
            last = page[-1]
            assert last.next_fire_at is not None
            cursor = (last.next_fire_at, last.id)
        self._resume = cursor
        return found

    def wait_s(self, interval_s: float) -> float:
        """How long the scheduler may sleep: until the soonest due instant the last pass
        saw, at most `interval_s` (schedules made or changed on other nodes are found by
        polling)."""
        if self._soonest is None:
            return interval_s
        until = (self._soonest - self.store.clock()).total_seconds()
        return min(interval_s, max(until, _MIN_WAIT_S))

    def _expect(self, at: datetime | None) -> None:
        if at is not None and (self._soonest is None or at < self._soonest):
            self._soonest = at

    def _due_now(self, schedule: ScheduleRecord, now: datetime) -> bool:
        """Whether `list_due_schedules(now)` would have listed it (the pass read ahead)."""
        if schedule.pending_tick_at is not None:
            expires = schedule.claim_expires_at
            return schedule.claimed_by == self.settings.node_id or expires is None or expires <= now
        return (
            not schedule.paused
            and schedule.next_fire_at is not None
            and schedule.next_fire_at <= now
        )

    def _due_next(self, schedule: ScheduleRecord, now: datetime) -> datetime | None:
        """When a schedule listed ahead of time becomes due (None if it is due now)."""
        if self._due_now(schedule, now):
            return None
        if schedule.pending_tick_at is not None:
            return schedule.claim_expires_at  # another node's claim, taken over then
        return schedule.next_fire_at

    def _claimable_tick(self, schedule: ScheduleRecord) -> bool:
        """Whether the schedule's next cron tick is to be claimed (the batched path)."""
        if schedule.pending_tick_at is not None or schedule.next_fire_at is None:
            return False
        try:
            return self.spec(schedule).trigger is None
        except errors.PingoError:
            return False  # `_advance` ends it, and says why

    async def _claim_ticks(
        self, due: list[ScheduleRecord], now: datetime
    ) -> list[tuple[ScheduleRecord, rules.TickDecision]]:
        """Claim the next tick of every schedule in `due` in one store call: each claim
        is its own compare-and-set (as in `_advance`), so nodes racing for the same
        schedules split them, one winner each. Returns the claims won."""
        node_id = self.settings.node_id
        lease = now + timedelta(seconds=self.settings.schedule_lease_s)
        decisions: list[rules.TickDecision] = []
        updates: list[tuple[str, int, ScheduleChanges]] = []
        for schedule in due:
            assert schedule.next_fire_at is not None
            decision = rules.decide(
                self.spec(schedule), schedule.next_fire_at, now, self.settings.schedule_grace_s
            )
            decisions.append(decision)
            runs = decision.run is not None
            updates.append(
                (
                    schedule.id,
                    schedule.version,
                    ScheduleChanges(
                        next_fire_at=decision.next_fire_at,
                        pending_tick_at=decision.run,
                        claimed_by=node_id if runs else None,
                        claim_expires_at=lease if runs else None,
                    ),
                )
            )
        results = await self.store.update_schedules(updates)
        return [(won, d) for won, d in zip(results, decisions, strict=True) if won is not None]

    async def _guarded_settle(
        self, schedule: ScheduleRecord, decision: rules.TickDecision, now: datetime
    ) -> bool:
        async with self._parallel:
            try:
                return await self._claimed(schedule, decision, now)
            except errors.StoreUnavailable:
                raise
            except errors.PingoError as exc:
                logger.warning(
                    "schedule %s: %s",
                    schedule.id,
                    exc.message,
                    extra={"event": "schedule_tick_error", "schedule_id": schedule.id},
                )
                return False

    async def _guarded(self, schedule: ScheduleRecord, now: datetime) -> bool:
        async with self._parallel:
            try:
                return await self._advance(schedule, now)
            except errors.StoreUnavailable:
                raise
            except errors.PingoError as exc:
                logger.warning(
                    "schedule %s: %s",
                    schedule.id,
                    exc.message,
                    extra={"event": "schedule_tick_error", "schedule_id": schedule.id},
                )
                return False

    async def _advance(self, schedule: ScheduleRecord, now: datetime) -> bool:
        """Claim the schedule's next tick, or take over its pending one; then settle it."""
        try:
            spec = self.spec(schedule)
        except errors.ValidationFailed as exc:
            # Stored before a check that refuses it now (a cron that never fires, a start
            # in the year 9999): left due, it would be listed and refused at every pass.
            tick = schedule.pending_tick_at or schedule.next_fire_at
            return await self._end(schedule, tick, _invalid(exc))
        node_id = self.settings.node_id
        lease = now + timedelta(seconds=self.settings.schedule_lease_s)
        if schedule.pending_tick_at is not None:
            if schedule.claimed_by != node_id:
                taken = await self.store.update_schedule(
                    schedule.id,
                    schedule.version,
                    ScheduleChanges(claimed_by=node_id, claim_expires_at=lease),
                )
                if taken is None:
                    return False
                logger.info(
                    "schedule %s: took over tick %s from %s",
                    schedule.id,
                    schedule.pending_tick_at,
                    schedule.claimed_by,
                    extra={"event": "schedule_tick_taken_over", "schedule_id": schedule.id},
                )
                schedule = taken
            return await self._settle(schedule, now)
        if schedule.next_fire_at is None:
            return False
        if spec.trigger is not None:
            return await self._triggered(schedule, spec, now)
        decision = rules.decide(spec, schedule.next_fire_at, now, self.settings.schedule_grace_s)
        claimed = await self.store.update_schedule(
            schedule.id,
            schedule.version,
            ScheduleChanges(
                next_fire_at=decision.next_fire_at,
                pending_tick_at=decision.run,
                claimed_by=node_id if decision.run is not None else None,
                claim_expires_at=lease if decision.run is not None else None,
            ),
        )
        if claimed is None:
            return False  # another node claimed it first
        return await self._claimed(claimed, decision, now)

    async def _claimed(
        self, claimed: ScheduleRecord, decision: rules.TickDecision, now: datetime
    ) -> bool:
        """After a won claim: record the ticks skipped, then settle the one to run."""
        spec = self.spec(claimed)
        for tick in decision.skipped:
            await self._record(claimed, tick, "skipped", reason=f"catch-up {spec.catch_up}")
        if decision.skipped:
            metrics.SCHEDULE_TICKS.labels(outcome="skipped").inc(len(decision.skipped))
            logger.info(
                "schedule %s: skipped %d tick(s) up to %s (catch-up %s)",
                claimed.id,
                len(decision.skipped),
                decision.skipped[0],
                spec.catch_up,
                extra={"event": "schedule_ticks_skipped", "schedule_id": claimed.id},
            )
        if decision.run is None:
            return True
        return await self._settle(claimed, now)

    async def _triggered(
        self, schedule: ScheduleRecord, spec: rules.ScheduleSpec, now: datetime
    ) -> bool:
        """Claim the data trigger's oldest occurrence at or after the watermark; settle it."""
        assert spec.trigger is not None and schedule.next_fire_at is not None
        if spec.trigger.kind == "dataset":
            tick = await self._stored_since(schedule, spec.trigger, schedule.next_fire_at)
        else:
            tick = await self._appeared_since(schedule, spec.trigger, schedule.next_fire_at)
        if tick is None:
            return False
        if not rules.in_calendar(spec, tick):
            # Nothing later can come after it (the watermark would move past the year 9999).
            return await self._end(
                schedule,
                tick,
                f"the occurrence at {tick.isoformat()} has no time in {spec.timezone} "
                "before the calendar ends (the year 9999)",
            )
        lease = now + timedelta(seconds=self.settings.schedule_lease_s)
        # The same compare-and-set as a cron tick's: the watermark moves past the
        # occurrence, which becomes the pending tick; one node wins it.
        claimed = await self.store.update_schedule(
            schedule.id,
            schedule.version,
            ScheduleChanges(
                next_fire_at=tick + _AFTER,
                pending_tick_at=tick,
                claimed_by=self.settings.node_id,
                claim_expires_at=lease,
            ),
        )
        if claimed is None:
            return False
        metrics.SCHEDULE_TRIGGERS.labels(kind=spec.trigger.kind).inc()
        logger.info(
            "schedule %s: %s trigger fired at %s",
            schedule.id,
            spec.trigger.kind,
            tick.isoformat(),
            extra={"event": "schedule_triggered", "schedule_id": schedule.id},
        )
        return await self._settle(claimed, now)

    async def _stored_since(
        self, schedule: ScheduleRecord, trigger: rules.Trigger, since: datetime
    ) -> datetime | None:
        """When the watched dataset was first stored at or after `since` (its owner's feed)."""
        watch = self._watches.get(schedule.id)
        if watch is None:
            watch = self._watches[schedule.id] = await self._watch(schedule, since)
            if len(self._watches) > _SPEC_CACHE:
                self._watches.popitem(last=False)
        now = self.store.clock()
        for _ in range(_TRIGGER_PAGES):
            fresh = await watch.follower.poll(now, limit=_TRIGGER_PAGE)
            watch.occurrences.update(
                e.at
                for e in fresh
                if e.payload is not None
                and e.payload.get("workflowName") == trigger.workflow
                and e.payload.get("actionName") == trigger.action
            )
            if len(fresh) < _TRIGGER_PAGE:
                break
        # Another node may have moved the watermark past some of them.
        watch.occurrences = {at for at in watch.occurrences if at >= since}
        return min(watch.occurrences, default=None)

    async def _watch(self, schedule: ScheduleRecord, since: datetime) -> _StoreWatch:
        """Follow the owner's dataset stores from the newest one settled before `since`:
        the feed is read backwards page by page until one is older (once per node)."""
        settled = since - timedelta(seconds=events.SETTLE_S)
        floor, before = 0, None
        while True:
            page = await self.store.list_events(
                owner=schedule.owner,
                kind=events.DATASET_STORED,
                before_seq=before,
                limit=_TRIGGER_PAGE,
            )
            older = next((e for e in page if e.at < settled), None)
            if older is not None:
                floor = older.seq
                break
            if len(page) < _TRIGGER_PAGE:
                break
            before = page[-1].seq
        follower = events.Follower(self.store, schedule.owner, floor, kind=events.DATASET_STORED)
        return _StoreWatch(follower)

    async def _appeared_since(
        self, schedule: ScheduleRecord, trigger: rules.Trigger, since: datetime
    ) -> datetime | None:
        """The watched path's modification time, if it exists and changed at or after `since`."""
        if self.storage is None or trigger.path is None:
            return None
        clock = time.monotonic()
        if clock - self._polled.get(schedule.id, -_PATH_POLL_S) < _PATH_POLL_S:
            return None
        self._polled[schedule.id] = clock
        if len(self._polled) > _SPEC_CACHE:
            self._polled.pop(next(iter(self._polled)))
        try:
            modified = await self.storage.modified_at(trigger.path)
        except (OverflowError, ValueError) as exc:
            # A modification time past the year 9999 (a remote root, or a filesystem with
            # 64-bit times) is no datetime: no occurrence, until the path changes again.
            logger.warning(
                "schedule %s: %s has no usable modification time: %s",
                schedule.id,
                trigger.path,
                exc,
                extra={"event": "schedule_tick_error", "schedule_id": schedule.id},
            )
            return None
        if modified is None or modified < since:
            return None
        return modified

    async def _settle(self, schedule: ScheduleRecord, now: datetime) -> bool:
        """Submit the pending tick (or skip or queue it per `maxConcurrent`); clear it."""
        tick = schedule.pending_tick_at
        assert tick is not None
        spec = self.spec(schedule)
        if spec.max_concurrent is not None:
            running = await self._running(schedule, spec.max_concurrent, tick)
            if running >= spec.max_concurrent:
                if spec.overlap == "queue":
                    # Keep the tick pending (and the claim alive) until a run ends.
                    await self.store.update_schedule(
                        schedule.id,
                        schedule.version,
                        ScheduleChanges(
                            claim_expires_at=now + timedelta(seconds=self.settings.schedule_lease_s)
                        ),
                    )
                    return False
                await self._record(schedule, tick, "skipped", reason="maxConcurrent")
                metrics.SCHEDULE_TICKS.labels(outcome="skipped").inc()
                return await self._clear(schedule)
        owner = await self.store.get_user(schedule.owner)
        if owner is None:
            # A revoked owner's schedule stays (it comes back with a reclaimed name), but
            # runs as nobody meanwhile; a new user of the name must reclaim it on purpose.
            await self._record(schedule, tick, "failed", reason="the owner no longer exists")
            metrics.SCHEDULE_TICKS.labels(outcome="failed").inc()
            return await self._clear(schedule)
        document = self.with_schedule_webhooks(spec, rules.render(spec, tick))
        try:
            # The owner's workflow cap applies as to their own submissions (a tick taken
            # over after its workflow was made replays it, uncapped).
            workflow = await self._submit(
                document,
                owner=schedule.owner,
                idempotency_key=rules.idempotency_key(schedule.id, tick),
                cap=owner.limits,
            )
        except errors.StoreUnavailable:
            raise
        except errors.TooManyWorkflows as exc:
            # Like `maxConcurrent`: the tick is skipped, not failed, and not retried.
            await self._record(schedule, tick, "skipped", reason="maxWorkflows")
            metrics.SCHEDULE_TICKS.labels(outcome="skipped").inc()
            logger.info(
                "schedule %s: tick %s skipped: %s",
                schedule.id,
                tick.isoformat(),
                exc.message,
                extra={"event": "schedule_tick_skipped", "schedule_id": schedule.id},
            )
            return await self._clear(schedule)
        except errors.PingoError as exc:
            # The document was valid when the schedule was made; an executor may have
            # gone since. The tick is settled as failed rather than retried forever.
            await self._record(schedule, tick, "failed", reason=exc.message)
            metrics.SCHEDULE_TICKS.labels(outcome="failed").inc()
            return await self._clear(schedule)
        await self._record(schedule, tick, "submitted", workflow_id=workflow.id)
        metrics.SCHEDULE_TICKS.labels(outcome="submitted").inc()
        if spec.trigger is None:
            # A data trigger's tick is when its data came, which may be long before.
            metrics.SCHEDULE_FIRE_LAG.observe(max(0.0, (self.store.clock() - tick).total_seconds()))
        logger.info(
            "schedule %s: tick %s submitted as workflow %s",
            schedule.id,
            tick.isoformat(),
            workflow.id,
            extra={
                "event": "schedule_tick_submitted",
                "schedule_id": schedule.id,
                "workflow_id": workflow.id,
            },
        )
        return await self._clear(schedule)

    def _submit(
        self,
        document: dict[str, Any],
        *,
        owner: str,
        idempotency_key: str,
        cap: UserLimits | None,
    ) -> Awaitable[WorkflowRecord]:
        """A tick's workflow planned and stored: in a child process when it is big and
        the node can (`detached`), else here."""
        actions = document.get("actions")
        big = isinstance(actions, list) and len(actions) > DETACHED_ACTIONS
        submit: Callable[..., Awaitable[WorkflowRecord]] = (
            self.detached if big and self.detached is not None else self.workflows.submit
        )
        return submit(document, owner=owner, idempotency_key=idempotency_key, cap=cap)

    @staticmethod
    def with_schedule_webhooks(
        spec: rules.ScheduleSpec, document: dict[str, Any]
    ) -> dict[str, Any]:
        """The document with the schedule's webhooks added to its own."""
        if not spec.webhooks:
            return document
        own = document.get("webhooks", [])
        document["webhooks"] = [*(own if isinstance(own, list) else []), *spec.webhooks]
        return document

    async def _running(self, schedule: ScheduleRecord, limit: int, tick: datetime) -> int:
        """How many of the schedule's recent runs are still RUNNING."""
        runs = await self.store.list_schedule_runs(schedule.id, limit=2 * limit + 20)
        ids = [r.workflow_id for r in runs if r.workflow_id is not None and r.tick_at != tick]
        found = await asyncio.gather(*(self.store.get_workflow(i) for i in ids))
        return sum(1 for w in found if w is not None and w.state is states.WorkflowState.RUNNING)

    async def _record(
        self,
        schedule: ScheduleRecord,
        tick: datetime,
        outcome: str,
        *,
        workflow_id: str | None = None,
        reason: str | None = None,
    ) -> None:
        await self.store.record_schedule_run(
            ScheduleRunRecord(
                schedule_id=schedule.id,
                tick_at=tick,
                outcome=outcome,
                recorded_at=self.store.clock(),
                workflow_id=workflow_id,
                reason=reason,
            )
        )

    async def _end(self, schedule: ScheduleRecord, tick: datetime | None, reason: str) -> bool:
        """End a schedule that can have no next tick, as if past its `end` (`next_fire_at`
        None, no pending tick), with `tick` recorded as failed for `reason`: the run log
        says why it stopped. One compare-and-set, so one node records it."""
        ended = await self.store.update_schedule(
            schedule.id,
            schedule.version,
            ScheduleChanges(
                next_fire_at=None, pending_tick_at=None, claimed_by=None, claim_expires_at=None
            ),
        )
        if ended is None:
            return False
        if tick is not None:
            await self._record(schedule, tick, "failed", reason=reason)
            metrics.SCHEDULE_TICKS.labels(outcome="failed").inc()
        logger.warning(
            "schedule %s ended: %s",
            schedule.id,
            reason,
            extra={"event": "schedule_ended", "schedule_id": schedule.id},
        )
        return True

    async def _clear(self, schedule: ScheduleRecord) -> bool:
        cleared = await self.store.update_schedule(
            schedule.id,
            schedule.version,
            ScheduleChanges(pending_tick_at=None, claimed_by=None, claim_expires_at=None),
        )
        # Losing this race is harmless: the node that took the tick over settles it
        # again with the same idempotency key, hence the same workflow.
        return cleared is not None


def _invalid(exc: errors.ValidationFailed) -> str:
    """Why a stored definition is refused, as a run's reason: its first issue."""
    if not exc.issues:
        return exc.message
    first = exc.issues[0]
    more = f" (and {len(exc.issues) - 1} more)" if len(exc.issues) > 1 else ""
    return f"the definition is invalid: {first.code} at '{first.pointer}': {first.message}{more}"


def next_fire_times(record: ScheduleRecord, count: int) -> list[datetime]:
    """The schedule's next `count` ticks from its `next_fire_at` (none while paused)."""
    if record.paused or record.next_fire_at is None or "trigger" in record.spec:
        return []
    try:
        spec = rules.parse_spec(record.spec)
    except errors.ValidationFailed:
        # Stored before a check that refuses it now: the scheduler ends it; a view of it
        # still answers meanwhile.
        return []
    times = [record.next_fire_at]
    while len(times) < count:
        following = rules.next_tick(spec, times[-1])
        if following is None:
            break
        times.append(following)
    return times

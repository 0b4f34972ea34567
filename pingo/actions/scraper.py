"""The scraper: claims READY actions (and PROCESSING ones whose lease expired) into a queue.

Claim by capacity: it claims, per action type, only what this node's executors
can start now (`capacity - held`, see `leases.capacity`), and never more than
the queue has room for: a claimed action is invisible to every other node until
its lease expires, so work this node cannot start stays READY for the others.
A type no executor here runs is never claimed.

When it claims:
- at once when this node makes actions READY (`wake`, passed to the services
  as `on_ready`), when this node's work ends (`capacity_freed`) and after a full
  batch;
- when another node made actions READY: pushed by the store where it can
  (`Store.watch_ready`, MongoDB change streams), else by an adaptive poll, every
  `fast_poll_s` while passes find work, backing off (doubling) to `idle_poll_s`
  once they find none; with pushes it polls every `poll_interval_s` only, for
  backoffs that expire and leases that run out.

Dispatch latency (READY → executor start) is measured from the first `wake`
since the last claim, i.e. from the moment this node's services had written
the READY state, or, for actions found by polling (made READY by another node
or past a backoff), from the start of the pass that found them: a node cannot
know when another node's write happened. It ends when the executor's
`submit` returns (the work has started).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from pingo import errors, loops
from pingo.actions.leases import HeldActions
from pingo.config import Settings
from pingo.store.protocol import ActionRecord, Store

logger = logging.getLogger(__name__)


#: Dataset id → its path, for the inputs of one claimed batch.
InputPaths = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claimed action waiting in the queue."""

    action: ActionRecord
    #: `time.perf_counter()` when this node knew it was READY (dispatch latency origin).
    ready_at: float
    #: The paths of its batch's input datasets, read once per batch while the
    #: submitters already move the actions to SUBMITTED (None: nothing to read).
    input_paths: asyncio.Future[InputPaths] | None = None


#: What the submitters take: a claimed action, or None telling one submitter to stop.
ActionQueue = asyncio.Queue[Claimed | None]


class Scraper(loops.Loop):
    """Claims actions by compare-and-set into the node's bounded action queue."""

    name = "scraper"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        queue: ActionQueue,
        held: HeldActions,
        capacities: Mapping[str, int] | None = None,
    ) -> None:
        """`capacities` (action type → actions it runs at once) bounds each type's
        claims by what is held; None claims any type, bounded by the queue only."""
        super().__init__(interval_s=settings.fast_poll_s)
        self.store = store
        self.node_id = settings.node_id
        self.lease_s = settings.lease_s
        #: Users at their in-flight cap wait READY: the store skips their actions.
        self.max_in_flight = settings.user_max_in_flight_actions
        self.batch = max(1, settings.claim_batch)
        self.capacity = max(1, settings.queue_size)
        self.capacities = None if capacities is None else dict(capacities)
        self.queue = queue
        self.held = held
        self.fast_poll_s = settings.fast_poll_s
        self.idle_poll_s = max(settings.fast_poll_s, settings.idle_poll_s)
        self.pushed_poll_s = max(self.idle_poll_s, settings.poll_interval_s)
        #: Whether the store pushes other nodes' READY actions (set by `ReadyWatch`).
        self.pushed = False
        self._ready_at: float | None = None
        self._starved = False
        #: Per type, when a claim last found no more of it to take. Until news of that
        #: type (or any type), a poll (a pass the interval brought) or an idle poll
        #: interval later, passes do not look for it: a node whose spark slots are free
        #: would otherwise ask the store for spark work each time a local action ends.
        self._exhausted: dict[str, float] = {}
        #: Counts news of READY work: a claim during which some came marks nothing
        #: exhausted (what it missed may be just that news).
        self._news = 0
        self.finished = asyncio.Event()

    def wake(self, types: Collection[str] | None = None) -> None:
        """Actions (of `types`; None: of any type) became READY on this node: claim now."""
        if self._ready_at is None:
            self._ready_at = time.perf_counter()
        self._news += 1
        if types is None:
            self._exhausted.clear()
        else:
            for action_type in types:
                self._exhausted.pop(action_type, None)
        super().wake()

    def room_freed(self) -> None:
        """A submitter took from a full queue: claim again (not a READY event)."""
        if self._starved:
            self._starved = False
            super().wake()

    def capacity_freed(self) -> None:
        """Work of this node ended or went back: its type may take more (not a READY event)."""
        super().wake()

    def ready_elsewhere(self) -> None:
        """The store saw an action become READY (any node's write): claim now."""
        self._news += 1
        self._exhausted.clear()
        super().wake()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.finished.set()

    async def run_once(self) -> bool:
        # Only this loop puts actions in the queue, so the room can only grow
        # while the claim is in flight: put_nowait below cannot fail.
        room = self.capacity - self.queue.qsize()
        if room <= 0:
            self._starved = True
            return False
        quotas = None if self.capacities is None else self._quotas()
        if quotas is not None and not any(quotas.values()):
            # Full: `capacity_freed` wakes the next pass; polling meanwhile finds nothing.
            self._back_off(found=False)
            return False
        ready_at, self._ready_at = self._ready_at, None
        started = time.perf_counter()
        if ready_at is None:
            ready_at = started
        limit = min(room, self.batch)
        news = self._news
        claimed = await self.store.claim_actions(
            self.node_id, limit, self.lease_s, max_in_flight=self.max_in_flight, quotas=quotas
        )
        if quotas is not None and news == self._news:
            self._note_exhausted(quotas, claimed, full=len(claimed) == limit)
        input_paths = self._read_input_paths(claimed)
        for action in claimed:
            self.held.add(action)
            self.queue.put_nowait(Claimed(action, ready_at, input_paths if action.inputs else None))
        more = len(claimed) == limit
        if more:
            # The rest of the backlog became READY no later than this batch did.
            self._ready_at = ready_at if self._ready_at is None else min(ready_at, self._ready_at)
        if claimed:
            logger.debug(
                "claimed %d actions",
                len(claimed),
                extra={"event": "actions_claimed", "count": len(claimed)},
            )
        self._back_off(found=bool(claimed))
        return more and not self.stopping

    def _quotas(self) -> dict[str, int]:
        """What is held allows (`HeldActions.quotas`), but nothing of an exhausted type."""
        assert self.capacities is not None
        quotas = self.held.quotas(self.capacities)
        if self.timed_out:
            # A poll: what other nodes made READY is news nobody brings.
            self._exhausted.clear()
        if self._exhausted:
            # An exhausted type is polled as an idle node polls (other nodes' work).
            recent = time.monotonic() - max(self.interval_s, self.idle_poll_s)
            for action_type, at in list(self._exhausted.items()):
                if at > recent:
                    quotas[action_type] = 0
                else:
                    del self._exhausted[action_type]
        return quotas

    def _note_exhausted(
        self, quotas: Mapping[str, int], claimed: list[ActionRecord], *, full: bool
    ) -> None:
        """Mark the types the claim took fewer of than their quota (the batch was not full)."""
        if full:
            return
        taken = Counter(a.type for a in claimed)
        now = time.monotonic()
        for action_type, quota in quotas.items():
            if quota and taken[action_type] < quota:
                self._exhausted[action_type] = now

    def _back_off(self, *, found: bool) -> None:
        """The adaptive poll: short while passes find work, doubling while they find none."""
        if self.pushed:
            self.interval_s = self.pushed_poll_s
        elif found:
            self.interval_s = self.fast_poll_s
        else:
            self.interval_s = min(self.idle_poll_s, self.interval_s * 2)

    def _read_input_paths(self, claimed: list[ActionRecord]) -> asyncio.Future[InputPaths] | None:
        """Start reading every input dataset of the batch at once (one store call)."""
        wanted = {dataset_id for action in claimed for dataset_id in action.inputs.values()}
        if not wanted:
            return None
        task = asyncio.ensure_future(self._input_paths(wanted))
        # Submitters that hand their action back never look: retrieve errors here.
        task.add_done_callback(_retrieve)
        return task

    async def _input_paths(self, dataset_ids: set[str]) -> InputPaths:
        datasets = await self.store.get_datasets(dataset_ids)
        return {dataset_id: dataset.path for dataset_id, dataset in datasets.items()}


def _retrieve(task: asyncio.Future[InputPaths]) -> None:
    if not task.cancelled():
        task.exception()


class ReadyWatch(loops.Loop):
    """Wakes the scraper on the store's READY events (MongoDB change streams).

    Where the store cannot push (`errors.Unsupported`: SQLite, a MongoDB without
    replica set) it stops for good and the scraper keeps its adaptive poll; a
    stream that breaks (the store went away) is opened again after `poll_interval_s`,
    the scraper polling meanwhile.
    """

    name = "ready-watch"

    def __init__(self, store: Store, scraper: Scraper, settings: Settings) -> None:
        super().__init__(interval_s=settings.poll_interval_s)
        self.store = store
        self.scraper = scraper

    async def run_once(self) -> bool:
        watching = asyncio.ensure_future(self._watch())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not watching.done():
                watching.cancel()
            self.scraper.pushed = False
        if watching.cancelled():
            return False
        exc = watching.exception()
        if isinstance(exc, errors.Unsupported):
            logger.info(
                "no change events from the store (%s); polling for other nodes' work",
                exc,
                extra={"event": "ready_watch_unsupported"},
            )
            self.stop()
            return False
        if isinstance(exc, errors.PingoError):
            # StoreUnavailable, or the stream failed: poll, and open it again later.
            logger.warning(
                "the store's change events stopped: %s",
                exc,
                extra={"event": "ready_watch_failed", "code": exc.code},
            )
        elif exc is not None:
            raise exc
        return False

    async def _watch(self) -> None:
        def on_ready() -> None:
            self.scraper.pushed = True
            self.scraper.ready_elsewhere()

        await self.store.watch_ready(on_ready)

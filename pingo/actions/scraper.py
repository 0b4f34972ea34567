"""The scraper: claims READY actions (and PROCESSING ones whose lease expired) into a queue.

It never claims more than the queue has room for: a claimed action is
invisible to every other node until its lease expires. It wakes at once when
this node makes actions READY (`wake`, passed to the services as `on_ready`),
polls as a fallback, and claims again immediately after a full batch.

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
from collections.abc import Mapping
from dataclasses import dataclass

from pingo import loops
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
        self, store: Store, settings: Settings, queue: ActionQueue, held: HeldActions
    ) -> None:
        super().__init__(interval_s=settings.poll_interval_s)
        self.store = store
        self.node_id = settings.node_id
        self.lease_s = settings.lease_s
        #: Users at their in-flight cap wait READY: the store skips their actions.
        self.max_in_flight = settings.user_max_in_flight_actions
        self.batch = max(1, settings.claim_batch)
        self.capacity = max(1, settings.queue_size)
        self.queue = queue
        self.held = held
        self._ready_at: float | None = None
        self._starved = False
        self.finished = asyncio.Event()

    def wake(self) -> None:
        """Actions became READY on this node: claim now."""
        if self._ready_at is None:
            self._ready_at = time.perf_counter()
        super().wake()

    def room_freed(self) -> None:
        """A submitter took from a full queue: claim again (not a READY event)."""
        if self._starved:
            self._starved = False
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
        ready_at, self._ready_at = self._ready_at, None
        started = time.perf_counter()
        if ready_at is None:
            ready_at = started
        limit = min(room, self.batch)
        claimed = await self.store.claim_actions(
            self.node_id, limit, self.lease_s, max_in_flight=self.max_in_flight
        )
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
        return more and not self.stopping

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

"""What this node holds a lease on, the loop that renews those leases, and per-type limits.

Every action the scraper claims is held from the claim until its work ends
(or it is handed back): queued (PROCESSING), submitted, running. The renewer
extends all those leases every `lease_s / 3`, so a live node never loses an
action to a lease expiry, and a dead node's actions come free within a lease.

What a node holds per type is also what it may claim next: `capacity` is how
many actions of a type its executor can run at once, and the scraper claims
only `capacity - held` of each (claim by capacity), so work it could not start
now stays READY for other nodes.

Where a type's actions are short, one claim per action ending would cost more
than the actions: the node then also holds some ahead, as many as its slots
finish within `Settings.claim_ahead_s` (at most `_AHEAD_PER_SLOT` per slot), and
claims them in batches once half of them ended, so that the other half keeps the
slots busy while the claim and its submissions are under way (`HeldActions.quotas`).
Long actions (a cluster job, anything past that time per slot) are claimed by
capacity alone: holding one ahead would keep it from an idle node for a whole run.

A renewal that finds an action gone from this node also stops the work this
node still runs for it, when the store says that work is no longer wanted: the
workflow was killed through another node's API, or the action was taken over
after this node's lease lapsed. Only the node that runs a process (or a cluster
client, whose log names the YARN applications to kill) can stop it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pingo import loops, states
from pingo.store.protocol import ActionRecord, Store

if TYPE_CHECKING:
    from pingo.actions.executors.base import Executor
    from pingo.config import Settings

logger = logging.getLogger(__name__)

Key = tuple[str, int]
#: The weight of the latest runtime in its type's running mean (`HeldActions.ahead`).
_RUNTIME_WEIGHT = 0.2
#: Runtimes below this count as this (a runtime of 0 would ask for unbounded ahead).
_SHORTEST_RUNTIME_S = 0.001
#: The most actions held ahead per slot, however short (`HeldActions.ahead`).
_AHEAD_PER_SLOT = 8


@dataclass(slots=True)
class Held:
    """What the node knows of one action it holds."""

    action_type: str
    callback_id: str
    #: The `version` of the claimed record: which claim of the action this node holds.
    claim_version: int = 0
    #: Whether it counts against its type's concurrency limit.
    limited: bool = False
    #: Once submitted: the attempt, the executor's id, and `time.monotonic()` then.
    attempt: int = 0
    external_id: str | None = None
    submitted_at: float | None = None
    #: Reconciliation asks the executor about it again no earlier than this.
    check_at: float = 0.0


class HeldActions:
    """The actions this node holds, and the per-type concurrency limits they count against."""

    def __init__(self, limits: Mapping[str, int] | None = None, *, ahead_s: float = 0.0) -> None:
        self._held: dict[Key, Held] = {}
        self._by_callback: dict[str, Key] = {}
        self._by_type: Counter[str] = Counter()
        #: How much of each type's work (seconds per slot) to hold ahead (`ahead`).
        self.ahead_s = ahead_s
        #: Per type, the running mean of its actions' runtimes on this node.
        self._runtime_s: dict[str, float] = {}
        self._limits = dict(limits or {})
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        #: Called whenever an action stops being held (the scraper claims again).
        self.on_release: Callable[[], None] = _nothing

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def keys(self) -> list[Key]:
        """Every held action's key."""
        return list(self._held)

    def get(self, key: Key) -> Held | None:
        """What this node knows of `key`, if it holds it."""
        return self._held.get(key)

    def count(self, action_type: str) -> int:
        """How many actions of `action_type` this node holds (queued, submitted or running)."""
        return self._by_type[action_type]

    def quotas(self, capacities: Mapping[str, int]) -> dict[str, int]:
        """Per type, how many more actions this node claims now (never negative).

        Up to `capacity + ahead` held, but nothing while fewer than half of `ahead`
        are missing: the rest keeps every slot busy meanwhile, so waiting for a
        batch's worth to end costs no slot time and saves claims. Claiming only once
        all of `ahead` ended would leave the slots idle for the claim, the
        submissions and their files (measured: bench/README.md, "Issue 15,
        fourteenth pass").
        """
        quotas = {}
        for action_type, capacity in capacities.items():
            ahead = self.ahead(action_type, capacity)
            missing = capacity + ahead - self._by_type[action_type]
            quotas[action_type] = missing if missing >= max(1, ahead // 2) else 0
        return quotas

    def ahead(self, action_type: str, capacity: int) -> int:
        """How many actions of `action_type` to hold beyond `capacity`: as many as its
        slots finish within `ahead_s`, by their mean runtime here, at most
        `_AHEAD_PER_SLOT` per slot; none until one ran here."""
        runtime_s = self._runtime_s.get(action_type)
        if runtime_s is None or self.ahead_s <= 0:
            return 0
        return min(
            _AHEAD_PER_SLOT * capacity,
            int(capacity * self.ahead_s / max(runtime_s, _SHORTEST_RUNTIME_S)),
        )

    def add(self, action: ActionRecord) -> None:
        """Hold `action` (claimed by this node); a newer claim of a held action replaces
        the older one (its lease lapsed and the action came back to this node)."""
        held = self._held.get(action.key)
        if held is None:
            self._held[action.key] = Held(action.type, action.callback_id, action.version)
            self._by_callback[action.callback_id] = action.key
            self._by_type[action.type] += 1
        else:
            held.claim_version = action.version

    def claimed(self, key: Key, version: int) -> None:
        """The held claim of `key` is now the record at `version` (if `key` is still held)."""
        held = self._held.get(key)
        if held is not None:
            held.claim_version = version

    def submitted(self, key: Key, attempt: int, external_id: str) -> None:
        """The executor started `key`'s attempt `attempt` as `external_id`."""
        held = self._held.get(key)
        if held is not None:
            held.attempt = attempt
            held.external_id = external_id
            held.submitted_at = time.monotonic()

    def overdue(self, after_s: float, now: float) -> list[tuple[Key, Held]]:
        """Submitted actions still held `after_s` after submission, due for a check at `now`."""
        return [
            (key, held)
            for key, held in self._held.items()
            if held.submitted_at is not None
            and now - held.submitted_at >= after_s
            and now >= held.check_at
        ]

    def remove(self, key: Key, *, claim: int | None = None) -> None:
        """Forget `key` (its work ended, or it went back); frees its limit slot.

        With `claim` (the claimed record's `version`), only while that claim is the one
        held: a stale claim giving up must not drop a newer claim's hold, which would
        leave that one's lease unrenewed while its work runs.
        """
        held = self._held.get(key)
        if held is None or (claim is not None and held.claim_version != claim):
            return
        del self._held[key]
        self._by_callback.pop(held.callback_id, None)
        self._by_type[held.action_type] -= 1
        if held.submitted_at is not None:
            self._ran(held.action_type, time.monotonic() - held.submitted_at)
        if held.limited:
            self._semaphores[held.action_type].release()
        self.on_release()

    def _ran(self, action_type: str, runtime_s: float) -> None:
        mean = self._runtime_s.get(action_type)
        self._runtime_s[action_type] = (
            runtime_s if mean is None else mean + _RUNTIME_WEIGHT * (runtime_s - mean)
        )

    def remove_callback(self, callback_id: str) -> None:
        """Forget the action whose callback id is `callback_id`, if held."""
        key = self._by_callback.get(callback_id)
        if key is not None:
            self.remove(key)

    async def acquire_limit(self, action: ActionRecord, give_up: asyncio.Event) -> bool:
        """Wait until `action`'s type is under its limit, then count it (no limit: no wait).

        False, without counting it, when `give_up` is set first (the node stops:
        a slot may only free when work that will not report anymore ends).
        """
        limit = self._limits.get(action.type)
        if limit is None:
            return True
        semaphore = self._semaphores.get(action.type)
        if semaphore is None:
            semaphore = self._semaphores[action.type] = asyncio.Semaphore(max(1, limit))
        if semaphore.locked():
            acquiring = asyncio.ensure_future(semaphore.acquire())
            giving_up = asyncio.ensure_future(give_up.wait())
            try:
                await asyncio.wait({acquiring, giving_up}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                giving_up.cancel()
                if not acquiring.done():
                    acquiring.cancel()
            try:
                await acquiring
            except asyncio.CancelledError:
                if not acquiring.cancelled():
                    raise  # we are cancelled ourselves, not the acquisition
                return False
            if give_up.is_set():
                semaphore.release()
                return False
        else:
            await semaphore.acquire()
        held = self._held.get(action.key)
        if held is None or held.limited:
            semaphore.release()
        else:
            held.limited = True
        return True


def _nothing() -> None:
    pass


def capacity(action_type: str, executor: Executor, settings: Settings) -> int:
    """How many actions of `action_type` a node runs at once: its executor's slots
    (local processes, or cluster clients in flight), within `PINGO_EXECUTOR_LIMITS`.

    An executor without slots (it only hands work on) is bounded by the queue size.
    """
    slots = getattr(executor, "slots", None)
    bound = slots if isinstance(slots, int) else settings.queue_size
    limit = settings.executor_limits.get(action_type)
    return max(1, bound if limit is None else min(bound, limit))


#: Stops the work this node runs as (action type, external id), through its executor.
StopWork = Callable[[str, str], Awaitable[None]]


def work_unwanted(held: Held, action: ActionRecord | None, node_id: str) -> bool:
    """Whether this node's submitted attempt of `action` runs for nothing now.

    True when the record says the action was killed, or its current attempt is
    not this node's (the lease lapsed: the reaper gave it back or another node took
    it over). False while nothing was submitted here, and when the action ended by
    this attempt's own report (FINISHED or FAILED): its client may still be exiting.
    """
    if held.external_id is None:
        return False
    if action is None or action.state is states.ActionState.KILLED:
        return True
    if action.attempts != held.attempt:
        return True
    if action.state in states.ACTION_ACTIVE:
        return action.owner != node_id
    return action.state not in (states.ActionState.FINISHED, states.ActionState.FAILED)


class LeaseRenewer(loops.Loop):
    """Renews this node's leases on everything it holds, every `lease_s / 3`."""

    name = "lease-renewer"

    def __init__(
        self,
        store: Store,
        node_id: str,
        held: HeldActions,
        lease_s: float,
        stop_work: StopWork | None = None,
    ) -> None:
        """`stop_work` stops work the store no longer wants from this node (None: left to run)."""
        super().__init__(interval_s=lease_s / 3)
        self.store = store
        self.node_id = node_id
        self.held = held
        self.lease_s = lease_s
        self.stop_work = stop_work
        #: Stops under way: a process's kill grace must not hold up the next renewal.
        self._stops: set[asyncio.Task[None]] = set()

    async def run_once(self) -> bool:
        keys = self.held.keys()
        if not keys:
            return False
        renewed = await self.store.renew_leases(self.node_id, keys, self.lease_s)
        if renewed < len(keys):
            await self._forget_lost(keys)
        return False

    async def _forget_lost(self, keys: list[Key]) -> None:
        # Some work ended through a callback this node did not see (another
        # node's HTTP endpoint), or another node took an action over: stop
        # renewing those, so that per-type limits free their slots.
        for key in keys:
            action = await self.store.get_action(*key)
            if (
                action is None
                or action.owner != self.node_id
                or action.state not in states.ACTION_ACTIVE
            ):
                held = self.held.get(key)
                self.held.remove(key)
                logger.debug(
                    "no longer holding %s/%s",
                    *key,
                    extra={"event": "lease_forgotten"},
                )
                if held is not None and work_unwanted(held, action, self.node_id):
                    self._stop(key, held, action)

    def _stop(self, key: Key, held: Held, action: ActionRecord | None) -> None:
        """Stop `held`'s work in the background (the executor kills it, cluster jobs first)."""
        if self.stop_work is None or held.external_id is None:
            return
        killed = action is None or action.state is states.ActionState.KILLED
        why = "killed" if killed else "taken over"
        logger.info(
            "stopping %s/%s attempt %d here: %s elsewhere",
            *key,
            held.attempt,
            why,
            extra={"event": "lost_work_stopped", "workflow_id": key[0], "why": why},
        )
        task = asyncio.create_task(self._stop_one(key, held.action_type, held.external_id))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop_one(self, key: Key, action_type: str, external_id: str) -> None:
        assert self.stop_work is not None
        try:
            await self.stop_work(action_type, external_id)
        except Exception:
            # A loop that raises stops the node; an executor failing one kill must not.
            logger.warning(
                "could not stop %s/%s through its executor",
                *key,
                exc_info=True,
                extra={"event": "action_kill_failed", "workflow_id": key[0]},
            )

"""The retention loop: keeps the bytes on disk under the storage budget.

When the bytes on disk (STORED + LEAF + STORED_TO_DELETE) exceed the high water
mark, the policy picks STORED datasets to evict: a pass frees what stays on disk
(STORED + LEAF) over the high mark, plus room for what was written over the
last interval (`pass_bytes_to_free`); the low water mark is the furthest a pass
may go. Each eviction is a move STORED → STORED_TO_DELETE by a compare-and-set
that also requires the dataset to be unclaimed, and the deletor removes the
files. LEAF and pinned datasets are never handed to the policy, and a claim
that arrives between the listing and the CAS makes the CAS fail: a dataset an
action will read is never evicted.

Why not down to the low mark, as a cache with hysteresis would: every pass
would then throw away 15% of the capacity (with the default marks) of data
that fits under the budget, and with it reuse the budget pays for; at a
budget that holds everything reusable, that is all a policy loses. Sizing the
pass to need costs more passes (under steady pressure one per interval,
each a candidate listing) but evicts no more bytes overall.

Safe on every node: the CAS decides, a node that loses it evicts nothing. Two
nodes passing at the same moment may evict a little more than needed (each
frees the whole excess).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pingo import metrics, states
from pingo.config import Settings
from pingo.loops import Loop
from pingo.retention.policy import EVICT_EVENT, Candidate, RetentionPolicy, build_candidates
from pingo.store.protocol import Store

logger = logging.getLogger(__name__)

D = states.DatasetState


@dataclass(frozen=True, slots=True)
class Evicted:
    """An eviction the loop applied."""

    dataset_id: str
    size_bytes: int
    reason: str


@dataclass(frozen=True, slots=True)
class Look:
    """What a pass saw: when (its read's start), and the bytes that stayed on disk after it."""

    at: datetime
    staying_bytes: int


def pass_bytes_to_free(
    staying_bytes: int, capacity_bytes: int, settings: Settings, headroom_bytes: int
) -> int:
    """How many bytes a pass must evict: the excess over the high mark, plus headroom.

    `headroom_bytes` is room for the writes expected before the next pass; it is
    capped so that a pass never goes below the low mark. Every policy is held to
    the same amount: the policy only chooses which datasets make it up.
    """
    high = int(settings.high_water * capacity_bytes)
    most = high - int(settings.low_water * capacity_bytes)
    return staying_bytes - high + min(max(headroom_bytes, 0), most)


def expected_growth(
    previous: Look | None, staying_bytes: int, now: datetime, interval_s: float
) -> int:
    """The bytes likely written over the next interval, at the rate seen since `previous`.

    Measured, not assumed: what stays on disk grew by so much since the last
    look, over so long (at least one interval, so that two looks close together
    do not make a burst of a rate). No previous look (the node just started): 0.
    """
    if previous is None:
        return 0
    growth = staying_bytes - previous.staying_bytes
    elapsed_s = max((now - previous.at).total_seconds(), interval_s)
    return max(int(growth * interval_s / elapsed_s), 0)


class RetentionLoop(Loop):
    """Asks the policy what to evict whenever storage passes the high water mark."""

    name = "retention"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        policy: RetentionPolicy,
        *,
        on_evict: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(settings.retention_interval_s)
        self.store = store
        self.settings = settings
        self.policy = policy
        #: Called after a pass evicted something (a node wakes its deletor with it).
        self.on_evict = on_evict
        #: The previous pass's look, to measure how fast storage grows.
        self.last_look: Look | None = None

    async def run_once(self) -> bool:
        evicted = await self.enforce()
        if evicted:
            self.on_evict()
        return False

    async def enforce(self) -> list[Evicted]:
        """One pass: if above the high water mark, evict what `pass_bytes_to_free` says."""
        capacity = self.settings.storage_capacity_bytes
        if capacity is None:
            return []
        # A look is dated when its read starts and measured up to when it ends: a
        # read answered late then cannot make the writes seen between two looks
        # seem to have taken less time than they did.
        looked_at = self.store.clock()
        by_state = await self.store.bytes_by_state()
        on_disk = sum(by_state.get(s, 0) for s in states.DATASET_ON_DISK)
        # What is already STORED_TO_DELETE is on its way out (its claims keep it a
        # little longer); only what would stay counts against the marks.
        staying = by_state.get(D.STORED, 0) + by_state.get(D.LEAF, 0)
        now = self.store.clock()
        growth = expected_growth(self.last_look, staying, now, self.settings.retention_interval_s)
        self.last_look = Look(looked_at, staying)
        if on_disk <= self.settings.high_water * capacity:
            return []
        to_free = pass_bytes_to_free(staying, capacity, self.settings, growth)
        if to_free <= 0:
            return []
        candidates = [c for c in await build_candidates(self.store) if c.evictable]
        try:
            decisions = self.policy.select_evictions(candidates, to_free, now)
        except Exception:
            # A broken plug-in must not take the node down: keeping everything is safe.
            logger.exception(
                "retention policy %s failed; nothing evicted",
                self.policy.name,
                extra={"event": "retention_policy_failed", "policy": self.policy.name},
            )
            return []
        by_id = {c.dataset_id: c for c in candidates}
        evicted: list[Evicted] = []
        freed = 0
        for decision in decisions:
            if freed >= to_free:
                break
            candidate = by_id.pop(decision.dataset_id, None)
            if candidate is None:
                logger.warning(
                    "retention policy %s chose %s, which is not an evictable candidate",
                    self.policy.name,
                    decision.dataset_id,
                    extra={"event": "retention_bad_decision", "policy": self.policy.name},
                )
                continue
            if await self._evict(candidate, decision.reason):
                evicted.append(Evicted(candidate.dataset_id, candidate.size_bytes, decision.reason))
                freed += candidate.size_bytes
        self.last_look = Look(looked_at, staying - freed)
        if evicted or decisions:
            logger.info(
                "retention: %s evicted %d datasets (%d bytes) of %d bytes to free "
                "(%d of them headroom for the writes of the next interval)",
                self.policy.name,
                len(evicted),
                freed,
                to_free,
                to_free - (staying - int(self.settings.high_water * capacity)),
                extra={
                    "event": "retention_pass",
                    "policy": self.policy.name,
                    "evicted": len(evicted),
                    "freed_bytes": freed,
                    "to_free_bytes": to_free,
                    "growth_bytes": growth,
                },
            )
        return evicted

    async def _evict(self, candidate: Candidate, reason: str) -> bool:
        states.ensure_transition(D.STORED, D.STORED_TO_DELETE, states.Trigger.RETENTION)
        record = await self.store.transition_dataset(
            candidate.dataset_id, {D.STORED}, D.STORED_TO_DELETE, if_unclaimed=True
        )
        if record is None:
            # Claimed, pinned by a user's DELETE, or reused as a LEAF meanwhile.
            logger.debug(
                "retention: %s moved on before eviction",
                candidate.dataset_id,
                extra={"event": "retention_evict_lost", "dataset_id": candidate.dataset_id},
            )
            return False
        await self.store.append_event(
            EVICT_EVENT,
            dataset_id=candidate.dataset_id,
            payload={
                "policy": self.policy.name,
                "reason": reason,
                "sizeBytes": candidate.size_bytes,
                "computeSeconds": candidate.compute_s,
                "recomputeCostSeconds": candidate.recompute_cost_s,
            },
        )
        metrics.RETENTION_EVICTIONS.labels(policy=self.policy.name).inc()
        return True

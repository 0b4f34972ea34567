"""The retention loop: keeps the bytes on disk under the storage budget.

When the bytes on disk (STORED + LEAF + STORED_TO_DELETE) exceed the high water
mark, the policy picks STORED datasets to evict until what will stay on disk
(STORED + LEAF) is under the low water mark; each is moved STORED →
STORED_TO_DELETE by a compare-and-set that also requires it to be unclaimed,
and the deletor removes the files. LEAF and pinned datasets are never handed to
the policy, and a claim that arrives between the listing and the CAS makes the
CAS fail: a dataset an action will read is never evicted.

Safe on every node: the CAS decides, a node that loses it evicts nothing. Two
nodes passing at the same moment may evict a little more than needed (each
frees the whole excess); the low water mark absorbs that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

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

    async def run_once(self) -> bool:
        evicted = await self.enforce()
        if evicted:
            self.on_evict()
        return False

    async def enforce(self) -> list[Evicted]:
        """One pass: evict down to the low water mark if above the high one."""
        capacity = self.settings.storage_capacity_bytes
        if capacity is None:
            return []
        by_state = await self.store.bytes_by_state()
        on_disk = sum(by_state.get(s, 0) for s in states.DATASET_ON_DISK)
        if on_disk <= self.settings.high_water * capacity:
            return []
        # What is already STORED_TO_DELETE is on its way out (its claims keep it a
        # little longer); only what would stay counts against the low mark.
        staying = by_state.get(D.STORED, 0) + by_state.get(D.LEAF, 0)
        to_free = staying - int(self.settings.low_water * capacity)
        if to_free <= 0:
            return []
        candidates = [c for c in await build_candidates(self.store) if c.evictable]
        now = self.store.clock()
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
        if evicted or decisions:
            logger.info(
                "retention: %s evicted %d datasets (%d bytes) of %d bytes to free",
                self.policy.name,
                len(evicted),
                freed,
                to_free,
                extra={
                    "event": "retention_pass",
                    "policy": self.policy.name,
                    "evicted": len(evicted),
                    "freed_bytes": freed,
                    "to_free_bytes": to_free,
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

"""The deletor: removes the files of datasets marked STORED_TO_DELETE once no claim holds them.

Safe on every node at once: each step is a compare-and-set (STORED_TO_DELETE →
PROCESSING only when unclaimed, PROCESSING → DELETING only when still
unclaimed, DELETING → DELETED), so exactly one deletor wins a dataset, and a
deletor that died mid-way is replaced once its record has been stale for a
lease (removal is idempotent, so redoing it is harmless).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pingo import loops, states
from pingo.store import protocol

if TYPE_CHECKING:
    from pingo.config import Settings
    from pingo.datasets.storage import DatasetStorage

logger = logging.getLogger(__name__)

D = states.DatasetState
T = states.Trigger


class Deletor(loops.Loop):
    """Deletes unclaimed STORED_TO_DELETE datasets, and finishes deletions a dead deletor left."""

    name = "deletor"
    #: Datasets taken per pass.
    batch = 100
    #: Leases between two sweeps for orphaned claims.
    janitor_leases = 10

    def __init__(self, store: protocol.Store, storage: DatasetStorage, settings: Settings) -> None:
        super().__init__(settings.deletor_interval_s)
        self.store = store
        self.storage = storage
        self.stale_s = settings.lease_s
        self.plan_deadline_s = settings.plan_deadline_s
        self._janitor_due: datetime | None = None

    async def run_once(self) -> bool:
        """Delete what can be deleted now; True when a full batch was found."""
        now = self.store.clock()
        if self._janitor_due is None or now >= self._janitor_due:
            self._janitor_due = now + timedelta(seconds=self.janitor_leases * self.stale_s)
            await self.release_orphan_claims()
        candidates = await self.store.list_deletable_datasets(self.stale_s, self.batch)
        if candidates:
            await asyncio.gather(*(self.delete(d) for d in candidates))
        return len(candidates) >= self.batch

    async def delete(self, dataset: protocol.DatasetRecord) -> protocol.DatasetRecord | None:
        """Take the dataset through PROCESSING and DELETING to DELETED; None if another won."""
        record: protocol.DatasetRecord | None = dataset
        if dataset.state is D.STORED_TO_DELETE:
            record = await self._move(dataset, D.PROCESSING, if_unclaimed=True)
        elif dataset.state in (D.PROCESSING, D.DELETING):
            # A deletor died holding it: take it over (the CAS refreshes its update time).
            record = await self._move(dataset, dataset.state)
        else:
            return None
        if record is None:
            return None
        if record.state is D.PROCESSING:
            record = await self._to_deleting(record)
            if record is None or record.state is not D.DELETING:
                return record
        if record.is_managed:
            await self.storage.remove(record.path)
        # else: an unmanaged dataset's files are the user's own; Pingo only forgets them.
        deleted = await self._move(record, D.DELETED)
        if deleted is not None:
            logger.info(
                "dataset %s deleted",
                deleted.id,
                extra={"event": "dataset_deleted", "dataset_id": deleted.id},
            )
        return deleted

    async def release_orphan_claims(self) -> int:
        """Drop claims that no one will ever release; return how many.

        Claims are released by the actions holding them when they end, but a process
        that died at the wrong moment leaves some behind: a planning that died (killed,
        out of memory, its node killed) after claiming the datasets it reuses and before
        its workflow was stored, or a callback that died after its action ended. Left
        alone they would block deletion and eviction forever. Every claimed dataset is
        looked at, whatever its state (a planning claims STORED and LEAF ones, which may
        be deleted meanwhile), and only those.
        """
        released = 0
        now = self.store.clock()
        after: str | None = None
        while page := await self.store.list_claimed_datasets(after=after, limit=100):
            after = page[-1].id
            for record in page:
                for claim in record.claims:
                    if await self._is_orphan(claim, now):
                        await self.store.remove_dataset_claim(record.id, claim)
                        released += 1
                        logger.warning(
                            "released orphaned claim %s on dataset %s",
                            claim,
                            record.id,
                            extra={"event": "orphan_claim_released", "dataset_id": record.id},
                        )
        return released

    async def _is_orphan(self, claim: str, now: datetime) -> bool:
        """Whether no one will release `claim`: its action ended, or its planning died.

        A planning writes its workflow after claiming, and the store refuses that write
        once the planning is `plan_deadline_s` old (`WorkflowPlan.deadline_at`). So a
        claim of an action not in the store, taken by a planning older than the
        deadline and a lease (the margin for the clocks of several nodes, as leases
        assume), whose workflow is not in the store either or has ended, is one whose
        action will never be: a planning still under way is never robbed, however
        slow (docs/states.md, "Claims").
        """
        workflow_id, _, action_id = claim.rpartition("/")
        try:
            action = await self.store.get_action(workflow_id, int(action_id))
        except ValueError:
            return False  # not a claim key Pingo makes: leave it to whoever did
        if action is not None:
            return action.state in states.ACTION_TERMINAL
        started = protocol.planning_started_at(workflow_id)
        if started is None:
            return False  # not a workflow id Pingo makes: its age is unknown
        if (now - started).total_seconds() <= self.plan_deadline_s + self.stale_s:
            return False
        # Never written; or written in part (MongoDB) and failed by the reaper since
        # (`OutcomeService.abandon_unwritten`): the action will never come. A RUNNING
        # one may still be being written, or waits for the reaper: not yet.
        workflow = await self.store.get_workflow(workflow_id)
        return workflow is None or workflow.state in states.WORKFLOW_TERMINAL

    async def _to_deleting(self, record: protocol.DatasetRecord) -> protocol.DatasetRecord | None:
        """PROCESSING → DELETING while unclaimed; back to STORED_TO_DELETE if a claim arrived."""
        if not record.claims:
            deleting = await self._move(record, D.DELETING, if_unclaimed=True)
            if deleting is not None:
                return deleting
            current = await self.store.get_dataset(record.id)
            if current is None or current.state is not D.PROCESSING:
                return None
            record = current
        # A workflow planned to read it (a recomputation claims it): keep it for now.
        return await self._move(record, D.STORED_TO_DELETE)

    async def _move(
        self,
        record: protocol.DatasetRecord,
        new: states.DatasetState,
        *,
        if_unclaimed: bool = False,
    ) -> protocol.DatasetRecord | None:
        states.ensure_transition(record.state, new, T.DELETOR)
        moved = await self.store.transition_dataset(
            record.id, {record.state}, new, if_unclaimed=if_unclaimed
        )
        if moved is None:
            logger.debug(
                "dataset %s moved on before %s",
                record.id,
                new.value,
                extra={"event": "deletion_cas_lost", "dataset_id": record.id},
            )
        return moved

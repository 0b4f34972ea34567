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

    def __init__(self, store: protocol.Store, storage: DatasetStorage, settings: Settings) -> None:
        super().__init__(settings.deletor_interval_s)
        self.store = store
        self.storage = storage
        self.stale_s = settings.lease_s

    async def run_once(self) -> bool:
        """Delete what can be deleted now; True when a full batch was found."""
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

"""Datasets as users see them: deleting one, its lineage, and the storage they use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pingo import errors, metrics, states
from pingo.datasets import integrity
from pingo.store import protocol

if TYPE_CHECKING:
    from pingo.datasets.storage import DatasetStorage

logger = logging.getLogger(__name__)

D = states.DatasetState

#: States whose files are still on disk (counted as used storage).
USING_STORAGE: frozenset[states.DatasetState] = states.DATASET_USING_STORAGE
#: States in which a deletion is already under way or done.
_GOING: frozenset[states.DatasetState] = frozenset(
    {D.STORED_TO_DELETE, D.PROCESSING, D.DELETING, D.DELETED}
)


class DatasetService:
    """User-facing dataset operations."""

    def __init__(
        self,
        store: protocol.Store,
        storage: DatasetStorage,
        *,
        capacity_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.storage = storage
        self.capacity_bytes = capacity_bytes

    async def may_manage(self, user: protocol.UserRecord, dataset: protocol.DatasetRecord) -> bool:
        """Whether `user` may delete, pin or unpin `dataset`, or force its computation
        again while it is stored: an admin, or the owner of the workflow that produced it
        (the API, the UI and the planner all ask here, or `manageable`)."""
        return dataset.id in await self.manageable(user, (dataset,))

    async def manageable(
        self, user: protocol.UserRecord, datasets: Collection[protocol.DatasetRecord]
    ) -> set[str]:
        """The ids of the `datasets` that `user` may manage (`may_manage`): the rule, for
        many datasets at once, each producing workflow read once (a forced re-run of a
        big workflow names thousands of datasets, most of one producer)."""
        if user.is_admin:
            return {d.id for d in datasets}
        wanted = sorted({d.producer_workflow_id for d in datasets})
        found = await asyncio.gather(*(self.store.get_workflow(w) for w in wanted))
        owned = {
            w
            for w, producer in zip(wanted, found, strict=True)
            if producer is not None and producer.owner == user.name
        }
        return {d.id for d in datasets if d.producer_workflow_id in owned}

    async def manageable_by_owner(
        self, owner: str, datasets: Collection[protocol.DatasetRecord]
    ) -> set[str]:
        """`manageable` for the user named `owner` (a workflow's): one with no record
        (the simulator's, one removed since) has no admin rights."""
        user = await self.store.get_user(owner) or protocol.UserRecord(
            name=owner, token_hash="", is_admin=False, created_at=self.store.clock()
        )
        return await self.manageable(user, datasets)

    async def check_may_manage(
        self, user: protocol.UserRecord, dataset: protocol.DatasetRecord
    ) -> None:
        """`Forbidden` unless `user` may manage `dataset` (see `may_manage`)."""
        if not await self.may_manage(user, dataset):
            raise errors.Forbidden(
                "only an admin or the owner of the workflow that produced a dataset may change it"
            )

    async def set_pinned(self, dataset_id: str, pinned: bool) -> protocol.DatasetRecord:
        """Pin (retention never evicts it; a user may still delete it) or unpin."""
        updated = await self.store.set_dataset_pinned(dataset_id, pinned)
        if updated is None:
            raise errors.NotFound(f"no dataset {dataset_id!r}")
        logger.info(
            "dataset %s %s",
            dataset_id,
            "pinned" if pinned else "unpinned",
            extra={"event": "dataset_pinned", "dataset_id": dataset_id, "pinned": pinned},
        )
        return updated

    async def mark_for_deletion(
        self, dataset_id: str, *, force: bool = False
    ) -> protocol.DatasetRecord:
        """Mark a stored dataset for the deletor (a LEAF only with `force`).

        The deletor waits for its claims; a deletion already under way (or done)
        is returned as it is.
        """
        for _ in range(5):
            record = await self.store.get_dataset(dataset_id)
            if record is None:
                raise errors.NotFound(f"no dataset {dataset_id}")
            if record.state in _GOING:
                return record
            if record.state is D.LEAF and not force:
                raise errors.Conflict(
                    f"dataset {dataset_id} is the output of a leaf action; delete it with force"
                )
            if record.state in states.DATASET_COMPUTING:
                raise errors.Conflict(f"dataset {dataset_id} is being computed")
            states.ensure_transition(record.state, D.STORED_TO_DELETE, states.Trigger.USER)
            moved = await self.store.transition_dataset(
                dataset_id, {record.state}, D.STORED_TO_DELETE
            )
            if moved is not None:
                logger.info(
                    "dataset %s marked for deletion",
                    dataset_id,
                    extra={"event": "dataset_marked_for_deletion", "dataset_id": dataset_id},
                )
                return moved
        raise errors.Conflict(f"dataset {dataset_id} keeps changing; retry")

    async def lineage(self, dataset_id: str) -> Lineage:
        """The dataset and all its ancestors, with the edges parent → child."""
        root = await self.store.get_dataset(dataset_id)
        if root is None:
            raise errors.NotFound(f"no dataset {dataset_id}")
        nodes: dict[str, protocol.DatasetRecord | None] = {root.id: root}
        edges: list[tuple[str, str]] = []
        frontier = [root]
        while frontier:
            for child in frontier:
                edges.extend((p, child.id) for p in child.parents)
            wanted = {p for child in frontier for p in child.parents if p not in nodes}
            found = await self.store.get_datasets(wanted) if wanted else {}
            for p in wanted:
                nodes[p] = found.get(p)
            frontier = list(found.values())
        return Lineage(dataset_id, nodes, tuple(edges))

    async def descendants(self, dataset_id: str, *, limit: int = 500) -> Lineage:
        """The dataset and the datasets computed from it, generation by generation, with
        the edges parent → child; at most `limit` of them (`truncated` says if more)."""
        root = await self.store.get_dataset(dataset_id)
        if root is None:
            raise errors.NotFound(f"no dataset {dataset_id}")
        nodes: dict[str, protocol.DatasetRecord | None] = {root.id: root}
        edges: list[tuple[str, str]] = []
        frontier = [root.id]
        truncated = False
        while frontier and not truncated:
            room = limit - len(nodes)
            parents = set(frontier)
            # Known nodes may come back too (a diamond): ask for room beyond them.
            children = await self.store.list_child_datasets(frontier, limit=room + len(nodes))
            fresh = [c for c in children if c.id not in nodes]
            truncated = len(fresh) > room
            fresh = fresh[: max(room, 0)]
            nodes.update((c.id, c) for c in fresh)
            edges.extend(
                (parent, child.id)
                for child in children
                if child.id in nodes
                for parent in child.parents
                if parent in parents
            )
            frontier = [c.id for c in fresh]
        return Lineage(dataset_id, nodes, tuple(dict.fromkeys(edges)), truncated)

    async def workflows_using(
        self, dataset_id: str, child_ids: Collection[str], *, limit: int = 100
    ) -> tuple[list[str], list[str]]:
        """Workflows that planned this dataset (computed, shared, reused or skipped it),
        and those that planned a dataset computed from it, newest first."""
        planned = await self.store.find_workflows_with_datasets([dataset_id], limit=limit)
        readers = (
            await self.store.find_workflows_with_datasets(child_ids, limit=limit)
            if child_ids
            else []
        )
        return planned, readers

    async def verify(self, dataset: protocol.DatasetRecord) -> integrity.Verdict:
        """Hash the dataset's files again and compare with its recorded digest.

        A mismatch is logged and counted; the planner finds it too (its own
        check sees the changed files) and recomputes the dataset on its next reuse.
        """
        if not dataset.is_managed or dataset.state not in states.DATASET_ON_DISK:
            return integrity.Verdict(integrity.Status.UNVERIFIABLE)
        verdict = await self.storage.verify(dataset.path, dataset.digest, full=True)
        if verdict.bad:
            metrics.DIGEST_MISMATCHES.labels(where="verify").inc()
            logger.warning(
                "dataset %s is %s (recorded %s, found %s)",
                dataset.id,
                verdict.status.value,
                dataset.digest,
                verdict.digest,
                extra={"event": "dataset_digest_mismatch", "dataset_id": dataset.id},
            )
        return verdict

    async def storage_summary(self) -> dict[str, Any]:
        """`{"usedBytes", "bytesByState"}` (and `capacityBytes` when a budget is set)."""
        # A DELETED dataset keeps the size it had, for its history; it takes no storage.
        by_state = {
            s: n for s, n in (await self.store.bytes_by_state()).items() if s in USING_STORAGE
        }
        summary: dict[str, Any] = {
            "usedBytes": sum(by_state.values()),
            "bytesByState": {s.value: n for s, n in sorted(by_state.items())},
        }
        if self.capacity_bytes is not None:
            summary["capacityBytes"] = self.capacity_bytes
        return summary


@dataclass(frozen=True, slots=True)
class Lineage:
    """A dataset's ancestor (or descendant) graph."""

    dataset_id: str
    #: Every dataset of the graph (the root first), None for an input whose record is gone.
    records: Mapping[str, protocol.DatasetRecord | None]
    #: (parent id, child id) pairs.
    edges: tuple[tuple[str, str], ...]
    #: Whether the graph was cut at its size limit (descendants only).
    truncated: bool = False

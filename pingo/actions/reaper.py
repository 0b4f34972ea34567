"""The reaper: reconciles SUBMITTED/RUNNING actions whose callback never came.

Two kinds, both after a lease plus a grace (`reconcile_grace_s`, for late
callbacks from a cluster):

- another node's actions whose lease expired (that node died or lost touch);
- this node's own submitted actions, whose leases it keeps renewing, still
  without a callback a lease plus the grace after their submission (the
  cluster's notification was lost); asked again every lease while RUNNING.

The reaper asks the action's executor what it knows (`Reaper.executor_status`,
the seam cluster reconciliation extends) and resolves the action through the
callbacks:

- SUCCEEDED → `success`; FAILED → `failed`; KILLED → `killed`;
- RUNNING → left alone (this node's own work is held again, so its lease renews;
  a held action is asked again a lease later);
- UNKNOWN (the local work of a dead node, an executor this node lacks, no
  external id yet) → `release_lost`: READY again while attempts remain; but
  `success` when the attempt left evidence beside its staging output that it
  completed (`storage.read_completion`: its node's note, or the sandbox's exit
  status): the dead node's work completed and only its report was lost, so it
  is not run a second time.

Every node may run it: the callbacks' compare-and-set keeps each resolution
single-effect.

Every lease it also settles the actions sharing another workflow's computation
whose producer ended without their settlement (a node died in between:
`OutcomeService.settle_stranded`), and fails the workflows whose plan a node died
writing on MongoDB (`OutcomeService.abandon_unwritten`). It also sweeps the local
data root's staging directory, on its first run and every lease after (`sweep_staging`): an entry
(a staging output, or a sandbox box) belongs to an attempt, named in its file
name; once that attempt is no longer its action's current one (its action moved
on, another attempt started), or its lease expired while it was only claimed,
nothing will promote it and it is removed. A submitted attempt's entries stay
until it is resolved, lease or not: its completion note may be what reconciles it.
Entries younger than a lease are left alone, so a sweep never races an attempt being started.
With it goes `sweep_replaced`: directory copies a forced recompute replaced while
readers held claims on them are removed once the dataset has no claim. On a node
whose local executor is sandboxed, it also kills, every lease, the sandboxes that
a server process killed on this machine left running (`sandbox.kill_orphans`):
the next server to start would, but a machine where other nodes keep running
might not see one start for days, and the orphan runs, and uses the machine,
until then.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from pingo import errors, loops, metrics, states
from pingo.actions.executors import base, sandbox
from pingo.actions.leases import HeldActions
from pingo.config import Settings
from pingo.datasets import trees
from pingo.datasets.storage import (
    COMPLETED_SUFFIX,
    EXIT_STATUS_SUFFIX,
    STAGING_DIR,
    Completion,
    DatasetStorage,
)
from pingo.store.protocol import ActionRecord, Store

logger = logging.getLogger(__name__)

A = states.ActionState


class Resolver(Protocol):
    """The outcomes the reaper resolves actions through (`OutcomeService`)."""

    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> object: ...

    async def failed(self, callback_id: str, attempt: int, error: str) -> object: ...

    async def killed(self, callback_id: str, attempt: int) -> object: ...

    async def release_lost(self, action: ActionRecord, reason: str) -> object: ...

    async def settle_stranded(self) -> int: ...

    async def abandon_unwritten(self) -> int: ...


class Reaper(loops.Loop):
    """Resolves actions whose node or callback went missing."""

    name = "reaper"

    def __init__(
        self,
        store: Store,
        settings: Settings,
        executors: Mapping[str, base.Executor],
        outcomes: Resolver,
        held: HeldActions,
        *,
        storage: DatasetStorage | None = None,
        sweep_sandboxes: bool = False,
        batch: int = 100,
    ) -> None:
        super().__init__(interval_s=max(0.05, min(settings.lease_s / 3, settings.poll_interval_s)))
        self.store = store
        self.node_id = settings.node_id
        self.grace = timedelta(seconds=settings.reconcile_grace_s)
        self.lease_s = settings.lease_s
        #: Collect sandboxed outputs as fresh copies (`sandbox.collect`).
        self.fresh_outputs = settings.sandbox_network == "on"
        self.executors = executors
        self.outcomes = outcomes
        self.held = held
        self.batch = batch
        self.storage = storage
        self.sweep_sandboxes = sweep_sandboxes
        self._next_sweep = 0.0

    async def run_once(self) -> bool:
        await self.check_overdue()
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.lease_s
            if self.storage is not None:
                await self.sweep_staging(self.storage)
                await self.sweep_replaced(self.storage)
            if self.sweep_sandboxes:
                await asyncio.to_thread(sandbox.kill_orphans)
            # A node that died between a producer's outcome and settling the actions
            # sharing its computation left them waiting: settle them here.
            await self.outcomes.settle_stranded()
            # A node that died writing a plan (MongoDB) left its workflow half-written.
            await self.outcomes.abandon_unwritten()
        expired = await self.store.list_actions_in_states(
            {A.SUBMITTED, A.RUNNING}, lease_expired=True, limit=self.batch
        )
        now = self.store.clock()
        resolved = 0
        for action in expired:
            if action.key in self.held:
                # Ours, and the renewer is on it (the lease lapsed between two renewals).
                continue
            if action.lease_expires_at is not None and action.lease_expires_at + self.grace > now:
                continue
            if await self.reconcile(action):
                resolved += 1
        return resolved > 0 and len(expired) == self.batch

    async def check_overdue(self) -> None:
        """Reconcile this node's own submitted actions whose callback is overdue."""
        now = time.monotonic()
        after_s = self.lease_s + self.grace.total_seconds()
        for key, held in self.held.overdue(after_s, now):
            executor = self.executors.get(held.action_type)
            if executor is None or held.external_id is None:
                continue
            status = await executor.status(held.external_id)
            if status is base.ExecutorStatus.RUNNING:
                held.check_at = now + self.lease_s
                continue
            action = await self.store.get_action(*key)
            if (
                action is not None
                and action.state in (A.SUBMITTED, A.RUNNING)
                and action.attempts == held.attempt
            ):
                await self.reconcile(action, status)
            # Resolved now, or it ended through a callback this node did not see.
            self.held.remove(key)

    async def executor_status(self, action: ActionRecord) -> base.ExecutorStatus:
        """What the action's executor on this node knows of its work."""
        executor = self.executors.get(action.type)
        if executor is None or action.external_id is None:
            return base.ExecutorStatus.UNKNOWN
        return await executor.status(action.external_id)

    async def reconcile(
        self, action: ActionRecord, status: base.ExecutorStatus | None = None
    ) -> bool:
        """Resolve one action from its executor's `status` (asked when not given).

        True when its state was acted upon.
        """
        if status is None:
            status = await self.executor_status(action)
        if status is base.ExecutorStatus.RUNNING:
            if action.owner == self.node_id:
                self.held.add(action)
            return False
        runtime_s = None
        failure = None
        if status is base.ExecutorStatus.UNKNOWN:
            try:
                completion = await self.noted_completion(action)
            except (OSError, trees.UnstorableOutput) as exc:
                # Completed, but what it wrote cannot be stored: a failure, not a loss
                # (a retry would only write it again).
                completion, status = None, base.ExecutorStatus.FAILED
                failure = f"the output could not be stored: {exc}"
            if completion is not None:
                status = base.ExecutorStatus.SUCCEEDED
                runtime_s = completion.runtime_s
        try:
            await self._resolve(action, status, runtime_s, failure)
        except errors.NotFound:
            return False
        except errors.Conflict as exc:
            # Someone resolved it first (a late callback, another node's reaper).
            logger.debug(
                "reconciling %s/%s lost: %s",
                action.workflow_id,
                action.action_id,
                exc,
                extra={"event": "reconcile_lost"},
            )
            return False
        metrics.RECONCILIATIONS.labels(outcome=status.value.lower()).inc()
        logger.info(
            "reconciled %s/%s attempt %d (executor says %s)",
            action.workflow_id,
            action.action_id,
            action.attempts,
            status.value,
            extra={
                "event": "action_reconciled",
                "workflow_id": action.workflow_id,
                "action_id": action.action_id,
                "status": status.value,
            },
        )
        return True

    async def noted_completion(self, action: ActionRecord) -> Completion | None:
        """What its attempt left beside its staging output to say it completed, if anything.

        A sandboxed output its node had no time to take out of its box is taken out
        here, as that node would have, ready for the success to promote it.
        """
        if self.storage is None or action.attempts < 1:
            return None
        staging = self.storage.staging_path(
            action.dataset_id, action.workflow_id, action.action_id, action.attempts
        )
        completion = await self.storage.completion(staging)
        if completion is not None:
            await asyncio.to_thread(
                functools.partial(sandbox.collect, staging, fresh=self.fresh_outputs)
            )
        return completion

    async def _resolve(
        self,
        action: ActionRecord,
        status: base.ExecutorStatus,
        runtime_s: float | None = None,
        failure: str | None = None,
    ) -> None:
        callback_id, attempt = action.callback_id, action.attempts
        if status is base.ExecutorStatus.SUCCEEDED:
            await self.outcomes.success(callback_id, attempt, runtime_s=runtime_s)
        elif status is base.ExecutorStatus.FAILED:
            await self.outcomes.failed(
                callback_id, attempt, failure or "the executor reports that the work failed"
            )
        elif status is base.ExecutorStatus.KILLED:
            await self.outcomes.killed(callback_id, attempt)
        else:
            await self.outcomes.release_lost(
                action,
                f"the lease of node {action.owner} expired and no executor here knows "
                f"attempt {attempt}",
            )

    async def sweep_staging(self, storage: DatasetStorage) -> int:
        """Remove staging entries of attempts that hold no lease; return how many."""
        if not storage.is_local:
            return 0
        entries = await asyncio.to_thread(_staging_entries, f"{storage.root}/{STAGING_DIR}")
        cutoff = time.time() - self.lease_s
        removed = 0
        for path, mtime in entries:
            if mtime > cutoff or await self._leased(os.path.basename(path)):
                continue
            # One the server cannot remove is logged and left for the next sweep: it
            # must not stop the sweep, or the node (a loop that raises stops it).
            if await storage.remove(path):
                removed += 1
        if removed:
            logger.info(
                "removed %d staging leftovers of attempts without a lease",
                removed,
                extra={"event": "staging_swept", "count": removed},
            )
        return removed

    async def sweep_replaced(self, storage: DatasetStorage) -> int:
        """Remove replaced copies whose dataset no reader claims any more; return how many.

        A forced recompute that replaced a directory other actions held claims on
        kept the old copy for them (`DatasetStorage.promote`): those readers have
        it bound in their sandbox. Once the dataset has no claim, every reader that
        started on the old copy has finished (later ones bound the new one).
        """
        entries = await asyncio.to_thread(storage.replaced_entries)
        if not entries:
            return 0
        datasets = await self.store.get_datasets({dataset_id for _, dataset_id in entries})
        removed = 0
        for path, dataset_id in entries:
            dataset = datasets.get(dataset_id)
            if dataset is not None and dataset.claims:
                continue
            await storage.remove(path)
            removed += 1
        if removed:
            logger.info(
                "removed %d replaced dataset copies no reader holds any more",
                removed,
                extra={"event": "replaced_swept", "count": removed},
            )
        return removed

    async def _leased(self, name: str) -> bool:
        """Whether the attempt a staging entry's name names may still be promoted: it is
        its action's submitted attempt (lease or not: the reaper resolves it), or
        claimed under a live lease."""
        for suffix in (
            sandbox.BOX_SUFFIX,
            sandbox.COLLECTING_SUFFIX,
            COMPLETED_SUFFIX,
            EXIT_STATUS_SUFFIX,
        ):
            name = name.removesuffix(suffix)
        parts = name.rsplit(".", 3)
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return False
        _, workflow_id, action_id, attempt = parts
        action = await self.store.get_action(workflow_id, int(action_id))
        if action is None or action.attempts != int(attempt):
            return False
        if action.state in (A.SUBMITTED, A.RUNNING):
            return True
        return (
            action.state is A.PROCESSING
            and action.lease_expires_at is not None
            and action.lease_expires_at > self.store.clock()
        )


def _staging_entries(directory: str) -> list[tuple[str, float]]:
    try:
        with os.scandir(directory) as entries:
            return [(e.path, e.stat(follow_symlinks=False).st_mtime) for e in entries]
    except FileNotFoundError:
        return []

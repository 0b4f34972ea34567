"""The callback system: what happens when work starts, succeeds, fails or is killed.

Every callback names an action (by its callback id) and the attempt it belongs
to. A callback for an older attempt is stale and changes nothing; the same
callback twice leaves the same state (each step is a compare-and-set that only
the first caller wins, and every step is safe to redo after a crash).

Success stores the dataset *before* the action becomes FINISHED, and the action
becomes FINISHED before its children are released: whoever sees a finished
parent can read its dataset.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from pingo import errors, events, metrics, states
from pingo.datasets import integrity
from pingo.datasets.service import DatasetService
from pingo.store import protocol

if TYPE_CHECKING:
    from pingo.config import Settings
    from pingo.datasets.storage import DatasetStorage

logger = logging.getLogger(__name__)

#: Told that actions became READY: their types, or None for any (the node's scraper).
ReadyNews = Callable[[Collection[str] | None], None]


def no_news(types: Collection[str] | None) -> None:
    """A `ReadyNews` nobody listens to."""


A = states.ActionState
D = states.DatasetState
W = states.WorkflowState
T = states.Trigger

#: States in which an executor may call back for the current attempt.
_EXECUTING: frozenset[states.ActionState] = frozenset({A.SUBMITTED, A.RUNNING})
#: The error of an action the cluster killed while its workflow was running.
_KILLED_BY_CLUSTER = "killed by the cluster (not by Pingo): no attempt is retried"
#: States in which an action has not started and can simply be killed.
_NOT_STARTED: frozenset[states.ActionState] = frozenset({A.WAITING, A.READY, A.PROCESSING})


@dataclass(frozen=True, slots=True)
class _Pending:
    """A success's dataset move, prepared for its finish to make (`_store_dataset`)."""

    move: protocol.DatasetMove
    managed: bool
    runtime_s: float | None


#: Where a computed dataset goes once its files are stored.
_STORED_TARGET: Mapping[states.DatasetState, states.DatasetState] = {
    D.TO_STORE: D.STORED,
    D.TO_LEAF: D.LEAF,
    D.TO_DELETE: D.STORED_TO_DELETE,
}
#: A dataset stored already, by a twin of the same provenance: a success keeps it.
_KEPT: frozenset[states.DatasetState] = frozenset({D.STORED, D.LEAF})
#: A deletor holds the dataset: its files are going away.
_BEING_DELETED: frozenset[states.DatasetState] = frozenset({D.PROCESSING, D.DELETING})
#: Planning reasons whose computation replaces a stored copy of the dataset.
REPLACING_REASONS: frozenset[str] = frozenset({"forced", integrity.MISMATCH_REASON})
#: Workflows whose onFailure is remembered.
_CACHE_SIZE = 4096
#: How often success polls a dataset that a deletor is removing.
_DELETION_POLL_S = 0.05
#: Actions killed, or read for the kill's sweep, per store call when a workflow is
#: killed or aborted; small for the reason `routes.workflows.DOCUMENT_PAGE` is.
_KILL_BATCH = 250
#: Why a workflow whose plan was never written whole failed (`abandon_unwritten`).
UNWRITTEN_ERROR = (
    "its submission was interrupted: the node writing it stopped, or lost the store, "
    "before all its actions were stored; submit it again"
)
#: Sharing actions settled per store read.
_SETTLE_BATCH = 500


P = ParamSpec("P")
R = TypeVar("R")


Handler = Callable[P, Coroutine[Any, Any, R]]


def _timed(kind: str) -> Callable[[Handler[P, R]], Handler[P, R]]:
    """Record how long a callback takes (`pingo_callback_seconds{kind=…}`)."""

    def decorate(handler: Handler[P, R]) -> Handler[P, R]:
        seconds = metrics.CALLBACK_SECONDS.labels(kind=kind)

        @functools.wraps(handler)
        async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            try:
                return await handler(*args, **kwargs)
            finally:
                seconds.observe(time.perf_counter() - started)

        return timed

    return decorate


class StaleCallback(errors.Conflict):
    """The callback belongs to an attempt that is not the action's current one."""

    code = "STALE_CALLBACK"


KillAction = Callable[[protocol.ActionRecord], Awaitable[None]]
WorkflowEnded = Callable[[protocol.WorkflowRecord], Awaitable[None]]
ActionFailed = Callable[[protocol.ActionRecord, protocol.WorkflowRecord], Awaitable[None]]


class OutcomeService:
    """Applies callbacks to actions, datasets and workflows (implements `Reporter`)."""

    def __init__(
        self,
        store: protocol.Store,
        storage: DatasetStorage,
        settings: Settings,
        *,
        on_ready: ReadyNews = no_news,
        kill_action: KillAction | None = None,
        on_workflow_ended: WorkflowEnded | None = None,
        on_action_failed: ActionFailed | None = None,
        feed: bool = True,
    ) -> None:
        self.store = store
        self.storage = storage
        self.settings = settings
        self.on_ready = on_ready
        self.kill_action = kill_action
        #: Told of each workflow this node moved to SUCCEEDED, FAILED or KILLED (webhooks).
        self.on_workflow_ended = on_workflow_ended
        #: Told of each action this node moved to FAILED for good (webhooks).
        self.on_action_failed = on_action_failed
        #: Whether outcomes go to their owner's events feed (the simulator has no users).
        self.feed = feed
        self._on_failure_cache: dict[str, str] = {}
        #: Workflow id -> (owner, name) (immutable), for the feed events of dataset stores.
        self._owner_cache: dict[str, tuple[str, str]] = {}
        #: Dataset id -> the outcome of this node's store of it in flight (the dataset as
        #: that store left it, or None): twins succeeding meanwhile wait for it.
        self._storing: dict[str, asyncio.Future[protocol.DatasetRecord | None]] = {}

    # -------------------------------------------------------------- callbacks

    @_timed("running")
    async def running(self, callback_id: str, attempt: int) -> protocol.ActionRecord:
        """The executor started the work: SUBMITTED → RUNNING."""
        action = await self._current(callback_id, attempt)
        if action.state is not A.SUBMITTED:
            return action
        changes = protocol.ActionChanges(
            started_at=self.store.clock() if action.started_at is None else protocol.KEEP
        )
        moved = await self._move(action, {A.SUBMITTED}, A.RUNNING, T.CALLBACK, changes)
        return moved or await self._reread(action)

    @_timed("success")
    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> protocol.ActionRecord:
        """The work succeeded: store the dataset, finish the action, release its children."""
        # The action and its dataset in one store call.
        found = await self.store.get_action_and_dataset_by_callback(callback_id)
        action, dataset = (None, None) if found is None else found
        action = self._check_current(callback_id, attempt, action)
        if action.state not in _EXECUTING:
            return action
        now = self.store.clock()
        if runtime_s is None and action.started_at is not None:
            runtime_s = max(0.0, (now - action.started_at).total_seconds())
        changes = protocol.ActionChanges(
            finished_at=now, runtime_s=runtime_s, error=None, lease_expires_at=None
        )
        # One store call: FINISHED by compare-and-set, then (only for the winner) its
        # input claims dropped, its children released and the actions sharing its
        # computation read, to be settled below; with the dataset's own move to its
        # stored state first when this success stores it (`pending`).
        states.ensure_transition(action.state, A.FINISHED, T.CALLBACK)
        finish = functools.partial(
            self.store.finish_action,
            action.workflow_id,
            action.action_id,
            _EXECUTING,
            changes,
            if_attempt=action.attempts,
            attached_limit=_SETTLE_BATCH,
        )
        pending = await self._store_dataset(action, runtime_s, dataset)
        outcome = None if pending is None else await self._finish_storing(action, pending, finish)
        if outcome is None:
            outcome = await finish()
        if outcome is None:
            _log_cas_lost(action, A.FINISHED)
            return await self._reread(action)
        finished, released, attached = outcome
        metrics.action_transitions(A.FINISHED.value).inc()
        if released:
            metrics.action_transitions(A.READY.value).inc(len(released))
            self.on_ready({a.type for a in released})
        elif await self._may_be_last(finished):
            await self._finish_if_done(finished.workflow_id, T.CALLBACK)
        await self.settle_sharers(finished.workflow_id, finished.action_id, first=attached)
        logger.info(
            "action %s/%s finished",
            finished.workflow_id,
            finished.action_id,
            extra={
                "event": "action_finished",
                "workflow_id": finished.workflow_id,
                "action_id": finished.action_id,
                "ready": len(released),
            },
        )
        return finished

    @_timed("failed")
    async def failed(self, callback_id: str, attempt: int, error: str) -> protocol.ActionRecord:
        """The work failed: retry after backoff while attempts remain, else FAILED."""
        action = await self._current(callback_id, attempt)
        if action.state not in _EXECUTING:
            return action
        moved = await self._fail_attempt(action, error, T.CALLBACK)
        return moved or await self._reread(action)

    @_timed("killed")
    async def killed(self, callback_id: str, attempt: int) -> protocol.ActionRecord:
        """The work was killed: KILLED when Pingo stopped it (a user's kill, an abort),
        FAILED when the cluster did so behind Pingo's back (no retry: someone meant it)."""
        action = await self._current(callback_id, attempt)
        if action.state not in _EXECUTING:
            return action
        workflow = await self._workflow(action.workflow_id)
        if workflow.state is W.RUNNING:
            # Pingo kills only when the workflow ends, and ends it first: this was not us.
            moved = await self._fail_for_good(action, _KILLED_BY_CLUSTER, T.CALLBACK)
            return moved or await self._reread(action)
        now = self.store.clock()
        changes = protocol.ActionChanges(finished_at=now, error="killed", lease_expires_at=None)
        moved = await self._move(action, _EXECUTING, A.KILLED, T.CALLBACK, changes)
        if moved is None:
            return await self._reread(action)
        await self._remove_staging(moved)
        await self._discard(moved)
        return moved

    async def submit_failed(
        self, action: protocol.ActionRecord, error: str
    ) -> protocol.ActionRecord:
        """The executor refused the submission: READY with backoff, or FAILED past maxAttempts."""
        moved = await self._fail_attempt(action, error, T.SUBMITTER)
        return moved or await self._reread(action)

    async def release_lost(
        self, action: protocol.ActionRecord, reason: str
    ) -> protocol.ActionRecord | None:
        """The node running the action died: READY again (the attempt counts), or FAILED.

        None when the action moved on meanwhile (a callback or another reaper won).
        """
        if action.state not in _EXECUTING:
            return None
        return await self._fail_attempt(action, reason, T.REAPER)

    async def kill_workflow(self, workflow_id: str) -> protocol.WorkflowRecord:
        """The user kills a workflow: it becomes KILLED and so does every unfinished action."""
        workflow = await self.store.get_workflow(workflow_id)
        if workflow is None:
            raise errors.NotFound(f"no workflow {workflow_id}")
        if workflow.state is W.RUNNING:
            states.ensure_transition(W.RUNNING, W.KILLED, T.USER)
            moved = await self.store.transition_workflow(
                workflow_id,
                {W.RUNNING},
                W.KILLED,
                protocol.WorkflowChanges(finished_at=self.store.clock(), error="killed by user"),
            )
            if moved is not None:
                await self._ended(moved)
            workflow = moved or await self._workflow(workflow_id)
        if workflow.state is not W.KILLED:
            raise errors.Conflict(f"workflow {workflow_id} already ended {workflow.state.value}")
        # Swept even when it was KILLED already: a kill interrupted by a crash finishes now.
        await self._sweep(workflow_id, "workflow killed", T.USER)
        logger.info(
            "workflow %s killed",
            workflow_id,
            extra={"event": "workflow_killed", "workflow_id": workflow_id},
        )
        return workflow

    async def abandon_unwritten(self) -> int:
        """The reaper's backstop for a plan half-written on MongoDB: FAILED, with the
        reason, for every workflow whose planning passed the deadline and a lease with
        its plan still not written whole (`Store.list_unwritten_workflows`); returns
        how many. Its writer is gone (or would be refused by now: docs/states.md), so
        the workflow would otherwise stay RUNNING for ever with actions that never come.
        What was written is killed like an abort's; the deletor then drops the claims
        its missing actions' planning took."""
        now = self.store.clock()
        margin = timedelta(seconds=self.settings.plan_deadline_s + self.settings.lease_s)
        abandoned = 0
        for workflow_id in await self.store.list_unwritten_workflows(limit=_SETTLE_BATCH):
            started = protocol.planning_started_at(workflow_id)
            if started is None or now - started <= margin:
                continue
            abandoned += await self._fail_unwritten(workflow_id, T.REAPER)
        return abandoned

    async def abandon_interrupted(self, workflow_id: str) -> bool:
        """The writer's own clean-up after `Store.persist_plan` raised: its caller is
        told the submission failed, so a workflow it may have written in part (MongoDB
        writes a plan in steps) ends FAILED now, with the reason, instead of at the
        reaper's deadline. Whether it did; False when nothing of it was stored (the
        other stores write a plan at once), or it ended already."""
        return await self._fail_unwritten(workflow_id, T.PLANNER)

    async def _fail_unwritten(self, workflow_id: str, trigger: states.Trigger) -> bool:
        states.ensure_transition(W.RUNNING, W.FAILED, trigger)
        moved = await self.store.transition_workflow(
            workflow_id,
            {W.RUNNING},
            W.FAILED,
            protocol.WorkflowChanges(finished_at=self.store.clock(), error=UNWRITTEN_ERROR),
        )
        if moved is None:
            return False  # never stored, or ended meanwhile (a user's kill, another reaper)
        logger.error(
            "workflow %s failed: %s",
            workflow_id,
            UNWRITTEN_ERROR,
            extra={"event": "workflow_unwritten", "workflow_id": workflow_id},
        )
        await self._ended(moved)
        # What was written is aborted as a failure's abort would (`recover_workflow`).
        await self._sweep(workflow_id, "workflow failed", T.CALLBACK)
        return True

    async def recover_workflow(self, workflow_id: str) -> protocol.WorkflowRecord:
        """Redo the follow-up steps a crashed node may have left undone (idempotent).

        A node can die between two steps of a callback: after an action became
        FINISHED but before its children were released or its claims dropped;
        after an action FAILED but before the workflow was aborted; in the middle
        of a kill. Every step is safe to redo, so this replays what is missing.
        Call it for each RUNNING workflow when a node starts (`recover_running`).
        """
        workflow = await self._workflow(workflow_id)
        actions = await self.store.list_actions(workflow_id)
        if workflow.state in (W.KILLED, W.FAILED):
            if any(a.state in states.ACTION_LEFT for a in actions):
                trigger = T.USER if workflow.state is W.KILLED else T.CALLBACK
                await self._sweep(workflow_id, f"workflow {workflow.state.value.lower()}", trigger)
                actions = await self.store.list_actions(workflow_id)
            await self._release_stale_claims(actions)
            await self.settle_sharers(workflow_id)
            return workflow
        if workflow.state is not W.RUNNING:
            await self._release_stale_claims(actions)
            return workflow
        by_id = {a.action_id: a for a in actions}
        woke = False
        for parent in actions:
            if parent.state is not A.FINISHED or parent.reused:
                continue
            stuck = [
                c
                for c in parent.children
                if c in by_id
                and by_id[c].state is A.WAITING
                and parent.action_id in by_id[c].waiting_on
            ]
            if stuck and await self.store.release_parent(workflow_id, parent.action_id, stuck):
                woke = True
        for child in actions:
            # Its last parent left the waiting set but the flip to READY was lost
            # (MongoDB applies the two as separate writes). Releasing any finished
            # parent again flips a WAITING action whose set is empty.
            if child.state is A.WAITING and not child.waiting_on and child.inputs:
                parent_id = next(iter(child.inputs))
                if await self.store.release_parent(workflow_id, parent_id, [child.action_id]):
                    woke = True
        await self._release_stale_claims(actions)
        # A node may have died between a producer's outcome and settling its sharers,
        # or between planning a sharing action and checking its producer once more.
        for waiting in actions:
            if waiting.is_attached:
                await self.settle_shared(waiting, T.REAPER)
        bad = [a for a in actions if a.state in states.ACTION_UNSUCCESSFUL]
        if bad:
            await self._drop_datasets(bad)
            await self.settle_sharers(workflow_id)
            first = bad[0]
            error = first.error or f"action {first.action_id} did not finish"
            if workflow.on_failure == "continue":
                victims = _descendants(by_id, bad)
                await asyncio.gather(
                    *(self._skip_downstream(v, "a parent action did not finish") for v in victims)
                )
            else:
                await self._after_failure(first, error, T.CALLBACK)
        if woke:
            self.on_ready(None)
        await self._finish_if_done(workflow_id, T.CALLBACK)
        return await self._workflow(workflow_id)

    async def recover_running(self, *, page_size: int = 100) -> int:
        """`recover_workflow` for every RUNNING workflow; returns how many were checked."""
        checked = 0
        cursor: str | None = None
        while True:
            page = await self.store.list_workflows(state=W.RUNNING, limit=page_size, cursor=cursor)
            for workflow in page.items:
                await self.recover_workflow(workflow.id)
                checked += 1
            if page.next_cursor is None:
                return checked
            cursor = page.next_cursor

    async def _drop_datasets(self, ended: list[protocol.ActionRecord]) -> None:
        """Give up the datasets that actions which will not finish were computing (one read)."""
        datasets = await self.store.get_datasets({a.dataset_id for a in ended})
        for action in ended:
            dataset = datasets.get(action.dataset_id)
            if (
                dataset is not None
                and dataset.state in states.DATASET_COMPUTING
                and (dataset.producer_workflow_id, dataset.producer_action_id) == action.key
            ):
                states.ensure_transition(dataset.state, D.DELETED, T.CALLBACK)
                await self.store.transition_dataset(dataset.id, {dataset.state}, D.DELETED)

    async def _release_stale_claims(self, actions: list[protocol.ActionRecord]) -> None:
        """Drop the claims that ended actions still hold (one read for all their inputs)."""
        ended = [a for a in actions if a.state in states.ACTION_TERMINAL and not a.reused]
        wanted = {ds for a in ended for ds in a.inputs.values()}
        if not wanted:
            return
        datasets = await self.store.get_datasets(wanted)
        removals = [
            (ds, key)
            for a in ended
            for ds in set(a.inputs.values())
            if ds in datasets
            and (key := protocol.claim_key(a.workflow_id, a.action_id)) in datasets[ds].claims
        ]
        await asyncio.gather(*(self.store.remove_dataset_claim(ds, key) for ds, key in removals))

    # ---------------------------------------------------------------- success

    async def _store_dataset(
        self,
        action: protocol.ActionRecord,
        runtime_s: float | None,
        read: protocol.DatasetRecord | None = None,
    ) -> _Pending | None:
        """Promote the attempt's output onto the dataset path and mark the dataset stored.

        A managed local output is measured and hashed (`integrity`) once promoted,
        when this success writes the record: the record's size and digest describe
        exactly the files now at its path. `read`: the dataset as the caller read it.

        The common case, a first store of the dataset, leaves its move to the stored
        state to the action's finish (`_Pending`), so both are one store call.
        """
        dataset = await self._settled_dataset(action.dataset_id, read)
        managed = bool(action.definition.get("isManaged", True))
        # A forced recompute, or one of a copy that failed verification, must
        # replace the stored copy; otherwise an existing copy was stored by a
        # twin of the same provenance and is kept.
        replace = action.reason in REPLACING_REASONS
        if replace and not await self._may_replace(action, dataset):
            replace = False
        twin = None if replace or dataset.state in _KEPT else self._storing.get(dataset.id)
        if twin is not None:
            # A twin of the same provenance on this node is storing it right now:
            # wait for it rather than promote, hash and lose the compare-and-set,
            # then read the dataset again (what twins succeeding together cost
            # before: two store calls and a file-thread hop each). What it stored
            # is as fresh as a read; if it stored nothing, read.
            theirs = await asyncio.shield(twin)
            dataset = theirs or await self._settled_dataset(action.dataset_id)
        if not replace and dataset.state in _KEPT:
            # Kept as it is, record and files (the loop below would return at once).
            # What this attempt wrote, if anything, goes: one lstat when it wrote
            # nothing, where promoting, sizing and hashing cost a dozen system calls
            # on the event loop, each a hand-over of the GIL.
            if managed:
                staging = self.storage.staging_path(
                    action.dataset_id, action.workflow_id, action.action_id, action.attempts
                )
                if await self.storage.exists(staging):
                    await self.storage.promote(staging, dataset.path)
            return None
        if replace or dataset.id in self._storing:
            await self._store_files(action, runtime_s, dataset, managed, replace)
            return None
        done: asyncio.Future[protocol.DatasetRecord | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._storing[dataset.id] = done
        try:
            stored = await self._store_files(
                action, runtime_s, dataset, managed, replace, defer=True
            )
        except BaseException:
            self._stored(dataset.id, None)
            raise
        if isinstance(stored, protocol.DatasetMove):
            return _Pending(stored, managed, runtime_s)
        self._stored(dataset.id, stored)
        return None

    def _stored(self, dataset_id: str, stored: protocol.DatasetRecord | None) -> None:
        """Tell the twins waiting for this node's store of `dataset_id` how it ended."""
        self._storing.pop(dataset_id).set_result(stored)

    async def _finish_storing(
        self,
        action: protocol.ActionRecord,
        pending: _Pending,
        finish: Callable[..., Awaitable[protocol.Finished | None]],
    ) -> protocol.Finished | None:
        """Store the dataset and finish the action in one store call (`finish_action`'s
        `stored`); None if a compare-and-set lost, once the dataset is stored the way of
        two calls (reread, and moved again from what it is now) for `finish` to follow.
        """
        try:
            outcome = await finish(stored=pending.move)
            if outcome is not None:
                if pending.move.event is not None:
                    events.count_recorded(pending.move.event.kind)
                return outcome
            dataset = await self._settled_dataset(action.dataset_id)
            await self._store_files(action, pending.runtime_s, dataset, pending.managed, False)
            return None
        finally:
            # Twins read what it became: the store call does not return the dataset.
            self._stored(pending.move.dataset_id, None)

    async def _may_replace(
        self, action: protocol.ActionRecord, dataset: protocol.DatasetRecord
    ) -> bool:
        """Whether this forced success may replace the files stored now.

        Planning lets anyone force a dataset with no files, and only those who may
        manage it one that has them (`WorkflowManager._check_forcing`); a dataset
        another user's computation stored while this one ran is theirs now: it is
        kept, as if reused, and what this attempt wrote goes.
        """
        if action.reason != "forced" or dataset.state not in states.DATASET_ON_DISK:
            # A copy that failed verification is repaired whoever's workflow needs it.
            return True
        if dataset.producer_workflow_id == action.workflow_id:
            return True
        workflow = await self.store.get_workflow(action.workflow_id)
        owner = "" if workflow is None else workflow.owner
        datasets = DatasetService(self.store, self.storage)
        allowed = await datasets.manageable_by_owner(owner, [dataset])
        if dataset.id in allowed:
            return True
        logger.warning(
            "forced success of %s/%s does not replace dataset %s, stored by another user's"
            " workflow while it ran",
            action.workflow_id,
            action.action_id,
            dataset.id,
            extra={"event": "forced_replace_refused", "dataset_id": dataset.id},
        )
        return False

    async def _store_files(
        self,
        action: protocol.ActionRecord,
        runtime_s: float | None,
        dataset: protocol.DatasetRecord,
        managed: bool,
        replace: bool,
        *,
        defer: bool = False,
    ) -> protocol.DatasetRecord | protocol.DatasetMove | None:
        """Promote the output and move the dataset to its stored state (compare-and-set).

        Returns the dataset as this left it: stored by this success, or found stored by
        another writer; None if it stored nothing (an intermediate marked for deletion).
        With `defer`, a first store (from a `_STORED_TARGET` state) returns the move
        instead of making it, for `finish_action` to make.
        """
        digest: str | None = None
        # Hashed only when this success stores the record: most successes of a
        # workflow of twins find the same provenance stored already, and keep it.
        unmeasured = managed
        if managed:
            staging = self.storage.staging_path(
                action.dataset_id, action.workflow_id, action.action_id, action.attempts
            )
            path = dataset.path
            # Readers that started on the old copy hold claims: they keep reading it.
            size = await self.storage.promote(
                staging, path, replace=replace, readers=replace and bool(dataset.claims)
            )
        else:
            # The user's own path: the work wrote there directly; measure it. No
            # digest: the user may change it, and it is never reused (always recomputed).
            path = str(action.definition.get("outputPath") or dataset.path)
            size = await self.storage.size(path)
        now = self.store.clock()
        # A few rounds at most: each lost CAS means another writer moved it on.
        for _ in range(5):
            target = _STORED_TARGET.get(dataset.state)
            if target is None and dataset.state is D.DELETED:
                # Evicted or failed elsewhere while this attempt ran: store it again.
                target = D.LEAF if await self._is_leaf(action) else D.STORED
            elif target is None and dataset.state is D.STORED_TO_DELETE:
                # Marked for deletion after planning chose to recompute it. An
                # intermediate may go (it was computed for its consumers, whose
                # claims hold it); this workflow's final output must stay.
                target = D.LEAF if await self._is_leaf(action) else None
            if target is None and replace and dataset.state in states.DATASET_ON_DISK:
                # The files were just replaced: the record must describe the new ones.
                target = dataset.state
            if target is None:
                # STORED / LEAF / an intermediate STORED_TO_DELETE: the same
                # provenance is on disk already (stored by someone else); keep it.
                return dataset if dataset.state in _KEPT else None
            states.ensure_transition(dataset.state, target, T.CALLBACK)
            if unmeasured:
                unmeasured = False
                measured = await self.storage.measure(path)
                if measured is not None:
                    size, digest = measured.size_bytes, measured.digest
            producer_workflow_id, producer_action_id = _producer_of_record(dataset, action)
            changes = protocol.DatasetChanges(
                size_bytes=size,
                digest=digest,
                compute_s=runtime_s,
                stored_at=now,
                path=path,
                producer_workflow_id=producer_workflow_id,
                producer_action_id=producer_action_id,
            )
            # Its owner's feed hears of it in the same write: a node dying in between
            # would leave it stored, found kept by the retry, and never announced.
            event = await self._stored_event(action, dataset.id, target, size)
            if defer and dataset.state in _STORED_TARGET:
                return protocol.DatasetMove(
                    dataset.id, frozenset({dataset.state}), target, changes, event
                )
            moved = await self.store.transition_dataset(
                dataset.id, {dataset.state}, target, changes, event=event
            )
            if moved is not None:
                if event is not None:
                    events.count_recorded(event.kind)
                if replace and dataset.digest not in (None, digest):
                    logger.info(
                        "dataset %s replaced (%s): digest %s -> %s",
                        dataset.id,
                        action.reason,
                        dataset.digest,
                        digest,
                        extra={"event": "dataset_replaced", "dataset_id": dataset.id},
                    )
                return moved
            dataset = await self._settled_dataset(action.dataset_id)
        raise errors.Conflict(f"dataset {action.dataset_id} keeps changing; retry the callback")

    async def _settled_dataset(
        self, dataset_id: str, read: protocol.DatasetRecord | None = None
    ) -> protocol.DatasetRecord:
        """The dataset once no deletor is removing its files (they would race a promotion).

        `read`: the dataset as just read, looked at before reading it again."""
        deadline = time.monotonic() + 2 * self.settings.lease_s
        while True:
            if read is None:
                dataset = await self.store.get_dataset(dataset_id)
            else:
                dataset, read = read, None
            if dataset is None:
                raise errors.NotFound(f"no dataset {dataset_id}")
            if dataset.state not in _BEING_DELETED:
                return dataset
            if time.monotonic() > deadline:
                raise errors.Conflict(f"dataset {dataset_id} is being deleted; retry the callback")
            await asyncio.sleep(_DELETION_POLL_S)

    async def _is_leaf(self, action: protocol.ActionRecord) -> bool:
        """Whether no action of its workflow reads it (rare path: the dataset was DELETED)."""
        workflow = await self.store.get_workflow(action.workflow_id)
        if workflow is None:
            return not action.children
        for other in workflow.document.get("actions", ()):
            for parent in other.get("parentActions", ()) or ():
                if isinstance(parent, Mapping) and parent.get("id") == action.action_id:
                    return False
        return True

    async def _may_be_last(self, finished: protocol.ActionRecord) -> bool:
        """Whether this success may have ended the workflow (a cheap filter before counting).

        A child runs after its parent, so the last action of a workflow to finish
        has no computing child, unless its children were UPSTREAM_FAILED because another
        branch failed, which only a "continue" workflow survives RUNNING.
        """
        if not finished.children:
            return True
        return await self._on_failure(finished.workflow_id) == "continue"

    async def _dataset_stored(
        self, action: protocol.ActionRecord, dataset: protocol.DatasetRecord
    ) -> None:
        """Tell the owner's feed (and the data triggers that read it) of a stored dataset."""
        event = await self._stored_event(action, dataset.id, dataset.state, dataset.size_bytes)
        if event is not None:
            await events.append(self.store, event)

    async def _stored_event(
        self,
        action: protocol.ActionRecord,
        dataset_id: str,
        state: D,
        size_bytes: int | None,
    ) -> protocol.NewEvent | None:
        """`dataset.stored` for the owner's feed (None without a feed or an owner)."""
        if not self.feed:
            return None
        known = await self._owner(action.workflow_id)
        if known is None:
            return None
        owner, workflow_name = known
        return events.stored_event(
            owner=owner,
            workflow_id=action.workflow_id,
            workflow_name=workflow_name,
            action=action,
            dataset_id=dataset_id,
            state=state,
            size_bytes=size_bytes,
        )

    async def _computed_for_another(
        self, action: protocol.ActionRecord, dataset: protocol.DatasetRecord
    ) -> bool:
        """Whether `dataset` was produced by a workflow of another owner than `action`'s
        (or one gone). A producer of the same owner recorded its store in their feed
        already: recording the share too would fire their triggers twice."""
        if not self.feed:
            return False
        mine = await self._owner(action.workflow_id)
        theirs = await self._owner(dataset.producer_workflow_id)
        return mine is not None and (theirs is None or theirs[0] != mine[0])

    async def _owner(self, workflow_id: str) -> tuple[str, str] | None:
        """The workflow's owner and name (immutable, so cached); None for a workflow gone."""
        cached = self._owner_cache.get(workflow_id)
        if cached is not None:
            return cached
        workflow = await self.store.get_workflow(workflow_id)
        if workflow is None:
            return None
        if len(self._owner_cache) >= _CACHE_SIZE:
            self._owner_cache.pop(next(iter(self._owner_cache)))
        known = self._owner_cache[workflow_id] = (workflow.owner, workflow.name)
        return known

    async def _on_failure(self, workflow_id: str) -> str:
        """The workflow's onFailure (immutable, so cached)."""
        cached = self._on_failure_cache.get(workflow_id)
        if cached is not None:
            return cached
        workflow = await self.store.get_workflow(workflow_id)
        value = "abort" if workflow is None else workflow.on_failure
        if len(self._on_failure_cache) >= _CACHE_SIZE:
            self._on_failure_cache.pop(next(iter(self._on_failure_cache)))
        self._on_failure_cache[workflow_id] = value
        return value

    # ---------------------------------------------------------------- sharing

    async def settle_shared(
        self, action: protocol.ActionRecord, trigger: states.Trigger = T.CALLBACK
    ) -> protocol.ActionRecord | None:
        """Settle an action that shares another workflow's computation of its dataset.

        FINISHED without running once the dataset is on disk; computing it itself
        (READY, or WAITING for its own parents) once its producer can no longer store
        it (failed, killed, gone). None when nothing changed: the producer is still at
        it, the action is not waiting for it, or another settler won.
        """
        if not action.is_attached or action.shared_with is None:
            return None
        dataset = await self.store.get_dataset(action.dataset_id)
        if dataset is not None and _holds_for(dataset, action):
            return await self._finish_shared(action, dataset, trigger)
        if dataset is not None and await self._still_computing(dataset, action.shared_with):
            return None
        return await self._detach(action, trigger)

    async def settle_sharers(
        self,
        workflow_id: str,
        action_id: int | None = None,
        trigger: states.Trigger = T.CALLBACK,
        *,
        first: list[protocol.ActionRecord] | None = None,
    ) -> int:
        """`settle_shared` every action sharing with this workflow's action (or any of its
        actions, without `action_id`); returns how many moved. `first` is the first
        batch when the caller read it already (`finish_action(attached_limit=…)`)."""
        moved = 0
        batch = first
        while True:
            if batch is None:
                batch = await self.store.list_attached_actions(
                    workflow_id, action_id, limit=_SETTLE_BATCH
                )
            if not batch:
                return moved
            settled = [r for r in await self._settle_all(batch, trigger) if r is not None]
            moved += len(settled)
            # Those still attached are waiting for a producer still at work: stop there.
            if len(batch) < _SETTLE_BATCH or not settled:
                return moved
            batch = None

    async def settle_stranded(self, limit: int = _SETTLE_BATCH) -> int:
        """The reaper's backstop: settle sharing actions whose settlement a dead node left
        undone; returns how many moved."""
        return await self.settle_waiting(
            await self.store.list_attached_actions(limit=limit), T.REAPER
        )

    async def settle_waiting(
        self, actions: Collection[protocol.ActionRecord], trigger: states.Trigger
    ) -> int:
        """`settle_shared` each of `actions`, skipping those whose producer is still at work
        after one look per producer (most are); returns how many moved."""
        by_producer: dict[str, list[protocol.ActionRecord]] = {}
        for action in actions:
            if action.is_attached and action.shared_with is not None:
                by_producer.setdefault(action.shared_with, []).append(action)
        moved = 0
        for producer, waiting in by_producer.items():
            dataset = await self.store.get_dataset(waiting[0].dataset_id)
            if dataset is not None and await self._still_computing(dataset, producer):
                continue
            settled = await self._settle_all(waiting, trigger)
            moved += sum(1 for r in settled if r is not None)
        return moved

    async def _settle_all(
        self, actions: Collection[protocol.ActionRecord], trigger: states.Trigger
    ) -> list[protocol.ActionRecord | None]:
        return list(await asyncio.gather(*(self.settle_shared(a, trigger) for a in actions)))

    async def _still_computing(self, dataset: protocol.DatasetRecord, producer: str) -> bool:
        """Whether `producer` (a claim key) is still computing `dataset` and may store it."""
        if dataset.state not in states.DATASET_COMPUTING:
            return False
        if protocol.claim_key(dataset.producer_workflow_id, dataset.producer_action_id) != producer:
            return False
        record = await self.store.get_action(*protocol.parse_claim_key(producer))
        if record is None:
            # Its plan may still be being written (MongoDB writes a plan's datasets before
            # its actions); a plan that never lands (its node died) is given up on once
            # the dataset has not moved for a lease.
            quiet = (self.store.clock() - dataset.updated_at).total_seconds()
            return quiet < self.settings.lease_s
        return record.state not in states.ACTION_TERMINAL

    async def _finish_shared(
        self,
        action: protocol.ActionRecord,
        dataset: protocol.DatasetRecord,
        trigger: states.Trigger,
    ) -> protocol.ActionRecord | None:
        """WAITING → FINISHED without running: the dataset it shared is on disk."""
        states.ensure_transition(A.WAITING, A.FINISHED, trigger)
        changes = protocol.ActionChanges(finished_at=self.store.clock(), error=None)
        # Only while it still waits for its producer: once it let go (to compute the
        # dataset itself), its own attempt decides.
        outcome = await self.store.finish_action(
            action.workflow_id,
            action.action_id,
            {A.WAITING},
            changes,
            if_waiting_on=action.action_id,
        )
        if outcome is None:
            _log_cas_lost(action, A.FINISHED)
            return None
        finished, released, _ = outcome
        metrics.action_transitions(A.FINISHED.value).inc()
        await self.store.record_dataset_uses((dataset.id,))
        if await self._computed_for_another(finished, dataset):
            # Computed during this run, by another user's workflow: new to this owner,
            # whose data triggers must not miss it because someone else ran it first.
            await self._dataset_stored(finished, dataset)
        logger.info(
            "action %s/%s shared %s's computation of dataset %s",
            finished.workflow_id,
            finished.action_id,
            action.shared_with,
            dataset.id,
            extra={
                "event": "action_shared",
                "workflow_id": finished.workflow_id,
                "action_id": finished.action_id,
                "dataset_id": dataset.id,
            },
        )
        if released:
            metrics.action_transitions(A.READY.value).inc(len(released))
            self.on_ready({a.type for a in released})
        else:
            await self._finish_if_done(finished.workflow_id, T.CALLBACK)
        return finished

    async def _detach(
        self, action: protocol.ActionRecord, trigger: states.Trigger
    ) -> protocol.ActionRecord | None:
        """Stop waiting for the producer: compute the dataset itself (READY once no parent
        of its own is left to wait for). Releasing itself twice changes nothing."""
        states.ensure_transition(A.WAITING, A.READY, trigger)
        before = await self.store.get_action(action.workflow_id, action.action_id)
        if before is None or not before.is_attached:
            return None
        ready = await self.store.release_parent(
            action.workflow_id, action.action_id, [action.action_id]
        )
        moved = ready[0] if ready else await self.store.get_action(*action.key)
        if moved is None or moved.state not in (A.READY, A.WAITING):
            return None  # a finish won the race: it shared after all
        logger.info(
            "action %s/%s computes its dataset itself: %s will not store it",
            action.workflow_id,
            action.action_id,
            action.shared_with,
            extra={
                "event": "action_unshared",
                "workflow_id": action.workflow_id,
                "action_id": action.action_id,
            },
        )
        if ready:
            metrics.action_transitions(A.READY.value).inc(len(ready))
            self.on_ready({a.type for a in ready})
        return moved

    # ---------------------------------------------------------------- failure

    async def _fail_attempt(
        self, action: protocol.ActionRecord, error: str, trigger: states.Trigger
    ) -> protocol.ActionRecord | None:
        """Retry the action after backoff, or fail it for good; None when it moved on.

        Only the winner of the compare-and-set removes the attempt's partial
        output: a success racing this failure may be promoting it.
        """
        now = self.store.clock()
        if action.attempts < action.max_attempts:
            delay = self.settings.retry_backoff_s * 2 ** max(action.attempts - 1, 0)
            changes = protocol.ActionChanges(
                owner=None,
                lease_expires_at=None,
                not_before=now + timedelta(seconds=delay),
                external_id=None,
                error=error,
            )
            expected = _EXECUTING & states.sources(A.READY, trigger)
            moved = await self._move(action, expected, A.READY, trigger, changes)
            if moved is not None:
                await self._remove_staging(action)
                logger.warning(
                    "action %s/%s attempt %d failed (%s); retrying in %.1f s",
                    action.workflow_id,
                    action.action_id,
                    action.attempts,
                    error,
                    delay,
                    extra={
                        "event": "action_retry",
                        "workflow_id": action.workflow_id,
                        "action_id": action.action_id,
                        "attempt": action.attempts,
                    },
                )
            return moved
        return await self._fail_for_good(action, error, trigger)

    async def _fail_for_good(
        self, action: protocol.ActionRecord, error: str, trigger: states.Trigger
    ) -> protocol.ActionRecord | None:
        """FAILED with no retry, then the workflow's onFailure; None when it moved on."""
        changes = protocol.ActionChanges(
            finished_at=self.store.clock(), error=error, lease_expires_at=None
        )
        expected = _EXECUTING & states.sources(A.FAILED, trigger)
        moved = await self._move(action, expected, A.FAILED, trigger, changes)
        if moved is None:
            return None
        await self._remove_staging(action)
        logger.warning(
            "action %s/%s failed after %d attempts: %s",
            action.workflow_id,
            action.action_id,
            action.attempts,
            error,
            extra={
                "event": "action_failed",
                "workflow_id": action.workflow_id,
                "action_id": action.action_id,
            },
        )
        await self._discard(moved)
        await self._action_failed(moved, error)
        await self._after_failure(
            moved, f"action {moved.action_id} ({moved.name}) failed: {error}", trigger
        )
        return moved

    async def _after_failure(
        self, action: protocol.ActionRecord, error: str, trigger: states.Trigger
    ) -> None:
        """Apply the workflow's onFailure after `action` ended FAILED or KILLED."""
        workflow = await self.store.get_workflow(action.workflow_id)
        if workflow is None or workflow.state is not W.RUNNING:
            return
        if workflow.on_failure == "continue":
            await self._kill_descendants(action)
            await self._finish_if_done(action.workflow_id, trigger, error)
            return
        # abort: the workflow fails first, so no success elsewhere can end it SUCCEEDED.
        states.ensure_transition(W.RUNNING, W.FAILED, trigger)
        failed = await self.store.transition_workflow(
            action.workflow_id,
            {W.RUNNING},
            W.FAILED,
            protocol.WorkflowChanges(finished_at=self.store.clock(), error=error),
        )
        await self._sweep(action.workflow_id, "workflow aborted", T.CALLBACK)
        if failed is not None:
            await self._ended(failed)

    async def _kill_descendants(self, action: protocol.ActionRecord) -> None:
        """onFailure "continue": what depends on the failed action can never run."""
        by_id = {a.action_id: a for a in await self.store.list_actions(action.workflow_id)}
        victims = _descendants(by_id, [action])
        error = f"parent action {action.action_id} ({action.name}) did not finish"
        await asyncio.gather(*(self._skip_downstream(v, error) for v in victims))

    async def _skip_downstream(self, action: protocol.ActionRecord, error: str) -> None:
        """UPSTREAM_FAILED: the action never runs, because an ancestor failed."""
        changes = protocol.ActionChanges(
            finished_at=self.store.clock(), error=error, owner=None, lease_expires_at=None
        )
        moved = await self._move(action, {A.WAITING}, A.UPSTREAM_FAILED, T.CALLBACK, changes)
        if moved is not None:
            await self._discard(moved)

    async def _sweep(self, workflow_id: str, error: str, trigger: states.Trigger) -> None:
        """Kill every unfinished action of the workflow; stop running ones through executors."""
        for state in _NOT_STARTED:
            states.ensure_transition(state, A.KILLED, trigger)
        for computing in states.DATASET_COMPUTING:
            states.ensure_transition(computing, D.DELETED, T.CALLBACK)
        changes = protocol.ActionChanges(
            finished_at=self.store.clock(), error=error, owner=None, lease_expires_at=None
        )
        # Bounded batches, each one store call (claims and datasets included): a
        # 100,000-action workflow never holds the store, nor this loop, for long.
        while True:
            killed = await self.store.kill_actions(
                workflow_id, _NOT_STARTED, changes, limit=_KILL_BATCH
            )
            if killed:
                metrics.action_transitions(A.KILLED.value).inc(len(killed))
            if len(killed) < _KILL_BATCH:
                break
        # Listed after the first sweep: an action a submitter took meanwhile is SUBMITTED now.
        running = await self._executing(workflow_id)
        await asyncio.gather(*(self._stop_running(a, error, trigger) for a in running))
        # Other workflows' actions sharing with the killed ones compute for themselves:
        # a kill never kills another workflow's work.
        await self.settle_sharers(workflow_id)

    async def _executing(self, workflow_id: str) -> list[protocol.ActionRecord]:
        """The workflow's actions handed to an executor, read a batch at a time: a big
        workflow's records never fill the heap all at once (issue 13), and only the few
        that run are kept."""
        running: list[protocol.ActionRecord] = []
        after: int | None = None
        while True:
            page = await self.store.list_actions(workflow_id, after=after, limit=_KILL_BATCH)
            running += [a for a in page if a.state in _EXECUTING]
            if len(page) < _KILL_BATCH:
                return running
            after = page[-1].action_id

    async def _stop_running(
        self, action: protocol.ActionRecord, error: str, trigger: states.Trigger
    ) -> None:
        if self.kill_action is not None:
            try:
                await self.kill_action(action)
            except Exception:
                # Marking it KILLED still stops Pingo from using its output.
                logger.warning(
                    "could not stop %s/%s through its executor",
                    action.workflow_id,
                    action.action_id,
                    exc_info=True,
                    extra={"event": "action_kill_failed", "workflow_id": action.workflow_id},
                )
        changes = protocol.ActionChanges(
            finished_at=self.store.clock(), error=error, lease_expires_at=None
        )
        moved = await self._move(action, _EXECUTING, A.KILLED, trigger, changes)
        if moved is not None:
            await self._remove_staging(moved)
            await self._discard(moved)

    # ---------------------------------------------------------------- helpers

    async def _current(self, callback_id: str, attempt: int) -> protocol.ActionRecord:
        action = await self.store.get_action_by_callback(callback_id)
        return self._check_current(callback_id, attempt, action)

    @staticmethod
    def _check_current(
        callback_id: str, attempt: int, action: protocol.ActionRecord | None
    ) -> protocol.ActionRecord:
        if action is None:
            raise errors.NotFound(f"no action has callback id {callback_id}")
        if attempt != action.attempts:
            raise StaleCallback(
                f"attempt {attempt} of action {action.workflow_id}/{action.action_id} "
                f"is stale (current attempt: {action.attempts})"
            )
        return action

    async def _reread(self, action: protocol.ActionRecord) -> protocol.ActionRecord:
        current = await self.store.get_action(action.workflow_id, action.action_id)
        if current is None:
            raise errors.NotFound(f"no action {action.workflow_id}/{action.action_id}")
        return current

    async def _workflow(self, workflow_id: str) -> protocol.WorkflowRecord:
        workflow = await self.store.get_workflow(workflow_id)
        if workflow is None:
            raise errors.NotFound(f"no workflow {workflow_id}")
        return workflow

    async def _move(
        self,
        action: protocol.ActionRecord,
        expected: Collection[states.ActionState],
        new: states.ActionState,
        trigger: states.Trigger,
        changes: protocol.ActionChanges,
    ) -> protocol.ActionRecord | None:
        """Check the edge, then compare-and-set on state and attempt; count the change."""
        states.ensure_transition(action.state, new, trigger)
        moved = await self.store.transition_action(
            action.workflow_id,
            action.action_id,
            expected,
            new,
            changes,
            if_attempt=action.attempts,
        )
        if moved is None:
            _log_cas_lost(action, new)
            return None
        metrics.action_transitions(new.value).inc()
        return moved

    async def _release_inputs(self, action: protocol.ActionRecord) -> None:
        """Drop the claims this action held on the datasets it reads."""
        key = protocol.claim_key(action.workflow_id, action.action_id)
        inputs = set(action.inputs.values())
        if inputs:
            await asyncio.gather(*(self.store.remove_dataset_claim(ds, key) for ds in inputs))

    async def _discard(self, action: protocol.ActionRecord) -> None:
        """An action that will not finish: release its claims, give up its dataset, and
        let the actions sharing its computation compute it themselves."""
        await self._release_inputs(action)
        dataset = await self.store.get_dataset(action.dataset_id)
        # Someone else produces it, or it is on disk: theirs to finish, or kept.
        if (
            dataset is not None
            and dataset.state in states.DATASET_COMPUTING
            and (dataset.producer_workflow_id, dataset.producer_action_id) == action.key
        ):
            states.ensure_transition(dataset.state, D.DELETED, T.CALLBACK)
            await self.store.transition_dataset(dataset.id, {dataset.state}, D.DELETED)
        await self.settle_sharers(action.workflow_id, action.action_id)

    async def _remove_staging(self, action: protocol.ActionRecord) -> None:
        """Remove the attempt's partial output (never an unmanaged action's own path)."""
        if action.attempts < 1 or not action.definition.get("isManaged", True):
            return
        staging = self.storage.staging_path(
            action.dataset_id, action.workflow_id, action.action_id, action.attempts
        )
        with contextlib.suppress(OSError):
            await self.storage.remove(staging)

    async def _finish_if_done(
        self, workflow_id: str, trigger: states.Trigger, error: str | None = None
    ) -> None:
        """End the workflow when none of its actions is left to run."""
        if await self.store.has_actions_in(workflow_id, states.ACTION_LEFT):
            return
        counts = await self.store.count_actions(workflow_id)
        if not counts:
            # No action at all: its plan was never written (a workflow with nothing to
            # run ends at submission). The reaper fails it (`abandon_unwritten`).
            return
        bad = sum(counts.get(s, 0) for s in states.ACTION_UNSUCCESSFUL)
        if bad:
            new = W.FAILED
            message = error or f"{bad} action(s) failed or were killed"
        else:
            new, trigger, message = W.SUCCEEDED, T.CALLBACK, None
        states.ensure_transition(W.RUNNING, new, trigger)
        moved = await self.store.transition_workflow(
            workflow_id,
            {W.RUNNING},
            new,
            protocol.WorkflowChanges(finished_at=self.store.clock(), error=message),
        )
        if moved is not None:
            logger.info(
                "workflow %s %s",
                workflow_id,
                new.value,
                extra={"event": "workflow_ended", "workflow_id": workflow_id, "state": new.value},
            )
            await self._ended(moved)

    async def _action_failed(self, action: protocol.ActionRecord, error: str) -> None:
        """Tell the owner's feed and `on_action_failed`; neither can fail the transition."""
        if not self.feed and self.on_action_failed is None:
            return
        workflow = await self.store.get_workflow(action.workflow_id)
        if workflow is None:
            return
        if self.feed:
            await self._record_failure(workflow, action, error)
        if self.on_action_failed is None:
            return
        try:
            await self.on_action_failed(action, workflow)
        except errors.PingoError as exc:
            logger.warning(
                "action %s/%s failed, but its notifications were not queued: %s",
                action.workflow_id,
                action.action_id,
                exc.message,
                extra={"event": "action_failed_hook_failed", "workflow_id": workflow.id},
            )

    async def _record_failure(
        self, workflow: protocol.WorkflowRecord, action: protocol.ActionRecord, error: str
    ) -> None:
        await events.record(
            self.store,
            events.ACTION_FAILED,
            owner=workflow.owner,
            workflow_id=workflow.id,
            dataset_id=action.dataset_id,
            payload={
                "actionId": action.action_id,
                "actionName": action.name,
                "attempts": action.attempts,
                "error": error,
            },
        )

    async def announce_end(self, workflow: protocol.WorkflowRecord) -> None:
        """Tell the feed and `on_workflow_ended` of a workflow that ended with no callback
        (planned SUCCEEDED: every dataset it needs was reused)."""
        await self._ended(workflow)

    async def _ended(self, workflow: protocol.WorkflowRecord) -> None:
        """Tell the owner's feed and `on_workflow_ended`; neither can fail the transition."""
        if self.feed:
            await events.record_end(self.store, workflow)
        if self.on_workflow_ended is None:
            return
        try:
            await self.on_workflow_ended(workflow)
        except errors.PingoError as exc:
            logger.warning(
                "workflow %s ended, but its notifications were not queued: %s",
                workflow.id,
                exc.message,
                extra={"event": "workflow_ended_hook_failed", "workflow_id": workflow.id},
            )


def _holds_for(dataset: protocol.DatasetRecord, action: protocol.ActionRecord) -> bool:
    """Whether the dataset is on disk for good for a sharing action: STORED or LEAF, or
    marked for deletion while its children's claims hold it (never a final output)."""
    if dataset.state in states.DATASET_REUSABLE:
        return True
    return dataset.state is D.STORED_TO_DELETE and bool(action.children)


def _log_cas_lost(action: protocol.ActionRecord, new: states.ActionState) -> None:
    logger.debug(
        "action %s/%s moved on before %s",
        action.workflow_id,
        action.action_id,
        new.value,
        extra={"event": "action_cas_lost", "workflow_id": action.workflow_id},
    )


def _descendants(
    by_id: Mapping[int, protocol.ActionRecord], roots: Iterable[protocol.ActionRecord]
) -> list[protocol.ActionRecord]:
    """The not-started actions downstream of `roots` (through computing children)."""
    seen: set[int] = set()
    frontier = [c for r in roots for c in r.children]
    while frontier:
        aid = frontier.pop()
        if aid in seen or aid not in by_id:
            continue
        seen.add(aid)
        frontier.extend(by_id[aid].children)
    return [by_id[aid] for aid in sorted(seen) if by_id[aid].state in _NOT_STARTED]


def _producer_of_record(
    dataset: protocol.DatasetRecord, action: protocol.ActionRecord
) -> tuple[str, int]:
    """Who the stored dataset names as its producer: the action that stored it, except
    that a lower twin of the same workflow stays. Planning makes the lowest twin the
    producer, and the workflow's document calls it the one that computed and the others
    shared, whichever finishes first; an action's detail reads twins from this record.
    """
    if (
        dataset.producer_workflow_id == action.workflow_id
        and dataset.producer_action_id < action.action_id
    ):
        return dataset.producer_workflow_id, dataset.producer_action_id
    return action.workflow_id, action.action_id

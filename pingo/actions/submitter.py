"""Submitters: take claimed actions from the queue and hand them to their executors.

Each submitter, for each action: waits for its type's concurrency limit, moves
it PROCESSING → SUBMITTED by compare-and-set (only if this node still owns it;
`attempts + 1`, a fresh lease, `started_at`), resolves its output (the staging
path, or the user's `outputPath` when unmanaged) and its inputs (the parents'
dataset paths), and calls `executor.submit`. A submit error goes to
`OutcomeService.submit_failed` (READY with backoff, or FAILED past
`maxAttempts`). The executor's external id is recorded on the action, for kills
and reconciliation: with the SUBMITTED transition when the executor names its
work beforehand (`external_id_for`), else once `submit` returns.

When the node stops, a submitter hands what it takes back (PROCESSING → READY)
instead of submitting it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pingo import errors, limits, loops, metrics, states
from pingo.actions.executors import base, cluster, sandbox
from pingo.actions.leases import HeldActions
from pingo.actions.scraper import ActionQueue, Claimed, InputPaths, Scraper
from pingo.callbacks import tokens
from pingo.config import Settings
from pingo.store.protocol import KEEP, ActionChanges, ActionRecord, Store, UserRecord

logger = logging.getLogger(__name__)

A = states.ActionState

#: Where a staging path comes from (`DatasetStorage.staging_path`).
StagingPath = Callable[[str, str, int, int], str]
#: `OutcomeService.submit_failed`.
SubmitFailed = Callable[[ActionRecord, str], Awaitable[object]]


class Submitter(loops.Loop):
    """One worker of the submitter pool (the node runs `settings.submitters` of them)."""

    name = "submitter"

    def __init__(
        self,
        index: int,
        *,
        store: Store,
        settings: Settings,
        queue: ActionQueue,
        scraper: Scraper,
        held: HeldActions,
        executors: Mapping[str, base.Executor],
        staging_path: StagingPath,
        submit_failed: SubmitFailed,
        secret: bytes,
        observe_dispatch: Callable[[float], None] = metrics.DISPATCH_SECONDS.observe,
        command_line_refusal: str | None = None,
        quotas: limits.StorageQuotas | None = None,
    ) -> None:
        super().__init__(interval_s=settings.poll_interval_s)
        self.name = f"submitter-{index}"
        self.store = store
        self.settings = settings
        self.node_id = settings.node_id
        self.queue = queue
        self.scraper = scraper
        self.held = held
        self.executors = executors
        self.staging_path = staging_path
        self.submit_failed = submit_failed
        self.secret = secret
        self.observe_dispatch = observe_dispatch
        #: Why only admins' command-line actions may run on this node, if so: they would
        #: run unsandboxed although the sandbox was not turned off (`auto` without user
        #: namespaces), or as root (`Node.command_line_refusal`).
        self.command_line_refusal = command_line_refusal
        #: The storage quotas' last gate (None: not checked before a spawn).
        self.quotas = quotas
        self.finished = asyncio.Event()
        #: The home as text, for the log paths (`base.log_path`).
        self._home = str(settings.home)
        self._submitted = metrics.action_transitions(A.SUBMITTED.value)

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.finished.set()

    def stop(self) -> None:
        """Finish the action in hand; hand back whatever is taken afterwards."""
        super().stop()
        # The queue is unbounded for asyncio (the scraper bounds it), so this never blocks.
        self.queue.put_nowait(None)

    async def run_once(self) -> bool:
        item = await self.queue.get()
        self.scraper.room_freed()
        if item is None:
            return False
        if self.stopping:
            await hand_back(self.store, self.node_id, self.held, item.action)
            return True
        await self.submit(item)
        return True

    async def submit(self, item: Claimed) -> None:
        """Submit one claimed action (never raises for the action's own problems)."""
        action = item.action
        executor = self.executors.get(action.type)
        # Which claim of the action this hand holds: removing its hold is only for it.
        claim = action.version
        try:
            if not await self.held.acquire_limit(action, self._stopping):
                await hand_back(self.store, self.node_id, self.held, action)
                return
            record = await self._mark_submitted(action, executor)
            if record is None:
                return
            # The submitted record is now the claim this node's hold is for, even if a
            # newer claim of the same action was queued meanwhile (that one's submit
            # loses its compare-and-set and must leave this hold alone).
            claim = record.version
            self.held.claimed(record.key, claim)
            if executor is None:
                # Fail at once: no node of this configuration will ever run it.
                await self.submit_failed(
                    record, f"no executor for action type {action.type!r} on this node"
                )
                self.held.remove(action.key, claim=claim)
                return
            try:
                submission = await self._submission(record, item.input_paths)
                await self._ensure_sandbox(record)
                await self._ensure_allowed_here(record, submission)
                await self._ensure_under_quota(record)
                external_id = await executor.submit(submission)
            except Exception as exc:
                if self.stopping:
                    # The executor refused because the node is shutting down:
                    # not the action's fault, so the attempt does not count.
                    await give_back_submitted(self.store, self.node_id, record)
                    self.held.remove(action.key, claim=claim)
                    return
                if isinstance(exc, BlockingIOError):
                    # EAGAIN from the spawn: the machine, or the server's user, is out of
                    # processes for now (say other users' fork bombs at their limits).
                    # Not this action's fault: it waits, its attempt uncounted.
                    delay = timedelta(seconds=self.settings.retry_backoff_s)
                    logger.warning(
                        "submitting %s/%s deferred %g s: %s",
                        record.workflow_id,
                        record.action_id,
                        delay.total_seconds(),
                        exc,
                        extra={"event": "submit_deferred", "workflow_id": record.workflow_id},
                    )
                    await give_back_submitted(
                        self.store, self.node_id, record, not_before=self.store.clock() + delay
                    )
                    self.held.remove(action.key, claim=claim)
                    return
                logger.warning(
                    "submitting %s/%s attempt %d failed: %s",
                    record.workflow_id,
                    record.action_id,
                    record.attempts,
                    exc,
                    extra={"event": "submit_failed", "workflow_id": record.workflow_id},
                )
                await self.submit_failed(record, f"submission failed: {exc}")
                self.held.remove(action.key, claim=claim)
                return
            self.observe_dispatch(time.perf_counter() - item.ready_at)
            self.held.submitted(action.key, record.attempts, external_id)
            if external_id != record.external_id:
                await self._record_external_id(record, external_id)
        except errors.PingoError as exc:
            # The store went away, or a callback (a kill) moved the action on
            # meanwhile: its lease runs out and the reaper or another pass resolves it.
            logger.warning(
                "submitting %s/%s stopped: %s",
                action.workflow_id,
                action.action_id,
                exc,
                extra={"event": "submit_interrupted", "code": exc.code},
            )
            self.held.remove(action.key, claim=claim)

    async def _mark_submitted(
        self, action: ActionRecord, executor: base.Executor | None
    ) -> ActionRecord | None:
        states.ensure_transition(A.PROCESSING, A.SUBMITTED, states.Trigger.SUBMITTER)
        now = self.store.clock()
        attempts = action.attempts + 1
        external_id: str | None = None
        if executor is None:
            # submit_failed fails an action past maxAttempts: make this attempt the last.
            attempts = max(attempts, action.max_attempts)
        else:
            # Executors that name their work before starting it (optional
            # `external_id_for`) save the second write that records the id.
            name_work: Callable[[str, int], str] | None = getattr(executor, "external_id_for", None)
            if name_work is not None:
                external_id = name_work(action.callback_id, attempts)
        record = await self.store.transition_action(
            action.workflow_id,
            action.action_id,
            {A.PROCESSING},
            A.SUBMITTED,
            ActionChanges(
                attempts=attempts,
                lease_expires_at=now + timedelta(seconds=self.settings.lease_s),
                started_at=now,
                external_id=external_id,
                error=None,
            ),
            if_owner=self.node_id,
            # Not only this node's, but still the claim this record came from: if the
            # lease lapsed meanwhile and the action came back to this node through
            # another attempt, this stale record must not submit it (a second run
            # under an attempt number already used).
            if_attempt=action.attempts,
        )
        if record is None:
            # Killed meanwhile, or our lease ran out and another node took it.
            self.held.remove(action.key, claim=action.version)
            logger.debug(
                "%s/%s was no longer ours to submit",
                action.workflow_id,
                action.action_id,
                extra={"event": "submit_lost", "workflow_id": action.workflow_id},
            )
        else:
            self._submitted.inc()
        return record

    async def _ensure_sandbox(self, action: ActionRecord) -> None:
        """Raise SandboxUnavailable for a non-admin's command-line action that this node
        would run unsandboxed, or as root (`command_line_refusal`).

        The API refuses such workflows at submission on this node, but work also comes
        from elsewhere: another node sharing the store, a schedule's tick, a workflow
        stored before a restart that lost user namespaces. This is the last gate
        before the process starts. It reads the store only on a refusing node.
        """
        refusal = self.command_line_refusal
        if refusal is None or action.type != sandbox.COMMAND_LINE:
            return
        owner = await self._owner(action)
        if owner is None or not owner.is_admin:
            raise errors.SandboxUnavailable(refusal)

    async def _ensure_under_quota(self, action: ActionRecord) -> None:
        """Raise StorageQuotaExceeded when the owner's stored datasets are at or past their
        quota: the attempt fails (and is retried after its backoff, by when the owner
        may have deleted some), so one admitted workflow cannot store without end."""
        if self.quotas is None:
            return
        refusal = await self.quotas.refusal(action.workflow_id)
        if refusal is not None:
            raise errors.StorageQuotaExceeded(refusal)

    async def _ensure_allowed_here(self, action: ActionRecord, submission: base.Submission) -> None:
        """Raise Forbidden for a non-admin's local unmanaged output outside their own
        directory of the roots, or a non-admin's cluster action that would run its code
        here or have its client read a local file here (`PINGO_HOST_CLIENTS`,
        `cluster.host_file_refusal`).

        The API refuses them at submission; this gate stops what came another way: a
        node with other settings, a schedule or a workflow accepted before they
        changed. It reads the store only for a refused action or an unmanaged output.
        """
        refusal = sandbox.host_client_refusal(action.type, self.settings)
        if refusal is None and cluster.names_host_files(action.type):
            # Judged on the paths this attempt's placeholders resolve to (the inputs' as
            # stored: a data root changed since planning counts as it is now on disk).
            refusal = cluster.host_file_refusal(
                action.definition, submission.output_path, submission.inputs, self.settings
            )
        if refusal is not None:
            user = await self._owner(action)
            # A revoked owner is no admin: revoking must not turn a refusal into a run.
            if user is None or not user.is_admin:
                raise errors.Forbidden(refusal)
        definition = action.definition
        if definition.get("isManaged", True) is not False:
            return
        path = str(definition.get("outputPath") or "")
        workflow = await self.store.get_workflow(action.workflow_id)
        owner = "" if workflow is None else workflow.owner
        refusal = sandbox.unmanaged_root_refusal(path, self.settings.unmanaged_roots, owner)
        if refusal is not None:
            user = await self.store.get_user(owner)
            if user is None or not user.is_admin:
                raise errors.Forbidden(refusal)

    async def _owner(self, action: ActionRecord) -> UserRecord | None:
        """The user record of the owner of `action`'s workflow, if there is one."""
        workflow = await self.store.get_workflow(action.workflow_id)
        return None if workflow is None else await self.store.get_user(workflow.owner)

    async def _submission(
        self, action: ActionRecord, input_paths: asyncio.Future[InputPaths] | None
    ) -> base.Submission:
        definition: Mapping[str, Any] = action.definition
        if definition.get("isManaged", True) is False:
            output = str(definition["outputPath"])
        else:
            output = self.staging_path(
                action.dataset_id, action.workflow_id, action.action_id, action.attempts
            )
        inputs: dict[int, str] = {}
        if action.inputs:
            paths = await self._input_paths(action, input_paths)
            for parent, dataset_id in action.inputs.items():
                path = paths.get(dataset_id)
                if path is None:
                    raise errors.NotFound(
                        f"input dataset {dataset_id} of parent action {parent} does not exist"
                    )
                inputs[int(parent)] = path
        timeout = definition.get("timeoutSeconds")
        return base.Submission(
            workflow_id=action.workflow_id,
            action_id=action.action_id,
            attempt=action.attempts,
            action_type=action.type,
            definition=definition,
            output_path=output,
            inputs=inputs,
            callback_id=action.callback_id,
            callback_url=f"{self.settings.base_url}/api/v1/callbacks/{action.callback_id}",
            callback_token=tokens.sign(self.secret, action.callback_id, action.attempts),
            timeout_s=float(timeout) if timeout is not None else None,
            log_path=base.log_path(
                self._home, action.workflow_id, action.action_id, action.attempts
            ),
        )

    async def _input_paths(
        self, action: ActionRecord, batch: asyncio.Future[InputPaths] | None
    ) -> InputPaths:
        """The paths of the action's inputs: its batch's read, else a read of its own."""
        if batch is not None:
            try:
                paths = await asyncio.shield(batch)
            except errors.StoreUnavailable:
                paths = {}
            if all(dataset_id in paths for dataset_id in action.inputs.values()):
                return paths
        datasets = await self.store.get_datasets(set(action.inputs.values()))
        return {dataset_id: dataset.path for dataset_id, dataset in datasets.items()}

    async def _record_external_id(self, action: ActionRecord, external_id: str) -> None:
        # The work may already have reported (RUNNING, or even finished): record
        # the id in whichever running state it is in; a finished action needs none.
        for state in (A.SUBMITTED, A.RUNNING):
            states.ensure_transition(state, state, states.Trigger.SUBMITTER)
            record = await self.store.transition_action(
                action.workflow_id,
                action.action_id,
                {state},
                state,
                ActionChanges(external_id=external_id),
                if_attempt=action.attempts,
            )
            if record is not None:
                return


async def hand_back(store: Store, node_id: str, held: HeldActions, action: ActionRecord) -> None:
    """Return a claimed, unsubmitted action to READY for any node (the node is stopping)."""
    states.ensure_transition(A.PROCESSING, A.READY, states.Trigger.SUBMITTER)
    record = await store.transition_action(
        action.workflow_id,
        action.action_id,
        {A.PROCESSING},
        A.READY,
        ActionChanges(owner=None, lease_expires_at=None),
        if_owner=node_id,
    )
    held.remove(action.key, claim=action.version)
    if record is not None:
        logger.debug(
            "handed %s/%s back",
            action.workflow_id,
            action.action_id,
            extra={"event": "action_handed_back", "workflow_id": action.workflow_id},
        )


async def give_back_submitted(
    store: Store, node_id: str, action: ActionRecord, *, not_before: datetime | None = None
) -> None:
    """Undo a submission the executor refused through no fault of the action (the node
    stops, no process could start): READY (from `not_before`), attempt uncounted."""
    states.ensure_transition(A.SUBMITTED, A.READY, states.Trigger.SUBMITTER)
    await store.transition_action(
        action.workflow_id,
        action.action_id,
        {A.SUBMITTED},
        A.READY,
        ActionChanges(
            attempts=max(0, action.attempts - 1),
            owner=None,
            lease_expires_at=None,
            started_at=None,
            external_id=None,
            not_before=KEEP if not_before is None else not_before,
        ),
        if_owner=node_id,
        if_attempt=action.attempts,
    )

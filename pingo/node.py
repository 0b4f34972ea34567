"""A Pingo node: the services and background loops that run workflows on one store.

`Node` wires the workflow manager, the outcome service, the datasets, the executors
and the loops (scraper, submitters, lease renewer, reaper, deletor, and the
retention loop when a storage budget is set). `run_node` is the single entry of
`pingo server`: it opens the store and runs a node until SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import pwd
import signal
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from pingo import errors, heap, limits, loops, states, untrusted
from pingo.actions.executors import base, local, sandbox
from pingo.actions.leases import HeldActions, LeaseRenewer, capacity
from pingo.actions.reaper import Reaper
from pingo.actions.scraper import ActionQueue, ReadyWatch, Scraper
from pingo.actions.submitter import Submitter, hand_back
from pingo.callbacks import tokens
from pingo.config import Settings
from pingo.datasets.deletor import Deletor
from pingo.datasets.service import DatasetService
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.retention import policy
from pingo.retention.loop import RetentionLoop
from pingo.retention.policy import RetentionPolicy
from pingo.schedules import rules as schedule_rules
from pingo.schedules.loop import Scheduler
from pingo.schedules.service import ScheduleService
from pingo.store import open_store
from pingo.store.protocol import ActionRecord, Store, UserLimits, WorkflowRecord
from pingo.store.sqlite import path_from_url
from pingo.webhooks import hooks
from pingo.webhooks.sender import WebhookSender
from pingo.workflows.keep import KeepHook
from pingo.workflows.planner import ForceTargets, StoredSubmission, WorkflowManager

logger = logging.getLogger(__name__)


class _HeldReporter:
    """The in-process callbacks, forgetting an action's lease once its work reported.

    Executors on this node report through it; the action leaves the node's
    held set (and its type's concurrency slot frees) as soon as it ended.
    """

    def __init__(self, outcomes: OutcomeService, held: HeldActions) -> None:
        self._outcomes = outcomes
        self._held = held

    async def running(self, callback_id: str, attempt: int) -> ActionRecord:
        return await self._outcomes.running(callback_id, attempt)

    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> ActionRecord:
        try:
            return await self._outcomes.success(callback_id, attempt, runtime_s=runtime_s)
        finally:
            self._held.remove_callback(callback_id)

    async def failed(self, callback_id: str, attempt: int, error: str) -> ActionRecord:
        try:
            return await self._outcomes.failed(callback_id, attempt, error)
        finally:
            self._held.remove_callback(callback_id)

    async def killed(self, callback_id: str, attempt: int) -> ActionRecord:
        try:
            return await self._outcomes.killed(callback_id, attempt)
        finally:
            self._held.remove_callback(callback_id)


class Node:
    """One Pingo node on a store."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        executors: Mapping[str, base.ExecutorFactory] | None = None,
        keep_hook: KeepHook | None = None,
        secret: bytes | None = None,
        observe_dispatch: Callable[[float], None] | None = None,
    ) -> None:
        """`executors` (action type → factory) replaces the `pingo.executors` entry points
        (tests, benchmarks); `keep_hook` is retention's planning-time hook."""
        self.settings = settings
        self.store = store
        self.secret = secret if secret is not None else tokens.load_or_create_secret(settings.home)
        self.storage = DatasetStorage(settings.data_root)
        self.held = HeldActions(settings.executor_limits, ahead_s=settings.claim_ahead_s)
        self.queue: ActionQueue = asyncio.Queue()
        #: Claims follow capacity (action type → how many run at once), set once the
        #: executors exist below.
        self.capacities: dict[str, int] = {}
        self.scraper = Scraper(store, settings, self.queue, self.held, self.capacities)
        self.outcomes = OutcomeService(
            store,
            self.storage,
            settings,
            on_ready=self.scraper.wake,
            kill_action=self._kill_action,
            on_workflow_ended=self._queue_webhooks,
            on_action_failed=self._queue_failure_webhooks,
        )
        # Retention's policy (with a budget): the loop evicts with it, and the planner
        # asks it whether each new intermediate is worth keeping.
        self.retention_policy: RetentionPolicy | None = None
        #: Whether a big submission may be planned in a child process (`submit_detached`):
        #: the child opens the same store from the settings and makes the same keep hook
        #: from them; a memory store, or a hook handed in, cannot cross to another process.
        self.detaches = keep_hook is None and not settings.store_url.startswith("memory:")
        if settings.storage_capacity_bytes is not None:
            self.retention_policy = policy.load_policy(settings.retention_policy)
            if keep_hook is None:
                keep_hook = policy.keep_hook(self.retention_policy, store)
        self.workflows = WorkflowManager(
            store,
            self.storage,
            settings,
            on_ready=self.scraper.wake,
            keep_hook=keep_hook,
            outcomes=self.outcomes,
        )
        self.datasets = DatasetService(
            store, self.storage, capacity_bytes=settings.storage_capacity_bytes
        )
        factories = base.load_executor_factories() if executors is None else dict(executors)
        #: How work reports, in-process or over HTTP: the callbacks, releasing held slots.
        self.reporter = _HeldReporter(self.outcomes, self.held)
        self.executors: dict[str, base.Executor] = {}
        for action_type, factory in factories.items():
            try:
                self.executors[action_type] = factory(settings, self.reporter)
            except errors.ConfigurationError as exc:
                # A cluster client missing on this machine (no `hadoop`, no `spark-submit`)
                # must not stop the node: the API refuses that type at submission instead.
                logger.warning(
                    "no executor for %s actions on this node: %s",
                    action_type,
                    exc.message,
                    extra={"event": "executor_unavailable", "action_type": action_type},
                )
        for action_type, executor in self.executors.items():
            self.capacities[action_type] = capacity(action_type, executor, settings)
        self.scraper.capacities = dict(self.capacities)
        self.held.on_release = self.scraper.capacity_freed
        self.ready_watch = ReadyWatch(store, self.scraper, settings)
        extra = {} if observe_dispatch is None else {"observe_dispatch": observe_dispatch}
        self.quotas = limits.StorageQuotas(store, settings)
        self.submitters = [
            Submitter(
                i,
                store=store,
                settings=settings,
                queue=self.queue,
                scraper=self.scraper,
                held=self.held,
                executors=self.executors,
                staging_path=self.storage.staging_path,
                submit_failed=self.outcomes.submit_failed,
                secret=self.secret,
                command_line_refusal=self.command_line_refusal,
                quotas=self.quotas,
                **extra,
            )
            for i in range(max(1, settings.submitters))
        ]
        self.renewer = LeaseRenewer(
            store, settings.node_id, self.held, settings.lease_s, stop_work=self._stop_work
        )
        self.reaper = Reaper(
            store,
            settings,
            self.executors,
            self.outcomes,
            self.held,
            storage=self.storage,
            sweep_sandboxes=self.sandbox == "on",
        )
        self.deletor = Deletor(store, self.storage, settings)
        self.schedules = ScheduleService(
            store,
            settings,
            self.workflows,
            self.storage,
            detached=self.submit_tick if self.detaches else None,
        )
        self.scheduler = Scheduler(self.schedules)
        self.webhooks = WebhookSender(store, settings)
        self.retention: loops.Loop | None = None
        self._task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the executors and every loop, supervised, in a background task."""
        if self._task is not None:
            raise errors.Conflict("the node is already started")
        for executor in self.executors.values():
            await executor.start()
        # A node that died between two steps of a callback (an action FINISHED
        # but its children not yet released, a kill half done) left work that no
        # lease will bring back: replay those steps (idempotent; planner helper).
        await self.outcomes.recover_running()
        self.retention = self._retention_loop()
        background: list[loops.Loop] = [
            self.ready_watch,
            self.renewer,
            self.reaper,
            self.deletor,
            self.scheduler,
            self.webhooks,
        ]
        if self.retention is not None:
            background.append(self.retention)
        self._task = asyncio.create_task(
            loops.supervise([self.scraper, *self.submitters, *background]), name="pingo-node"
        )
        # Work left READY before this node started (or by a crashed node) needs no poll.
        self.scraper.wake()
        logger.info(
            "node %s started with executors for %s; sandbox %s",
            self.settings.node_id,
            ", ".join(sorted(self.executors)) or "nothing",
            self.sandbox,
            extra={
                "event": "node_started",
                "node_id": self.settings.node_id,
                "sandbox": self.sandbox,
            },
        )

    def _retention_loop(self) -> loops.Loop | None:
        if self.retention_policy is None:
            return None
        return RetentionLoop(
            self.store, self.settings, self.retention_policy, on_evict=self.deletor.wake
        )

    async def stop(self) -> None:
        """Stop claiming, hand queued work back, let running work finish briefly, stop loops."""
        task, self._task = self._task, None
        if task is None:
            return
        self.scraper.stop()
        for submitter in self.submitters:
            submitter.stop()
        # Closing the executors lets running work finish for a grace and makes a
        # submitter waiting for a slot give its action back; leases keep being
        # renewed meanwhile.
        closing = asyncio.gather(
            *(self._close(name, executor) for name, executor in self.executors.items())
        )
        stopped = asyncio.gather(
            self.scraper.finished.wait(), *(s.finished.wait() for s in self.submitters)
        )
        watched: set[asyncio.Future[Any]] = {stopped, task}
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        await closing
        if not stopped.done():
            stopped.cancel()
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is not None:
                with contextlib.suppress(errors.PingoError):
                    await hand_back(self.store, self.settings.node_id, self.held, item.action)
        for loop in (
            self.ready_watch,
            self.scheduler,
            self.webhooks,
            self.renewer,
            self.reaper,
            self.deletor,
            self.retention,
        ):
            if loop is not None:
                loop.stop()
        try:
            await task
        except Exception:
            logger.exception("a loop had died", extra={"event": "node_loop_died"})
        self.storage.close()
        logger.info(
            "node %s stopped",
            self.settings.node_id,
            extra={"event": "node_stopped", "node_id": self.settings.node_id},
        )

    @staticmethod
    async def _close(name: str, executor: base.Executor) -> None:
        try:
            await executor.close()
        except Exception:
            logger.exception(
                "executor for %s failed to close", name, extra={"event": "executor_close_failed"}
            )

    @property
    def sandbox(self) -> str:
        """`on`, `off` (PINGO_SANDBOX=off) or `unavailable` (auto without user namespaces)."""
        executor = self.executors.get(sandbox.COMMAND_LINE)
        if getattr(executor, "sandbox", None) is not None:
            return "on"
        return "off" if self.settings.sandbox == "off" else "unavailable"

    @property
    def command_line_refusal(self) -> str | None:
        """Why this node refuses non-admins' command-line actions, if it does: its local
        executor would spawn them without the sandbox although PINGO_SANDBOX did not say
        `off`, or in the sandbox of a server run as root (`PINGO_ROOT_ACTIONS`). Other
        command-line executors, such as the benchmarks' no-op one, spawn nothing."""
        executor = self.executors.get(sandbox.COMMAND_LINE)
        if self.settings.sandbox == "off" or not isinstance(executor, local.LocalExecutor):
            return None
        if executor.sandbox is None:
            return sandbox.UNAVAILABLE_DETAIL
        return sandbox.as_root_refusal(self.settings)

    @property
    def running(self) -> bool:
        """Whether the node's loops are running."""
        return self._task is not None and not self._task.done()

    async def wait_workflow(
        self,
        workflow_id: str,
        timeout_s: float,
        *,
        poll_s: float = 0.01,
        max_poll_s: float = 0.1,
    ) -> WorkflowRecord:
        """The workflow once it is SUCCEEDED, FAILED or KILLED.

        Polls the store, first every `poll_s`, backing off to `max_poll_s`. A
        workflow record carries its whole document, so between full reads it
        polls the action counts, and reads the workflow once nothing is left to
        run (or every tenth poll, for a workflow killed or failed meanwhile).

        Raises `TimeoutError` after `timeout_s`, `NotFound` for an unknown id, and
        the error of a loop that died (the node cannot finish anything then).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        polls = 0
        read_workflow = True
        while True:
            if read_workflow:
                workflow = await self.store.get_workflow(workflow_id)
                if workflow is None:
                    raise errors.NotFound(f"no workflow {workflow_id}")
                if workflow.state in states.WORKFLOW_TERMINAL:
                    return workflow
                state = workflow.state.value
            if self._task is not None and self._task.done():
                self._task.result()
                raise errors.Conflict("the node stopped")
            if loop.time() >= deadline:
                raise TimeoutError(f"workflow {workflow_id} still {state} after {timeout_s:g} s")
            await asyncio.sleep(min(poll_s, max(0.0, deadline - loop.time())))
            poll_s = min(poll_s * 1.5, max_poll_s)
            polls += 1
            left = await self.store.has_actions_in(workflow_id, states.ACTION_LEFT)
            read_workflow = polls % 10 == 0 or not left

    async def _queue_webhooks(self, workflow: WorkflowRecord) -> None:
        """Queue the deliveries a workflow's end owes its webhooks (OutcomeService's hook)."""
        schedule_id = schedule_rules.schedule_of(workflow.idempotency_key)
        now = self.store.clock()
        if untrusted.is_undecoded(workflow.document):
            # A big workflow's document is still its text: finding its webhooks decodes
            # megabytes, which must not hold the event loop (issue 13).
            deliveries = await asyncio.to_thread(hooks.deliveries_for, workflow, schedule_id, now)
        else:
            deliveries = hooks.deliveries_for(workflow, schedule_id, now)
        if deliveries:
            await self.store.create_deliveries(deliveries)
            self.webhooks.wake()

    async def _queue_failure_webhooks(self, action: ActionRecord, workflow: WorkflowRecord) -> None:
        """Queue the `action.failed` deliveries of an action's failure (OutcomeService's hook)."""
        schedule_id = schedule_rules.schedule_of(workflow.idempotency_key)
        deliveries = hooks.action_failed_deliveries(
            workflow, action, schedule_id, self.store.clock()
        )
        if deliveries:
            await self.store.create_deliveries(deliveries)
            self.webhooks.wake()

    async def _kill_action(self, action: ActionRecord) -> None:
        """Stop an action's running work through its executor (OutcomeService's hook)."""
        if action.external_id is not None:
            await self._stop_work(action.type, action.external_id)

    async def _stop_work(self, action_type: str, external_id: str) -> None:
        """Stop the work `external_id` names, if this node's executor of its type runs it."""
        executor = self.executors.get(action_type)
        if executor is not None:
            await executor.kill(external_id)

    async def submit_detached(self, job: BigSubmission) -> tuple[WorkflowRecord, bool]:
        """`workflows.submit_once` for a big workflow, its planning in a child process.

        A 100,000-action submission allocates about 500 MiB at its peak; in this process,
        the few long-lived objects allocated meanwhile kept most of it from ever going
        back to the system (issue 13). The child parses, checks, plans and persists, then
        exits, giving all of it back; this process only hears the workflow's id and tally
        and does what needs it (`WorkflowManager.adopt`). Only when `detaches`.
        """
        started = time.perf_counter()
        try:
            persisted = await _in_child(self.settings, job)
        except (errors.TooManyWorkflows, errors.StorageQuotaExceeded) as refused:
            limits.count_refusal(type(refused))  # the child's count died with it
            raise
        return await self.workflows.adopt(persisted, rerun_of=job.rerun_of, started=started)

    async def submit_tick(
        self,
        document: dict[str, Any],
        *,
        owner: str,
        idempotency_key: str,
        cap: UserLimits | None,
    ) -> WorkflowRecord:
        """A schedule tick's big workflow, planned through `submit_detached`."""
        job = BigSubmission(
            owner=owner,
            body=json.dumps(document).encode(),
            decode=json.loads,
            check=None,
            cap=cap,
            idempotency_key=idempotency_key,
        )
        record, _ = await self.submit_detached(job)
        return record


@dataclass(frozen=True, slots=True)
class BigSubmission:
    """A big workflow for `Node.submit_detached`: everything its child process needs,
    pickled (the functions by reference)."""

    owner: str
    #: The request's body, undecoded; None for a re-run (the child reads the document
    #: of `rerun_of` from the store).
    body: bytes | None
    #: Decodes `body` as the API decodes request bodies (raising the API's errors).
    decode: Callable[[bytes], Any]
    #: Refuses a document this node cannot run, as the API does in-process; None for a
    #: schedule's tick, whose document was checked when the schedule was made (what may
    #: run is checked again before each spawn, as for a tick planned in-process).
    check: Callable[[Any], None] | None
    #: The owner's limits, whose workflow cap the planner applies (`WorkflowManager.submit`).
    cap: UserLimits | None = None
    idempotency_key: str | None = None
    force: tuple[int | str, ...] = ()
    rerun_of: str | None = None


#: Why spawn: a forked child would inherit this process's heap (hundreds of MiB after a
#: busy day) and the store's open connections and threads.
_CHILD_CONTEXT = multiprocessing.get_context("spawn")


async def _in_child(settings: Settings, job: BigSubmission) -> StoredSubmission:
    """`job` planned and persisted in a new process, which exits once it answered."""
    # Not `max_tasks_per_child=1`: the pool's manager thread would then replace the child
    # once it exited (a whole new process, spawned for nothing) or, when the shutdown
    # below came first, die on the pool's emptied process table (a TypeError in its
    # thread, CPython 3.11). The shutdown alone makes the child exit after its one task.
    pool = ProcessPoolExecutor(max_workers=1, mp_context=_CHILD_CONTEXT)
    try:
        return await asyncio.wrap_future(pool.submit(_child_main, settings, job))
    except BrokenProcessPool as exc:
        # Killed (the OOM killer, an operator) or crashed: the store's transaction of the
        # workflow either committed whole or not at all.
        logger.error(
            "the process planning a workflow of %s ended before it answered",
            job.owner,
            extra={"event": "submission_interrupted", "owner": job.owner},
        )
        raise errors.SubmissionInterrupted(
            "the process planning this workflow ended before it answered; retry with an "
            "Idempotency-Key to store it once"
        ) from exc
    finally:
        # Never wait here (the loop would): told to shut down, the pool's manager thread
        # sends the child its sentinel, and the child exits.
        pool.shutdown(wait=False)


def _child_main(settings: Settings, job: BigSubmission) -> StoredSubmission:
    """The child process: one submission, then exit."""
    return asyncio.run(_child_submission(settings, job))


async def _child_submission(settings: Settings, job: BigSubmission) -> StoredSubmission:
    async with _open_store(settings) as store:
        keep_hook = None
        if settings.storage_capacity_bytes is not None:
            keep_hook = policy.keep_hook(policy.load_policy(settings.retention_policy), store)
        manager = WorkflowManager(
            store, DatasetStorage(settings.data_root), settings, keep_hook=keep_hook, feed=False
        )
        document: Any
        if job.body is not None:
            document = job.decode(job.body)
        else:
            assert job.rerun_of is not None
            original = await store.get_workflow(job.rerun_of)
            if original is None:
                raise errors.NotFound(f"no workflow {job.rerun_of}")
            document = untrusted.plain(original.document)
        if job.check is not None:
            job.check(document)
        force: ForceTargets = job.force
        return await manager.persist_detached(
            document,
            owner=job.owner,
            idempotency_key=job.idempotency_key,
            force=force,
            rerun_of=job.rerun_of,
            cap=job.cap,
        )


def _open_store(settings: Settings) -> Store:
    """The store `settings` names, as every process of a node opens it."""
    return open_store(
        settings.store_url,
        sqlite_synchronous=settings.sqlite_synchronous,
        sqlite_cache_mb=settings.sqlite_cache_mb,
        mongo_write_concern=settings.mongo_write_concern,
    )


#: Files in `$PINGO_HOME` the server trusts or writes secrets into: one planted there by
#: another user (or a link) would hand them the admin token or the callback secret.
_HOME_SECRETS = ("admin.token", tokens.SECRET_FILE)


def _refuse(path: object, problem: str, remedy: str) -> errors.ConfigurationError:
    return errors.ConfigurationError(f"refusing to start: {path} {problem}; {remedy}")


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_home(settings: Settings) -> None:
    """Create `$PINGO_HOME` (mode 0700), or refuse one another user could have tampered with.

    The home holds the store, the admin token, the callback secret and the logs. Started
    on a home that another user owns (or may write), the server would write its secrets
    where they can read them and trust files they planted. So the home must be owned by
    the server's effective uid and writable by no group or other user; and the files the
    server trusts in it (`admin.token`, `callback.secret`, a SQLite store there) must be
    its own regular files, not links. A link as the home itself is followed (a home moved
    to another disk is common) only when the link is the server's or root's, so nobody
    else can re-point it, and its target passes the same checks.
    """
    home = settings.home
    euid = os.geteuid()
    remedy = (
        f"run the server as the directory's owner, or give it to uid {euid} "
        f"(chown {euid} DIR; chmod 0700 DIR), or choose another PINGO_HOME"
    )
    try:
        link = os.lstat(home)
    except FileNotFoundError:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        link = os.lstat(home)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (euid, 0):
        raise _refuse(
            home,
            f"is a symbolic link owned by {_owner(link.st_uid)}, who may re-point it",
            remedy.replace("DIR", str(home)),
        )
    st = os.stat(home)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(home, "is not a directory", "choose another PINGO_HOME")
    if st.st_uid != euid:
        raise _refuse(
            home,
            f"(PINGO_HOME) is owned by {_owner(st.st_uid)}, not by the server's {_owner(euid)}",
            remedy.replace("DIR", str(home)),
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(
            home,
            f"(PINGO_HOME) is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})",
            f"make it the server's only (chmod 0700 {home}) after checking nobody planted "
            "files in it",
        )
    # Pingo's home holds the store, the secrets and the logs: its owner's only.
    os.chmod(home, 0o700)
    trusted = [home / name for name in _HOME_SECRETS]
    if settings.store_url.startswith("sqlite://"):
        db = path_from_url(settings.store_url)
        if os.path.dirname(os.path.abspath(db)) == os.path.abspath(home):
            trusted += [home / (os.path.basename(db) + s) for s in ("", "-wal", "-shm", "-journal")]
    for path in trusted:
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            continue
        remove = f"remove it (after checking what it is) or chown {euid} {path}"
        if stat.S_ISLNK(found.st_mode):
            raise _refuse(path, "is a symbolic link, which the server will not follow", remove)
        if not stat.S_ISREG(found.st_mode):
            raise _refuse(path, "is not a regular file", remove)
        if found.st_uid != euid:
            raise _refuse(
                path,
                f"is owned by {_owner(found.st_uid)}, not by the server's {_owner(euid)}",
                remove,
            )


@contextlib.asynccontextmanager
async def running_node(settings: Settings) -> AsyncIterator[Node]:
    """Open the store `settings` names and run a node on it while the block runs."""
    check_home(settings)
    async with _open_store(settings) as store:
        node = Node(settings, store)
        await node.start()
        thresholds = gc.get_threshold()
        freeze_startup_heap()
        heap.keep_big_buffers_mapped()
        try:
            yield node
        finally:
            await node.stop()
            gc.set_threshold(*thresholds)


def freeze_startup_heap() -> None:
    """Move everything alive after start-up out of the garbage collector's reach.

    Modules, settings, compiled schemas and caches live as long as the process; left in
    the collected generations, every full collection walks them again, and those walks
    were the submission p99 (gen-2 passes of 100-300 ms). Collect first, so garbage of
    the start-up is freed rather than kept forever. Then space the young collections
    out (`heap.space_young_collections`).
    """
    gc.collect()
    gc.freeze()
    heap.space_young_collections()


async def run_node(settings: Settings) -> None:
    """Open the store and run a node until SIGINT or SIGTERM (or a loop dies)."""
    async with running_node(settings) as node:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            stopped = asyncio.ensure_future(stop.wait())
            assert node._task is not None
            await asyncio.wait({stopped, node._task}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            died = node._task.done()
            failure = node._task.exception() if died and not node._task.cancelled() else None
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if failure is not None:
        raise failure

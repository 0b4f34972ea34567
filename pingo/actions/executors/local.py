"""The local executor: runs `command-line` actions as subprocesses of this node.

- argv is executed as given (no shell unless the argv asks for one, e.g.
  `["sh", "-c", "…"]`), in its own session so that a timeout or a kill reaches
  the whole process group.
- Placeholders (see `placeholders`): `{output}` and `{input:<parentId>}` anywhere in
  an argument; `{inputs}` as a whole argument expands to one argument per input
  path (ascending parent id), inside a longer argument to the paths joined by
  commas. The same values are in `PINGO_OUTPUT`, `PINGO_INPUT_<parentId>`,
  `PINGO_INPUTS` (a JSON object parent id → path), with `PINGO_WORKFLOW_ID` and
  `PINGO_ACTION_ID`. The action's own `env` is applied first (placeholders resolved
  in its values), the `PINGO_*` variables last, on the server's environment minus
  anything that looks like a secret (`*TOKEN*`, `*SECRET*`, `*PASSWORD*`).
- Sandbox (see `sandbox`): with `PINGO_SANDBOX` on, the argv runs inside
  bubblewrap and the environment is only the action's `env`, the `PINGO_*`
  variables and a default PATH: none of the server's. Output goes to a private
  box that `sandbox.collect` moves to the staging path once the process exited.
- Output: the executor creates the parent directory of `{output}` (the staging
  path) and nothing at `{output}` itself; the command creates a file or a
  directory there (or nothing, an empty dataset). Promotion onto the dataset
  path happens in the success callback, so a partial output never looks stored.
- stdout and stderr go to the attempt's log file.
- Slots: `submit` waits for a free slot, starts the process and returns once it
  runs. The wait bounds the submitters, which hold only what the scraper claimed.
- External id: `"<callback id>.<attempt>@<node id>"`, known before the process
  starts (`external_id_for`), so the submitter records it with the SUBMITTED
  transition instead of a second store write. It is unique across restarts: a
  recycled pid or another node's work is never mistaken for ours. `pid()` maps it
  to the process id while the process runs.

Processes are started with `os.posix_spawn` (a vfork-style clone, no
`preexec_fn`) and their exit is watched through a pidfd registered with the
event loop: asyncio's subprocess transports cost a thread or pipes per child,
and `subprocess.Popen` a good deal of Python per spawn, which matters when
actions are as cheap as `true`. As with Popen, the child gets the signal
dispositions Python changed (SIGPIPE, SIGXFSZ) reset to their defaults, and
no descriptor of the server but stdin (/dev/null), stdout and stderr (the log):
every descriptor Python and its drivers open is close-on-exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from pingo import errors
from pingo.actions.executors import placeholders, sandbox
from pingo.actions.executors.base import ExecutorStatus, Reporter, Submission
from pingo.config import Settings
from pingo.datasets import storage, trees

logger = logging.getLogger(__name__)

#: Seconds between SIGTERM and SIGKILL when a process group is stopped.
KILL_GRACE_S = 5.0
#: Directories remembered as created (each workflow adds its log directory).
_REMEMBERED_DIRS = 4096
#: Bytes of the log's end quoted in a failure's error.
LOG_TAIL_BYTES = 2000

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD", re.IGNORECASE)
#: Dispositions Python changes for itself that a child must not inherit (as Popen resets).
_RESET_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)


def server_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment without its secrets (PINGO_ADMIN_TOKEN, *TOKEN*, …)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if not _SECRET_NAME.search(k)}


class ExecutorClosed(errors.PingoError):
    """The executor is shutting down and accepts no more work."""

    code = "EXECUTOR_CLOSED"


class KilledBeforeStart(errors.PingoError):
    """The work was killed while it waited for a slot: it never starts."""

    code = "KILLED_BEFORE_START"


@dataclass(slots=True, eq=False)
class _Process:
    pid: int
    submission: Submission
    external_id: str
    started: float
    pidfd: int | None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    #: Its exit code once reaped (negative: killed by that signal).
    returncode: int | None = None
    #: Why we stopped it, if we did: "killed", "timeout" or "shutdown".
    stopped_for: str | None = None
    timer: asyncio.TimerHandle | None = None


class LocalExecutor:
    """Runs `command-line` actions as local subprocesses with bounded concurrency."""

    #: Whether a process's exit 0 is the attempt's success, noted beside its output
    #: before the report (a cluster client's exit 0 is not: the cluster reports).
    notes_completion = True

    def __init__(
        self,
        reporter: Reporter,
        *,
        slots: int,
        node_id: str,
        environ: Mapping[str, str] | None = None,
        box: sandbox.Sandbox | None = None,
        kill_grace_s: float = KILL_GRACE_S,
        close_grace_s: float = 5.0,
    ) -> None:
        if slots < 1:
            raise errors.ConfigurationError(f"local slots must be at least 1, not {slots}")
        self.reporter = reporter
        self.slots = slots
        self.node_id = node_id
        self.kill_grace_s = kill_grace_s
        self.close_grace_s = close_grace_s
        self._base_env = server_environment(environ)
        #: None: processes run unsandboxed (PINGO_SANDBOX=off, or auto without namespaces).
        self.sandbox = box
        self._slots: asyncio.Semaphore | None = None
        #: Work from start until its report is done (status says RUNNING meanwhile).
        self._procs: dict[str, _Process] = {}
        #: How work ended whose report failed, until reconciliation asks.
        self._unreported: dict[str, ExecutorStatus] = {}
        #: Work waiting for a slot, and whether it was killed meanwhile (then it never
        #: starts: `kill` finds no process to stop).
        self._waiting: dict[str, bool] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._dirs: set[str] = set()
        self._executables: dict[tuple[str, str], str] = {}
        self._devnull_fd: int | None = None
        self._closing = False

    # ------------------------------------------------------------------ protocol

    async def start(self) -> None:
        """Create the slots (on the running loop); kill sandboxes a killed server left."""
        self._slots = asyncio.Semaphore(self.slots)
        self._closing = False
        if self.sandbox is not None:
            await asyncio.to_thread(sandbox.kill_orphans)

    async def close(self) -> None:
        """Accept no more work; let running processes finish for a short grace.

        What is still running then is killed without a report and left to its
        lease, as after a crash: once the lease expires, a reaper retries the
        action. Reporting it killed would kill the user's workflow for our stop,
        and leaving it running would leave work nobody reports on.
        """
        self._closing = True
        running = self._alive()
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(p.exited.wait() for p in running)), self.close_grace_s
                )
        remaining = self._alive()
        for proc in remaining:
            proc.stopped_for = "shutdown"
            _killpg(proc.pid, signal.SIGKILL)
        if remaining:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*(p.exited.wait() for p in remaining)), self.kill_grace_s
                )
        # Report tasks already under way finish; they are short store writes.
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._devnull_fd is not None:
            os.close(self._devnull_fd)
            self._devnull_fd = None

    async def submit(self, submission: Submission) -> str:
        """Wait for a slot, start the process, return its external id."""
        if self._closing:
            raise ExecutorClosed()
        if self._slots is None:
            await self.start()
        assert self._slots is not None
        argv, env, env_args = self._prepare(submission)
        # Creating files can take milliseconds on a busy disk: do it in a thread,
        # before the slot wait, so a freed slot is refilled by a bare spawn.
        log, status = await asyncio.to_thread(self._open_files, submission)
        args = None if env_args is None else _args_file(env_args)
        waiting = self.external_id_for(submission.callback_id, submission.attempt)
        self._waiting[waiting] = False
        try:
            try:
                await self._slots.acquire()
            finally:
                killed = self._waiting.pop(waiting)
            try:
                if self._closing:
                    raise ExecutorClosed()
                if killed:
                    raise KilledBeforeStart(f"{waiting} was killed before a slot freed")
                if self.sandbox is not None and _is_local(submission.output_path):
                    sandbox.ensure_plain_box(_local(submission.output_path))
                proc = self._spawn(submission, argv, env, log, status, args)
            except BaseException:
                self._slots.release()
                raise
        finally:
            log.close()
            for fd in (status, args):
                if fd is not None:
                    os.close(fd)
        logger.debug(
            "started pid %d for %s/%s attempt %d",
            proc.pid,
            submission.workflow_id,
            submission.action_id,
            submission.attempt,
            extra={"event": "local_started", "external_id": proc.external_id},
        )
        return proc.external_id

    def external_id_for(self, callback_id: str, attempt: int) -> str:
        """The external id `submit` will return for this attempt (known beforehand)."""
        return f"{callback_id}.{attempt}@{self.node_id}"

    def pid(self, external_id: str) -> int | None:
        """The process id of the work while it runs here, else None."""
        proc = self._procs.get(external_id)
        return None if proc is None or proc.returncode is not None else proc.pid

    async def kill(self, external_id: str) -> None:
        """Stop the process group (SIGTERM, SIGKILL after a grace); it reports `killed`."""
        if external_id in self._waiting:
            self._waiting[external_id] = True
            return
        proc = self._procs.get(external_id)
        if proc is None or proc.returncode is not None:
            return
        if proc.stopped_for is None:
            proc.stopped_for = "killed"
        await self._terminate(proc)

    async def status(self, external_id: str) -> ExecutorStatus:
        """RUNNING while this executor's process runs or its report is under way.

        UNKNOWN otherwise: finished work has reported, and anything else
        (another node's work, work from before a restart) nobody will report on.
        Work whose report failed (the store was down) says how it ended, once.
        """
        if external_id in self._procs:
            return ExecutorStatus.RUNNING
        return self._unreported.pop(external_id, ExecutorStatus.UNKNOWN)

    @property
    def running(self) -> int:
        """Processes running now."""
        return len(self._alive())

    def _alive(self) -> list[_Process]:
        return [p for p in self._procs.values() if p.returncode is None]

    # ------------------------------------------------------------------ internals

    def _prepare(self, submission: Submission) -> tuple[list[str], dict[str, str], bytes | None]:
        """The argv and environment to spawn, and what bwrap reads from `_ARGS_FD`.

        Sandboxed, the spawned program is bwrap, on the host: it gets an empty
        environment, and the command's comes through `_ARGS_FD` (`env_arguments`).
        """
        definition = submission.definition
        command = definition.get("command")
        if not isinstance(command, list) or not command:
            raise errors.ConfigurationError(
                f"action {submission.action_id} has no command to run (expected an argv list)"
            )
        output, inputs = _local(submission.output_path), submission.inputs
        argv = placeholders.resolve_argv([str(a) for a in command], output, inputs)
        env = {} if self.sandbox is not None else dict(self._base_env)
        own_env: Any = definition.get("env") or {}
        for key, value in own_env.items():
            env[str(key)] = placeholders.resolve_argument(str(value), output, inputs)
        env.update(
            placeholders.environment(output, inputs, submission.workflow_id, submission.action_id)
        )
        if self.sandbox is None:
            return argv, env, None
        local = _is_local(submission.output_path)
        if _refused_output(self.sandbox, submission):
            raise errors.Forbidden(sandbox.OWN_PATH_DETAIL.format(path=output))
        early, late = self.sandbox.split_environment(sandbox.environment(env))
        wrapped = self.sandbox.argv(
            argv,
            output=output,
            box=sandbox.box_for(output) if local else None,
            inputs=(_local(p) for p in inputs.values()),
            status_fd=_STATUS_FD if local else None,
            args_fd=_ARGS_FD,
            loader_env=late,
        )
        return wrapped, {}, sandbox.env_arguments(early)

    def _executable(self, name: str, env: Mapping[str, str], *, fresh: bool = False) -> str:
        """`name` as given when it is a path, else found on the child's PATH.

        Lookups are cached (a PATH search is a dozen system calls per spawn);
        `fresh` looks again, after the cached program went away.
        """
        if os.sep in name:
            return name
        search = env.get("PATH", os.defpath)
        key = (name, search)
        found = None if fresh else self._executables.get(key)
        if found is None:
            found = shutil.which(name, path=search)
            if found is None:
                raise FileNotFoundError(errno.ENOENT, "no such program on PATH", name)
            self._executables[key] = found
        return found

    def _devnull(self) -> int:
        if self._devnull_fd is None:
            self._devnull_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return self._devnull_fd

    def _ensure_dir(self, path: str) -> None:
        # Every attempt of a workflow shares these directories: create each once.
        if path not in self._dirs:
            os.makedirs(path, exist_ok=True)
            if len(self._dirs) >= _REMEMBERED_DIRS:
                # A server runs for months: forget rather than grow (makedirs is idempotent).
                self._dirs.clear()
            self._dirs.add(path)

    def _open_files(self, submission: Submission) -> tuple[BinaryIO, int | None]:
        """Create the output's parent directory, open the attempt's log and, for a
        sandboxed local output, the file bwrap writes its exit status to (in a thread)."""
        output = submission.output_path
        status = None
        # A remote output (hdfs://, s3://) is created by the job itself.
        if _is_local(output):
            self._ensure_dir(os.path.dirname(_local(output)) or ".")
            if self.sandbox is not None:
                sandbox.make_box(_local(output))
                status = _status_file(_local(output) + storage.EXIT_STATUS_SUFFIX)
        log_path: Path = submission.log_path
        self._ensure_dir(str(log_path.parent))
        # submit closes both once the child has its own copy of the descriptors.
        log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        return log, status

    def _spawn(
        self,
        submission: Submission,
        argv: list[str],
        env: dict[str, str],
        log: BinaryIO,
        status: int | None = None,
        args: int | None = None,
    ) -> _Process:
        log_fd = log.fileno()
        file_actions = [
            (os.POSIX_SPAWN_DUP2, self._devnull(), 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ]
        if status is not None:
            file_actions.append((os.POSIX_SPAWN_DUP2, status, _STATUS_FD))
        if args is not None:
            file_actions.append((os.POSIX_SPAWN_DUP2, args, _ARGS_FD))
        if self.sandbox is not None:
            executable = self.sandbox.bwrap  # argv[0] is its tag
        else:
            executable = self._executable(argv[0], env)
        try:
            pid = os.posix_spawn(
                executable,
                argv,
                env,
                file_actions=file_actions,
                setsid=True,
                setsigdef=_RESET_SIGNALS,
            )
        except (FileNotFoundError, PermissionError):
            if self.sandbox is not None:
                raise
            again = self._executable(argv[0], env, fresh=True)
            if again == executable:
                raise
            pid = os.posix_spawn(
                again, argv, env, file_actions=file_actions, setsid=True, setsigdef=_RESET_SIGNALS
            )
        started = time.monotonic()
        external_id = self.external_id_for(submission.callback_id, submission.attempt)
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # pragma: no cover - kernels before 5.3
            pidfd = None
        proc = _Process(pid, submission, external_id, started, pidfd)
        self._procs[external_id] = proc
        loop = asyncio.get_running_loop()
        if pidfd is not None:
            loop.add_reader(pidfd, self._on_exit, proc)
        else:  # pragma: no cover
            self._track(proc)
        if submission.timeout_s is not None:
            proc.timer = loop.call_later(submission.timeout_s, self._on_timeout, proc)
        return proc

    def _track(self, proc: _Process) -> None:  # pragma: no cover - kernels without pidfd
        async def wait() -> None:
            _, status = await asyncio.to_thread(os.waitpid, proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            self._on_exit(proc)

        self._spawn_task(wait(), proc.external_id)

    def _on_exit(self, proc: _Process) -> None:
        """The pidfd became readable: the process exited; reap it and report."""
        if proc.pidfd is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(proc.pidfd)
            os.close(proc.pidfd)
            proc.pidfd = None
        returncode = _reap(proc)
        runtime_s = time.monotonic() - proc.started
        if proc.timer is not None:
            proc.timer.cancel()
        if proc.stopped_for is not None:
            # Stragglers the leader left in its group go with it.
            _killpg(proc.pid, signal.SIGKILL)
        proc.exited.set()
        assert self._slots is not None
        self._slots.release()
        if proc.stopped_for == "shutdown":
            self._procs.pop(proc.external_id, None)
            return
        self._spawn_task(self._report(proc, returncode, runtime_s), proc.external_id)

    def _spawn_task(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=f"pingo-local-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_outcome(self, proc: _Process, returncode: int, runtime_s: float) -> None:
        """Tell the callbacks how the work ended."""
        sub = proc.submission
        if proc.stopped_for == "killed":
            await self.reporter.killed(sub.callback_id, sub.attempt)
        elif proc.stopped_for == "timeout":
            await self.reporter.failed(
                sub.callback_id, sub.attempt, f"timed out after {sub.timeout_s:g} s"
            )
        elif returncode == 0:
            await self.reporter.success(sub.callback_id, sub.attempt, runtime_s=runtime_s)
        else:
            await self.reporter.failed(
                sub.callback_id, sub.attempt, _failure(returncode, sub.log_path)
            )

    def _completed(self, proc: _Process, returncode: int) -> bool:
        """Whether the attempt completed here: its exit alone says it succeeded."""
        return self.notes_completion and proc.stopped_for is None and returncode == 0

    def _checked_settle(self, proc: _Process, returncode: int, runtime_s: float) -> str | None:
        """In a worker thread: why the server must not move the sandboxed output
        (`_refused_move`), else `_settle_output`."""
        if self.sandbox is not None:
            refusal = _refused_move(self.sandbox, proc.submission)
            if refusal is not None:
                return refusal
        self._settle_output(proc, returncode, runtime_s)
        return None

    def _settle_output(self, proc: _Process, returncode: int, runtime_s: float) -> None:
        """In a worker thread: the sandbox's output onto the staging path, then, for a
        completed attempt, the note that it completed (`storage.record_completion`).

        The note comes before the success report: should this node die during the
        report, the reaper of another node finishes the attempt from it instead of
        running the work a second time.
        """
        output = _local(proc.submission.output_path)
        if self.sandbox is not None:
            managed = proc.submission.definition.get("isManaged", True) is not False
            sandbox.collect(output, fresh=self.sandbox.network, links=managed)
        if self._completed(proc, returncode):
            storage.record_completion(output, runtime_s)

    async def _settled_or_why_not(
        self, proc: _Process, returncode: int, runtime_s: float
    ) -> str | None:
        """The attempt's output out of its box and noted (`_settle_output`, in a worker
        thread), or why a successful attempt fails instead: the server must not move it
        (`_refused_move`), or it could not be taken out (`trees.UnstorableOutput`: too
        deep, too sparse, a link where none may be; or a full disk). Never a
        success then: nothing, or a copy cut short, would be stored as the output. An
        attempt that failed or was killed keeps its own outcome."""
        sub = proc.submission
        try:
            # One worker-thread hop: the check and the move it guards run together.
            refusal = await asyncio.to_thread(self._checked_settle, proc, returncode, runtime_s)
            if refusal is not None:
                return refusal
        except (OSError, trees.UnstorableOutput) as exc:
            logger.warning(
                "output %s of attempt %d could not be collected: %s",
                sub.output_path,
                sub.attempt,
                exc,
                extra={"event": "output_not_collected", "path": sub.output_path},
            )
            if proc.stopped_for is None and returncode == 0:
                return f"the output could not be stored: {exc}"
            await asyncio.to_thread(trees.remove, sandbox.box_for(_local(sub.output_path)))
        return None

    async def _report(self, proc: _Process, returncode: int, runtime_s: float) -> None:
        sub = proc.submission
        local = _is_local(sub.output_path)
        noted = local and self._completed(proc, returncode)
        # What says the attempt completed (the note, the sandbox's exit status) stays
        # until the outcome is in the store, and goes once it is: nothing to recover.
        evidence = local and (noted or self.sandbox is not None)
        try:
            if evidence:
                refusal = await self._settled_or_why_not(proc, returncode, runtime_s)
                if refusal is not None:
                    output = _local(sub.output_path)
                    await asyncio.to_thread(trees.remove, sandbox.box_for(output))
                    storage.forget_completion(output)
                    await self.reporter.failed(sub.callback_id, sub.attempt, refusal)
                    return
            await self._report_outcome(proc, returncode, runtime_s)
            if evidence:
                storage.forget_completion(_local(sub.output_path))
        except errors.PingoError as exc:
            if evidence:
                storage.forget_completion(_local(sub.output_path))
            # A stale attempt (the reaper moved on) or a workflow killed meanwhile:
            # the callbacks decided; nothing is left for us to do.
            logger.warning(
                "report for %s/%s attempt %d refused: %s",
                sub.workflow_id,
                sub.action_id,
                sub.attempt,
                exc,
                extra={"event": "local_report_refused"},
            )
        except Exception:
            # The store may be down: remember how the work ended, so that
            # reconciliation (`status`) can still apply it.
            self._unreported[proc.external_id] = _outcome(proc, returncode)
            logger.exception(
                "report for %s/%s attempt %d failed",
                sub.workflow_id,
                sub.action_id,
                sub.attempt,
                extra={"event": "local_report_failed"},
            )
        finally:
            self._procs.pop(proc.external_id, None)

    def _on_timeout(self, proc: _Process) -> None:
        if proc.stopped_for is None:
            proc.stopped_for = "timeout"
        self._spawn_task(self._terminate(proc), proc.external_id)

    async def _terminate(self, proc: _Process) -> None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.exited.wait(), self.kill_grace_s)
        except TimeoutError:
            _killpg(proc.pid, signal.SIGKILL)
            await proc.exited.wait()


def _reap(proc: _Process) -> int:
    """Collect the exited process (a zombie by now: no wait) and record its exit code."""
    if proc.returncode is None:
        try:
            _, status = os.waitpid(proc.pid, 0)
        except ChildProcessError:  # pragma: no cover - reaped by someone else
            status = 255 << 8
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode


def _outcome(proc: _Process, returncode: int) -> ExecutorStatus:
    if proc.stopped_for == "killed":
        return ExecutorStatus.KILLED
    if proc.stopped_for is None and returncode == 0:
        return ExecutorStatus.SUCCEEDED
    return ExecutorStatus.FAILED


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


#: The descriptor bwrap writes its JSON status to, in the child (`--json-status-fd`).
_STATUS_FD = 3
#: The descriptor bwrap reads more options from, in the child (`--args`).
_ARGS_FD = 4


def _status_file(path: str) -> int:
    """Open (truncate) the exit status file, never through a link (`storage.open_evidence`)."""
    return _above_child_fds(storage.open_evidence(path))


def _args_file(data: bytes) -> int:
    """A descriptor holding `data` from its start, for bwrap's `--args`."""
    fd = os.memfd_create("pingo-bwrap-args", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return _above_child_fds(fd)


def _above_child_fds(fd: int) -> int:
    """`fd`, moved above the numbers the child gets (0 to `_ARGS_FD`): a dup2 onto
    itself would leave it close-on-exec, and one dup2 could overwrite another's source."""
    if fd > _ARGS_FD:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _ARGS_FD + 1)
    os.close(fd)
    return moved


def _refused_output(box: sandbox.Sandbox, submission: Submission) -> bool:
    """Whether an unmanaged local output would land on Pingo's own files (`Sandbox.hides`).

    Managed outputs are staging paths the server chose, inside the data root."""
    return (
        submission.definition.get("isManaged", True) is False
        and _is_local(submission.output_path)
        and box.hides(_local(submission.output_path))
    )


def _refused_move(box: sandbox.Sandbox, submission: Submission) -> str | None:
    """Why the server must not move this sandboxed attempt's output out of its box.

    For an unmanaged output, the path is checked again (a link the user swapped in
    since the spawn must not make the server move the output onto Pingo's files),
    and the output may not be or hold a link: moved to the user's path with the
    server's rights, one would plant a link on the host, which the server's own
    later opens and bwrap's binds of that path would follow.
    """
    output = _local(submission.output_path)
    if _refused_output(box, submission):
        return sandbox.OWN_PATH_DETAIL.format(path=output)
    if submission.definition.get("isManaged", True) is False and _is_local(submission.output_path):
        link = sandbox.planted_link(output)
        if link is not None:
            return sandbox.LINKED_OUTPUT_DETAIL.format(path=output, link=link)
    return None


def _is_local(path: str) -> bool:
    """Whether `path` is on this machine (a remote output, hdfs:// or s3://, is the job's)."""
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    """A `file://` URL as a plain path; anything else as is."""
    return path[len("file://") :] if path.startswith("file://") else path


def _failure(returncode: int, log_path: Path) -> str:
    if returncode < 0:
        try:
            how = f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    return f"{how}; log tail:\n{_tail(log_path)}"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unavailable: {exc})"


def create(settings: Settings, reporter: Reporter) -> LocalExecutor:
    """Entry point for `command-line` actions."""
    return LocalExecutor(
        reporter,
        slots=settings.local_slots,
        node_id=settings.node_id,
        box=sandbox.from_settings(settings),
        close_grace_s=settings.stop_grace_s,
    )

"""Executors that drive a cluster through a client command (`hadoop jar`, `spark-submit`).

The client runs on this node in its own process group, its output in the
attempt's log. Completion normally arrives through the cluster's callback
(Hadoop's job-end notification, the Spark wrapper); the client's exit status
is kept so that `status` can answer reconciliation when a callback is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from pingo import errors
from pingo.actions.executors import placeholders
from pingo.actions.executors.base import ExecutorStatus, Reporter, Submission
from pingo.config import Settings

logger = logging.getLogger(__name__)

#: Seconds between SIGTERM and SIGKILL when stopping a client's process group.
KILL_GRACE_S = 5.0


def find_program(name: str, setting: str) -> str:
    """`name` as given when it is a path, else from PATH, else beside this Python (the venv).

    Raises `ConfigurationError` naming `setting` when there is no such program, so
    a node without a cluster client leaves the action type unconfigured (and
    submissions of it are refused) instead of failing each action at run time.
    """
    if os.sep in name:
        found: str | None = name if os.access(name, os.X_OK) else None
    else:
        found = shutil.which(name)
        beside = Path(sys.executable).parent / name
        if found is None and beside.exists():
            found = str(beside)
    if found is None:
        raise errors.ConfigurationError(
            f"{name!r} is not an executable program (looked on PATH and beside {sys.executable});"
            f" set {setting}"
        )
    return found


def ensure_local_parent(path: str) -> None:
    """Create the parent directory of a local staging path (remote ones the job creates)."""
    scheme = urlsplit(path).scheme
    if scheme in ("", "file"):
        local = Path(urlsplit(path).path if scheme == "file" else path)
        local.parent.mkdir(parents=True, exist_ok=True)


def client_environment(submission: Submission, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """The server's environment less its secrets, plus the action's PINGO_* variables."""
    secret_words = ("TOKEN", "SECRET", "PASSWORD")
    env = {k: v for k, v in os.environ.items() if not any(w in k.upper() for w in secret_words)}
    env.update(
        placeholders.environment(
            submission.output_path,
            submission.inputs,
            submission.workflow_id,
            submission.action_id,
        )
    )
    env.update(extra)
    return env


class ClientProcessExecutor:
    """Base class: run one client process per submission and remember how it ended."""

    #: Prefix of external ids, e.g. "hadoop" → "hadoop:4242".
    kind = "client"

    def __init__(self, settings: Settings, reporter: Reporter) -> None:
        self.settings = settings
        self.reporter = reporter
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self._ended: dict[str, ExecutorStatus] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def build_command(self, submission: Submission) -> list[str]:
        """The client's argv for this submission."""
        raise NotImplementedError

    def build_environment(self, submission: Submission) -> dict[str, str]:
        """The client's environment."""
        return client_environment(submission)

    async def on_exit(self, submission: Submission, returncode: int) -> None:
        """React to the client's exit (the callback normally carries the outcome)."""

    async def start(self) -> None:
        """Nothing to acquire: clients are started per submission."""

    async def close(self) -> None:
        """Leave running clients alone: their callbacks or reconciliation finish them."""
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def submit(self, submission: Submission) -> str:
        """Start the client; return its external id once it runs."""
        argv = self.build_command(submission)
        ensure_local_parent(submission.output_path)
        submission.log_path.parent.mkdir(parents=True, exist_ok=True)
        with submission.log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=self.build_environment(submission),
                start_new_session=True,
            )
        external_id = f"{self.kind}:{proc.pid}"
        self._running[external_id] = proc
        task = asyncio.create_task(
            self._watch(external_id, proc, submission), name=f"pingo-{external_id}"
        )
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        logger.info(
            "%s started %s for %s/%s attempt %d",
            self.kind,
            external_id,
            submission.workflow_id,
            submission.action_id,
            submission.attempt,
            extra={"event": "client_started", "external_id": external_id},
        )
        return external_id

    async def _watch(
        self, external_id: str, proc: asyncio.subprocess.Process, submission: Submission
    ) -> None:
        try:
            if submission.timeout_s is None:
                returncode = await proc.wait()
            else:
                try:
                    returncode = await asyncio.wait_for(proc.wait(), submission.timeout_s)
                except TimeoutError:
                    await self._terminate(proc)
                    self._ended[external_id] = ExecutorStatus.FAILED
                    await self.reporter.failed(
                        submission.callback_id,
                        submission.attempt,
                        f"timed out after {submission.timeout_s:g} s",
                    )
                    return
        finally:
            self._running.pop(external_id, None)
        if external_id not in self._ended:
            self._ended[external_id] = (
                ExecutorStatus.SUCCEEDED if returncode == 0 else ExecutorStatus.FAILED
            )
        await self.on_exit(submission, returncode)

    async def kill(self, external_id: str) -> None:
        """Stop the client's whole process group (idempotent)."""
        proc = self._running.get(external_id)
        if proc is None:
            return
        self._ended[external_id] = ExecutorStatus.KILLED
        await self._terminate(proc)

    async def status(self, external_id: str) -> ExecutorStatus:
        """RUNNING while the client runs here; how it ended after; UNKNOWN if never seen."""
        if external_id in self._running:
            return ExecutorStatus.RUNNING
        return self._ended.get(external_id, ExecutorStatus.UNKNOWN)

    @staticmethod
    async def _terminate(proc: asyncio.subprocess.Process) -> None:
        # The client's children (JVMs, Python workers) share its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

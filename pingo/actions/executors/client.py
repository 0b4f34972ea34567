"""Executors that drive a cluster through a client command (`hadoop jar`, `spark-submit`).

The client runs on this node exactly as a local action does (the local
executor's process handling: its own session, the attempt's log, timeouts and
kills reaching the whole process group), but its outcome normally arrives
through the cluster's callback (Hadoop's job-end notification, the Spark
wrapper). The client's exit is remembered so that `status` can answer
reconciliation when that callback is lost.

A kill stops the work on the cluster too, not only the client: the jobs the
client's log names (see `cluster.scan_log`) are killed with `yarn application
-kill` (and Spark's own kill for standalone drivers), each outcome logged, then
the client process. Killing twice kills nothing the second time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from pingo import errors
from pingo.actions.executors import cluster, placeholders
from pingo.actions.executors.base import ExecutorStatus, Reporter, Submission
from pingo.actions.executors.local import LocalExecutor, _outcome, _Process
from pingo.config import Settings

#: How many ended clients `status` remembers (reconciliation asks within a lease or two).
REMEMBERED_OUTCOMES = 10_000

logger = logging.getLogger(__name__)


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


class ClientProcessExecutor(LocalExecutor):
    """Base class: one client process per submission; the cluster reports the outcome."""

    notes_completion = False

    def __init__(self, settings: Settings, reporter: Reporter, action_type: str) -> None:
        """`action_type`'s entry in `executor_limits`, else `cluster_in_flight`, bounds
        the clients running at once (and so the node's claims of that type)."""
        slots = settings.executor_limits.get(action_type, settings.cluster_in_flight)
        super().__init__(reporter, slots=slots, node_id=settings.node_id)
        self.settings = settings
        self._ended: OrderedDict[str, ExecutorStatus] = OrderedDict()
        #: External id → its client's log, remembered like `_ended` (kills read it).
        self._logs: OrderedDict[str, Path] = OrderedDict()
        #: Cluster jobs this executor killed already (a kill is idempotent).
        self._killed: set[str] = set()

    async def submit(self, submission: Submission) -> str:
        """Start the client; remember its log, where it names the jobs it submits."""
        external_id = self.external_id_for(submission.callback_id, submission.attempt)
        self._logs[external_id] = submission.log_path
        while len(self._logs) > REMEMBERED_OUTCOMES:
            self._logs.popitem(last=False)
        return await super().submit(submission)

    async def kill(self, external_id: str) -> None:
        """Kill the cluster jobs the client submitted, then the client itself."""
        log = self._logs.get(external_id)
        if log is not None:
            jobs = await asyncio.to_thread(cluster.scan_log, log)
            for argv, job in self.kill_commands(jobs):
                if job in self._killed:
                    continue
                if await cluster.run_kill(argv, job):
                    self._killed.add(job)
        await super().kill(external_id)

    def kill_commands(self, jobs: cluster.ClusterJobs) -> list[tuple[list[str], str]]:
        """(argv, job) pairs that kill `jobs` on the cluster: `yarn application -kill`."""
        if not jobs.application_ids:
            return []
        try:
            yarn = find_program(self.settings.yarn_bin, "PINGO_YARN_BIN")
        except errors.ConfigurationError as exc:
            logger.warning(
                "cannot kill YARN applications %s: %s",
                ", ".join(jobs.application_ids),
                exc.message,
                extra={"event": "cluster_kill_failed"},
            )
            return []
        return [([yarn, "application", "-kill", app], app) for app in jobs.application_ids]

    def build_command(self, submission: Submission) -> list[str]:
        """The client's argv for this submission."""
        raise NotImplementedError

    def extra_environment(self) -> Mapping[str, str]:
        """Variables the client needs beyond the action's PINGO_* ones."""
        return {}

    def _prepare(self, submission: Submission) -> tuple[list[str], dict[str, str], bytes | None]:
        env = dict(self._base_env)
        env.update(self.extra_environment())
        env.update(
            placeholders.environment(
                submission.output_path,
                submission.inputs,
                submission.workflow_id,
                submission.action_id,
            )
        )
        return self.build_command(submission), env, None

    async def status(self, external_id: str) -> ExecutorStatus:
        """RUNNING while the client runs here; how it ended after; UNKNOWN if never seen."""
        if external_id in self._procs:
            return ExecutorStatus.RUNNING
        return self._ended.get(external_id, ExecutorStatus.UNKNOWN)

    async def _report(self, proc: _Process, returncode: int, runtime_s: float) -> None:
        self._ended[proc.external_id] = _outcome(proc, returncode)
        while len(self._ended) > REMEMBERED_OUTCOMES:
            self._ended.popitem(last=False)
        await super()._report(proc, returncode, runtime_s)

    async def _report_outcome(self, proc: _Process, returncode: int, runtime_s: float) -> None:
        # Exit 0: the cluster's callback carries the success; if it is lost,
        # reconciliation finds SUCCEEDED in `status` after the grace. A failing
        # client may never have reached the cluster, so its failure is reported
        # here (twice is harmless: callbacks are idempotent).
        if proc.stopped_for is None and returncode == 0:
            return
        await super()._report_outcome(proc, returncode, runtime_s)

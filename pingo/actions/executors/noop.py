"""The no-op executor: every submission succeeds at once, without running anything.

For benchmarks of the control plane (scraper, submitters, callbacks, store) and
for tests that exercise the engine without processes. It is not registered as
an entry point: pass it explicitly, `Node(settings, store, executors={"command-line":
noop.create})`. Success is reported through the in-process `Reporter` from a task
of its own, as a real executor's would be, after `submit` has returned.
"""

from __future__ import annotations

import asyncio
import logging

from pingo import errors
from pingo.actions.executors.base import ExecutorStatus, Reporter, Submission
from pingo.config import Settings

logger = logging.getLogger(__name__)


class NoopExecutor:
    """Reports every submission successful, after `delay_s` (a stand-in for a job's runtime)."""

    def __init__(self, reporter: Reporter, *, delay_s: float = 0.0) -> None:
        self.reporter = reporter
        self.delay_s = delay_s
        self._tasks: set[asyncio.Task[None]] = set()
        #: Submissions seen so far (benchmarks read it).
        self.submitted = 0

    async def start(self) -> None:
        """Nothing to acquire."""

    async def close(self) -> None:
        """Let pending reports finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def external_id_for(self, callback_id: str, attempt: int) -> str:
        """Known before submission: the submitter records it with SUBMITTED."""
        return f"noop:{callback_id}.{attempt}"

    async def submit(self, submission: Submission) -> str:
        """Schedule the success report; return a fresh id."""
        external_id = self.external_id_for(submission.callback_id, submission.attempt)
        self.submitted += 1
        task = asyncio.create_task(self._report(submission), name=f"pingo-{external_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return external_id

    async def _report(self, submission: Submission) -> None:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        try:
            await self.reporter.success(
                submission.callback_id, submission.attempt, runtime_s=self.delay_s
            )
        except errors.PingoError as exc:
            logger.warning("no-op report refused: %s", exc, extra={"event": "noop_report_refused"})

    async def kill(self, external_id: str) -> None:
        """Nothing runs, nothing to stop."""

    async def status(self, external_id: str) -> ExecutorStatus:
        """No-op work is over as soon as it starts: nothing to say about it."""
        return ExecutorStatus.UNKNOWN


def create(settings: Settings, reporter: Reporter) -> NoopExecutor:
    """Factory with the `ExecutorFactory` signature (no delay)."""
    return NoopExecutor(reporter)

"""Background loops: one class per loop, `run()` until `stop()`, supervised.

Each pass waits for whichever comes first: a `wake()`, the poll interval, or
`stop()`. A loop that raises anything but a transient store error is fatal:
the supervisor stops every other loop and re-raises, so a node never limps on
with half its machinery dead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from pingo import errors

logger = logging.getLogger(__name__)


class Loop:
    """Base class of Pingo's background loops."""

    #: Task name, and the loop's name in logs.
    name: str = "loop"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stopping = asyncio.Event()
        self._woken = asyncio.Event()
        #: Whether this pass came because the interval ran out (no `wake` came).
        self.timed_out = False

    async def run_once(self) -> bool:
        """Do one pass; return True when more work may be waiting right now."""
        raise NotImplementedError

    def wait_s(self) -> float:
        """How long to wait for a wake-up after a pass that found nothing more to do."""
        return self.interval_s

    def wake(self) -> None:
        """Start the next pass now instead of at the next interval."""
        self._woken.set()

    def stop(self) -> None:
        """Ask the loop to finish its current pass and return."""
        self._stopping.set()
        self._woken.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        """Pass after pass until stopped."""
        logger.debug("%s started", self.name, extra={"event": "loop_started", "loop": self.name})
        while not self._stopping.is_set():
            self._woken.clear()
            try:
                more = await self.run_once()
            except errors.StoreUnavailable as exc:
                # Transient: the store may come back; keep polling at the interval.
                logger.warning(
                    "%s: store unavailable: %s",
                    self.name,
                    exc,
                    extra={"event": "loop_store_unavailable", "loop": self.name},
                )
                more = False
            if more:
                # Yield so a busy loop never starves the event loop.
                self.timed_out = False
                await asyncio.sleep(0)
                continue
            try:
                await asyncio.wait_for(self._woken.wait(), timeout=self.wait_s())
                self.timed_out = False
            except TimeoutError:
                self.timed_out = True
        logger.debug("%s stopped", self.name, extra={"event": "loop_stopped", "loop": self.name})


async def supervise(loops: Sequence[Loop]) -> None:
    """Run `loops` until all stop; if one dies, stop the others and re-raise its error."""
    tasks = [asyncio.create_task(loop.run(), name=f"pingo-{loop.name}") for loop in loops]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                failed = task.get_name()
                logger.error(
                    "%s died; stopping the node",
                    failed,
                    exc_info=task.exception(),
                    extra={"event": "loop_died", "loop": failed},
                )
                for loop in loops:
                    loop.stop()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise task.exception()  # type: ignore[misc]
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for loop in loops:
            loop.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

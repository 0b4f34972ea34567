"""The scheduler loop: every node runs one; ticks are claimed in the store, so any may win."""

from __future__ import annotations

from pingo import loops
from pingo.schedules.service import ScheduleService


class Scheduler(loops.Loop):
    """Each pass claims and settles the due ticks of every schedule (see `service`)."""

    name = "scheduler"

    def __init__(self, service: ScheduleService) -> None:
        super().__init__(service.settings.schedule_interval_s)
        self.service = service

    async def run_once(self) -> bool:
        return await self.service.fire_due()

    def wait_s(self) -> float:
        # Until the next tick the last pass saw coming, if that is before the interval.
        return self.service.wait_s(self.interval_s)

"""The reaper's staging sweep: leftovers of attempts without a lease go, live attempts stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pingo.actions.executors import sandbox
from pingo.actions.leases import HeldActions
from pingo.actions.reaper import Reaper
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import CHAIN, ManualClock, start_attempt, workflow


def _staging(storage: DatasetStorage, action: protocol.ActionRecord, attempt: int) -> str:
    return storage.staging_path(action.dataset_id, action.workflow_id, action.action_id, attempt)


def _plant(old: dict[str, str], young: list[str], age_s: float) -> None:
    """Create staging entries ("file", "dir", "box" or "link"), `old` ones `age_s` old."""
    for path, kind in old.items():
        if kind == "file":
            Path(path).write_text("output")
        elif kind == "dir":
            os.mkdir(path)
            Path(path, "part-0").write_text("output")
        elif kind == "box":
            os.mkdir(sandbox.box_for(path))
            path = sandbox.box_for(path)
        else:
            os.symlink("/nowhere", path)
        then = time.time() - age_s
        os.utime(path, (then, then), follow_symlinks=False)
    for path in young:
        Path(path).write_text("just created")


def _present(paths: list[str]) -> list[bool]:
    return [os.path.lexists(p) for p in paths]


async def test_sweep_removes_staging_of_attempts_without_a_lease(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    callbacks = OutcomeService(store, storage, settings, on_ready=lambda: None)
    manager = planner.WorkflowManager(store, storage, settings, outcomes=callbacks)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    running = await start_attempt(store, record.id, 1)
    waiting = await store.get_action(record.id, 2)
    assert waiting is not None

    live = _staging(storage, running, 1)
    stale_attempt = _staging(storage, running, 0)
    not_started = _staging(storage, waiting, 1)
    stray = os.path.join(os.path.dirname(live), "not-a-staging-name")
    young = _staging(storage, waiting, 2)
    old = {live: "file", stale_attempt: "dir", not_started: "box", stray: "link"}
    _plant(old, [young], settings.lease_s + 5)
    _plant({live: "box"}, [], settings.lease_s + 5)

    reaper = Reaper(store, settings, {}, callbacks, HeldActions({}), storage=storage)
    assert await reaper.sweep_staging(storage) == 3
    watched = [live, sandbox.box_for(live), young, stale_attempt, sandbox.box_for(not_started)]
    assert _present(watched) == [True, True, True, False, False]
    assert _present([stray]) == [False]

    # Once the lease lapses, the attempt's staging is a leftover too.
    clock.advance(settings.lease_s + 1)
    assert await reaper.sweep_staging(storage) == 2
    assert _present([live, sandbox.box_for(live), young]) == [False, False, True]

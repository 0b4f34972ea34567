"""The reaper's staging sweep: leftovers of attempts without a lease go, live attempts stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pingo.actions.executors import sandbox
from pingo.actions.leases import HeldActions
from pingo.actions.reaper import Reaper
from pingo.callbacks.service import CallbackService
from pingo.config import Settings
from pingo.datasets.storage import DatasetStorage
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import CHAIN, ManualClock, start_attempt, workflow


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


async def test_sweep_removes_staging_of_attempts_without_a_lease(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    callbacks = CallbackService(store, storage, settings, on_ready=lambda: None)
    manager = planner.WorkflowManager(store, storage, settings, callbacks=callbacks)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    running = await start_attempt(store, record.id, 1)
    waiting = await store.get_action(record.id, 2)
    assert waiting is not None

    def staging(action: protocol.ActionRecord, attempt: int) -> Path:
        return Path(
            storage.staging_path(action.dataset_id, action.workflow_id, action.action_id, attempt)
        )

    live = staging(running, 1)
    live.write_text("being written")
    live_box = Path(sandbox.box_for(str(live)))
    live_box.mkdir()
    stale_attempt = staging(running, 0)
    stale_attempt.mkdir()
    (stale_attempt / "part-0").write_text("old")
    not_started = Path(sandbox.box_for(str(staging(waiting, 1))))
    not_started.mkdir()
    stray = live.parent / "not-a-staging-name"
    stray.symlink_to("/nowhere")
    young = staging(waiting, 2)
    young.write_text("just created")
    for path in (live, live_box, stale_attempt, not_started, stray):
        _age(path, settings.lease_s + 5)

    reaper = Reaper(store, settings, {}, callbacks, HeldActions({}), storage=storage)
    assert await reaper.sweep_staging(storage) == 3
    assert live.exists() and live_box.exists() and young.exists()
    assert not stale_attempt.exists() and not not_started.exists()
    assert not os.path.lexists(stray)

    # Once the lease lapses, the attempt's staging is a leftover too.
    clock.advance(settings.lease_s + 1)
    assert await reaper.sweep_staging(storage) == 2
    assert not live.exists() and not live_box.exists() and young.exists()

"""The reaper and a staging output: the sweep removes leftovers of attempts nothing will
promote and keeps live ones; a dead node's attempt that noted its completion is finished
from its output, not run again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pingo import states
from pingo.actions.executors import sandbox
from pingo.actions.leases import HeldActions
from pingo.actions.reaper import Reaper
from pingo.config import Settings
from pingo.datasets.storage import (
    COMPLETED_SUFFIX,
    SPARE_PREFIX,
    DatasetStorage,
    record_completion,
)
from pingo.outcomes.service import OutcomeService, no_news
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import (
    CHAIN,
    ManualClock,
    content,
    start_attempt,
    workflow,
    write_output,
)

A = states.ActionState


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
    callbacks = OutcomeService(store, storage, settings, on_ready=no_news)
    manager = planner.WorkflowManager(store, storage, settings, outcomes=callbacks)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    running = await start_attempt(store, record.id, 1)
    waiting = await store.get_action(record.id, 2)
    assert waiting is not None

    live = _staging(storage, running, 1)
    stale_attempt = _staging(storage, running, 0)
    not_started = _staging(storage, waiting, 1)
    stray = os.path.join(os.path.dirname(live), "not-a-staging-name")
    # An evidence file kept for reuse and left idle since (`storage.SpareFiles`).
    spare = os.path.join(os.path.dirname(live), f"{SPARE_PREFIX}0123456789ab.7")
    young = _staging(storage, waiting, 2)
    old = {live: "file", stale_attempt: "dir", not_started: "box", stray: "link", spare: "file"}
    _plant(old, [young], settings.lease_s + 5)
    _plant({live: "box"}, [], settings.lease_s + 5)

    reaper = Reaper(store, settings, {}, callbacks, HeldActions({}), storage=storage)
    assert await reaper.sweep_staging(storage) == 4
    watched = [live, sandbox.box_for(live), young, stale_attempt, sandbox.box_for(not_started)]
    assert _present(watched) == [True, True, True, False, False]
    assert _present([stray, spare]) == [False, False]

    # A lapsed lease alone does not make a submitted attempt's staging a leftover: the
    # reaper has still to resolve the attempt, perhaps from its completion note.
    clock.advance(settings.lease_s + 1)
    _plant({live + COMPLETED_SUFFIX: "file"}, [], settings.lease_s + 5)
    assert await reaper.sweep_staging(storage) == 0
    # Once the attempt is resolved (given back here: that removes its output), nothing
    # will promote it, and the sweep takes what is left.
    assert await callbacks.release_lost(running, "its node died") is not None
    assert await reaper.sweep_staging(storage) == 2
    assert _present([live, sandbox.box_for(live), live + COMPLETED_SUFFIX, young]) == [
        False,
        False,
        False,
        True,
    ]


async def _dead_nodes_attempt(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, *, noted: bool
) -> tuple[Reaper, protocol.ActionRecord]:
    """Action 1 of a chain submitted by node `ghost`, which wrote its output (and, when
    `noted`, its completion note) and died before reporting; the reaper of another node."""
    callbacks = OutcomeService(store, storage, settings, on_ready=no_news)
    manager = planner.WorkflowManager(store, storage, settings, outcomes=callbacks)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    action = await start_attempt(store, record.id, 1, node="ghost")
    staging = write_output(storage, action, b"computed once")
    if noted:
        record_completion(str(staging), 2.5)
    reaper = Reaper(store, settings, {}, callbacks, HeldActions({}), storage=storage)
    return reaper, action


async def test_a_dead_nodes_completed_attempt_is_finished_from_its_note_not_run_again(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    reaper, action = await _dead_nodes_attempt(store, storage, settings, noted=True)
    clock.advance(30 + settings.reconcile_grace_s + 1)  # start_attempt's lease, then the grace
    await reaper.run_once()

    finished = await store.get_action(action.workflow_id, 1)
    assert finished is not None
    assert (finished.state, finished.attempts) == (A.FINISHED, 1)
    assert finished.runtime_s == 2.5
    dataset = await store.get_dataset(action.dataset_id)
    assert dataset is not None and content(dataset.path) == b"computed once"
    child = await store.get_action(action.workflow_id, 2)
    assert child is not None and child.state is A.READY


async def test_a_dead_nodes_attempt_without_a_note_is_run_again(
    store: protocol.Store, storage: DatasetStorage, settings: Settings, clock: ManualClock
) -> None:
    # Its output may be partial: only the note says the command exited 0 with it whole.
    reaper, action = await _dead_nodes_attempt(store, storage, settings, noted=False)
    clock.advance(30 + settings.reconcile_grace_s + 1)
    await reaper.run_once()

    again = await store.get_action(action.workflow_id, 1)
    assert again is not None
    assert (again.state, again.attempts) == (A.READY, 1)

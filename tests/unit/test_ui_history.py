"""An action's state history as the UI derives it from the record's stamps and its logs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from pingo import states
from pingo.store.protocol import ActionRecord
from pingo.ui import Attempt, history

A = states.ActionState
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _action(**overrides: object) -> ActionRecord:
    record = ActionRecord(
        workflow_id="wf",
        action_id=1,
        name="a",
        type="command-line",
        state=A.WAITING,
        dataset_id="d",
        reused=False,
        reason="absent",
        definition={},
        inputs={},
        waiting_on=(),
        children=(),
        callback_id="c",
        created_at=T0,
        updated_at=T0,
    )
    return replace(record, **overrides)  # type: ignore[arg-type]


def _whats(action: ActionRecord, attempts: list[Attempt] | None = None) -> list[str]:
    return [m.what for m in history(action, attempts or [])]


def test_a_waiting_action_was_only_planned() -> None:
    assert _whats(_action()) == ["planned"]


def test_a_ready_action_shows_its_state_since_the_last_update() -> None:
    moments = history(_action(state=A.READY, updated_at=T0 + timedelta(seconds=5)), [])
    assert [(m.what, m.at) for m in moments] == [
        ("planned", T0),
        ("READY (now)", T0 + timedelta(seconds=5)),
    ]


def test_a_retried_action_dates_earlier_attempts_by_their_logs() -> None:
    action = _action(
        state=A.FINISHED,
        attempts=3,
        started_at=T0 + timedelta(seconds=30),
        finished_at=T0 + timedelta(seconds=40),
        updated_at=T0 + timedelta(seconds=40),
    )
    attempts = [
        Attempt(1, 10, T0 + timedelta(seconds=10)),
        Attempt(2, None, None),  # its log is on another node
        Attempt(3, 10, T0 + timedelta(seconds=39)),
    ]
    assert _whats(action, attempts) == [
        "planned",
        "attempt 1 wrote its last log line",
        "attempt 3 SUBMITTED",
        "FINISHED",
    ]


def test_a_reused_action_ends_without_running() -> None:
    action = _action(state=A.FINISHED, reused=True, reason="reused")
    assert _whats(action) == ["planned", "FINISHED"]

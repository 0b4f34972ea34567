"""An action's state history as the UI shows it: the recorded entries, each with how long
the action stayed in that state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pingo import states
from pingo.store.protocol import ActionRecord, StateEntry
from pingo.ui import history

A = states.ActionState
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _action(*entries: tuple[A, float]) -> ActionRecord:
    return ActionRecord(
        workflow_id="wf",
        action_id=1,
        name="a",
        type="command-line",
        state=entries[-1][0],
        dataset_id="d",
        reused=False,
        reason="absent",
        definition={},
        inputs={},
        waiting_on=(),
        children=(),
        callback_id="c",
        created_at=T0,
        updated_at=T0 + timedelta(seconds=entries[-1][1]),
        history=tuple(StateEntry(state, T0 + timedelta(seconds=s)) for state, s in entries),
    )


def _rows(action: ActionRecord, now_s: float) -> list[tuple[str, float, float | None]]:
    moments = history(action, T0 + timedelta(seconds=now_s))
    return [(m.state, (m.at - T0).total_seconds(), m.lasted_s) for m in moments]


def test_each_state_lasts_until_the_next_and_the_current_one_until_now() -> None:
    action = _action((A.WAITING, 0), (A.READY, 2), (A.PROCESSING, 2.5))
    assert _rows(action, 10) == [
        ("WAITING", 0, 2.0),
        ("READY", 2, 0.5),
        ("PROCESSING", 2.5, 7.5),
    ]


def test_a_retry_shows_every_pass_and_an_ended_action_no_last_duration() -> None:
    action = _action(
        (A.READY, 0), (A.SUBMITTED, 1), (A.READY, 3), (A.SUBMITTED, 4), (A.FINISHED, 9)
    )
    assert _rows(action, 100) == [
        ("READY", 0, 1.0),
        ("SUBMITTED", 1, 2.0),
        ("READY", 3, 1.0),
        ("SUBMITTED", 4, 5.0),
        ("FINISHED", 9, None),
    ]


def test_a_reused_action_has_one_entry() -> None:
    assert _rows(_action((A.FINISHED, 0)), 5) == [("FINISHED", 0, None)]

"""The state machines: one table per entity, checked by `ensure_transition`."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from pingo import errors, states

A, D, W = states.ActionState, states.DatasetState, states.WorkflowState
TABLES: list[tuple[type[Any], Any, frozenset[Any]]] = [
    (A, states.ACTION_TRANSITIONS, states.ACTION_TERMINAL),
    (D, states.DATASET_TRANSITIONS, frozenset()),
    (W, states.WORKFLOW_TRANSITIONS, states.WORKFLOW_TERMINAL),
]


@pytest.mark.parametrize(
    ("enum", "table", "terminal"), TABLES, ids=["action", "dataset", "workflow"]
)
def test_terminal_states_have_no_outgoing_edge(enum: Any, table: Any, terminal: Any) -> None:
    assert not [(src, dst) for src, dst in table if src in terminal]


@pytest.mark.parametrize(
    ("enum", "table", "terminal"), TABLES, ids=["action", "dataset", "workflow"]
)
def test_every_edge_names_its_triggers_and_stays_in_its_enum(
    enum: Any, table: Any, terminal: Any
) -> None:
    for (src, dst), triggers in table.items():
        assert type(src) is enum and type(dst) is enum
        assert triggers and all(isinstance(t, states.Trigger) for t in triggers)


@pytest.mark.parametrize(
    ("enum", "table", "terminal"), TABLES, ids=["action", "dataset", "workflow"]
)
def test_every_state_is_reachable_or_initial(enum: Any, table: Any, terminal: Any) -> None:
    targets = {dst for _, dst in table}
    initial = {A.WAITING, A.READY, W.RUNNING, D.TO_STORE, D.TO_LEAF, D.TO_DELETE, D.STORED, D.LEAF}
    assert set(enum) <= targets | initial


@pytest.mark.parametrize(
    ("enum", "table", "terminal"), TABLES, ids=["action", "dataset", "workflow"]
)
def test_ensure_transition_follows_the_table_exactly(enum: Any, table: Any, terminal: Any) -> None:
    for src, dst in itertools.product(enum, enum):
        if (src, dst) in table:
            states.ensure_transition(src, dst)
            for trigger in table[(src, dst)]:
                states.ensure_transition(src, dst, trigger)
            for trigger in set(states.Trigger) - table[(src, dst)]:
                with pytest.raises(errors.InvalidTransition):
                    states.ensure_transition(src, dst, trigger)
        else:
            assert not states.is_allowed(src, dst)
            with pytest.raises(errors.InvalidTransition):
                states.ensure_transition(src, dst)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (A.FINISHED, A.READY),
        (A.WAITING, A.RUNNING),
        (A.KILLED, A.READY),
        (D.LEAF, D.DELETED),
        (D.STORED, D.DELETING),
        (W.SUCCEEDED, W.RUNNING),
        (W.FAILED, W.KILLED),
    ],
)
def test_forbidden_transitions_raise(src: Any, dst: Any) -> None:
    with pytest.raises(errors.InvalidTransition) as caught:
        states.ensure_transition(src, dst)
    assert caught.value.code == "INVALID_TRANSITION"
    assert src.value in caught.value.message and dst.value in caught.value.message


def test_a_user_cannot_evict_for_retention_and_retention_cannot_touch_a_leaf() -> None:
    states.ensure_transition(D.LEAF, D.STORED_TO_DELETE, states.Trigger.USER)
    with pytest.raises(errors.InvalidTransition, match="by retention"):
        states.ensure_transition(D.LEAF, D.STORED_TO_DELETE, states.Trigger.RETENTION)


def test_states_of_different_entities_never_mix() -> None:
    assert not states.is_allowed(A.RUNNING, W.SUCCEEDED)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidTransition):
        states.ensure_transition(W.RUNNING, A.FINISHED)


def test_sources_is_the_expected_state_set_of_a_compare_and_set() -> None:
    assert states.sources(A.PROCESSING) == {A.READY, A.PROCESSING}
    assert states.sources(A.PROCESSING, states.Trigger.SCRAPER) == {A.READY, A.PROCESSING}
    assert states.sources(A.PROCESSING, states.Trigger.USER) == frozenset()
    assert states.sources(D.DELETED, states.Trigger.DELETOR) == {D.DELETING}
    assert states.sources(W.KILLED) == {W.RUNNING}
    for enum, table, _ in TABLES:
        for dst in enum:
            assert states.sources(dst) == {src for src, d in table if d == dst}


def test_claim_and_on_disk_sets_are_consistent() -> None:
    assert states.ACTION_ACTIVE.isdisjoint(states.ACTION_TERMINAL)
    assert states.DATASET_REUSABLE <= states.DATASET_ON_DISK
    assert states.DATASET_COMPUTING.isdisjoint(states.DATASET_ON_DISK)


DOCS = Path(__file__).resolve().parents[2] / "docs" / "states.md"


def documented_table(entity: str) -> dict[tuple[str, str], set[str]]:
    """The `| from | to | triggered by | when |` rows after `<!-- table: entity -->`."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split(f"<!-- table: {entity} -->", 1)[1]
    rows: dict[tuple[str, str], set[str]] = {}
    for line in section.splitlines()[3:]:
        if not line.startswith("|"):
            break
        src, dst, triggers = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rows[(src, dst)] = {t.strip() for t in triggers.split(",")}
    return rows


@pytest.mark.parametrize(
    ("entity", "table"),
    [
        ("action", states.ACTION_TRANSITIONS),
        ("dataset", states.DATASET_TRANSITIONS),
        ("workflow", states.WORKFLOW_TRANSITIONS),
    ],
)
def test_docs_show_exactly_the_table(entity: str, table: Any) -> None:
    in_code = {(s.value, d.value): {t.value for t in ts} for (s, d), ts in table.items()}
    assert documented_table(entity) == in_code

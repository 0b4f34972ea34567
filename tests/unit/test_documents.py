"""The workflow document, encoded in slices, is byte for byte the one encoded at once."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from pingo.api import documents
from pingo.states import ActionState, WorkflowState
from pingo.store.protocol import ActionRecord, WorkflowRecord
from pingo.workflows import reuse

START = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _workflow() -> WorkflowRecord:
    return WorkflowRecord(
        id="wf-1",
        name='naïve "quoted" </script>',
        owner="alice",
        state=WorkflowState.RUNNING,
        document={},
        scope="server",
        on_failure="abort",
        end_dataset_id=None,
        created_at=START,
    )


def _action(action_id: int) -> ActionRecord:
    state = random.Random(action_id).choice(list(ActionState))
    return ActionRecord(
        workflow_id="wf-1",
        action_id=action_id,
        name=f"a{action_id} é中",
        type="command-line",
        state=state,
        dataset_id=f"ds-{action_id}",
        reused=action_id % 3 == 0,
        reason="absent",
        definition={},
        inputs={},
        waiting_on=(),
        children=(),
        callback_id=f"cb-{action_id}",
        created_at=START,
        updated_at=START,
        attempts=action_id % 4,
        started_at=START + timedelta(seconds=action_id) if action_id % 2 else None,
    )


@pytest.mark.parametrize("count", [0, 1, 999, 1000, 1001, 2500])
def test_sliced_encoding_is_the_whole_encoding(count: int) -> None:
    actions = [_action(i) for i in range(count)]
    random.Random(count).shuffle(actions)  # the document orders them itself
    workflow = _workflow()
    whole = documents.encode(documents.workflow_document(workflow, actions))
    sliced = documents.encode_workflow_document(workflow, actions)
    assert sliced == whole
    assert [a["actionId"] for a in json.loads(sliced)["actions"]] == list(range(count))


def test_twins_found_among_candidates_are_those_found_among_all() -> None:
    """`TwinFinder` given the store's `twin_datasets` keeps only those, and finds the same
    twins as one that keeps every dataset seen running."""
    rng = random.Random(13)
    actions = [(i, f"ds-{rng.randrange(40)}", rng.random() < 0.8) for i in range(200)]
    computing = Counter(d for _, d, runs in actions if runs)
    candidates = {d for d, n in computing.items() if n > 1}
    every, only = reuse.TwinFinder(), reuse.TwinFinder(candidates)
    found = [i for i, d, runs in actions if every.is_twin(d, runs=runs)]
    assert found == [i for i, d, runs in actions if only.is_twin(d, runs=runs)]
    assert found and only._computing <= candidates < set(computing)

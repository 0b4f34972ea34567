"""Store rules that every backend applies the same way (and the planner with them).

The reference backend (`memory.py`) once held these and the others imported them
from it; a rule shared by all backends lives here instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pingo.states import ActionState, DatasetState
from pingo.store.protocol import HISTORY_LIMIT, ActionRecord, DatasetPlan, StateEntry

#: Targets of a dataset being computed, weakest first: a plan never lowers one.
TARGET_RANK: Mapping[DatasetState, int] = {
    DatasetState.TO_DELETE: 0,
    DatasetState.TO_STORE: 1,
    DatasetState.TO_LEAF: 2,
}


def plan_upgrades(existing: DatasetState, planned: DatasetState) -> bool:
    """Whether persisting a plan moves an existing dataset to the planned state."""
    if existing is DatasetState.DELETED:
        return True
    old, new = TARGET_RANK.get(existing), TARGET_RANK.get(planned)
    return old is not None and new is not None and new > old


def revived_fields(plan: DatasetPlan) -> dict[str, Any]:
    """The fields a plan overwrites when it moves a DELETED dataset back to computing.

    The plan's action now produces the dataset, wherever and however it says, and
    the old files are gone: their size, digest and time of storing go with them.
    The dataset's history (`compute_s`, `use_count`, `last_used_at`, `pinned`)
    stays. Keys are `DatasetRecord` field names; a backend renames what it stores
    under another name.
    """
    return {
        "path": plan.path,
        "producer_workflow_id": plan.producer_workflow_id,
        "producer_action_id": plan.producer_action_id,
        "is_managed": plan.is_managed,
        "size_bytes": None,
        "digest": None,
        "stored_at": None,
    }


def opening_history(action: ActionRecord) -> Sequence[StateEntry]:
    """The history an action is created with: its own, else its planned state at creation."""
    return action.history or (StateEntry(action.state, action.created_at),)


def entered(
    history: Sequence[StateEntry], state: ActionState, at: datetime
) -> tuple[StateEntry, ...]:
    """`history` with `state` entered at `at`, the oldest entries dropped past the limit."""
    return (*history, StateEntry(state, at))[-HISTORY_LIMIT:]

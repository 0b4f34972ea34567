"""Store rules that every backend applies the same way (and the planner with them).

The reference backend (`memory.py`) once held these and the others imported them
from it; a rule shared by all backends lives here instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from pingo.states import ACTION_TERMINAL, ActionState, DatasetState
from pingo.store.protocol import (
    HISTORY_LIMIT,
    ActionRecord,
    DatasetPlan,
    StateEntry,
    claim_key,
)

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


# ---------------------------------------------------------------- in-flight sharing

#: Dataset states in which another workflow's action is computing the dataset for
#: good, so a new plan shares that computation (`pingo.workflows.planner` reads the
#: same set). TO_DELETE is left out: such a copy goes once its readers end.
SHAREABLE: frozenset[DatasetState] = frozenset({DatasetState.TO_STORE, DatasetState.TO_LEAF})
#: The planner's reason for an action that shares a computation in flight.
IN_FLIGHT = "in-flight"
#: Planning reasons of an action that must run its own computation, never share one:
#: forced (`forceComputation`, a forced rerun), unmanaged (its output is the user's
#: path), and a stored copy that failed verification (its output replaces that copy).
RUNS_ITS_OWN: frozenset[str] = frozenset({"forced", "unmanaged", "digest-mismatch"})


def may_share(action: ActionRecord) -> bool:
    """Whether a planned action is one that would compute, and may share instead."""
    return (
        not action.reused
        and action.shared_with is None
        and action.state in (ActionState.WAITING, ActionState.READY)
        and action.reason not in RUNS_ITS_OWN
    )


def producer_to_share(
    workflow_id: str,
    existing: DatasetState,
    producer: tuple[str, int],
    producer_state: ActionState | None,
) -> str | None:
    """The claim key of the producer a plan of `workflow_id` shares, from the dataset as
    it stood before the plan merged into it; None when the plan computes it itself.

    This is the store's half of in-flight deduplication: two plans read the dataset
    absent at the same moment, and the one persisted second finds the first's
    computation here, in the atomic creation that sees both. A producer not found
    may be a plan still being written (MongoDB writes datasets before actions): it is
    shared, and `OutcomeService.settle_shared` gives up on it after a lease.
    """
    if existing not in SHAREABLE or producer[0] == workflow_id:
        return None
    if producer_state is not None and producer_state in ACTION_TERMINAL:
        return None
    return claim_key(*producer)


def as_sharer(action: ActionRecord, producer: str) -> ActionRecord:
    """`action` planned to share `producer`'s computation: WAITING for it (its own id in
    `waiting_on`) beside its own parents, with the planner's in-flight reason."""
    return replace(
        action,
        state=ActionState.WAITING,
        waiting_on=(*action.waiting_on, action.action_id),
        shared_with=producer,
        reason=IN_FLIGHT,
        history=(),
    )


def shared_actions(
    actions: Iterable[ActionRecord], producers: Mapping[str, str]
) -> dict[int, ActionRecord]:
    """The actions of a plan that share a computation, by action id, from `producers`
    (dataset id → the producer's claim key, `producer_to_share`)."""
    return {
        a.action_id: as_sharer(a, producers[a.dataset_id])
        for a in actions
        if a.dataset_id in producers and may_share(a)
    }

"""The state machines of actions, datasets and workflows.

This module is the single home of Pingo's states: one enum per entity, one
table of allowed transitions (each edge says who triggers it), and
`ensure_transition`, which every component calls before asking the store for a
compare-and-set. The store's filter on the expected state is what makes a
transition atomic; this table is what makes it legal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pingo import errors


class ActionState(enum.StrEnum):
    #: Planned; waits for at least one parent action to finish, or for another
    #: workflow's action computing its dataset (in-flight deduplication).
    WAITING = "WAITING"
    #: Every parent finished (or was reused); any node may claim it.
    READY = "READY"
    #: Claimed by a node's scraper (claim state, guarded by a lease).
    PROCESSING = "PROCESSING"
    #: Handed to an executor by a submitter (claim state, guarded by a lease).
    SUBMITTED = "SUBMITTED"
    #: The executor reported that the work started.
    RUNNING = "RUNNING"
    #: The work succeeded and its dataset is stored.
    FINISHED = "FINISHED"
    #: The work failed and no attempt is left.
    FAILED = "FAILED"
    #: A user (or an aborting workflow) stopped the action.
    KILLED = "KILLED"
    #: A parent failed or was killed in an `onFailure: continue` workflow: it never ran.
    UPSTREAM_FAILED = "UPSTREAM_FAILED"


class DatasetState(enum.StrEnum):
    #: Being computed; deleted as soon as its consumers finish.
    TO_DELETE = "TO_DELETE"
    #: Being computed; kept once stored, until retention evicts it.
    TO_STORE = "TO_STORE"
    #: Being computed by a leaf action; kept until a user deletes it.
    TO_LEAF = "TO_LEAF"
    #: On disk, an intermediate that retention may evict.
    STORED = "STORED"
    #: On disk, the output of a leaf action: never removed by the system.
    LEAF = "LEAF"
    #: On disk, to be removed once no claim holds it.
    STORED_TO_DELETE = "STORED_TO_DELETE"
    #: Claimed by a deletor (synchronization state).
    PROCESSING = "PROCESSING"
    #: Its files are being removed.
    DELETING = "DELETING"
    #: No files on disk; computing it again is the only way back.
    DELETED = "DELETED"


class WorkflowState(enum.StrEnum):
    #: Some action is neither finished nor reused.
    RUNNING = "RUNNING"
    #: Every action finished or was reused.
    SUCCEEDED = "SUCCEEDED"
    #: An action failed with no attempt left.
    FAILED = "FAILED"
    #: A user killed the workflow.
    KILLED = "KILLED"


class Trigger(enum.StrEnum):
    """Who causes a transition."""

    PLANNER = "planner"
    SCRAPER = "scraper"
    SUBMITTER = "submitter"
    CALLBACK = "callback"
    REAPER = "reaper"
    DELETOR = "deletor"
    RETENTION = "retention"
    USER = "user"


A = ActionState
D = DatasetState
W = WorkflowState

#: Allowed action transitions, each with the components that trigger it.
ACTION_TRANSITIONS: Mapping[tuple[ActionState, ActionState], frozenset[Trigger]] = {
    # Last parent finished; or, for an action sharing another workflow's computation of
    # its dataset, that computation failed or was killed: it computes it itself.
    (A.WAITING, A.READY): frozenset({Trigger.CALLBACK, Trigger.PLANNER, Trigger.REAPER}),
    # Sharing: the other workflow's action stored the dataset; this one never runs.
    (A.WAITING, A.FINISHED): frozenset({Trigger.CALLBACK, Trigger.PLANNER, Trigger.REAPER}),
    (A.WAITING, A.KILLED): frozenset({Trigger.USER, Trigger.CALLBACK}),  # kill, abort
    # onFailure "continue": what depends on a failed action can never run.
    (A.WAITING, A.UPSTREAM_FAILED): frozenset({Trigger.CALLBACK}),
    (A.READY, A.PROCESSING): frozenset({Trigger.SCRAPER}),  # claim by CAS
    (A.READY, A.KILLED): frozenset({Trigger.USER, Trigger.CALLBACK}),
    (A.READY, A.FAILED): frozenset({Trigger.SUBMITTER}),  # no executor can run it
    (A.PROCESSING, A.PROCESSING): frozenset({Trigger.SCRAPER}),  # reclaim, lease expired
    (A.PROCESSING, A.SUBMITTED): frozenset({Trigger.SUBMITTER}),
    (A.PROCESSING, A.READY): frozenset({Trigger.SUBMITTER}),  # handed back on shutdown
    (A.PROCESSING, A.KILLED): frozenset({Trigger.USER, Trigger.CALLBACK}),
    # The executor's external id is recorded once submit returns (no state change).
    (A.SUBMITTED, A.SUBMITTED): frozenset({Trigger.SUBMITTER}),
    (A.RUNNING, A.RUNNING): frozenset({Trigger.SUBMITTER}),
    (A.SUBMITTED, A.RUNNING): frozenset({Trigger.CALLBACK}),
    (A.SUBMITTED, A.FINISHED): frozenset({Trigger.CALLBACK, Trigger.REAPER}),
    (A.SUBMITTED, A.READY): frozenset({Trigger.SUBMITTER, Trigger.CALLBACK, Trigger.REAPER}),
    (A.SUBMITTED, A.FAILED): frozenset({Trigger.SUBMITTER, Trigger.CALLBACK, Trigger.REAPER}),
    (A.SUBMITTED, A.KILLED): frozenset({Trigger.USER, Trigger.CALLBACK}),
    (A.RUNNING, A.FINISHED): frozenset({Trigger.CALLBACK, Trigger.REAPER}),
    (A.RUNNING, A.READY): frozenset({Trigger.CALLBACK, Trigger.REAPER}),  # retry after failure
    (A.RUNNING, A.FAILED): frozenset({Trigger.CALLBACK, Trigger.REAPER}),
    (A.RUNNING, A.KILLED): frozenset({Trigger.USER, Trigger.CALLBACK}),
}

#: Allowed dataset transitions, each with the components that trigger it.
DATASET_TRANSITIONS: Mapping[tuple[DatasetState, DatasetState], frozenset[Trigger]] = {
    # Planning (re)computes a dataset that is absent or gone; a dataset already
    # being computed elsewhere may be upgraded (TO_DELETE < TO_STORE < TO_LEAF).
    (D.DELETED, D.TO_STORE): frozenset({Trigger.PLANNER}),
    (D.DELETED, D.TO_LEAF): frozenset({Trigger.PLANNER}),
    (D.DELETED, D.TO_DELETE): frozenset({Trigger.PLANNER}),
    (D.TO_DELETE, D.TO_STORE): frozenset({Trigger.PLANNER}),
    (D.TO_DELETE, D.TO_LEAF): frozenset({Trigger.PLANNER}),
    (D.TO_STORE, D.TO_LEAF): frozenset({Trigger.PLANNER}),
    (D.STORED, D.LEAF): frozenset({Trigger.PLANNER}),  # reused by a leaf action
    # Success of the producing action.
    (D.TO_STORE, D.STORED): frozenset({Trigger.CALLBACK}),
    (D.TO_LEAF, D.LEAF): frozenset({Trigger.CALLBACK}),
    (D.TO_DELETE, D.STORED_TO_DELETE): frozenset({Trigger.CALLBACK}),
    # A recomputation finished after the dataset was evicted meanwhile.
    (D.DELETED, D.STORED): frozenset({Trigger.CALLBACK}),
    (D.DELETED, D.LEAF): frozenset({Trigger.CALLBACK}),
    (D.DELETED, D.STORED_TO_DELETE): frozenset({Trigger.CALLBACK}),
    # A leaf recomputed while its old copy waits for deletion (a user deleted it,
    # then submitted it again): the workflow's final output must outlive the delete.
    (D.STORED_TO_DELETE, D.LEAF): frozenset({Trigger.CALLBACK}),
    # A forced recompute (or one of a copy that failed verification) replaced
    # the files in place: the record takes the new size and digest.
    (D.STORED, D.STORED): frozenset({Trigger.CALLBACK}),
    (D.LEAF, D.LEAF): frozenset({Trigger.CALLBACK}),
    (D.STORED_TO_DELETE, D.STORED_TO_DELETE): frozenset({Trigger.CALLBACK}),
    # Failure or kill of the producing action: partial output removed.
    (D.TO_STORE, D.DELETED): frozenset({Trigger.CALLBACK}),
    (D.TO_LEAF, D.DELETED): frozenset({Trigger.CALLBACK}),
    (D.TO_DELETE, D.DELETED): frozenset({Trigger.CALLBACK}),
    # Eviction: retention or a user marks it; LEAF only by a user (force).
    (D.STORED, D.STORED_TO_DELETE): frozenset({Trigger.RETENTION, Trigger.USER}),
    (D.LEAF, D.STORED_TO_DELETE): frozenset({Trigger.USER}),
    # The deletor: claim by CAS, remove files, done. A deletor that died is
    # replaced once the record has been stale for a lease.
    (D.STORED_TO_DELETE, D.PROCESSING): frozenset({Trigger.DELETOR}),
    (D.PROCESSING, D.PROCESSING): frozenset({Trigger.DELETOR}),
    (D.PROCESSING, D.STORED_TO_DELETE): frozenset({Trigger.DELETOR}),  # a claim arrived
    (D.PROCESSING, D.DELETING): frozenset({Trigger.DELETOR}),
    (D.DELETING, D.DELETING): frozenset({Trigger.DELETOR}),
    (D.DELETING, D.DELETED): frozenset({Trigger.DELETOR}),
}

#: Allowed workflow transitions, each with the components that trigger it.
WORKFLOW_TRANSITIONS: Mapping[tuple[WorkflowState, WorkflowState], frozenset[Trigger]] = {
    (W.RUNNING, W.SUCCEEDED): frozenset({Trigger.PLANNER, Trigger.CALLBACK}),
    (W.RUNNING, W.FAILED): frozenset(
        {Trigger.CALLBACK, Trigger.SUBMITTER, Trigger.REAPER, Trigger.PLANNER}
    ),
    (W.RUNNING, W.KILLED): frozenset({Trigger.USER}),
}

#: Action states from which the action will not move again.
ACTION_TERMINAL: frozenset[ActionState] = frozenset(
    {A.FINISHED, A.FAILED, A.KILLED, A.UPSTREAM_FAILED}
)
#: Action states with work left to do: while one of a workflow's actions is in one, the
#: workflow is not over.
ACTION_LEFT: frozenset[ActionState] = frozenset(ActionState) - ACTION_TERMINAL
#: Terminal action states other than FINISHED: a workflow holding one did not succeed.
ACTION_UNSUCCESSFUL: frozenset[ActionState] = frozenset({A.FAILED, A.KILLED, A.UPSTREAM_FAILED})
#: Action states in which an executor may be working on the action.
ACTION_ACTIVE: frozenset[ActionState] = frozenset({A.PROCESSING, A.SUBMITTED, A.RUNNING})
#: Dataset states whose files are on disk.
DATASET_ON_DISK: frozenset[DatasetState] = frozenset({D.STORED, D.LEAF, D.STORED_TO_DELETE})
#: Dataset states whose files still take storage (on disk, or being deleted): the only
#: states whose `size_bytes` counts, in `/storage` and in dataset documents.
DATASET_USING_STORAGE: frozenset[DatasetState] = DATASET_ON_DISK | {D.PROCESSING, D.DELETING}
#: Dataset states that planning reuses.
DATASET_REUSABLE: frozenset[DatasetState] = frozenset({D.STORED, D.LEAF})
#: Dataset states in which the producing action is computing it.
DATASET_COMPUTING: frozenset[DatasetState] = frozenset({D.TO_STORE, D.TO_LEAF, D.TO_DELETE})
#: Workflow states from which the workflow will not move again.
WORKFLOW_TERMINAL: frozenset[WorkflowState] = frozenset({W.SUCCEEDED, W.FAILED, W.KILLED})

_TABLES: Mapping[type[enum.Enum], Mapping[tuple[Any, Any], frozenset[Trigger]]] = {
    ActionState: ACTION_TRANSITIONS,
    DatasetState: DATASET_TRANSITIONS,
    WorkflowState: WORKFLOW_TRANSITIONS,
}


def is_allowed(
    current: ActionState | DatasetState | WorkflowState,
    new: ActionState | DatasetState | WorkflowState,
    trigger: Trigger | None = None,
) -> bool:
    """Whether `current → new` is an edge of its entity's table (for `trigger`, if given)."""
    if type(current) is not type(new):
        return False
    triggers = _TABLES[type(current)].get((current, new))
    if triggers is None:
        return False
    return trigger is None or trigger in triggers


def ensure_transition(
    current: ActionState | DatasetState | WorkflowState,
    new: ActionState | DatasetState | WorkflowState,
    trigger: Trigger | None = None,
) -> None:
    """Raise `InvalidTransition` unless `current → new` is allowed (for `trigger`)."""
    if not is_allowed(current, new, trigger):
        by = f" by {trigger.value}" if trigger is not None else ""
        raise errors.InvalidTransition(
            f"{type(current).__name__} {current.value} → {new.value} is not allowed{by}"
        )


def sources(
    new: ActionState | DatasetState | WorkflowState, trigger: Trigger | None = None
) -> frozenset[ActionState | DatasetState | WorkflowState]:
    """Every state from which `new` may be reached (by `trigger`, if given).

    Components use this to build the expected-state set of a compare-and-set.
    """
    table = _TABLES[type(new)]
    return frozenset(
        src
        for (src, dst), triggers in table.items()
        if dst == new and (trigger is None or trigger in triggers)
    )

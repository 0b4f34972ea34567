"""The one vocabulary for what planning did with each action's dataset.

Every place that talks about reuse (the dry run, the workflow document, the CLI,
the logs endpoint, the docs) uses these four words and nothing else:

- **computed**: the action runs and stores its dataset;
- **shared**: another computation of the same dataset was under way. Another
  workflow's ("in-flight"): the action waits for it and never runs, unless that
  computation fails or is killed, when it computes the dataset itself (and is then
  *computed*). A twin action's in this workflow: both run, the first to succeed
  stores it, the other's output is dropped;
- **reused**: the dataset was stored already: the action never runs;
- **not needed**: every child of the action reuses a stored dataset, so its own
  output is never read: the action never runs.

The planner's `reason` says *why* in more detail ("absent", "forced",
"DELETED", …); these words say *what happened*.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from pingo.store import rules


class Reuse(enum.StrEnum):
    #: The action runs and stores its dataset.
    COMPUTED = "computed"
    #: Another computation of its dataset was under way: it waited for it (another
    #: workflow's), or ran beside it (a twin's in the same workflow).
    SHARED = "shared"
    #: Its dataset was stored: the action never runs.
    REUSED = "reused"
    #: Its output is not read by anything that runs: the action never runs.
    NOT_NEEDED = "not needed"


#: The planner's reason for an action whose dataset another workflow is computing (the
#: store gives it to an action it makes share, `pingo.store.rules.as_sharer`).
IN_FLIGHT = rules.IN_FLIGHT
#: The planner's reason for an action whose every child reuses a stored dataset.
NOT_NEEDED_REASON = "not-needed"


@dataclass(frozen=True, slots=True)
class SharedWith:
    """The other workflow's action whose computation an action shares, as shown to the
    sharer's owner (`sharedWith` in the dry run and the workflow document).

    `workflow_id` and `action_id` are None when the producer is another user's: they
    see only the action's name, never the workflow.
    """

    name: str
    workflow_id: str | None = None
    action_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        view: dict[str, Any] = {"name": self.name}
        if self.workflow_id is not None:
            view.update(workflowId=self.workflow_id, actionId=self.action_id)
        return view


def outcome(*, runs: bool, reason: str, twin: bool = False) -> Reuse:
    """The word for one action: `runs` (it computes), the planner's `reason`, and `twin`
    (a lower action of the same workflow computes the same dataset)."""
    if runs:
        return Reuse.SHARED if twin or reason == IN_FLIGHT else Reuse.COMPUTED
    return Reuse.NOT_NEEDED if reason == NOT_NEEDED_REASON else Reuse.REUSED


def summary(outcomes: Iterable[Reuse]) -> dict[str, int]:
    """`{"computed", "shared", "reused", "notNeeded"}` counts, zeros included."""
    counts = dict.fromkeys(Reuse, 0)
    for word in outcomes:
        counts[word] += 1
    return {
        "computed": counts[Reuse.COMPUTED],
        "shared": counts[Reuse.SHARED],
        "reused": counts[Reuse.REUSED],
        "notNeeded": counts[Reuse.NOT_NEEDED],
    }


class TwinFinder:
    """Tells twins apart as a workflow's actions come, in ascending action id: an action
    that runs while a lower running action of the same workflow computes its dataset.

    Only the datasets seen running are kept, so a big workflow's document can be built a
    page of actions at a time (issue 13). Given `candidates` (`Store.twin_datasets`), only
    those are: the ids of a 100,000-action workflow's datasets alone were 13 MiB of
    small strings, and the objects allocated beside them kept that memory from the
    system long after.
    """

    __slots__ = ("_candidates", "_computing")

    def __init__(self, candidates: Collection[str] | None = None) -> None:
        self._candidates = candidates
        self._computing: set[str] = set()

    def is_twin(self, dataset_id: str, *, runs: bool) -> bool:
        """Whether this action (the next in ascending id) is a twin of an earlier one."""
        if not runs or (self._candidates is not None and dataset_id not in self._candidates):
            return False
        if dataset_id in self._computing:
            return True
        self._computing.add(dataset_id)
        return False


def twins(dataset_ids: Iterable[tuple[int, str, bool]]) -> frozenset[int]:
    """Action ids that run while a lower-numbered running action of the same workflow
    computes the same dataset, from `(action id, dataset id, runs)` triples."""
    finder = TwinFinder()
    return frozenset(
        action_id
        for action_id, dataset_id, runs in sorted(dataset_ids)
        if finder.is_twin(dataset_id, runs=runs)
    )

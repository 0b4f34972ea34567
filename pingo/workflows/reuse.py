"""The one vocabulary for what planning did with each action's dataset.

Every place that talks about reuse (the dry run, the workflow document, the CLI,
the logs endpoint, the docs) uses these four words and nothing else:

- **computed**: the action runs and stores its dataset;
- **shared**: the action runs, but another computation of the same dataset is
  under way (another workflow's, or a twin action's in this workflow, "in-flight"):
  the first to succeed stores it, the other's output is dropped;
- **reused**: the dataset was stored already: the action never runs;
- **not needed**: every child of the action reuses a stored dataset, so its own
  output is never read: the action never runs.

The planner's `reason` says *why* in more detail ("absent", "forced",
"DELETED", …); these words say *what happened*.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Reuse(enum.StrEnum):
    #: The action runs and stores its dataset.
    COMPUTED = "computed"
    #: The action runs while another computation of its dataset is under way.
    SHARED = "shared"
    #: Its dataset was stored: the action never runs.
    REUSED = "reused"
    #: Its output is not read by anything that runs: the action never runs.
    NOT_NEEDED = "not needed"


#: The planner's reason for an action that runs while its dataset is computed elsewhere.
IN_FLIGHT = "in-flight"
#: The planner's reason for an action whose every child reuses a stored dataset.
NOT_NEEDED_REASON = "not-needed"


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


def twins(dataset_ids: Iterable[tuple[int, str, bool]]) -> frozenset[int]:
    """Action ids that run while a lower-numbered running action of the same workflow
    computes the same dataset, from `(action id, dataset id, runs)` triples."""
    first: dict[str, int] = {}
    found: set[int] = set()
    for action_id, dataset_id, runs in sorted(dataset_ids):
        if not runs:
            continue
        if dataset_id in first:
            found.add(action_id)
        else:
            first[dataset_id] = action_id
    return frozenset(found)

"""Store rules that every backend applies the same way (and the planner with them).

The reference backend (`memory.py`) once held these and the others imported them
from it; a rule shared by all backends lives here instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from pingo.states import DatasetState

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

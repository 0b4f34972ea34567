"""Small pieces every store backend shares: id lists in chunks, the lost-CAS log line.

A compare-and-set that finds the record moved on is normal under concurrency (another
node, another callback got there first); it is logged at debug level, with the same
words and the same structured fields whichever backend lost it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from enum import Enum
from typing import TypeVar

T = TypeVar("T")

logger = logging.getLogger("pingo.store")


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size` (bound parameters, `$in` lists)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def log_cas_lost(
    record: str,
    new: Enum | None,
    *,
    workflow_id: str | None = None,
    action_id: int | None = None,
    dataset_id: str | None = None,
    schedule_id: str | None = None,
) -> None:
    """Log that a compare-and-set on `record` ("action wf/3", …) lost: it moved on meanwhile."""
    ids = {
        "workflow_id": workflow_id,
        "action_id": action_id,
        "dataset_id": dataset_id,
        "schedule_id": schedule_id,
    }
    change = "updated" if new is None else f"moved to {new.value}"
    logger.debug(
        "%s not %s: lost the compare-and-set",
        record,
        change,
        extra={"event": "cas_lost", **{k: v for k, v in ids.items() if v is not None}},
    )


def log_action_cas_lost(workflow_id: str, action_id: int, new: Enum) -> None:
    """`log_cas_lost` for one action."""
    log_cas_lost(
        f"action {workflow_id}/{action_id}", new, workflow_id=workflow_id, action_id=action_id
    )


def log_event_lost(kind: str, workflow_id: str | None, message: str) -> None:
    """Log that a feed event was not recorded (a store error): the change it reports
    happened, and stays; only the feed misses it."""
    logger.warning(
        "feed event %s of %s not recorded: %s",
        kind,
        workflow_id,
        message,
        extra={"event": "feed_event_lost", "kind": kind, "workflow_id": workflow_id},
    )

"""Each user's feed of their workflows' events, and the admins' audit log.

Both are rows of the store's one event log (`Store.append_event`). A feed event
names its `owner`, the user whose feed (`GET /api/v1/events`) shows it; an audit
entry names no owner (no user's feed shows it) and is read by admins only
(`GET /api/v1/audit`). Writing either is best effort: the change it reports has
happened already, so a store error here is logged and never fails or undoes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pingo import errors, metrics
from pingo.states import DatasetState
from pingo.store import _common
from pingo.store.protocol import (
    ActionRecord,
    DatasetRecord,
    EventRecord,
    NewEvent,
    Store,
    WorkflowRecord,
)

logger = logging.getLogger(__name__)

#: A workflow was planned and stored (by its owner, a schedule or a re-run).
WORKFLOW_SUBMITTED = "workflow.submitted"
#: A workflow ended; the payload's `state` says how.
WORKFLOW_FINISHED = "workflow.finished"
#: An action failed for good (its attempts spent, or the cluster killed it).
ACTION_FAILED = "action.failed"
#: An action's output was stored as a dataset.
DATASET_STORED = "dataset.stored"
#: Every kind a user's feed holds, for the `kind` filter.
FEED_KINDS = (WORKFLOW_SUBMITTED, WORKFLOW_FINISHED, ACTION_FAILED, DATASET_STORED)
#: The kind of an audit entry (who did what, when, from where).
AUDIT = "audit"

#: How long a follower waits before it counts an event as settled. The MongoDB store
#: hands out a sequence number before it inserts the event, so an event with a lower
#: number may become visible just after one with a higher number.
SETTLE_S = 2.0


async def record(
    store: Store,
    kind: str,
    *,
    owner: str,
    workflow_id: str | None = None,
    dataset_id: str | None = None,
    payload: Mapping[str, Any] | None = None,
) -> None:
    """Append an event to `owner`'s feed; a store error is logged, not raised."""
    await append(store, NewEvent(kind, owner, workflow_id, dataset_id, payload))


async def append(store: Store, event: NewEvent) -> None:
    """Append `event`; a store error is logged, not raised."""
    try:
        await store.append_event(
            event.kind,
            owner=event.owner,
            workflow_id=event.workflow_id,
            dataset_id=event.dataset_id,
            payload=event.payload,
        )
        count_recorded(event.kind)
    except errors.PingoError as exc:
        metrics.EVENTS_RECORDED.labels(kind=event.kind, outcome="lost").inc()
        _common.log_event_lost(event.kind, event.workflow_id, exc.message)


async def record_end(store: Store, workflow: WorkflowRecord) -> None:
    """Append `workflow.finished` to the workflow's owner's feed."""
    await record(
        store,
        WORKFLOW_FINISHED,
        owner=workflow.owner,
        workflow_id=workflow.id,
        payload={"name": workflow.name, "state": workflow.state.value, "error": workflow.error},
    )


async def record_stored(
    store: Store,
    *,
    owner: str,
    workflow_id: str,
    workflow_name: str,
    action: ActionRecord,
    dataset: DatasetRecord,
) -> None:
    """Append `dataset.stored` to `owner`'s feed: their `action` has `dataset` on disk
    (what data triggers follow, `pingo.schedules.service`)."""
    await append(
        store,
        stored_event(
            owner=owner,
            workflow_id=workflow_id,
            workflow_name=workflow_name,
            action=action,
            dataset_id=dataset.id,
            state=dataset.state,
            size_bytes=dataset.size_bytes,
        ),
    )


def stored_event(
    *,
    owner: str,
    workflow_id: str,
    workflow_name: str,
    action: ActionRecord,
    dataset_id: str,
    state: DatasetState,
    size_bytes: int | None,
) -> NewEvent:
    """`dataset.stored` for `owner`'s feed, to append with the dataset's own move
    (`Store.transition_dataset`'s `event`) or alone (`record_stored`)."""
    payload = {
        "workflowName": workflow_name,
        "actionId": action.action_id,
        "actionName": action.name,
        "state": state.value,
        "sizeBytes": size_bytes,
    }
    return NewEvent(DATASET_STORED, owner, workflow_id, dataset_id, payload)


def count_recorded(kind: str) -> None:
    """Count an event appended with another write (`stored_event`)."""
    metrics.EVENTS_RECORDED.labels(kind=kind, outcome="recorded").inc()


async def audit(
    store: Store,
    *,
    actor: str,
    action: str,
    remote: str | None,
    target: Mapping[str, str],
    status: int,
) -> None:
    """Append an audit entry: `actor` did `action` on `target` from `remote`."""
    payload = {
        "actor": actor,
        "action": action,
        "remote": remote,
        "target": dict(target),
        "status": status,
    }
    try:
        await store.append_event(AUDIT, payload=payload)
        metrics.EVENTS_RECORDED.labels(kind=AUDIT, outcome="recorded").inc()
    except errors.PingoError as exc:
        metrics.EVENTS_RECORDED.labels(kind=AUDIT, outcome="lost").inc()
        logger.error(
            "audit entry lost: %s did %s on %s: %s",
            actor,
            action,
            dict(target),
            exc.message,
            extra={"event": "audit_entry_lost", "actor": actor, "action": action},
        )


class Follower:
    """Hands out each new event of one feed once, in sequence order, as it appears.

    It asks the store for what came after its *floor*, the highest number below which
    everything has settled, and remembers what it handed out above it; an event that
    becomes visible late (see `SETTLE_S`) is still handed out.
    """

    def __init__(self, store: Store, owner: str, after_seq: int, kind: str | None = None) -> None:
        self.store = store
        self.owner = owner
        self.kind = kind
        self._floor = after_seq
        self._sent: set[int] = set()

    async def poll(self, now: datetime, limit: int = 100) -> list[EventRecord]:
        """The events not handed out yet, oldest first."""
        found = await self.store.list_events(
            owner=self.owner, kind=self.kind, after_seq=self._floor, limit=limit
        )
        fresh = [e for e in found if e.seq not in self._sent]
        self._sent.update(e.seq for e in fresh)
        settled_before = now - timedelta(seconds=SETTLE_S)
        settled = [e.seq for e in found if e.at <= settled_before]
        if len(found) >= limit and not settled:
            # A full page of unsettled events: move on rather than read it forever.
            settled = [found[-1].seq]
        if settled:
            self._floor = max(self._floor, *settled)
            self._sent = {seq for seq in self._sent if seq > self._floor}
        return fresh

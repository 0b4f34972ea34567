"""Prometheus metrics, in one registry that `/metrics` serves.

Components record here; only `pingo.api` exposes them over HTTP.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

SUBMISSIONS = Counter(
    "pingo_workflow_submissions", "Workflows submitted.", ["outcome"], registry=REGISTRY
)
ACTION_TRANSITIONS = Counter(
    "pingo_action_transitions", "Action state changes made by this node.", ["state"],
    registry=REGISTRY,
)  # fmt: skip
#: `ACTION_TRANSITIONS`' series by state, looked up once each: `labels` takes a lock and
#: builds a key on every call, and several transitions are counted per action.
_TRANSITIONS: dict[str, Any] = {}


def action_transitions(state: str) -> Any:
    """The `pingo_action_transitions{state=…}` counter (`state`: an ActionState's value)."""
    counter = _TRANSITIONS.get(state)
    if counter is None:
        counter = _TRANSITIONS[state] = ACTION_TRANSITIONS.labels(state=state)
    return counter


DISPATCH_SECONDS = Histogram(
    "pingo_dispatch_seconds",
    "Time from an action becoming READY to its executor starting it.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
CALLBACK_SECONDS = Histogram(
    "pingo_callback_seconds", "Time to handle a callback.", ["kind"], registry=REGISTRY
)
RECONCILIATIONS = Counter(
    "pingo_reconciliations", "Actions resolved by reconciliation.", ["outcome"],
    registry=REGISTRY,
)  # fmt: skip
RETENTION_EVICTIONS = Counter(
    "pingo_retention_evictions", "Datasets evicted by the retention policy.", ["policy"],
    registry=REGISTRY,
)  # fmt: skip
RETENTION_DECLINES = Counter(
    "pingo_retention_declines",
    "New datasets the retention policy declined to keep past their run.", ["policy"],
    registry=REGISTRY,
)  # fmt: skip
DIGEST_SECONDS = Histogram(
    "pingo_dataset_digest_seconds",
    "Time to hash a dataset's content (at commit, on verification).",
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60),
    registry=REGISTRY,
)
DIGEST_MISMATCHES = Counter(
    "pingo_dataset_digest_mismatches",
    "Datasets whose content no longer matched their digest (`where`: plan or verify).",
    ["where"],
    registry=REGISTRY,
)
SCHEDULE_TICKS = Counter(
    "pingo_schedule_ticks", "Schedule ticks settled by this node.", ["outcome"],
    registry=REGISTRY,
)  # fmt: skip
SCHEDULE_FIRE_LAG = Histogram(
    "pingo_schedule_fire_lag_seconds",
    "Time from a schedule's tick being due to its workflow being submitted.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60),
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "pingo_webhook_deliveries", "Webhook delivery attempts by this node.", ["outcome"],
    registry=REGISTRY,
)  # fmt: skip
SCHEDULE_TRIGGERS = Counter(
    "pingo_schedule_triggers", "Data-trigger occurrences claimed by this node.", ["kind"],
    registry=REGISTRY,
)  # fmt: skip
EVENTS_RECORDED = Counter(
    "pingo_events_recorded", "Feed events and audit entries written (or lost) by this node.",
    ["kind", "outcome"],
    registry=REGISTRY,
)  # fmt: skip

"""The retention plug-in API: what a policy sees, what it decides, and how it is loaded.

A policy is a small object with a `name`, a `select_evictions` method (given the
STORED datasets that may be evicted and how many bytes must go, return which to
evict and why) and a `keep_new` method (asked at planning time whether a new
intermediate is worth keeping at all; a policy that declines may say why through an
optional `explain_decline`). Policies only decide: the retention loop
performs the compare-and-set and the deletor removes the files, just as a retry
strategy returns a decision and the worker acts on it.

Policies register through the entry-point group `pingo.retention_policies`; each
entry point names a zero-argument factory (usually the class). `load_policy`
builds a fresh instance per call, so stateful policies (GDSF's inflation value)
never share state between loops or simulations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from pingo import errors, metrics, states
from pingo.store.protocol import DatasetRecord, Store
from pingo.workflows.keep import KeepHook, NewDatasetInfo

__all__ = [
    "DECLINE_EVENT",
    "ENTRY_POINT_GROUP",
    "EVICT_EVENT",
    "Candidate",
    "Eviction",
    "ExplainsDeclines",
    "KeepHook",
    "NewDatasetInfo",
    "RetentionPolicy",
    "available_policies",
    "build_candidates",
    "keep_hook",
    "load_policy",
    "parse_policy_spec",
    "recent_decisions",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pingo.retention_policies"
#: The event kind every eviction is recorded under.
EVICT_EVENT = "retention.evict"
#: The event kind every new dataset a policy declined to keep is recorded under.
DECLINE_EVENT = "retention.decline"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A STORED dataset that the policy may choose to evict."""

    dataset_id: str
    #: Measured size on disk (0 when unknown).
    size_bytes: int
    #: Measured runtime of the action that produced it (0 when unknown).
    compute_s: float
    #: `compute_s` plus the runtime of every ancestor that is not on disk any more:
    #: what evicting it would cost the next reader, lineage included.
    recompute_cost_s: float
    created_at: datetime
    #: How many times planning reused it.
    use_count: int
    #: Last reuse (None if never reused).
    last_used_at: datetime | None
    #: Dataset ids of its inputs (its lineage, one level up).
    parents: tuple[str, ...]
    #: Pinned and claimed datasets are never evicted; the loop hands policies only
    #: candidates with both False, the fields are here for tools that list them all.
    pinned: bool = False
    claimed: bool = False
    action_type: str = ""
    stored_at: datetime | None = None

    @property
    def last_touched_at(self) -> datetime:
        """When the data was last used: its latest reuse, or when it was written.

        A dataset is created (planned) when its workflow is submitted but only
        written when its action ends, possibly hours later, and a recomputed
        dataset keeps its first creation time: so the latest of the reuse, the
        storing and the creation is when anything last touched the data.
        """
        moments = [self.created_at]
        if self.stored_at is not None:
            moments.append(self.stored_at)
        if self.last_used_at is not None:
            moments.append(self.last_used_at)
        return max(moments)

    @property
    def evictable(self) -> bool:
        return not self.pinned and not self.claimed


@dataclass(frozen=True, slots=True)
class Eviction:
    """A policy's decision: evict `dataset_id`, because `reason`."""

    dataset_id: str
    reason: str


@runtime_checkable
class RetentionPolicy(Protocol):
    """A retention algorithm. Decides; never deletes."""

    #: The name it is selected by (`PINGO_RETENTION_POLICY`, `--policy`).
    name: str

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        """Which candidates to evict, in order, to free at least `bytes_to_free` bytes."""
        ...

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        """Whether a new intermediate is worth keeping once computed (False: TO_DELETE)."""
        ...


@runtime_checkable
class ExplainsDeclines(Protocol):
    """Optional beside `RetentionPolicy`: why `keep_new` just declined a dataset."""

    def explain_decline(self, dataset: NewDatasetInfo, now: datetime) -> str:
        """The reason, with its figures, for the `False` `keep_new` returned for `dataset`."""
        ...


PolicyFactory = Callable[..., RetentionPolicy]


def _builtin_factories() -> dict[str, PolicyFactory]:
    # Imported lazily: builtin imports this module for the dataclasses.
    from pingo.retention import builtin

    return dict(builtin.BUILTINS)


def load_policy_factories() -> dict[str, PolicyFactory]:
    """Policy name → factory, from the entry points (the built-ins always included).

    A plug-in that fails to load is logged and skipped.
    """
    factories = _builtin_factories()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            factory = ep.load()
        except Exception:
            logger.exception(
                "retention policy plug-in %s failed to load; skipped",
                ep.name,
                extra={"event": "retention_policy_load_failed", "policy": ep.name},
            )
            continue
        if not callable(factory):
            logger.error(
                "retention policy plug-in %s is not callable; skipped",
                ep.name,
                extra={"event": "retention_policy_load_failed", "policy": ep.name},
            )
            continue
        factories[ep.name] = factory
    return factories


def available_policies() -> list[str]:
    """Names of every policy that loads, sorted."""
    return sorted(load_policy_factories())


def parse_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name` or `name:key=value,key=value` → the name and its options (strings)."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise errors.ConfigurationError(
                f"retention policy option {item!r} of {spec!r} is not key=value"
            )
        options[key.strip()] = value.strip()
    return name.strip(), options


def load_policy(spec: str) -> RetentionPolicy:
    """A fresh instance of the policy `spec` names, with its options.

    `spec` is a registered name, optionally followed by options passed to the
    factory as string keyword arguments: `most-used:window=50`. Raises
    `ConfigurationError` when no policy of that name loads, when it rejects
    its options, or when the factory does not build a `RetentionPolicy`.
    """
    name, options = parse_policy_spec(spec)
    factories = load_policy_factories()
    factory = factories.get(name)
    if factory is None:
        raise errors.ConfigurationError(
            f"unknown retention policy {name!r}; available: {', '.join(sorted(factories))}"
        )
    try:
        policy = factory(**options)
    except errors.ConfigurationError:
        raise
    except Exception as exc:
        raise errors.ConfigurationError(f"retention policy {name!r} failed to start") from exc
    if not isinstance(policy, RetentionPolicy):
        raise errors.ConfigurationError(
            f"retention policy {name!r} lacks name, select_evictions or keep_new"
        )
    return policy


def keep_hook(policy: RetentionPolicy, store: Store) -> KeepHook:
    """The planner's keep hook for `policy`, asking it with the store's clock.

    A decline is logged and recorded as a `DECLINE_EVENT`, with the policy's
    reason when it gives one, so that `GET /storage` lists it beside the evictions.
    """

    async def hook(dataset: NewDatasetInfo) -> bool:
        now = store.clock()
        keep = policy.keep_new(dataset, now)
        if not keep:
            reason = _decline_reason(policy, dataset, now)
            logger.info(
                "retention: %s will not keep %s: %s",
                policy.name,
                dataset.dataset_id,
                reason,
                extra={
                    "event": "retention_drop_new",
                    "policy": policy.name,
                    "dataset_id": dataset.dataset_id,
                    "reason": reason,
                },
            )
            await store.append_event(
                DECLINE_EVENT,
                dataset_id=dataset.dataset_id,
                workflow_id=dataset.workflow_id,
                payload={"policy": policy.name, "reason": reason},
            )
            metrics.RETENTION_DECLINES.labels(policy=policy.name).inc()
        return keep

    return hook


def _decline_reason(policy: RetentionPolicy, dataset: NewDatasetInfo, now: datetime) -> str:
    """The policy's own reason for declining `dataset`, or a plain one."""
    plain = f"{policy.name}: not worth keeping past its run"
    if not isinstance(policy, ExplainsDeclines):
        return plain
    try:
        return str(policy.explain_decline(dataset, now))
    except Exception:
        # A plug-in's broken explanation must not fail the submission it is planning.
        logger.exception(
            "retention policy %s failed to explain a decline",
            policy.name,
            extra={"event": "retention_policy_failed", "policy": policy.name},
        )
        return plain


# ------------------------------------------------------------------------- candidates


async def build_candidates(
    store: Store, records: Collection[DatasetRecord] | None = None
) -> list[Candidate]:
    """Candidates for every managed STORED dataset (pinned and claimed included, flagged).

    `recompute_cost_s` walks the lineage through the store: an ancestor that is
    not STORED or LEAF (evicted, being deleted, being computed) would have to be
    recomputed too, so its runtime is added and its own parents are walked.
    Each ancestor counts once per candidate, even when several paths reach it.
    """
    if records is None:
        records = await store.list_retention_candidates()
    stored = [r for r in records if r.state == states.DatasetState.STORED and r.is_managed]
    known: dict[str, DatasetRecord] = {r.id: r for r in stored}
    costs = await _recompute_costs(store, stored, known)
    return [
        Candidate(
            dataset_id=r.id,
            size_bytes=r.size_bytes or 0,
            compute_s=r.compute_s or 0.0,
            recompute_cost_s=costs[r.id],
            created_at=r.created_at,
            use_count=r.use_count,
            last_used_at=r.last_used_at,
            parents=r.parents,
            pinned=r.pinned,
            claimed=bool(r.claims),
            action_type=r.action_type,
            stored_at=r.stored_at,
        )
        for r in stored
    ]


async def _recompute_costs(
    store: Store, stored: Sequence[DatasetRecord], known: dict[str, DatasetRecord]
) -> dict[str, float]:
    # Fetch the lineage level by level, in batches, sharing what one candidate's
    # walk fetched with the others: most candidates of a workflow share ancestors.
    frontier = {p for r in stored for p in r.parents if p not in known}
    while frontier:
        fetched = await store.get_datasets(frontier)
        known.update(fetched)
        frontier = {
            p
            for r in fetched.values()
            if r.state not in states.DATASET_REUSABLE
            for p in r.parents
            if p not in known
        }
    return _Lineage(known).costs(stored)


class _Lineage:
    """Recompute costs over the known lineage, memoized per missing ancestor.

    A missing ancestor's closure (itself and its missing ancestors) is a
    frozenset built from its parents' closures with C-level unions, and its cost
    is summed once; a dataset's cost then starts from its costliest missing
    parent and adds only what the others bring. Candidates of one workflow
    share most of their lineage, so each pass stays near linear in its size.
    """

    def __init__(self, known: Mapping[str, DatasetRecord]) -> None:
        self.known = known
        self.closure: dict[str, frozenset[str]] = {}
        self.cost: dict[str, float] = {}

    def missing(self, dataset_id: str) -> bool:
        record = self.known.get(dataset_id)
        return record is not None and record.state not in states.DATASET_REUSABLE

    def runtime(self, dataset_id: str) -> float:
        return self.known[dataset_id].compute_s or 0.0

    def costs(self, stored: Sequence[DatasetRecord]) -> dict[str, float]:
        costs: dict[str, float] = {}
        for record in stored:
            _, extra = self._combine(record.parents)
            costs[record.id] = (record.compute_s or 0.0) + extra
        return costs

    def _combine(self, parents: Sequence[str]) -> tuple[frozenset[str], float]:
        """The union of the missing parents' closures, and its total runtime."""
        gone = [p for p in parents if self.missing(p)]
        if not gone:
            return frozenset(), 0.0
        for parent in gone:
            self._resolve(parent)
        main = max(gone, key=lambda p: len(self.closure[p]))
        union = self.closure[main]
        cost = self.cost[main]
        others = [self.closure[p] for p in gone if p != main]
        if others:
            extra = frozenset().union(*others) - union
            cost += sum(self.runtime(d) for d in extra)
            union = union | extra
        return union, cost

    def _resolve(self, root: str) -> None:
        # Iterative post-order: lineages can be deeper than Python's recursion limit.
        stack = [root]
        while stack:
            top = stack[-1]
            if top in self.closure:
                stack.pop()
                continue
            parents = self.known[top].parents
            pending = [p for p in parents if self.missing(p) and p not in self.closure]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            union, cost = self._combine(parents)
            self.closure[top] = union | {top}
            self.cost[top] = cost + self.runtime(top)


# -------------------------------------------------------------------------- decisions


async def recent_decisions(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    """The latest `limit` evictions and the latest `limit` declines, newest first, as JSON.

    For `GET /storage`. Each kind has its own `limit`: a run whose policy declines
    thousands of new datasets must not hide the evictions, nor the reverse.
    """
    found = [
        *await store.list_events(kind=EVICT_EVENT, limit=limit),
        *await store.list_events(kind=DECLINE_EVENT, limit=limit),
    ]
    found.sort(key=lambda e: e.seq, reverse=True)
    decisions: list[dict[str, Any]] = []
    for event in found:
        payload = dict(event.payload or {})
        decisions.append(
            {
                "seq": event.seq,
                "at": event.at.isoformat(),
                "kind": "decline" if event.kind == DECLINE_EVENT else "evict",
                "datasetId": event.dataset_id,
                "policy": payload.get("policy"),
                "reason": payload.get("reason"),
                "sizeBytes": payload.get("sizeBytes"),
                # Recorded since the UI's decision page; older events have none.
                "computeSeconds": payload.get("computeSeconds"),
                "recomputeCostSeconds": payload.get("recomputeCostSeconds"),
            }
        )
    return decisions

"""The workflow manager: decide which actions compute and which reuse a stored dataset.

The original algorithm (reference/pingo-design.md, "The Workflow Manager"):
actions are processed from the leaves towards the roots, breadth-first; an
action is visited only when it is a leaf or a child of it computes, so the
ancestors of a reused action are left alone. A visited action computes when it
is forced or unmanaged, when its dataset is absent or not on disk for good
(DELETED, DELETING, PROCESSING, TO_DELETE, STORED_TO_DELETE). When another
workflow's action is computing it right now (TO_STORE, TO_LEAF: the original
computed it again, its documented inefficiency), the action *shares* that
computation instead: it is planned WAITING for the producer and still counts
as computing here (its parents are planned, so that it can compute the dataset
itself if the producer fails; `pingo.outcomes.service.OutcomeService.settle_shared`
decides). A STORED or LEAF dataset is reused: a leaf promotes it to LEAF,
and every computing child claims it; a claim that fails (the dataset moved on)
means computing after all.

Processing goes by "generations" of the reversed DAG: an action comes after
every one of its children, so a child's decision is always known when its
parent is visited, and a parent whose reuse failed is simply a computing
action when its own parents come up.

The whole plan is persisted by one `Store.persist_plan` call. Two plans read at the
same moment cannot see each other's computations: the store, which sees both, makes
the later one's actions share the earlier one's (`pingo.store.rules.producer_to_share`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pingo import errors, events, heap, limits, metrics, states, untrusted
from pingo.datasets import integrity
from pingo.datasets.service import DatasetService
from pingo.outcomes.service import OutcomeService, ReadyNews, no_news
from pingo.store import protocol, rules
from pingo.workflows import language, provenance, reuse
from pingo.workflows.definition import ActionDefinition, WorkflowDefinition
from pingo.workflows.keep import KeepHook, NewDatasetInfo

if TYPE_CHECKING:
    from pingo.config import Settings
    from pingo.datasets.storage import DatasetStorage
    from pingo.outcomes.service import OutcomeService

logger = logging.getLogger(__name__)

#: Actions decided between two yields to the event loop while planning.
_PLAN_CHUNK = 2_000
#: Producers of one workflow read one by one; past this, its actions are listed once.
_PRODUCER_READS = 16

A = states.ActionState
D = states.DatasetState
W = states.WorkflowState

#: Used when the action does not say (Settings has no default for it).
DEFAULT_MAX_ATTEMPTS = 3

#: Dataset states that mean "compute it": nothing usable is on disk for good.
_RECOMPUTE: frozenset[states.DatasetState] = frozenset(
    {D.DELETED, D.DELETING, D.PROCESSING, D.TO_DELETE, D.STORED_TO_DELETE}
)
#: Another workflow is computing it; the original computes again rather than join.
_IN_FLIGHT: frozenset[states.DatasetState] = rules.SHAREABLE


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """One action's planning decision."""

    action_id: int
    name: str
    dataset_id: str
    compute: bool
    #: "forced", "unmanaged", "absent", a dataset state ("DELETED", …), "in-flight",
    #: "claim-failed", "digest-mismatch", "reused" or "not-needed".
    reason: str
    #: The dataset's state when planning looked, None when absent.
    dataset_state: states.DatasetState | None
    #: The other workflow's action it waits for instead of computing (in flight).
    shared_with: reuse.SharedWith | None = None

    def to_json(self, *, twin: bool = False) -> dict[str, Any]:
        return {
            "actionId": self.action_id,
            "name": self.name,
            "datasetId": self.dataset_id,
            "compute": self.compute,
            "reuse": self.outcome(twin=twin).value,
            "reason": self.reason,
            "datasetState": None if self.dataset_state is None else self.dataset_state.value,
            "sharedWith": None if self.shared_with is None else self.shared_with.to_json(),
        }

    def outcome(self, *, twin: bool = False) -> reuse.Reuse:
        """Computed, shared, reused or not needed (`pingo.workflows.reuse`)."""
        return reuse.outcome(runs=self.compute, reason=self.reason, twin=twin)


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions for a whole workflow, in ascending action id."""

    workflow_id: str
    actions: tuple[PlannedAction, ...]

    def to_json(self) -> dict[str, Any]:
        twins = reuse.twins((a.action_id, a.dataset_id, a.compute) for a in self.actions)
        return {
            "workflowId": self.workflow_id,
            "actions": [a.to_json(twin=a.action_id in twins) for a in self.actions],
            "summary": reuse.summary(a.outcome(twin=a.action_id in twins) for a in self.actions),
        }


def scope_for(settings: Settings, owner: str) -> str:
    """The sharing scope a user's dataset ids are computed in."""
    return f"user:{owner}" if settings.sharing_scope == "user" else "server"


def children_map(definition: WorkflowDefinition) -> dict[int, tuple[int, ...]]:
    """Action id → its child action ids, ascending (built once per plan)."""
    children: dict[int, list[int]] = {aid: [] for aid in definition.actions}
    for aid in sorted(definition.actions):
        for parent in definition.actions[aid].parents:
            children[parent].append(aid)
    return {aid: tuple(kids) for aid, kids in children.items()}


def reverse_generations(
    definition: WorkflowDefinition, children: Mapping[int, Sequence[int]] | None = None
) -> list[list[int]]:
    """Action ids in generations: leaves first, then actions whose children all came before."""
    if children is None:
        children = children_map(definition)
    pending = {aid: len(kids) for aid, kids in children.items()}
    current = sorted(aid for aid, n in pending.items() if n == 0)
    generations: list[list[int]] = []
    while current:
        generations.append(current)
        following: list[int] = []
        for aid in current:
            for parent in definition.actions[aid].parents:
                pending[parent] -= 1
                if pending[parent] == 0:
                    following.append(parent)
        current = sorted(following)
    return generations


@dataclass(slots=True)
class _Decision:
    compute: bool
    reason: str
    state: states.DatasetState | None
    #: The `claim_key` of the other workflow's action it shares (waits for), if any.
    shared_with: str | None = None
    shared_view: reuse.SharedWith | None = None


@dataclass(frozen=True, slots=True)
class _Identified:
    """A parsed, validated workflow with its dataset ids and its shape (worked out off-loop)."""

    definition: WorkflowDefinition
    dataset_ids: dict[int, str]
    children: dict[int, tuple[int, ...]]
    generations: list[list[int]]

    def planning(
        self, workflow_id: str, records: Mapping[str, protocol.DatasetRecord]
    ) -> _Planning:
        return _Planning(
            workflow_id,
            self.definition,
            self.dataset_ids,
            records,
            children=self.children,
            generations=self.generations,
        )


@dataclass(frozen=True, slots=True)
class _Tally:
    """What the log and the metrics say about a persisted plan."""

    computing: int
    ready: int
    #: Dataset ids reused (each once).
    reused: list[str]
    #: Action ids sharing another workflow's computation in flight.
    sharing: list[int] = field(default_factory=list)

    def joined(self, shared: Sequence[protocol.ActionRecord]) -> _Tally:
        """The tally once the store made `shared` (planned to compute) share instead."""
        ids = {a.action_id for a in shared}
        return dataclasses.replace(
            self,
            # Those with nothing else to wait for were planned READY.
            ready=self.ready - sum(1 for a in shared if a.waiting_on == (a.action_id,)),
            sharing=sorted({*self.sharing, *ids}),
        )

    def counted(self, workflow_id: str = "") -> StoredSubmission:
        """The tally as `StoredSubmission` gives it: numbers, and the few sharing actions."""
        return StoredSubmission(
            workflow_id,
            replayed=False,
            computing=self.computing,
            ready=self.ready,
            reused=len(self.reused),
            sharing=tuple(self.sharing),
        )


@dataclass(frozen=True, slots=True)
class StoredSubmission:
    """A workflow that a submission in another process stored (or replayed): all that
    the server's process needs of it, never its actions (issue 13)."""

    workflow_id: str
    replayed: bool
    computing: int = 0
    ready: int = 0
    #: Datasets reused (their use is already recorded).
    reused: int = 0
    #: Action ids sharing another workflow's computation in flight.
    sharing: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Submitted:
    """What `WorkflowManager.submit_once` did."""

    record: protocol.WorkflowRecord
    #: Whether `record` is an earlier workflow submitted with the same idempotency key.
    replayed: bool
    #: The workflow's actions as stored, when it ended at submission (every dataset it
    #: needed was reused): nothing changes them after. None otherwise.
    actions: Sequence[protocol.ActionRecord] | None = None


#: What `_persist` gives for a new workflow: its record, its plan, its tally and the
#: actions the store made share (`Store.persist_plan`).
_Stored = tuple[
    protocol.WorkflowRecord, protocol.WorkflowPlan, _Tally, tuple[protocol.ActionRecord, ...]
]


@dataclass(slots=True)
class _Planning:
    """The working state of one planning pass."""

    workflow_id: str
    definition: WorkflowDefinition
    dataset_ids: Mapping[int, str]
    records: Mapping[str, protocol.DatasetRecord]
    children: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    #: `reverse_generations` of the definition.
    generations: list[list[int]] = field(default_factory=list)
    decisions: dict[int, _Decision] = field(default_factory=dict)
    #: (dataset id, claim key) added to the store, to release if persisting fails.
    claims: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.children:
            self.children = children_map(self.definition)
        if not self.generations:
            self.generations = reverse_generations(self.definition, self.children)

    def is_leaf(self, action_id: int) -> bool:
        return not self.children[action_id]

    def computing_children(self, action_id: int) -> tuple[int, ...]:
        return tuple(c for c in self.children[action_id] if self.decisions[c].compute)


def _decide(
    action: ActionDefinition,
    record: protocol.DatasetRecord | None,
    forced: bool,
) -> _Decision:
    """The local decision for a visited action, before any claim is tried."""
    state = None if record is None else record.state
    if forced or action.force_computation:
        return _Decision(True, "forced", state)
    if not action.is_managed:
        return _Decision(True, "unmanaged", state)
    if state is None:
        return _Decision(True, "absent", None)
    if state in _RECOMPUTE:
        return _Decision(True, state.value, state)
    if state in _IN_FLIGHT:
        return _Decision(True, reuse.IN_FLIGHT, state)
    return _Decision(False, "reused", state)


class WorkflowManager:
    """Accepts workflows: parse, identify, plan, claim, persist."""

    def __init__(
        self,
        store: protocol.Store,
        storage: DatasetStorage,
        settings: Settings,
        *,
        on_ready: ReadyNews = no_news,
        keep_hook: KeepHook | None = None,
        outcomes: OutcomeService | None = None,
        feed: bool = True,
    ) -> None:
        self.store = store
        #: Whether submissions go to their owner's events feed (the simulator has no users).
        self.feed = feed
        self.storage = storage
        self.settings = settings
        self.on_ready = on_ready
        self.keep_hook = keep_hook
        # The node hands in its own (with its kill and webhook hooks); tests and tools
        # that need no hooks get a plain one, made once, here.
        self.outcomes = (
            outcomes
            if outcomes is not None
            else OutcomeService(store, storage, settings, on_ready=on_ready, feed=feed)
        )

    # ------------------------------------------------------------------ public

    async def submit(
        self,
        document: bytes | str | Mapping[str, Any],
        *,
        owner: str,
        idempotency_key: str | None = None,
        force: ForceTargets = (),
        rerun_of: str | None = None,
        cap: protocol.UserLimits | None = None,
    ) -> protocol.WorkflowRecord:
        """Plan and persist a workflow; return its record (an existing one for a repeated key).

        `cap`: the owner's limits, when their workflow cap and storage quota apply (the
        API's submissions and re-runs): checked once the document is known valid
        (`_persist`).
        """
        submitted = await self.submit_once(
            document,
            owner=owner,
            idempotency_key=idempotency_key,
            force=force,
            rerun_of=rerun_of,
            cap=cap,
        )
        return submitted.record

    async def submit_once(
        self,
        document: bytes | str | Mapping[str, Any],
        *,
        owner: str,
        idempotency_key: str | None = None,
        force: ForceTargets = (),
        rerun_of: str | None = None,
        cap: protocol.UserLimits | None = None,
    ) -> Submitted:
        """`submit`, whether the record is a replay of an earlier one with the same key,
        and the actions of a workflow that ended at submission.

        A key the owner already used for a different document raises
        `IDEMPOTENCY_KEY_REUSED`, on the fast path and on the race path alike
        (two submissions with one key that both missed the first lookup).
        """
        started = time.perf_counter()
        persisted = await self._persist(document, owner, idempotency_key, force, rerun_of, cap)
        if isinstance(persisted, protocol.WorkflowRecord):
            return Submitted(persisted, replayed=True)
        record, plan, tally, shared = persisted
        # The store's sharers as it wrote them; the planner's own as planned.
        wanted = set(tally.sharing).difference(a.action_id for a in shared)
        sharing = [*shared, *(a for a in plan.actions if a.action_id in wanted)]
        await self._announce(record, tally.counted(), sharing, rerun_of, started)
        if record.state not in states.WORKFLOW_TERMINAL:
            return Submitted(record, replayed=False)
        # Every action ended as planned (reused or not needed): the store holds these.
        return Submitted(record, replayed=False, actions=plan.actions)

    async def persist_detached(
        self,
        document: bytes | str | Mapping[str, Any],
        *,
        owner: str,
        idempotency_key: str | None = None,
        force: ForceTargets = (),
        rerun_of: str | None = None,
        cap: protocol.UserLimits | None = None,
    ) -> StoredSubmission:
        """The first half of `submit_once`, in a process of its own (`pingo.node`): plan
        and persist, and say only what the server's process needs for `adopt`."""
        persisted = await self._persist(document, owner, idempotency_key, force, rerun_of, cap)
        if isinstance(persisted, protocol.WorkflowRecord):
            return StoredSubmission(persisted.id, replayed=True)
        record, _, tally, _ = persisted
        return tally.counted(record.id)

    async def adopt(
        self, persisted: StoredSubmission, *, rerun_of: str | None, started: float
    ) -> tuple[protocol.WorkflowRecord, bool]:
        """The second half of `submit_once` for a workflow `persist_detached` stored: what
        needs this process (wake-ups, metrics, events, sharing, the end of one with
        nothing to run), from the small result alone."""
        record = await self.store.get_workflow(persisted.workflow_id)
        if record is None:
            raise errors.NotFound(f"no workflow {persisted.workflow_id}")
        if persisted.replayed:
            metrics.SUBMISSIONS.labels(outcome="duplicate").inc()
            return record, True
        found = await asyncio.gather(
            *(self.store.get_action(record.id, aid) for aid in persisted.sharing)
        )
        sharing = [a for a in found if a is not None]
        await self._announce(record, persisted, sharing, rerun_of, started)
        return record, False

    async def _persist(
        self,
        document: bytes | str | Mapping[str, Any],
        owner: str,
        idempotency_key: str | None,
        force: ForceTargets,
        rerun_of: str | None,
        cap: protocol.UserLimits | None,
    ) -> protocol.WorkflowRecord | _Stored:
        """Identify, plan, claim and store, and record the use of the datasets reused: the
        record, its plan, its tally and the actions the store made share
        (`Store.persist_plan`), or the earlier workflow a repeated key replays.

        The order of the refusals is this one, in-process and in a child alike: a
        repeated key replays (never capped: it makes no new workflow) or is
        `IDEMPOTENCY_KEY_REUSED`; then an invalid document is 422 whatever the owner's
        `cap` (retrying it later could not help); then the cap is 429, then the storage
        quota 403.
        """
        if idempotency_key is not None:
            existing = await self.store.find_workflow_by_idempotency_key(owner, idempotency_key)
            if existing is not None:
                return await self._replay(existing, document)
        scope = scope_for(self.settings, owner)
        identified = await self._identify(document, scope)
        forced, records = await self._resolve(identified, force, owner, live=True)
        if cap is not None:
            await limits.check_workflow_cap(self.store, owner, cap, self.settings)
            await limits.check_storage_quota(self.store, owner, cap, self.settings)
        now = self.store.clock()
        workflow_id = protocol.new_workflow_id(now)
        planning = identified.planning(workflow_id, records)
        try:
            await self._plan(planning, forced, owner, live=True)
            plan, tally = await self._workflow_plan(
                planning, owner, scope, now, idempotency_key, rerun_of
            )
            try:
                persisted = await self.store.persist_plan(plan)
            except errors.PlanExpired:
                logger.warning(
                    "planning workflow %s took longer than %g s: refused, nothing stored",
                    workflow_id,
                    self.settings.plan_deadline_s,
                    extra={"event": "plan_expired", "workflow_id": workflow_id},
                )
                raise
            except BaseException as exc:
                # Any other failure may come after part of the plan was stored (MongoDB).
                await asyncio.shield(self._abandon_interrupted(workflow_id))
                if not isinstance(exc, errors.Conflict) or idempotency_key is None:
                    raise
                existing = await self.store.find_workflow_by_idempotency_key(owner, idempotency_key)
                if existing is None or existing.id == workflow_id:
                    raise  # (its own record, written before a later write failed)
                await self._release(planning.claims)
                return await self._replay(existing, identified.definition.document)
        except BaseException:
            await asyncio.shield(self._release(planning.claims))
            raise
        record = persisted.workflow
        if persisted.shared:
            # Planned at the same moment as another workflow computing the same dataset:
            # the store made these share it (`Store.persist_plan`).
            tally = tally.joined(persisted.shared)
        # A big submission's objects are freed after the answer, in slices (see `heap`).
        heap.bury(
            plan.actions,
            plan.datasets,
            planning.decisions.values(),
            identified.definition.actions.values(),
        )
        if tally.reused:
            await self.store.record_dataset_uses(tally.reused)
            if self.feed:
                await self._reused_from_others(record, plan.actions, records)
        return record, plan, tally, persisted.shared

    async def _reused_from_others(
        self,
        record: protocol.WorkflowRecord,
        actions: Sequence[protocol.ActionRecord],
        records: Mapping[str, protocol.DatasetRecord],
    ) -> None:
        """Tell the owner's feed of each dataset their actions reused from another user's
        computation, the first time it reaches them (`dataset.stored`, as their own store
        would have): otherwise whoever ran the owner's command first would keep the
        owner's data triggers quiet. Their own datasets told them when they were stored."""
        owners: dict[str, str | None] = {}
        for action in actions:
            dataset = records.get(action.dataset_id) if action.reason == "reused" else None
            if dataset is None:
                continue
            producer = dataset.producer_workflow_id
            if producer not in owners:
                found = await self.store.get_workflow(producer)
                owners[producer] = None if found is None else found.owner
            if owners[producer] == record.owner:
                continue
            told = await self.store.list_events(
                kind=events.DATASET_STORED, owner=record.owner, dataset_id=dataset.id, limit=1
            )
            if not told:
                await events.record_stored(
                    self.store,
                    owner=record.owner,
                    workflow_id=record.id,
                    workflow_name=record.name,
                    action=action,
                    dataset=dataset,
                )

    async def _announce(
        self,
        record: protocol.WorkflowRecord,
        counted: StoredSubmission,
        sharing: Sequence[protocol.ActionRecord],
        rerun_of: str | None,
        started: float,
    ) -> None:
        """Tell everyone in this process about a stored workflow: its owner's feed, its
        end if nothing is left to run, its sharing actions, metrics, the submitters."""
        if self.feed:
            await events.record(
                self.store,
                events.WORKFLOW_SUBMITTED,
                owner=record.owner,
                workflow_id=record.id,
                payload={"name": record.name, "rerunOf": rerun_of},
            )
        if record.state in states.WORKFLOW_TERMINAL:
            # Nothing to run (every dataset it needs was reused): it ended at submission.
            await self.outcomes.announce_end(record)
        if sharing:
            await self._settle_sharing(sharing)
        metrics.SUBMISSIONS.labels(outcome="accepted" if counted.computing else "reused").inc()
        if counted.ready:
            metrics.action_transitions(A.READY.value).inc(counted.ready)
            self.on_ready(None)
        logger.info(
            "workflow %s (%s) planned: %d to compute, %d reused, %d ready, in %.1f ms",
            record.id,
            record.name,
            counted.computing,
            counted.reused,
            counted.ready,
            (time.perf_counter() - started) * 1000,
            extra={
                "event": "workflow_submitted",
                "workflow_id": record.id,
                "compute": counted.computing,
                "reused": counted.reused,
            },
        )

    async def _replay(
        self, existing: protocol.WorkflowRecord, document: bytes | str | Mapping[str, Any]
    ) -> protocol.WorkflowRecord:
        """The earlier workflow submitted with the same key, if it was the same document."""
        if await asyncio.to_thread(_differs, existing.document, document):
            issue = errors.ValidationIssue(
                "IDEMPOTENCY_KEY_REUSED",
                f"this key was used for workflow {existing.id} with a different document",
                "",
            )
            failure = errors.ValidationFailed([issue])
            failure.code = "IDEMPOTENCY_KEY_REUSED"
            raise failure
        metrics.SUBMISSIONS.labels(outcome="duplicate").inc()
        return existing

    async def dry_run(
        self,
        document: bytes | str | Mapping[str, Any],
        *,
        owner: str,
        force: ForceTargets = (),
    ) -> Plan:
        """The decisions `submit` would make now; stores nothing and adds no claims."""
        identified = await self._identify(document, scope_for(self.settings, owner))
        forced, records = await self._resolve(identified, force, owner, live=False)
        planning = identified.planning(protocol.new_workflow_id(self.store.clock()), records)
        await self._plan(planning, forced, owner, live=False)
        return _to_plan(planning)

    async def kill(self, workflow_id: str) -> protocol.WorkflowRecord:
        """Kill a workflow (delegates to the outcome service)."""
        return await self.outcomes.kill_workflow(workflow_id)

    async def _settle_sharing(self, sharing: Sequence[protocol.ActionRecord]) -> None:
        """Check each sharing action's producer once more, now that the action is stored.

        The producer may have ended between planning's read and the persist, when its
        own settlement could not see this action yet: whichever of the two looks last
        settles it (a compare-and-set, so both looking changes nothing). `shared`: the
        actions the store made share (as persisted), which `plan` has computing.
        """
        await self.outcomes.settle_waiting(sharing, states.Trigger.PLANNER)

    # ---------------------------------------------------------------- planning

    async def _identify(self, document: bytes | str | Mapping[str, Any], scope: str) -> _Identified:
        """Parse and validate `document`, compute its dataset ids and shape, off the event loop.

        All of it is pure CPU work linear in the actions (seconds for 100,000); in a
        worker thread it shares the GIL with the loop in short slices instead of
        stopping every other request until it is done.
        """
        try:
            return await asyncio.to_thread(self._identify_sync, document, scope)
        except errors.ValidationFailed:
            metrics.SUBMISSIONS.labels(outcome="invalid").inc()
            raise

    def _identify_sync(self, document: bytes | str | Mapping[str, Any], scope: str) -> _Identified:
        definition = language.parse(document, max_actions=self.settings.max_actions)
        children = children_map(definition)
        return _Identified(
            definition,
            provenance.dataset_ids(definition, scope),
            children,
            reverse_generations(definition, children),
        )

    async def _resolve(
        self, identified: _Identified, force: ForceTargets, owner: str, *, live: bool
    ) -> tuple[frozenset[int], dict[str, protocol.DatasetRecord]]:
        """The actions `force` names (422 for a name or id it does not find) and the
        datasets of the workflow as stored now, once `owner` was found allowed to force
        each action forced (403 otherwise, `_check_forcing`).

        Every planning starts here, a dry run's and a submission's alike (the API's,
        a re-run's, a schedule's tick, a big one's in its child process), so no
        submission forces a dataset its owner may not replace.
        """
        forced = _forced(identified.definition, force)
        records = await self.store.get_datasets(identified.dataset_ids.values())
        await self._check_forcing(identified, records, forced, owner, live=live)
        return forced, records

    async def _check_forcing(
        self,
        identified: _Identified,
        records: Mapping[str, protocol.DatasetRecord],
        forced: frozenset[int],
        owner: str,
        *,
        live: bool,
    ) -> None:
        """403 if a forced action would replace a dataset on disk that `owner` may not manage.

        A forced computation replaces the stored files, and its workflow becomes the
        dataset's producer of record (`OutcomeService._store_files`): it would let
        the owner choose the bytes that every user reusing the dataset reads, and take
        over pinning and deleting it from its producer. So forcing a dataset whose files
        are on disk needs what changing it needs, `DatasetService.may_manage` (an
        admin, or the owner of the workflow that produced it). A dataset with no files
        (absent, being computed, DELETED) may be forced by anyone.
        """
        definition = identified.definition
        replaced: dict[str, int] = {}  # dataset id → the first action forcing it
        for aid, action in definition.actions.items():
            if aid not in forced and not action.force_computation:
                continue
            record = records.get(identified.dataset_ids[aid])
            if record is not None and record.state in states.DATASET_ON_DISK:
                replaced[record.id] = min(aid, replaced.get(record.id, aid))
        if not replaced:
            return
        datasets = DatasetService(self.store, self.storage)
        allowed = await datasets.manageable_by_owner(owner, [records[ds] for ds in replaced])
        refused = sorted(aid for ds, aid in replaced.items() if ds not in allowed)
        if not refused:
            return
        first = refused[0]
        dataset_id = identified.dataset_ids[first]
        if live:
            logger.info(
                "workflow of %s refused: it forces %d stored datasets it may not replace",
                owner,
                len(refused),
                extra={"event": "forcing_refused", "owner": owner, "dataset_id": dataset_id},
            )
        how = "the re-run forces it" if first in forced else "it sets forceComputation"
        others = len(refused) - 1
        more = f" (and {others} other forced action{'s' * (others > 1)})" if others else ""
        # Never the producer's workflow, id or name: the owner may not see it.
        raise errors.Forbidden(
            f"action {definition.actions[first].name!r} (id {first}){more} may not be forced: "
            f"{how}, and its dataset {dataset_id} is stored "
            f"({records[dataset_id].state.value}). Forcing it would replace files other "
            "workflows reuse, which only an admin or the owner of the workflow that produced "
            "it may do. Drop the force to reuse it as it is; to check its files, GET "
            f"/api/v1/datasets/{dataset_id}?verify=true (a copy that does not match is "
            "computed again by the next workflow that needs it); or ask the dataset's "
            "producer or an admin to force it"
        )

    async def _plan(
        self, planning: _Planning, forced: frozenset[int], owner: str, *, live: bool
    ) -> None:
        """Fill `planning.decisions` for every action, adding claims when `live`."""
        definition = planning.definition
        decisions = planning.decisions
        decided = 0
        for generation in planning.generations:
            reusing: list[int] = []
            for aid in generation:
                decided += 1
                if decided % _PLAN_CHUNK == 0:
                    await asyncio.sleep(0)  # let other requests in between chunks
                action = definition.actions[aid]
                kids = planning.children[aid]
                needed = (
                    not kids
                    or aid in forced
                    or action.force_computation
                    or any(decisions[c].compute for c in kids)
                )
                if not needed:
                    record = planning.records.get(planning.dataset_ids[aid])
                    planning.decisions[aid] = _Decision(
                        False, reuse.NOT_NEEDED_REASON, None if record is None else record.state
                    )
                    continue
                decision = _decide(
                    action, planning.records.get(planning.dataset_ids[aid]), aid in forced
                )
                planning.decisions[aid] = decision
                if not decision.compute:
                    reusing.append(aid)
            if reusing:
                reusing = await self._check_integrity(planning, reusing, live=live)
            if live and reusing:
                # One round trip per generation: every claim (and leaf promotion)
                # of the generation at once. Parents come in later generations,
                # so an action whose claim fails is a computing child for them.
                held = await asyncio.gather(*(self._hold(planning, aid) for aid in reusing))
                for aid, ok in zip(reusing, held, strict=True):
                    if not ok:
                        planning.decisions[aid].compute = True
                        planning.decisions[aid].reason = "claim-failed"
        await self._share_in_flight(planning, owner)

    async def _share_in_flight(self, planning: _Planning, owner: str) -> None:
        """Make each in-flight action share its producer's computation, while that one runs.

        One read per distinct producer (and its workflow, for what `owner` may see). A
        producer found ended (its dataset still says otherwise: a crash in between) is
        not shared: the action computes, as before.
        """
        wanted: dict[tuple[str, int], list[int]] = {}
        for aid, decision in planning.decisions.items():
            if decision.reason != reuse.IN_FLIGHT:
                continue
            record = planning.records[planning.dataset_ids[aid]]
            key = (record.producer_workflow_id, record.producer_action_id)
            wanted.setdefault(key, []).append(aid)
        if not wanted:
            return
        keys = {protocol.claim_key(*k): k for k in wanted}
        producers = await _producers(self.store, keys)
        views = await shared_views(self.store, owner, producers)
        for claim, key in keys.items():
            producer = producers.get(claim)
            if producer is None or producer.state in states.ACTION_TERMINAL:
                continue
            for aid in wanted[key]:
                planning.decisions[aid].shared_with = claim
                planning.decisions[aid].shared_view = views[claim]

    async def _check_integrity(
        self, planning: _Planning, reusing: list[int], *, live: bool
    ) -> list[int]:
        """Drop from `reusing` the actions whose stored copy no longer matches its digest.

        Such an action computes (reason "digest-mismatch"), as if its dataset
        were DELETED, and its output replaces the bad copy. The check hashes a
        dataset only when its files' stat fingerprint changed since this node
        last hashed them (`integrity.DigestCache`): reuse of unchanged data costs
        one lstat per file.
        """
        wanted = {
            planning.dataset_ids[aid]: planning.records[planning.dataset_ids[aid]]
            for aid in reusing
        }
        checked = [r for r in wanted.values() if r.is_managed and r.digest is not None]
        if not checked:
            return reusing
        verdicts = await self.storage.check_before_reuse(
            [(r.path, r.digest) for r in checked if r.digest is not None]
        )
        bad = {r.id for r, v in zip(checked, verdicts, strict=True) if v.bad}
        if not bad:
            return reusing
        for record, verdict in zip(checked, verdicts, strict=True):
            if record.id in bad and live:
                metrics.DIGEST_MISMATCHES.labels(where="plan").inc()
                logger.warning(
                    "dataset %s is %s (recorded %s, found %s): recomputing it",
                    record.id,
                    verdict.status.value,
                    record.digest,
                    verdict.digest,
                    extra={
                        "event": "dataset_digest_mismatch",
                        "dataset_id": record.id,
                        "workflow_id": planning.workflow_id,
                    },
                )
        kept: list[int] = []
        for aid in reusing:
            if planning.dataset_ids[aid] in bad:
                planning.decisions[aid].compute = True
                planning.decisions[aid].reason = integrity.MISMATCH_REASON
            else:
                kept.append(aid)
        return kept

    async def _hold(self, planning: _Planning, action_id: int) -> bool:
        """Make a reused dataset safe to read: LEAF for a leaf, a claim per computing child."""
        dataset_id = planning.dataset_ids[action_id]
        record = planning.records[dataset_id]
        if planning.is_leaf(action_id):
            if record.state is D.LEAF:
                return True
            states.ensure_transition(D.STORED, D.LEAF, states.Trigger.PLANNER)
            moved = await self.store.transition_dataset(dataset_id, {D.STORED}, D.LEAF)
            if moved is not None:
                return True
            # Lost a race: someone else may have made it LEAF, which is just as good.
            current = await self.store.get_dataset(dataset_id)
            return current is not None and current.state is D.LEAF
        keys = [
            protocol.claim_key(planning.workflow_id, c)
            for c in planning.computing_children(action_id)
        ]
        results = await asyncio.gather(
            *(self.store.add_dataset_claim(dataset_id, k, states.DATASET_REUSABLE) for k in keys)
        )
        ok = True
        for key, result in zip(keys, results, strict=True):
            if result is None:
                ok = False
            else:
                planning.claims.append((dataset_id, key))
        if not ok:
            logger.debug(
                "dataset %s moved on while claiming it; computing it instead",
                dataset_id,
                extra={"event": "claim_failed", "dataset_id": dataset_id},
            )
        return ok

    async def _abandon_interrupted(self, workflow_id: str) -> None:
        """After `persist_plan` raised: end what it may have written of the workflow
        (`OutcomeService.abandon_interrupted`). Best effort: with the store down, the
        reaper does it later (docs/states.md, "A plan written in part")."""
        try:
            await self.outcomes.abandon_interrupted(workflow_id)
        except errors.PingoError as exc:
            logger.warning(
                "workflow %s: its failed submission is left to the reaper: %s",
                workflow_id,
                exc.message,
                extra={"event": "plan_cleanup_failed", "workflow_id": workflow_id},
            )

    async def _release(self, claims: Sequence[tuple[str, str]]) -> None:
        if claims:
            await asyncio.gather(
                *(self.store.remove_dataset_claim(ds, key) for ds, key in claims),
                return_exceptions=True,
            )

    async def _workflow_plan(
        self,
        planning: _Planning,
        owner: str,
        scope: str,
        now: datetime,
        idempotency_key: str | None,
        rerun_of: str | None,
    ) -> tuple[protocol.WorkflowPlan, _Tally]:
        """The records to persist: the workflow, every action, every dataset to compute.

        Building them is CPU work linear in the actions: a big workflow's goes to a
        worker thread, so the loop keeps serving other requests meanwhile.
        """
        decisions = planning.decisions
        computing = [aid for aid in sorted(planning.definition.actions) if decisions[aid].compute]
        keep = await self._keep_decisions(planning, owner, scope, computing)
        build = (planning, owner, scope, now, idempotency_key, rerun_of, computing, keep)
        if len(planning.definition.actions) <= _PLAN_CHUNK:
            return self._build_plan(*build)
        return await asyncio.to_thread(self._build_plan, *build)

    def _build_plan(
        self,
        planning: _Planning,
        owner: str,
        scope: str,
        now: datetime,
        idempotency_key: str | None,
        rerun_of: str | None,
        computing: list[int],
        keep: Mapping[int, bool],
    ) -> tuple[protocol.WorkflowPlan, _Tally]:
        definition = planning.definition
        wf = planning.workflow_id
        ids = planning.dataset_ids
        decisions = planning.decisions
        actions: list[protocol.ActionRecord] = []
        datasets: dict[str, protocol.DatasetPlan] = {}
        order = sorted(definition.actions)
        callback_ids = protocol.new_callback_ids(wf, len(order))
        for index, aid in enumerate(order):
            action = definition.actions[aid]
            decision = decisions[aid]
            inputs = {p: ids[p] for p in action.parents}
            common: dict[str, Any] = {
                "workflow_id": wf,
                "action_id": aid,
                "name": action.name,
                "type": action.type,
                "dataset_id": ids[aid],
                "reason": decision.reason,
                "definition": dict(action.raw),
                "inputs": inputs,
                "callback_id": callback_ids[index],
                "created_at": now,
                "updated_at": now,
                "max_attempts": action.max_attempts or DEFAULT_MAX_ATTEMPTS,
            }
            if not decision.compute:
                actions.append(
                    protocol.ActionRecord(
                        state=A.FINISHED,
                        reused=True,
                        waiting_on=(),
                        children=(),
                        finished_at=now,
                        **common,
                    )
                )
                continue
            waiting = tuple(p for p in action.parents if decisions[p].compute)
            if decision.shared_with is not None:
                # Its own id: it waits for the producer too (`ActionRecord.waiting_on`).
                waiting = (*waiting, aid)
            children = planning.computing_children(aid)
            actions.append(
                protocol.ActionRecord(
                    state=A.WAITING if waiting else A.READY,
                    reused=False,
                    waiting_on=waiting,
                    children=children,
                    shared_with=decision.shared_with,
                    **common,
                )
            )
            if planning.is_leaf(aid):
                target = D.TO_LEAF
            else:
                target = D.TO_STORE if keep.get(aid, True) else D.TO_DELETE
            _add_dataset(
                datasets,
                protocol.DatasetPlan(
                    id=ids[aid],
                    state=target,
                    path=(
                        action.output_path
                        if not action.is_managed and action.output_path
                        else self.storage.path_for(ids[aid])
                    ),
                    scope=scope,
                    action_type=action.type,
                    definition=provenance.identity(action, [ids[p] for p in action.parents], scope),
                    parents=tuple(ids[p] for p in action.parents),
                    producer_workflow_id=wf,
                    producer_action_id=aid,
                    is_managed=action.is_managed,
                    claims=tuple(protocol.claim_key(wf, c) for c in children),
                ),
            )

        done = not computing
        if done:
            states.ensure_transition(W.RUNNING, W.SUCCEEDED, states.Trigger.PLANNER)
        workflow = protocol.WorkflowRecord(
            id=wf,
            name=definition.name,
            owner=owner,
            state=W.SUCCEEDED if done else W.RUNNING,
            document=definition.document,
            scope=scope,
            on_failure=definition.on_failure,
            end_dataset_id=ids.get(definition.end_action_id),
            created_at=now,
            finished_at=now if done else None,
            idempotency_key=idempotency_key,
            rerun_of=rerun_of,
        )
        tally = _Tally(
            computing=len(computing),
            ready=sum(1 for a in actions if a.state is A.READY),
            # One use per dataset per workflow, however many of its actions reuse it.
            reused=sorted({ids[aid] for aid, d in decisions.items() if d.reason == "reused"}),
            sharing=sorted(aid for aid, d in decisions.items() if d.shared_with is not None),
        )
        # Past this the deletor may release the claims this planning took (`_persist`).
        deadline_at = now + timedelta(seconds=self.settings.plan_deadline_s)
        plan = protocol.WorkflowPlan(
            workflow, tuple(actions), tuple(datasets.values()), deadline_at
        )
        return plan, tally

    async def _keep_decisions(
        self, planning: _Planning, owner: str, scope: str, computing: Sequence[int]
    ) -> dict[int, bool]:
        """Ask retention's hook about each new intermediate (never leaves nor unmanaged)."""
        hook = self.keep_hook
        if hook is None:
            return {}
        definition = planning.definition
        asked = [
            aid
            for aid in computing
            if not planning.is_leaf(aid) and definition.actions[aid].is_managed
        ]
        infos = [
            NewDatasetInfo(
                dataset_id=planning.dataset_ids[aid],
                workflow_id=planning.workflow_id,
                owner=owner,
                scope=scope,
                action=definition.actions[aid],
                parents=tuple(planning.dataset_ids[p] for p in definition.actions[aid].parents),
                previous=planning.records.get(planning.dataset_ids[aid]),
                workflow=definition,
                dataset_ids=planning.dataset_ids,
            )
            for aid in asked
        ]
        answers = await asyncio.gather(*(hook(info) for info in infos))
        return dict(zip(asked, answers, strict=True))


def _add_dataset(datasets: dict[str, protocol.DatasetPlan], plan: protocol.DatasetPlan) -> None:
    """Add a dataset to compute, merging twins: actions of one workflow with the same provenance.

    The first (lowest action id) is the producer of record; every twin computes (a
    twin within one workflow does not share its sibling's computation) and the first
    success stores it.
    """
    twin = datasets.get(plan.id)
    if twin is None:
        datasets[plan.id] = plan
        return
    state = max(
        twin.state, plan.state, key=lambda s: rules.TARGET_RANK[s]
    )  # twins keep the strongest target
    claims = tuple(dict.fromkeys((*twin.claims, *plan.claims)))
    datasets[plan.id] = dataclasses.replace(twin, state=state, claims=claims)


async def _producers(
    store: protocol.Store, keys: Collection[str]
) -> dict[str, protocol.ActionRecord]:
    """The actions named by claim keys (those that exist): one read each, or one listing
    of a workflow that many of them belong to (a big workflow resubmitted while it runs)."""
    by_workflow: dict[str, list[str]] = {}
    for key in keys:
        by_workflow.setdefault(protocol.parse_claim_key(key)[0], []).append(key)
    wanted = set(keys)
    listed = [w for w, ks in by_workflow.items() if len(ks) > _PRODUCER_READS]
    single = [k for ks in by_workflow.values() if len(ks) <= _PRODUCER_READS for k in ks]
    found: dict[str, protocol.ActionRecord] = {}
    for actions in await asyncio.gather(*(store.list_actions(w) for w in listed)):
        for action in actions:
            key = protocol.claim_key(*action.key)
            if key in wanted:
                found[key] = action
    reads = await asyncio.gather(*(store.get_action(*protocol.parse_claim_key(k)) for k in single))
    found.update((k, a) for k, a in zip(single, reads, strict=True) if a is not None)
    return found


async def shared_views(
    store: protocol.Store,
    owner: str,
    producers: Mapping[str, protocol.ActionRecord] | Collection[str],
) -> dict[str, reuse.SharedWith]:
    """How `owner` sees each producer (by claim key) that their actions share with: the
    action's name always, its workflow and id only when `owner` owns that workflow too.

    `producers` are the records, or just their claim keys (read here).
    """
    if not isinstance(producers, Mapping):
        producers = await _producers(store, producers)
    workflow_ids = sorted({a.workflow_id for a in producers.values()})
    found = await asyncio.gather(*(store.get_workflow(w) for w in workflow_ids))
    owners = {w: r.owner for w, r in zip(workflow_ids, found, strict=True) if r is not None}
    views = {}
    for claim, producer in producers.items():
        if owners.get(producer.workflow_id) == owner:
            views[claim] = reuse.SharedWith(producer.name, producer.workflow_id, producer.action_id)
        else:
            views[claim] = reuse.SharedWith(producer.name)
    return views


#: What `force` may name: action ids (int) and action names (str).
ForceTargets = Collection[int | str]


def _forced(definition: WorkflowDefinition, force: ForceTargets) -> frozenset[int]:
    """The action ids `force` names, by id or by name (422 for any it does not find).

    Names are not unique: a name forces every action that bears it. Problems
    point into the rerun body's `force` list (`/force/<index>`).
    """
    if not force:
        # Nothing to resolve: no index of a 100,000-action workflow's names on the loop.
        return frozenset()
    by_name: dict[str, list[int]] = {}
    for aid, action in definition.actions.items():
        by_name.setdefault(action.name, []).append(aid)
    chosen: set[int] = set()
    issues: list[errors.ValidationIssue] = []
    for index, item in enumerate(force):
        pointer = f"/force/{index}"
        if isinstance(item, int):
            if item in definition.actions:
                chosen.add(item)
            else:
                issues.append(
                    errors.ValidationIssue(
                        "UNKNOWN_ACTION_ID", f"no action with id {item}", pointer
                    )
                )
        elif item in by_name:
            chosen.update(by_name[item])
        else:
            issues.append(
                errors.ValidationIssue("UNKNOWN_ACTION_NAME", f"no action named {item!r}", pointer)
            )
    if issues:
        metrics.SUBMISSIONS.labels(outcome="invalid").inc()
        raise errors.ValidationFailed(issues)
    return frozenset(chosen)


def _to_plan(planning: _Planning) -> Plan:
    return Plan(
        workflow_id=planning.workflow_id,
        actions=tuple(
            PlannedAction(
                action_id=aid,
                name=planning.definition.actions[aid].name,
                dataset_id=planning.dataset_ids[aid],
                compute=planning.decisions[aid].compute,
                reason=planning.decisions[aid].reason,
                dataset_state=planning.decisions[aid].state,
                shared_with=planning.decisions[aid].shared_view,
            )
            for aid in sorted(planning.definition.actions)
        ),
    )


def _differs(stored: Mapping[str, Any], sent: bytes | str | Mapping[str, Any]) -> bool:
    """Whether a stored document and a submitted one differ (decoding both: call off-loop)."""
    submitted = sent if isinstance(sent, Mapping) else untrusted.loads(sent)
    return bool(untrusted.plain(stored) != submitted)

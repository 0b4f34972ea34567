"""The JSON documents the API returns, built from store records as `models` Structs.

Their shapes are `pingo.api.models`; this module decides what goes in them (who
sees what) and encodes them. The web UI reads the same documents as dicts
(`as_dict`), camelCase keys and all.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from pingo import limits, states
from pingo.actions.executors import cluster
from pingo.api import models
from pingo.config import Settings
from pingo.datasets.integrity import Verdict
from pingo.store.protocol import (
    ActionRecord,
    DatasetRecord,
    EventRecord,
    UserLimits,
    UserRecord,
    WorkflowRecord,
)
from pingo.workflows import planner, reuse

#: Actions per call of the JSON encoder in `encode_workflow_document`.
_ENCODE_CHUNK = 1000

_ENCODER = msgspec.json.Encoder()


def encode(data: Any) -> bytes:
    """Compact UTF-8 JSON of a model (or plain JSON data): how every document leaves."""
    return _ENCODER.encode(data)


def as_dict(document: msgspec.Struct) -> dict[str, Any]:
    """A document as the JSON object it encodes to (camelCase keys, times as text)."""
    converted: dict[str, Any] = msgspec.to_builtins(document)
    return converted


def counts(actions: Iterable[ActionRecord]) -> dict[str, int]:
    """Actions per state, every state present (zeros included) so clients need no defaults."""
    result = {state.value: 0 for state in states.ActionState}
    for action in actions:
        result[action.state.value] += 1
    return result


def action_outcome(action: ActionRecord, *, twin: bool = False) -> reuse.Reuse:
    """Computed, shared, reused or not needed (`pingo.workflows.reuse`)."""
    if action.shared_with is not None and not twin:
        # Shared while it waits for the other workflow's computation, or once that one
        # stored the dataset (it never ran); computed once it computes it itself.
        waited = action.is_attached or (
            action.state is states.ActionState.FINISHED and action.attempts == 0
        )
        return reuse.Reuse.SHARED if waited else reuse.Reuse.COMPUTED
    return reuse.outcome(runs=not action.reused, reason=action.reason, twin=twin)


#: Producer claim key → how the document shows it (`pingo.api.routes.workflows` reads them).
SharedViews = Mapping[str, reuse.SharedWith]


def shared_view(view: reuse.SharedWith | None) -> models.SharedWith | None:
    """`sharedWith`: the producer's ids only when `view` may show them."""
    if view is None:
        return None
    if view.workflow_id is None:
        return models.SharedWith(name=view.name)
    return models.SharedWith(
        name=view.name,
        workflow_id=view.workflow_id,
        action_id=msgspec.UNSET if view.action_id is None else view.action_id,
    )


def shared_with(action: ActionRecord, views: SharedViews) -> models.SharedWith | None:
    """`sharedWith` of an action: whom it shared (or shares) its dataset's computation with."""
    if action.shared_with is None:
        return None
    return shared_view(views.get(action.shared_with))


def action_summary(
    action: ActionRecord, *, twin: bool = False, views: SharedViews | None = None
) -> models.ActionSummary:
    """An action as it appears in the workflow document (`error`: why it failed, if it did)."""
    return models.ActionSummary(
        action_id=action.action_id,
        name=action.name,
        type=action.type,
        state=action.state,
        dataset_id=action.dataset_id,
        reused=action.reused,
        reuse=action_outcome(action, twin=twin),
        shared_with=shared_with(action, views or {}),
        attempts=action.attempts,
        started_at=action.started_at,
        finished_at=action.finished_at,
        error=action.error,
    )


def cluster_jobs(attempt: int, jobs: cluster.ClusterJobs) -> models.ClusterJobs:
    """`GET …/actions/{actionId}/cluster-jobs`: the jobs one attempt's client submitted."""
    return models.ClusterJobs(
        attempt=attempt,
        applications=[
            models.ClusterApplication(id=app, logs_command=["yarn", *cluster.logs_command(app)])
            for app in jobs.application_ids
        ],
        drivers=list(jobs.driver_ids),
        urls=list(jobs.urls),
    )


def is_twin(action: ActionRecord, dataset: DatasetRecord | None) -> bool:
    """Whether a lower action of the same workflow computes this action's dataset too.

    Planning makes the lowest of such twins the dataset's producer of record, so one
    dataset read answers it, where `reuse.twins` needs every action of the workflow.
    """
    return (
        not action.reused
        and dataset is not None
        and dataset.producer_workflow_id == action.workflow_id
        and dataset.producer_action_id < action.action_id
    )


def action_detail(
    action: ActionRecord,
    dataset: DatasetRecord | None = None,
    views: SharedViews | None = None,
) -> models.ActionDetail:
    """`GET /workflows/{id}/actions/{actionId}`: the summary plus what a debugger needs.

    `dataset` (the action's) tells whether it shares its dataset with a twin.
    """
    summary = action_summary(action, twin=is_twin(action, dataset), views=views)
    return models.ActionDetail(
        **msgspec.structs.asdict(summary),
        reason=action.reason,
        callback_id=action.callback_id,
        external_id=action.external_id,
        definition=dict(action.definition),
        history=[models.HistoryEntry(state=e.state, at=e.at) for e in action.history],
    )


def workflow_summary(workflow: WorkflowRecord) -> models.WorkflowSummary:
    """A workflow as it appears in lists (the document without `counts` and `actions`)."""
    return models.WorkflowSummary(
        id=workflow.id,
        name=workflow.name,
        owner=workflow.owner,
        state=workflow.state,
        created_at=workflow.created_at,
        finished_at=workflow.finished_at,
        end_dataset_id=workflow.end_dataset_id,
    )


def workflow_document(
    workflow: WorkflowRecord, actions: list[ActionRecord], views: SharedViews | None = None
) -> models.WorkflowDocument:
    """The workflow document: every action of the definition, in ascending action id."""
    ordered = sorted(actions, key=lambda a: a.action_id)
    twins = _twins(ordered)
    return _workflow_head(
        workflow,
        counts(ordered),
        reuse_summary(action_outcome(a, twin=a.action_id in twins) for a in ordered),
        [action_summary(a, twin=a.action_id in twins, views=views) for a in ordered],
    )


def encode_workflow_document(
    workflow: WorkflowRecord, actions: Sequence[ActionRecord], views: SharedViews | None = None
) -> bytes:
    """`encode(workflow_document(...))`, the same bytes, a thousand actions per encoder call.

    One call of the C encoder over a 100,000-action document holds the GIL for
    most of a second; in slices, a worker thread doing this lets the event loop
    run in between (issue 13).
    """
    encoder = DocumentEncoder(workflow)
    encoder.add(sorted(actions, key=lambda a: a.action_id), views)
    return encoder.finish()


class DocumentEncoder:
    """The workflow document encoded as its actions come, a page at a time, in ascending
    action id: the bytes of `encode(workflow_document(...))` (issue 13).

    Only the encoded actions, their counts and the datasets of running actions (for
    twins) are kept, never the records: a big workflow's document is read from the
    store a page at a time, so its records never fill the server's heap all at once.
    The head (counts, reuse summary) depends on every action: it is encoded last and
    placed first.
    """

    def __init__(self, workflow: WorkflowRecord, twins: Collection[str] | None = None) -> None:
        """`twins`: the workflow's `Store.twin_datasets`, if known."""
        self._workflow = workflow
        self._parts: list[bytes] = []
        self._counts = {state.value: 0 for state in states.ActionState}
        self._tally = dict.fromkeys(reuse.Reuse, 0)
        self._twins = reuse.TwinFinder(twins)
        self._last: int | None = None

    def add(self, page: Sequence[ActionRecord], views: SharedViews | None = None) -> None:
        """Encode the next actions (ascending ids, above every earlier page's)."""
        for start in range(0, len(page), _ENCODE_CHUNK):
            summaries = [self._summary(a, views) for a in page[start : start + _ENCODE_CHUNK]]
            # `[…]` without its brackets: `finish` joins the slices with commas.
            self._parts.append(encode(summaries)[1:-1])

    def _summary(self, action: ActionRecord, views: SharedViews | None) -> models.ActionSummary:
        if self._last is not None and action.action_id <= self._last:
            raise ValueError(f"action {action.action_id} comes after action {self._last}")
        self._last = action.action_id
        twin = self._twins.is_twin(action.dataset_id, runs=not action.reused)
        self._counts[action.state.value] += 1
        self._tally[action_outcome(action, twin=twin)] += 1
        return action_summary(action, twin=twin, views=views)

    def finish(self) -> bytes:
        """The whole document."""
        tally = self._tally
        head = encode(
            _workflow_head(
                self._workflow,
                self._counts,
                models.ReuseSummary(
                    computed=tally[reuse.Reuse.COMPUTED],
                    shared=tally[reuse.Reuse.SHARED],
                    reused=tally[reuse.Reuse.REUSED],
                    not_needed=tally[reuse.Reuse.NOT_NEEDED],
                ),
                [],
            )
        )
        # `actions` is the model's last field: `…,"actions":[]}` loses its `]}`.
        return b"".join((head[:-2], b",".join(self._parts), b"]}"))


def _twins(ordered: Sequence[ActionRecord]) -> frozenset[int]:
    """The actions that share their dataset with a lower action of the same workflow."""
    return reuse.twins((a.action_id, a.dataset_id, not a.reused) for a in ordered)


def reuse_summary(outcomes: Iterable[reuse.Reuse]) -> models.ReuseSummary:
    """How many actions are computed, shared, reused and not needed."""
    found = reuse.summary(outcomes)
    return models.ReuseSummary(
        computed=found["computed"],
        shared=found["shared"],
        reused=found["reused"],
        not_needed=found["notNeeded"],
    )


def _workflow_head(
    workflow: WorkflowRecord,
    action_counts: dict[str, int],
    summary: models.ReuseSummary,
    actions: list[models.ActionSummary],
) -> models.WorkflowDocument:
    """The workflow document with `actions`, `counts` and `reuse` as given."""
    return models.WorkflowDocument(
        id=workflow.id,
        name=workflow.name,
        owner=workflow.owner,
        state=workflow.state,
        created_at=workflow.created_at,
        finished_at=workflow.finished_at,
        error=workflow.error,
        counts=action_counts,
        reuse=summary,
        end_dataset_id=workflow.end_dataset_id,
        actions=actions,
    )


def plan_document(plan: planner.Plan) -> models.Plan:
    """A dry run's answer: what planning decided for each action; nothing stored."""
    twins = reuse.twins((a.action_id, a.dataset_id, a.compute) for a in plan.actions)
    return models.Plan(
        workflow_id=plan.workflow_id,
        actions=[
            models.PlannedAction(
                action_id=a.action_id,
                name=a.name,
                dataset_id=a.dataset_id,
                compute=a.compute,
                reuse=a.outcome(twin=a.action_id in twins),
                reason=a.reason,
                dataset_state=a.dataset_state,
                shared_with=shared_view(a.shared_with),
            )
            for a in plan.actions
        ],
        summary=reuse_summary(a.outcome(twin=a.action_id in twins) for a in plan.actions),
    )


class DatasetView(enum.Enum):
    """How much of a dataset a viewer may see (decided in `pingo.api.routes.datasets`)."""

    #: An admin: everything, readers' claims included.
    ADMIN = "admin"
    #: The owner of the workflow that produced it: everything but other workflows' claims.
    OWNER = "owner"
    #: Anyone else in its sharing scope: what it is, never whose workflow made it or how.
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Producer:
    """The owner of a dataset's producing workflow and the producing action's name."""

    owner: str | None
    name: str | None


def stored_size(dataset: DatasetRecord) -> int | None:
    """The bytes a dataset's files take now: None while it is computed and once DELETED."""
    return dataset.size_bytes if dataset.state in states.DATASET_USING_STORAGE else None


def dataset_document(
    dataset: DatasetRecord,
    view: DatasetView = DatasetView.ADMIN,
    producer: Producer | None = None,
) -> models.Dataset:
    """A dataset, with where it came from, as much as `view` may see.

    Another user's workflow id, document and `env` values are never shown to
    OTHER viewers: their `producedBy` holds the action's name and type only,
    and the claims (which name the reading workflows) are shown as a count.
    """
    name = None if producer is None else producer.name
    if view is DatasetView.OTHER:
        produced_by = models.ProducedBy(name=name, type=dataset.action_type)
    else:
        produced_by = models.ProducedBy(
            name=name,
            type=dataset.action_type,
            workflow_id=dataset.producer_workflow_id,
            action_id=dataset.producer_action_id,
            definition=dict(dataset.definition),
        )
    # An unmanaged path is the producer's own path; a managed one only says the id.
    shows_path = view is not DatasetView.OTHER or dataset.is_managed
    return models.Dataset(
        id=dataset.id,
        state=dataset.state,
        size_bytes=stored_size(dataset),
        digest=dataset.digest,
        path=dataset.path if shows_path else msgspec.UNSET,
        scope=dataset.scope,
        managed=dataset.is_managed,
        pinned=dataset.pinned,
        claim_count=len(dataset.claims),
        claims=list(dataset.claims) if view is DatasetView.ADMIN else msgspec.UNSET,
        produced_by=produced_by,
        parents=list(dataset.parents),
        compute_seconds=dataset.compute_s,
        use_count=dataset.use_count,
        created_at=dataset.created_at,
        stored_at=dataset.stored_at,
        last_used_at=dataset.last_used_at,
    )


def lineage_node(
    dataset_id: str,
    dataset: DatasetRecord | None,
    view: DatasetView = DatasetView.ADMIN,
    producer: Producer | None = None,
) -> models.LineageNode:
    """One node of a lineage graph, as much as `view` may see (as `dataset_document`)."""
    if dataset is None:
        # An input whose record is gone: still part of the lineage.
        return models.LineageNode(id=dataset_id, state=None)
    node = models.LineageNode(
        id=dataset.id,
        state=dataset.state,
        action_type=dataset.action_type,
        action_name=None if producer is None else producer.name,
        size_bytes=stored_size(dataset),
        digest=dataset.digest,
        is_managed=dataset.is_managed,
        stored_at=dataset.stored_at,
    )
    if view is not DatasetView.OTHER:
        node.producer_workflow_id = dataset.producer_workflow_id
        node.producer_action_id = dataset.producer_action_id
    return node


def verification_document(verdict: Verdict, dataset: DatasetRecord) -> models.Verification:
    """`?verify=true`: the recorded digest against what the files hash to now."""
    return models.Verification(
        status=verdict.status.value,
        recorded_digest=dataset.digest,
        actual_digest=verdict.digest,
        recorded_size_bytes=dataset.size_bytes,
        actual_size_bytes=verdict.size_bytes,
    )


def _limits(values: UserLimits | limits.EffectiveLimits) -> models.Limits:
    return models.Limits(
        max_workflows=values.max_workflows,
        max_in_flight_actions=values.max_in_flight_actions,
        submissions_per_minute=values.submissions_per_minute,
        max_storage_bytes=values.max_storage_bytes,
    )


def user_document(user: UserRecord, settings: Settings) -> models.User:
    """A user with the limits that apply to them, never with a token hash.

    `limits` are in force (null: unlimited); `ownLimits` are the user's own
    overrides (null: the server's default applies).
    """
    return models.User(
        name=user.name,
        admin=user.is_admin,
        created_at=user.created_at,
        limits=_limits(limits.effective(user.limits, settings)),
        own_limits=_limits(user.limits),
    )


def new_user_document(user: UserRecord, settings: Settings, token: str) -> models.NewUser:
    """A user just created, with its token (shown this once)."""
    return models.NewUser(**msgspec.structs.asdict(user_document(user, settings)), token=token)


def callback_answer(action: ActionRecord) -> models.CallbackAnswer:
    """What a callback returns: enough for the caller, nothing about the workflow."""
    return models.CallbackAnswer(
        callback_id=action.callback_id, attempt=action.attempts, state=action.state
    )


def event_document(event: EventRecord) -> models.Event:
    """An event of a user's feed (`GET /api/v1/events`)."""
    return models.Event(
        id=str(event.seq),
        kind=event.kind,
        at=event.at,
        workflow_id=event.workflow_id,
        dataset_id=event.dataset_id,
        data=dict(event.payload or {}),
    )


def audit_document(event: EventRecord) -> models.AuditEntry:
    """An entry of the audit log (`GET /api/v1/audit`)."""
    # The audit middleware records every key (`pingo.api.audit`).
    payload: Mapping[str, Any] = event.payload or {}
    return models.AuditEntry(
        id=str(event.seq),
        at=event.at,
        actor=payload["actor"],
        action=payload["action"],
        remote=payload.get("remote"),
        target=payload.get("target", {}),
        status=payload["status"],
    )

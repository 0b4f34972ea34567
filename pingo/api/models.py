"""The shapes of the API's JSON: one msgspec Struct per document and request body.

These models are the one source of each shape. `documents.py` builds the
responses from store records and encodes them; `bodies.py` validates request
bodies against them; `openapi.py` takes `components/schemas` from `schemas()`.
Field names are snake_case here and camelCase on the wire (`rename="camel"`).

A field typed `… | msgspec.UnsetType` is left out of the JSON while it holds
`UNSET` (a field the viewer may not see); `None` is always sent as `null`.
msgspec won the measurement against pydantic (`bench/bench_models.py`).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from pingo import events, limits, states
from pingo.datasets import integrity
from pingo.schedules import rules
from pingo.store.protocol import HISTORY_LIMIT
from pingo.workflows import reuse

#: Where a generated schema points at another: OpenAPI's components.
REF_TEMPLATE = "#/components/schemas/{name}"
#: A request field's schema may name the issue code its violations get
#: (`bodies.read_model`); SCHEMA_VIOLATION otherwise.
ISSUE_CODE = "x-pingo-issue-code"


class Model(msgspec.Struct, kw_only=True, rename="camel"):
    """Base of every response document: camelCase on the wire, built by keyword."""


class Body(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """Base of every request body: camelCase, and an unknown field is an error."""


DatasetId = Annotated[
    str, msgspec.Meta(pattern="^[0-9a-f]{64}$", description="sha256 of provenance")
]
Reason = Annotated[
    str,
    msgspec.Meta(
        description="why planning decided so: forced, unmanaged, absent, a dataset state, "
        "in-flight, claim-failed, digest-mismatch, reused or not-needed"
    ),
]
ReuseWord = Annotated[
    reuse.Reuse,
    msgspec.Meta(
        description="computed (runs), shared (another computation of its dataset was under "
        "way: another workflow's, which it waits for and never runs unless that one fails or "
        "is killed; or a twin's in the same workflow, beside which it runs), reused (its "
        "dataset was stored: never runs) or not needed (nothing that runs reads it: never runs)"
    ),
]
#: An event's position: what `id` and `next` of the feed and the audit log hold.
EventPosition = Annotated[str, msgspec.Meta(pattern="^[0-9]{1,18}$")]


# ---------------------------------------------------------------- workflows and actions


class SharedWith(Model, kw_only=True):
    """The other workflow's action computing its dataset, which it waits for instead of
    computing it (in-flight deduplication); `workflowId` and `actionId` only when that
    workflow is the viewer's own (another user's shows its action name alone)."""

    name: str
    workflow_id: str | UnsetType = UNSET
    action_id: int | UnsetType = UNSET


class ActionSummary(Model, kw_only=True):
    """An action as the workflow document lists it."""

    action_id: int
    name: str
    type: str
    state: states.ActionState
    dataset_id: DatasetId
    reused: Annotated[
        bool,
        msgspec.Meta(description="planning reused its dataset or did not need it: never runs"),
    ]
    reuse: ReuseWord
    shared_with: SharedWith | None
    attempts: Annotated[int, msgspec.Meta(ge=0)]
    started_at: datetime | None
    finished_at: datetime | None
    error: Annotated[
        str | None,
        msgspec.Meta(
            description="why the last attempt failed (or the action was killed), if it did"
        ),
    ]


class HistoryEntry(Model, kw_only=True):
    """A state an action entered, and when (`ActionRecord.history`)."""

    state: states.ActionState
    at: datetime


class ActionDetail(ActionSummary, kw_only=True):
    """An action with what a debugger needs."""

    reason: Reason
    callback_id: str
    external_id: str | None
    definition: Annotated[dict[str, Any], msgspec.Meta(description="the action as submitted")]
    history: Annotated[
        list[HistoryEntry],
        msgspec.Meta(
            max_length=HISTORY_LIMIT,
            description="each state the action entered and when, oldest first; retries "
            f"repeat states; the latest {HISTORY_LIMIT} entries are kept",
        ),
    ]


class ClusterApplication(Model, kw_only=True):
    """A YARN application an attempt's client submitted."""

    id: Annotated[str, msgspec.Meta(pattern="^application_[0-9]+_[0-9]+$")]
    logs_command: Annotated[
        list[str], msgspec.Meta(description="argv that fetches its aggregated logs")
    ]


class ClusterJobs(Model, kw_only=True):
    """The cluster jobs one attempt's client submitted, from its log."""

    attempt: Annotated[int, msgspec.Meta(ge=1)]
    applications: list[ClusterApplication]
    drivers: Annotated[
        list[str], msgspec.Meta(description="Spark standalone cluster-mode driver ids")
    ]
    urls: Annotated[list[str], msgspec.Meta(description="tracking URLs (YARN) and Spark UI URLs")]


class ReuseSummary(Model, kw_only=True):
    """How many actions are computed, shared, reused and not needed."""

    computed: int
    shared: int
    reused: int
    not_needed: int


class WorkflowSummary(Model, kw_only=True):
    """A workflow as lists show it (the document without `counts` and `actions`)."""

    id: str
    name: str
    owner: str
    state: states.WorkflowState
    created_at: datetime
    finished_at: datetime | None
    end_dataset_id: str | None


class WorkflowDocument(Model, kw_only=True):
    """A workflow and every action of its definition."""

    id: str
    name: str
    owner: str
    state: states.WorkflowState
    created_at: datetime
    finished_at: datetime | None
    error: Annotated[
        str | None, msgspec.Meta(description="why the workflow failed or was killed, if it did")
    ]
    counts: Annotated[
        dict[str, int],
        msgspec.Meta(description="actions per state (every state, zeros included)"),
    ]
    reuse: ReuseSummary
    end_dataset_id: str | None
    # Last: `documents.encode_workflow_document` appends the actions in slices.
    actions: Annotated[
        list[ActionSummary],
        msgspec.Meta(description="every action of the definition, ascending actionId"),
    ]


class WorkflowPage(Model, kw_only=True):
    """A page of workflows."""

    items: list[WorkflowSummary]
    next: Annotated[str | None, msgspec.Meta(description="cursor of the next page")]


class PlannedAction(Model, kw_only=True):
    """What planning decided for one action (a dry run)."""

    action_id: int
    name: str
    dataset_id: DatasetId
    compute: Annotated[
        bool,
        msgspec.Meta(
            description="the action will run (one sharing another workflow's computation, "
            "`sharedWith`, runs only if that computation fails)"
        ),
    ]
    reuse: ReuseWord
    reason: Reason
    dataset_state: states.DatasetState | None
    shared_with: SharedWith | None


class Plan(Model, kw_only=True):
    """A dry run's plan: nothing stored."""

    workflow_id: str
    actions: list[PlannedAction]
    summary: ReuseSummary


# ---------------------------------------------------------------------------- datasets


class ProducedBy(Model, kw_only=True):
    """The action that produced a dataset; `workflowId`, `actionId` and `definition` only
    for admins and the owner of the producing workflow."""

    name: str | None
    type: str
    workflow_id: str | UnsetType = UNSET
    action_id: int | UnsetType = UNSET
    definition: dict[str, Any] | UnsetType = UNSET


class Verification(Model, kw_only=True):
    """Only with ?verify=true: the files hashed again; a mismatched or missing dataset is
    recomputed at its next reuse, never handed out."""

    status: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(integrity.Status)})]
    recorded_digest: str | None
    actual_digest: str | None
    recorded_size_bytes: int | None
    actual_size_bytes: int | None


class Dataset(Model, kw_only=True):
    """A dataset, with where it came from, as much as the viewer may see."""

    id: DatasetId
    state: states.DatasetState
    size_bytes: int | None
    digest: Annotated[
        Annotated[str, msgspec.Meta(pattern="^sha256:[0-9a-f]{64}$")] | None,
        msgspec.Meta(
            description="SHA-256 of the content's manifest, recorded at commit (null: "
            "unmanaged, remote, or not stored yet); see docs/security.md",
        ),
    ]
    path: Annotated[
        str | UnsetType,
        msgspec.Meta(description="absent for another user's unmanaged dataset"),
    ] = UNSET
    scope: str
    managed: bool
    pinned: bool
    claim_count: Annotated[int, msgspec.Meta(description="actions that will read it")]
    claims: Annotated[
        list[str] | UnsetType,
        msgspec.Meta(description="admins only: the reading actions (workflowId/actionId)"),
    ] = UNSET
    produced_by: ProducedBy
    parents: list[DatasetId]
    compute_seconds: float | None
    use_count: int
    created_at: datetime
    stored_at: datetime | None
    last_used_at: datetime | None
    verification: Verification | UnsetType = UNSET


class DatasetPage(Model, kw_only=True):
    """A page of datasets."""

    items: list[Dataset]
    next: Annotated[str | None, msgspec.Meta(description="cursor of the next page")]


class LineageNode(Model, kw_only=True):
    """One dataset of a lineage graph; only `id` and a null `state` for an input whose
    record is gone, and no producer ids for another user's dataset."""

    id: str
    state: states.DatasetState | None
    action_type: str | UnsetType = UNSET
    action_name: str | UnsetType | None = UNSET
    size_bytes: int | UnsetType | None = UNSET
    digest: str | UnsetType | None = UNSET
    is_managed: bool | UnsetType = UNSET
    stored_at: datetime | UnsetType | None = UNSET
    producer_workflow_id: str | UnsetType = UNSET
    producer_action_id: int | UnsetType = UNSET


class LineageEdge(Model, kw_only=True):
    """A parent dataset read by the action that produced a child."""

    parent: str = msgspec.field(name="from")
    child: str = msgspec.field(name="to")


class Lineage(Model, kw_only=True):
    """The dataset and its ancestors."""

    dataset_id: str
    nodes: list[LineageNode]
    edges: list[LineageEdge]


class RetentionDecision(Model, kw_only=True):
    """One retention decision: an eviction, or a new dataset declined at planning."""

    seq: int
    at: Annotated[str, msgspec.Meta(extra_json_schema={"format": "date-time"})]
    kind: Literal["evict", "decline"]
    dataset_id: str | None
    policy: str | None
    reason: str | None
    size_bytes: int | None
    compute_seconds: float | None
    recompute_cost_seconds: float | None


class Storage(Model, kw_only=True):
    """Storage capacity, usage by dataset state, the retention policy and its decisions."""

    capacity_bytes: int | None
    used_bytes: int
    bytes_by_state: dict[str, int]
    own_bytes: Annotated[
        int,
        msgspec.Meta(
            description="bytes of STORED and LEAF datasets the caller's workflows produced: "
            "what their storage quota counts"
        ),
    ]
    quota_bytes: Annotated[
        int | None,
        msgspec.Meta(description="the caller's storage quota (null: unlimited)"),
    ]
    policy: str
    decisions: list[RetentionDecision]


# ----------------------------------------------------------------------------- callbacks


class CallbackAnswer(Model, kw_only=True):
    """What a callback returns: enough for the caller, nothing about the workflow."""

    callback_id: str
    attempt: int
    state: states.ActionState


# --------------------------------------------------------------------------------- users

#: A user's name: what `auth.check_user_name` accepts.
USER_NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Limits(Model, kw_only=True):
    """Per-user limits (docs/limits.md)."""

    max_workflows: int | None
    max_in_flight_actions: int | None
    submissions_per_minute: int | None
    max_storage_bytes: int | None


class User(Model, kw_only=True):
    """A user with the limits that apply to them, never with a token hash."""

    name: str
    admin: bool
    created_at: datetime
    limits: Annotated[Limits, msgspec.Meta(description="In force (null: unlimited).")]
    own_limits: Annotated[
        Limits, msgspec.Meta(description="The user's own (null: server default).")
    ]


class NewUser(User, kw_only=True):
    """A new user and its token."""

    token: Annotated[str, msgspec.Meta(description="shown once; only its hash is kept")]


class UserList(Model, kw_only=True):
    """Every user, by name."""

    items: list[User]


#: A limit a request sets: an integer from 1 up, or null for the server's default.
LimitValue = Annotated[
    Annotated[int, msgspec.Meta(ge=1, le=limits.MAX_LIMIT)] | None,
    msgspec.Meta(
        description=f"an integer from 1 to {limits.MAX_LIMIT}, or null for the server's default",
        extra_json_schema={ISSUE_CODE: "INVALID_LIMIT"},
    ),
]

#: A storage quota a request sets: bytes from 1 up, or null for the server's default.
BytesLimitValue = Annotated[
    Annotated[int, msgspec.Meta(ge=1, le=limits.MAX_BYTES_LIMIT)] | None,
    msgspec.Meta(
        description=f"bytes, from 1 to {limits.MAX_BYTES_LIMIT}, or null for the server's default",
        extra_json_schema={ISSUE_CODE: "INVALID_LIMIT"},
    ),
]


class LimitsUpdate(Body, kw_only=True):
    """Limits to change; null resets one to the server's default, an absent one is kept."""

    max_workflows: LimitValue | UnsetType = UNSET
    max_in_flight_actions: LimitValue | UnsetType = UNSET
    submissions_per_minute: LimitValue | UnsetType = UNSET
    max_storage_bytes: BytesLimitValue | UnsetType = UNSET


class UserUpdate(Body, kw_only=True):
    """`PATCH /users/{name}`."""

    limits: LimitsUpdate


class UserRequest(Body, kw_only=True):
    """`POST /users`."""

    name: Annotated[
        str,
        msgspec.Meta(
            pattern=USER_NAME_PATTERN,
            description="1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            extra_json_schema={ISSUE_CODE: "INVALID_USER_NAME"},
        ),
    ]
    admin: bool = False
    #: Hand a revoked user's name back with what it still owns (without it, such a name
    #: is refused: the new user would inherit a stranger's workflows, schedules and feed).
    reclaim: Annotated[
        bool,
        msgspec.Meta(
            description="the same person coming back: the new token gets the old user's "
            "workflows, schedules and feed (a name that still owns any is 409 without it)"
        ),
    ] = False


# ---------------------------------------------------------------------- workflows: bodies


class RerunRequest(Body, kw_only=True):
    """`POST /workflows/{id}/rerun`."""

    force: Annotated[
        list[str | int],
        msgspec.Meta(description="action names (every action bearing it) or ids to recompute"),
    ] = msgspec.field(default_factory=list)


# ----------------------------------------------------------------------------- schedules

#: What a schedule's `start` and `end` may be: not JSON Schema's `date-time` alone.
SCHEDULE_TIME = (
    "An RFC 3339 date-time, or one without an offset, which is a local time in the"
    " schedule's time zone (2026-01-01T00:00:00)."
)
#: A time as a schedule's definition holds it (the text as submitted).
TimeText = Annotated[str, msgspec.Meta(description=SCHEDULE_TIME)]


class WebhookView(Model):
    """A webhook as views show it: never its secret."""

    url: str
    events: list[str]


class Schedule(Model):
    """A schedule: its definition, state and next ticks; no secret."""

    id: str
    name: str
    owner: str
    cron: Annotated[str | None, msgspec.Meta(description="null for a data trigger")]
    trigger: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(
            extra_json_schema={
                "anyOf": [{"$ref": REF_TEMPLATE.format(name="Trigger")}, {"type": "null"}]
            }
        ),
    ]
    timezone: Annotated[str, msgspec.Meta(description="An IANA zone name.")]
    catch_up: Annotated[
        str, msgspec.Meta(extra_json_schema={"enum": list(rules.CATCH_UP_POLICIES)})
    ]
    catch_up_limit: Annotated[int, msgspec.Meta(ge=1, le=rules.MAX_CATCH_UP)]
    max_concurrent: Annotated[int, msgspec.Meta(ge=1, le=rules.MAX_CONCURRENT)] | None
    overlap: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(rules.OVERLAP_POLICIES)})]
    parameters: dict[str, str]
    start: TimeText | None
    end: TimeText | None
    paused: bool
    next_fire_at: datetime | None
    fires_on_data_after: datetime | None
    next_fire_times: list[datetime]
    pending_tick_at: datetime | None
    created_at: datetime
    updated_at: datetime
    webhooks: list[WebhookView]
    workflow: Annotated[dict[str, Any], msgspec.Meta(description="webhook secrets removed")]


class ScheduleList(Model):
    """Schedules (one page: `next` is always null)."""

    items: list[Schedule]
    next: None = None


class ScheduleRun(Model):
    """What became of one tick of a schedule."""

    tick_at: datetime
    workflow_id: str | None
    outcome: Annotated[
        str, msgspec.Meta(extra_json_schema={"enum": ["submitted", "skipped", "failed"]})
    ]
    reason: str | None
    recorded_at: datetime


class ScheduleRunList(Model):
    """A schedule's runs, latest first (one page: `next` is always null)."""

    items: list[ScheduleRun]
    next: None = None


class Delivery(Model):
    """One entry of a webhook delivery log (the URL and outcome; never the secret)."""

    id: str
    event: str
    url: str
    workflow_id: str
    schedule_id: str | None
    state: Annotated[
        str, msgspec.Meta(extra_json_schema={"enum": ["pending", "delivered", "failed"]})
    ]
    attempts: Annotated[int, msgspec.Meta(ge=0)]
    last_status: int | None
    last_error: str | None
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime


class DeliveryList(Model):
    """A delivery log, newest first (one page: `next` is always null)."""

    items: list[Delivery]
    next: None = None


# ------------------------------------------------------------------------ events, audit


class Event(Model, kw_only=True):
    """An event of your feed."""

    id: EventPosition
    kind: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(events.FEED_KINDS)})]
    at: datetime
    workflow_id: str | None
    dataset_id: str | None
    data: Annotated[dict[str, Any], msgspec.Meta(description="per kind: see docs/api.md#events")]


class EventPage(Model, kw_only=True):
    """A page of your feed."""

    items: list[Event]
    next: EventPosition | None


class AuditEntry(Model, kw_only=True):
    """A user action: who, what, when, from where."""

    id: EventPosition
    at: datetime
    actor: str
    action: Annotated[str, msgspec.Meta(description="workflow.submit, user.add, …")]
    remote: Annotated[str | None, msgspec.Meta(description="the peer address")]
    target: dict[str, str]
    status: int


class AuditPage(Model, kw_only=True):
    """A page of the audit log."""

    items: list[AuditEntry]
    next: EventPosition | None


# ------------------------------------------------------------------------------- system


class Status(Model, kw_only=True):
    """The process answers."""

    status: str


class Readiness(Model, kw_only=True):
    """The store answers, and whether command-line actions run sandboxed."""

    status: str
    sandbox: Annotated[
        str,
        msgspec.Meta(
            description="Whether command-line actions run sandboxed (PINGO_SANDBOX).",
            extra_json_schema={"enum": ["on", "off", "unavailable"]},
        ),
    ]


# ------------------------------------------------------------------------------ problems


class ValidationIssue(Model, kw_only=True):
    """One problem found in a request."""

    code: Annotated[str, msgspec.Meta(description="stable machine-readable code")]
    message: str
    pointer: Annotated[str, msgspec.Meta(description="RFC 6901 JSON pointer")]


class Problem(Model, kw_only=True):
    """RFC 9457 problem details."""

    type: Annotated[str, msgspec.Meta(extra_json_schema={"format": "uri-reference"})]
    title: str
    status: int
    detail: str
    code: Annotated[str, msgspec.Meta(description="stable code; see /docs#problems")]
    instance: str | UnsetType = UNSET
    errors: list[ValidationIssue] | UnsetType = UNSET


#: Every model `components/schemas` describes (those they refer to come along).
DOCUMENTED: tuple[type[msgspec.Struct], ...] = (
    ActionSummary,
    ActionDetail,
    ClusterJobs,
    WorkflowSummary,
    WorkflowDocument,
    WorkflowPage,
    Plan,
    Dataset,
    DatasetPage,
    Verification,
    Lineage,
    Storage,
    CallbackAnswer,
    WebhookView,
    Schedule,
    ScheduleList,
    ScheduleRun,
    ScheduleRunList,
    Delivery,
    DeliveryList,
    User,
    NewUser,
    UserList,
    Limits,
    UserUpdate,
    UserRequest,
    RerunRequest,
    Event,
    EventPage,
    AuditEntry,
    AuditPage,
    Status,
    Readiness,
    Problem,
    ValidationIssue,
)


@functools.cache
def schemas() -> dict[str, Any]:
    """`components/schemas` for every documented model, generated from the models."""
    _, components = msgspec.json.schema_components(DOCUMENTED, ref_template=REF_TEMPLATE)
    return {name: _tidy(schema) for name, schema in components.items()}


def _tidy(node: Any) -> Any:
    """`node` with each description on one line: msgspec keeps a docstring's indentation."""
    if isinstance(node, dict):
        return {
            key: " ".join(value.split()) if key == "description" else _tidy(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    return node

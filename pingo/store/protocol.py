"""The `Store` protocol: every read and write of Pingo's state, in domain verbs.

Backends (`sqlite`, `mongo`, `memory`) implement it and pass the one contract
suite in `tests/contract/`. Records are frozen; a change goes through a
compare-and-set that names the states it expects and returns the new record,
or `None` when another writer won. Losing a race is not an error.

Time: a store stamps `updated_at` and evaluates leases with the clock it was
opened with (`open_store(..., clock=...)`), so the simulator can run the real
components on a virtual clock.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, NamedTuple, Protocol, Self, TypeVar

from pingo.states import ActionState, DatasetState, WorkflowState

Clock = Callable[[], datetime]
"""Returns the current time as an aware UTC datetime."""

T = TypeVar("T")
C = TypeVar("C")


class _Keep(enum.Enum):
    KEEP = "KEEP"


#: Marks a field of a `*Changes` object that the update leaves as it is.
KEEP = _Keep.KEEP


def claim_key(workflow_id: str, action_id: int) -> str:
    """The key an action's claim on a dataset is recorded under."""
    return f"{workflow_id}/{action_id}"


def parse_claim_key(key: str) -> tuple[str, int]:
    """`claim_key`'s inverse: (workflow id, action id). Workflow ids hold no `/`."""
    workflow_id, _, action_id = key.rpartition("/")
    return workflow_id, int(action_id)


_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
#: Base-36 digits of the milliseconds in a workflow id: fixed, so ids sort by time.
_ID_TIME_DIGITS = 9


def new_workflow_id(now: datetime) -> str:
    """A unique id that sorts by creation time: `wf-<ms since epoch, base36>-<random>`.

    `now` is when its planning started: `planning_started_at` reads it back, so a claim
    (`claim_key`) tells how old the planning that took it is, even if its workflow was
    never stored.
    """
    n = int(now.timestamp() * 1000)
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = _BASE36[r] + digits
        if n == 0:
            break
    return f"wf-{digits.rjust(_ID_TIME_DIGITS, '0')}-{secrets.token_hex(5)}"


def new_callback_ids(workflow_id: str, count: int) -> list[str]:
    """Callback ids for a new workflow's `count` actions: 128 random bits each, after the
    time in the workflow's id (`new_workflow_id`), so that a plan's ids sort together.

    A store indexes callback ids (a callback finds its action by one). Random from the
    first character, each of a plan's 1,000 ids landed on a page of its own in that
    index, and the plan's commit wrote every one of them (bench/README.md, "Resubmission,
    second pass"). Only the planning's time shows, as it does in the workflow's id.
    """
    stamp = _time_stamp(workflow_id) or ""
    # One system call for all of them, not one per action.
    entropy = secrets.token_bytes(16 * count).hex()
    return [f"{stamp}{entropy[32 * i : 32 * i + 32]}" for i in range(count)]


def planning_started_at(workflow_id: str) -> datetime | None:
    """When the planning of `workflow_id` started (`new_workflow_id`'s `now`, to the
    millisecond); None for an id not made by `new_workflow_id`."""
    stamp = _time_stamp(workflow_id)
    return None if stamp is None else datetime.fromtimestamp(int(stamp, 36) / 1000, UTC)


def _time_stamp(workflow_id: str) -> str | None:
    """The base-36 time digits of an id made by `new_workflow_id`; None for any other id."""
    prefix, _, rest = workflow_id.partition("-")
    stamp, _, random = rest.partition("-")
    if prefix != "wf" or len(stamp) != _ID_TIME_DIGITS or not random:
        return None
    try:
        int(stamp, 36)
    except ValueError:
        return None
    return stamp


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    id: str
    name: str
    owner: str
    state: WorkflowState
    #: The submitted document, as JSON.
    document: Mapping[str, Any]
    #: The sharing scope its dataset ids were computed in.
    scope: str
    #: "abort" or "continue".
    on_failure: str
    end_dataset_id: str | None
    created_at: datetime
    finished_at: datetime | None = None
    idempotency_key: str | None = None
    #: The workflow this one re-runs, if any.
    rerun_of: str | None = None
    error: str | None = None
    version: int = 0


#: Most entries an action's `history` keeps: the oldest go first. 64 covers about
#: fifteen attempts (an attempt is READY, PROCESSING, SUBMITTED, RUNNING), far past
#: any `maxAttempts` in use, while bounding the row a transition rewrites.
HISTORY_LIMIT = 64


@dataclass(frozen=True, slots=True)
class StateEntry:
    """An action entered `state` at `at` (one step of its recorded history)."""

    state: ActionState
    at: datetime


@dataclass(frozen=True, slots=True)
class ActionRecord:
    workflow_id: str
    action_id: int
    name: str
    type: str
    state: ActionState
    dataset_id: str
    #: True when planning reused the dataset (or did not need it): never runs.
    reused: bool
    #: Why planning decided as it did ("absent", "forced", "reused", "DELETED", …).
    reason: str
    #: The action as submitted, as JSON.
    definition: Mapping[str, Any]
    #: Parent action id → the dataset id it reads (all parents, computed or reused).
    inputs: Mapping[int, str]
    #: Parent action ids this action still waits for. Its own id means it waits for
    #: another workflow's action computing its dataset (`shared_with`): releasing
    #: itself (`release_parent(wf, id, [id])`) is how it stops waiting for that one.
    waiting_on: tuple[int, ...]
    #: Child action ids (those that compute) to release when this one finishes.
    children: tuple[int, ...]
    #: Secret-free id the cluster calls back with; unique across the store.
    callback_id: str
    created_at: datetime
    updated_at: datetime
    #: Submissions started so far; callbacks carry the attempt they belong to.
    attempts: int = 0
    max_attempts: int = 3
    #: The node holding the lease (claim states and while an executor runs it).
    owner: str | None = None
    lease_expires_at: datetime | None = None
    #: Backoff: not claimable before this time.
    not_before: datetime | None = None
    #: The executor's id for the running work (pid, YARN application id, …).
    external_id: str | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: Measured runtime of the successful attempt.
    runtime_s: float | None = None
    version: int = 0
    #: In-flight deduplication: the `claim_key` of the other workflow's action that was
    #: computing this action's dataset when it was planned, which it waits for instead
    #: of computing it (fixed at planning; `pingo.callbacks.sharing`).
    shared_with: str | None = None
    #: Each state the action entered and when, oldest first, at most `HISTORY_LIMIT`
    #: (retries enter the same states again). Written by the statement that changes
    #: the state, with the store's clock; a write that keeps the state (a reclaim, the
    #: executor's id) adds nothing. A plan leaves it empty: the store opens it with
    #: the planned state at `created_at` (`rules.opening_history`).
    history: Sequence[StateEntry] = ()

    @property
    def key(self) -> tuple[str, int]:
        return (self.workflow_id, self.action_id)

    @property
    def is_attached(self) -> bool:
        """WAITING for the action it shares with (not yet settled)."""
        return (
            self.shared_with is not None
            and self.state is ActionState.WAITING
            and self.action_id in self.waiting_on
        )


@dataclass(frozen=True, slots=True)
class PlannedAction:
    """What planning decided for one action: the fields `pingo.workflows.reuse` needs."""

    action_id: int
    dataset_id: str
    reused: bool
    reason: str


@dataclass(frozen=True, slots=True)
class DatasetRecord:
    id: str
    state: DatasetState
    #: Where its files are (under the data root, or the user's own path if unmanaged).
    path: str
    scope: str
    action_type: str
    #: The identity-relevant definition of the producing action, as JSON.
    definition: Mapping[str, Any]
    #: Dataset ids of the inputs it was computed from (its lineage).
    parents: tuple[str, ...]
    producer_workflow_id: str
    producer_action_id: int
    is_managed: bool
    created_at: datetime
    updated_at: datetime
    #: Claim keys (`claim_key`) of actions that will read it; a claimed dataset is never deleted.
    #: A sequence: a backend may decode them only when read (SQLite does).
    claims: Sequence[str] = ()
    size_bytes: int | None = None
    #: `sha256:<hex>` of its content, recorded at commit (`pingo.datasets.integrity`);
    #: None for unmanaged and remote datasets and those stored before digests existed.
    digest: str | None = None
    #: Measured runtime of the action that produced it.
    compute_s: float | None = None
    use_count: int = 0
    last_used_at: datetime | None = None
    stored_at: datetime | None = None
    pinned: bool = False
    version: int = 0


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Something worth remembering: a dataset used, a retention decision, …"""

    seq: int
    kind: str
    at: datetime
    dataset_id: str | None = None
    workflow_id: str | None = None
    payload: Mapping[str, Any] | None = None
    #: The user whose feed shows it (`GET /api/v1/events`); None for server events
    #: (retention decisions, the audit log), which no user's feed shows.
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append with a write (`Store.transition_dataset`'s `event`): the
    arguments of `Store.append_event`."""

    kind: str
    owner: str | None = None
    workflow_id: str | None = None
    dataset_id: str | None = None
    payload: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class DatasetMove:
    """A dataset's compare-and-set to make with an action's (`Store.finish_action`'s
    `stored`): the arguments of `Store.transition_dataset`."""

    dataset_id: str
    expected: frozenset[DatasetState]
    new: DatasetState
    changes: DatasetChanges
    event: NewEvent | None = None


@dataclass(frozen=True, slots=True)
class UserLimits:
    """A user's own limits; None means "the server's default" (`Settings.user_*`)."""

    #: Workflows RUNNING at once.
    max_workflows: int | None = None
    #: Actions claimed, submitted or running at once (dispatch waits beyond it).
    max_in_flight_actions: int | None = None
    #: Workflow submissions a minute (a token bucket, kept per node).
    submissions_per_minute: int | None = None
    #: Bytes of datasets on disk the user's workflows produced (`Store.bytes_produced_by`):
    #: at or past it new workflows are refused, and actions fail to start, until the user
    #: deletes some.
    max_storage_bytes: int | None = None


NO_LIMITS = UserLimits()


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    #: sha256 hex of the bearer token; tokens themselves are never stored.
    token_hash: str
    is_admin: bool
    created_at: datetime
    #: Overrides of the server-wide limits.
    limits: UserLimits = NO_LIMITS


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A recurring workflow (rules in `pingo.schedules`)."""

    id: str
    owner: str
    name: str
    #: The schedule as its owner defined it (cron, timezone, workflow, webhooks with
    #: their secrets, …), as JSON; `pingo.schedules.parse_spec` reads it.
    spec: Mapping[str, Any]
    paused: bool
    #: The next tick not yet claimed; None once the schedule ended.
    next_fire_at: datetime | None
    #: A tick claimed but not yet settled (submitted, skipped or failed); it blocks
    #: further claims until then, and a node may take it over once the claim expired.
    pending_tick_at: datetime | None
    claimed_by: str | None
    claim_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    version: int = 0


@dataclass(frozen=True, slots=True)
class ScheduleRunRecord:
    """What became of one tick of a schedule."""

    schedule_id: str
    tick_at: datetime
    #: "submitted", "skipped" or "failed".
    outcome: str
    recorded_at: datetime
    workflow_id: str | None = None
    #: Why a tick was skipped or failed.
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class WebhookDeliveryRecord:
    """One notification to send (or sent) to a webhook's URL."""

    id: str
    #: The user whose workflow or schedule named the webhook (who may read the log).
    owner: str
    workflow_id: str
    schedule_id: str | None
    url: str
    event: str
    #: The exact bytes that are signed and sent.
    body: bytes
    #: "pending", "delivered" or "failed" (attempts spent).
    state: str
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    last_status: int | None = None
    last_error: str | None = None
    claimed_by: str | None = None
    claim_expires_at: datetime | None = None
    version: int = 0


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    #: Opaque; pass it back to get the next page. None on the last page.
    next_cursor: str | None


class Finished(NamedTuple):
    """What `Store.finish_action` did: the FINISHED record, the children it made READY,
    and the actions still attached to it (read after the finish, when asked)."""

    action: ActionRecord
    released: list[ActionRecord]
    attached: list[ActionRecord]


# ------------------------------------------------------------------ writes and changes


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    """A dataset that a planned workflow will compute.

    Persisting creates it in `state`, or, when it exists, moves it to `state`
    if it is DELETED or being computed with a weaker target
    (TO_DELETE < TO_STORE < TO_LEAF), and otherwise leaves its state alone.
    `claims` are added either way.

    A DELETED dataset moved this way is being computed again by this plan: it
    also takes the plan's `path`, `producer_*` and `is_managed`, and loses its
    `size_bytes`, `digest` and `stored_at` (its files are gone). Its history (`compute_s`,
    `use_count`, `last_used_at`, `pinned`) stays.
    """

    id: str
    state: DatasetState
    path: str
    scope: str
    action_type: str
    definition: Mapping[str, Any]
    parents: tuple[str, ...]
    producer_workflow_id: str
    producer_action_id: int
    is_managed: bool
    claims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkflowPlan:
    """Everything planning decided, persisted by `Store.create_workflow` in one call."""

    workflow: WorkflowRecord
    actions: tuple[ActionRecord, ...]
    datasets: tuple[DatasetPlan, ...]
    #: `persist_plan` refuses the plan (`errors.PlanExpired`) once the store's clock is
    #: past this: its planning took so long that the deletor may have released the
    #: claims it took as orphans (`Settings.plan_deadline_s`). None: no deadline.
    deadline_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Persisted:
    """What `Store.persist_plan` wrote."""

    workflow: WorkflowRecord
    #: The plan's actions that the store persisted sharing another workflow's computation
    #: of their dataset instead of computing it: their records as written
    #: (`rules.as_sharer`; the history the store opened aside).
    shared: tuple[ActionRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class _Changes:
    def items(self) -> Iterator[tuple[str, Any]]:
        """The fields to set, skipping those left as `KEEP`."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not KEEP:
                yield f.name, value


@dataclass(frozen=True, slots=True)
class ActionChanges(_Changes):
    attempts: int | _Keep = KEEP
    owner: str | _Keep | None = KEEP
    lease_expires_at: datetime | _Keep | None = KEEP
    not_before: datetime | _Keep | None = KEEP
    external_id: str | _Keep | None = KEEP
    error: str | _Keep | None = KEEP
    started_at: datetime | _Keep | None = KEEP
    finished_at: datetime | _Keep | None = KEEP
    runtime_s: float | _Keep | None = KEEP


@dataclass(frozen=True, slots=True)
class DatasetChanges(_Changes):
    size_bytes: int | _Keep | None = KEEP
    digest: str | _Keep | None = KEEP
    compute_s: float | _Keep | None = KEEP
    stored_at: datetime | _Keep | None = KEEP
    path: str | _Keep = KEEP
    producer_workflow_id: str | _Keep = KEEP
    producer_action_id: int | _Keep = KEEP


@dataclass(frozen=True, slots=True)
class WorkflowChanges(_Changes):
    finished_at: datetime | _Keep | None = KEEP
    error: str | _Keep | None = KEEP


@dataclass(frozen=True, slots=True)
class ScheduleChanges(_Changes):
    paused: bool | _Keep = KEEP
    next_fire_at: datetime | _Keep | None = KEEP
    pending_tick_at: datetime | _Keep | None = KEEP
    claimed_by: str | _Keep | None = KEEP
    claim_expires_at: datetime | _Keep | None = KEEP


@dataclass(frozen=True, slots=True)
class DeliveryChanges(_Changes):
    state: str | _Keep = KEEP
    attempts: int | _Keep = KEEP
    next_attempt_at: datetime | _Keep = KEEP
    last_status: int | _Keep | None = KEEP
    last_error: str | _Keep | None = KEEP
    claimed_by: str | _Keep | None = KEEP
    claim_expires_at: datetime | _Keep | None = KEEP


# -------------------------------------------------------------------------- protocol


class Store(Protocol):
    """Pingo's state store. Open it with `pingo.store.open_store` as an async context manager."""

    clock: Clock

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def ping(self) -> None:
        """Return when the store answers; raise `StoreUnavailable` otherwise."""
        ...

    async def release_memory(self) -> None:
        """Give back the memory of this process's caches of the store (SQLite's page
        cache), which refill on demand: after a big workflow, so that the server's
        resident memory comes back down (issue 13). Nothing is lost."""
        ...

    # ---- workflows

    async def create_workflow(self, plan: WorkflowPlan) -> WorkflowRecord:
        """`persist_plan`, returning only the workflow."""
        ...

    async def persist_plan(self, plan: WorkflowPlan) -> Persisted:
        """Persist a planned workflow: its record, its actions, its datasets, their claims.

        An action that would compute a dataset (`rules.may_share`) which another
        workflow's action, not ended, is computing when the plan lands (TO_STORE or
        TO_LEAF before this plan merges into it) is persisted sharing that computation
        (`rules.producer_to_share`, `rules.as_sharer`), in the same atomic step that
        merges the dataset: two plans of one dataset written at the same moment, on
        one node or several, leave exactly one computing it. The caller settles the
        shared actions it gets back (their producer may end at any time).

        Raises `Conflict` when the owner already has a workflow with the same idempotency
        key, `PlanExpired` (writing nothing) when the clock is past the plan's
        `deadline_at`: in the write transaction (SQLite), the same step of the event loop
        (memory), or right before the workflow's document is written (MongoDB).
        """
        ...

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow, or None."""
        ...

    async def find_workflow_by_idempotency_key(self, owner: str, key: str) -> WorkflowRecord | None:
        """The owner's workflow submitted with `key`, or None."""
        ...

    async def find_workflow_ids(
        self, prefix: str, *, owner: str | None = None, limit: int = 2
    ) -> list[str]:
        """Ids that start with `prefix` of workflows (owned by `owner`, if given), in id order,
        at most `limit` (see `pingo.store.lookup`)."""
        ...

    async def list_unwritten_workflows(self, *, limit: int = 100) -> list[str]:
        """Ids of RUNNING workflows whose plan was not written whole, lowest first, at
        most `limit`: `persist_plan` stored the workflow's record, then stopped (its node
        died, a write failed) before the last of its actions. Only MongoDB, which has no
        transaction, can leave one; the other stores write a plan at once and return []."""
        ...

    async def list_workflows(
        self,
        *,
        owner: str | None = None,
        state: WorkflowState | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[WorkflowRecord]:
        """Workflows matching every filter given, newest first."""
        ...

    async def transition_workflow(
        self,
        workflow_id: str,
        expected: Collection[WorkflowState],
        new: WorkflowState,
        changes: WorkflowChanges = WorkflowChanges(),
    ) -> WorkflowRecord | None:
        """Compare-and-set: move the workflow to `new` if its state is in `expected`."""
        ...

    # ---- actions

    async def get_action(self, workflow_id: str, action_id: int) -> ActionRecord | None:
        """The action, or None."""
        ...

    async def get_action_by_callback(self, callback_id: str) -> ActionRecord | None:
        """The action whose callback id is `callback_id`, or None."""
        ...

    async def get_action_and_dataset_by_callback(
        self, callback_id: str
    ) -> tuple[ActionRecord, DatasetRecord | None] | None:
        """`get_action_by_callback`, and the dataset the action computes (`get_dataset`
        of its `dataset_id`, None if gone), in one call: what every success reads first.
        The two reads need not be one snapshot."""
        ...

    async def list_actions(
        self, workflow_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[ActionRecord]:
        """The workflow's actions in ascending action id: every one, or a page of at most
        `limit` with ids above `after` (a big workflow read a page at a time, issue 13)."""
        ...

    async def list_planned_actions(self, workflow_id: str) -> list[PlannedAction]:
        """Planning's decision for each action of the workflow, in action id order (cheap:
        none of the action's documents is read)."""
        ...

    async def twin_datasets(self, workflow_id: str) -> frozenset[str]:
        """The datasets that more than one action of the workflow computes (reused ones
        aside): the only ones whose actions can be twins (`reuse.TwinFinder`). Usually
        none; a big workflow's document asks first, then keeps only these (issue 13)."""
        ...

    async def list_actions_in_states(
        self,
        states: Collection[ActionState],
        *,
        lease_expired: bool = False,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        """Actions in any of `states` (with a lease that expired, if asked), oldest update first."""
        ...

    async def count_actions(self, workflow_id: str) -> dict[ActionState, int]:
        """How many of the workflow's actions are in each state (states with none omitted)."""
        ...

    async def has_actions_in(self, workflow_id: str, states: Collection[ActionState]) -> bool:
        """Whether any of the workflow's actions is in one of `states`.

        Cheaper than `count_actions` where a backend counts by scanning (MongoDB):
        the outcome service asks it after every action to know whether work is left.
        """
        ...

    async def transition_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = ActionChanges(),
        *,
        if_owner: str | None = None,
        if_attempt: int | None = None,
    ) -> ActionRecord | None:
        """Compare-and-set on state (and owner, attempt when given); None when another won."""
        ...

    async def transition_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = ActionChanges(),
    ) -> list[ActionRecord]:
        """Move every action of the workflow in `expected` to `new`, each by its own CAS."""
        ...

    async def kill_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        changes: ActionChanges = ActionChanges(),
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        """Kill up to `limit` of the workflow's actions in `expected`, lowest ids first.

        Each action is its own compare-and-set to KILLED. For every action killed,
        in the same call: its claim (`claim_key`) is removed from each dataset in
        its `inputs`, and the dataset it was computing (in a `DATASET_COMPUTING`
        state, with this action as its producer) becomes DELETED. Returns the
        killed records in ascending action id; fewer than `limit` means none was
        left. A big workflow is killed by calling it until then: one bounded
        batch per call, so no call holds the store (or the caller) for long. The
        memory and SQLite backends do each batch atomically (one transaction);
        MongoDB as ordered steps, the compare-and-sets first.
        """
        ...

    async def claim_actions(
        self,
        node_id: str,
        limit: int,
        lease_s: float,
        *,
        max_in_flight: int | None = None,
        quotas: Mapping[str, int] | None = None,
    ) -> list[ActionRecord]:
        """Claim up to `limit` actions for `node_id`, oldest first, each by CAS.

        Claimable: READY whose `not_before` has passed, or PROCESSING whose lease
        expired. Claimed actions are PROCESSING, owned by `node_id`, leased for `lease_s`.
        A READY action is skipped (it stays READY) while its workflow's owner has as
        many actions in flight (`ACTION_ACTIVE`, counted in the store) as their
        `UserLimits.max_in_flight_actions`, else `max_in_flight` (None: no cap).
        With `quotas` (action type → how many this node can start now), at most
        `quotas[type]` actions of each type are claimed, and none of a type not
        named: the rest stays claimable by other nodes.
        """
        ...

    async def watch_ready(self, on_ready: Callable[[], None]) -> None:
        """Call `on_ready` whenever any writer may have made an action READY, until cancelled.

        Raises `Unsupported` at once when the backend cannot push such events
        (SQLite, memory, a MongoDB without change streams): callers poll instead.
        """
        ...

    async def renew_leases(
        self, node_id: str, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> int:
        """Extend the leases `node_id` holds on `keys`; return how many it still held.

        Held: owned by `node_id` in PROCESSING, SUBMITTED or RUNNING (even if the
        lease expired, as long as nobody reclaimed it). A key given twice counts once.
        """
        ...

    async def release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        """Remove a finished parent from each child's waiting set, atomically per child.

        Children left with nothing to wait for move WAITING → READY; those are returned.
        Releasing twice changes nothing the second time.
        """
        ...

    async def finish_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        changes: ActionChanges = ActionChanges(),
        *,
        if_attempt: int | None = None,
        if_waiting_on: int | None = None,
        attached_limit: int = 0,
        stored: DatasetMove | None = None,
    ) -> Finished | None:
        """Compare-and-set the action to FINISHED, then drop its claims and release its children.

        With `stored`, that dataset's compare-and-set (`transition_dataset`, its event
        included) is made first, in the same transaction: a success stores its output
        and finishes in one write. If either compare-and-set loses, neither changes
        anything and None is returned; on MongoDB the dataset's move stays when the
        action's loses, as two calls would leave it.

        With `if_waiting_on`, the compare-and-set also requires that id in its
        `waiting_on` (a shared action finishes only while it still waits for its producer).
        None when another writer won the compare-and-set; nothing else changes then.
        Otherwise, in the same call, the action's claim (`claim_key`) is removed from
        every dataset in its `inputs` and it is released from each of its `children`
        as `release_parent` does; returns the finished record, the children that
        became READY and, read after the compare-and-set, the first `attached_limit`
        actions attached to it as `list_attached_actions(workflow_id, action_id)`
        lists them (none when 0: a success settles them, and saves a call). The
        memory and SQLite backends do all of it atomically; the MongoDB backend does
        it as ordered single-document steps (see there).
        """
        ...

    async def list_attached_actions(
        self,
        producer_workflow_id: str | None = None,
        producer_action_id: int | None = None,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        """Actions still waiting for the action they share with (`ActionRecord.is_attached`).

        Those sharing with an action of `producer_workflow_id` (and with that action, if
        `producer_action_id` is given), or with any action when no producer is given;
        ordered by (workflow id, action id), at most `limit`.
        """
        ...

    # ---- datasets

    async def get_dataset(self, dataset_id: str) -> DatasetRecord | None:
        """The dataset, or None."""
        ...

    async def get_datasets(self, dataset_ids: Collection[str]) -> dict[str, DatasetRecord]:
        """The datasets that exist among `dataset_ids`, by id."""
        ...

    async def find_dataset_ids(
        self, prefix: str, *, scopes: Collection[str] | None = None, limit: int = 2
    ) -> list[str]:
        """Ids that start with `prefix` of datasets (in one of `scopes`, if given), in id
        order, at most `limit` (see `pingo.store.lookup`)."""
        ...

    async def list_datasets(
        self,
        *,
        state: DatasetState | None = None,
        scopes: Collection[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[DatasetRecord]:
        """Datasets (in `state`, and in one of the sharing `scopes`, if given), newest first.

        The cursor is the position of the page's last row: filtered here, in the store,
        it never names a dataset outside `scopes` (a caller filtering after the page
        would hand out a cursor naming one)."""
        ...

    async def list_child_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 1000
    ) -> list[DatasetRecord]:
        """Datasets computed from one of `dataset_ids` (one of their `parents`), in id
        order, at most `limit`: a lineage's next generation down."""
        ...

    async def find_workflows_with_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 100
    ) -> list[str]:
        """Ids of the workflows with an action whose dataset is one of `dataset_ids` (it
        computed, shared, reused or did not need it), highest id first (the planner's ids
        sort by submission time, so newest first), at most `limit`."""
        ...

    async def transition_dataset(
        self,
        dataset_id: str,
        expected: Collection[DatasetState],
        new: DatasetState,
        changes: DatasetChanges = DatasetChanges(),
        *,
        if_unclaimed: bool = False,
        event: NewEvent | None = None,
    ) -> DatasetRecord | None:
        """Compare-and-set on state (and on having no claims, if asked).

        `event` is appended only if the dataset moved: in the same transaction where the
        store has them (SQLite, memory), so a node that dies between the two never leaves
        a dataset stored with no `dataset.stored` in its owner's feed; on MongoDB right
        after, and a failure to append it is logged, not raised (the dataset moved).
        """
        ...

    async def add_dataset_claim(
        self, dataset_id: str, claim: str, allowed: Collection[DatasetState]
    ) -> DatasetRecord | None:
        """Add `claim` if the dataset is in an `allowed` state; None when it moved on."""
        ...

    async def remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        """Remove `claim` (idempotent); None when the dataset does not exist."""
        ...

    async def record_dataset_uses(self, dataset_ids: Collection[str]) -> int:
        """Count one more use of each dataset named (once however often it is named), now,
        in one write; return how many of them exist."""
        ...

    async def set_dataset_pinned(self, dataset_id: str, pinned: bool) -> DatasetRecord | None:
        """Pin (never evicted by retention) or unpin the dataset; None when it does not exist."""
        ...

    async def list_claimed_datasets(
        self, *, after: str | None = None, limit: int = 100
    ) -> list[DatasetRecord]:
        """Datasets holding at least one claim, whatever their state, in id order: the
        first `limit` whose id is greater than `after` (the last one's id is the next
        page's `after`). For the deletor's sweep of claims no one will release."""
        ...

    async def list_deletable_datasets(
        self, stale_s: float, limit: int = 100
    ) -> list[DatasetRecord]:
        """For the deletor: STORED_TO_DELETE with no claims, and PROCESSING or
        DELETING not updated for `stale_s` (a deletor died)."""
        ...

    async def list_retention_candidates(self) -> list[DatasetRecord]:
        """For retention: every STORED dataset (pinned and claimed included; the caller filters)."""
        ...

    async def bytes_by_state(self) -> dict[DatasetState, int]:
        """Total `size_bytes` per dataset state (states with no dataset omitted)."""
        ...

    async def bytes_produced_by(self, owner: str) -> int:
        """Total `size_bytes` of the datasets whose files take storage
        (`DATASET_USING_STORAGE`: until the deletor removed them) and whose producing
        workflow is `owner`'s: what a storage quota counts."""
        ...

    # ---- events

    async def append_event(
        self,
        kind: str,
        *,
        dataset_id: str | None = None,
        workflow_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> EventRecord:
        """Record an event, stamped now, with the next sequence number."""
        ...

    async def list_events(
        self,
        *,
        kind: str | None = None,
        dataset_id: str | None = None,
        owner: str | None = None,
        before_seq: int | None = None,
        after_seq: int | None = None,
        limit: int = 100,
    ) -> list[EventRecord]:
        """Events matching every filter given, newest first; oldest first when
        `after_seq` is given (a feed following what came since)."""
        ...

    # ---- users

    async def create_user(self, user: UserRecord) -> UserRecord:
        """Create the user; raise `Conflict` if the name is taken."""
        ...

    async def get_user(self, name: str) -> UserRecord | None:
        """The user, or None."""
        ...

    async def get_user_by_token_hash(self, token_hash: str) -> UserRecord | None:
        """The user whose token hashes to `token_hash`, or None."""
        ...

    async def list_users(self) -> list[UserRecord]:
        """Every user, by name."""
        ...

    async def delete_user(self, name: str) -> bool:
        """Delete the user; False when there was none."""
        ...

    async def set_user_limits(self, name: str, limits: UserLimits) -> UserRecord | None:
        """Replace the user's limit overrides; None when there is no such user."""
        ...

    async def count_running_workflows(self, owner: str) -> int:
        """How many of `owner`'s workflows are RUNNING (not yet terminal)."""
        ...

    # ---- schedules

    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        """Persist a new schedule; raise `Conflict` if its id exists."""
        ...

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None."""
        ...

    async def list_schedules(
        self, *, owner: str | None = None, limit: int = 100
    ) -> list[ScheduleRecord]:
        """Schedules (of `owner`, if given), newest first."""
        ...

    async def list_due_schedules(
        self,
        now: datetime,
        node_id: str,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
    ) -> list[ScheduleRecord]:
        """Schedules with a tick to act on, soonest first: not paused with
        `next_fire_at <= now`, or with a pending tick whose claim expired or is
        held by `node_id`.

        `after` pages on: given the `(next_fire_at, id)` of the last schedule without a
        pending tick that a page held, only schedules without a pending tick that sort
        after it, by `(next_fire_at, id)` (the pending ones were on the first page)."""
        ...

    async def update_schedule(
        self, schedule_id: str, expected_version: int, changes: ScheduleChanges
    ) -> ScheduleRecord | None:
        """Compare-and-set on the version; None when another writer changed it first."""
        ...

    async def update_schedules(
        self, updates: Sequence[tuple[str, int, ScheduleChanges]]
    ) -> list[ScheduleRecord | None]:
        """`update_schedule` for each `(schedule_id, expected_version, changes)`, in one
        store call (a scheduler pass claims every due tick at once); results in order."""
        ...

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule and its runs; False when there was none."""
        ...

    async def record_schedule_run(self, run: ScheduleRunRecord) -> ScheduleRunRecord:
        """Record a tick's outcome once: the first record of a tick wins and is returned."""
        ...

    async def list_schedule_runs(
        self, schedule_id: str, limit: int = 100
    ) -> list[ScheduleRunRecord]:
        """The schedule's runs, latest tick first."""
        ...

    # ---- webhook deliveries

    async def create_deliveries(self, deliveries: Sequence[WebhookDeliveryRecord]) -> None:
        """Persist new deliveries; one whose id exists is left as it is (idempotent)."""
        ...

    async def claim_deliveries(
        self, node_id: str, now: datetime, limit: int, lease_s: float
    ) -> list[WebhookDeliveryRecord]:
        """Claim pending deliveries due by `now` (unclaimed or with an expired claim), by CAS."""
        ...

    async def update_delivery(
        self, delivery_id: str, expected_version: int, changes: DeliveryChanges
    ) -> WebhookDeliveryRecord | None:
        """Compare-and-set on the version; None when another writer changed it first."""
        ...

    async def list_deliveries(
        self,
        *,
        owner: str | None = None,
        workflow_id: str | None = None,
        schedule_id: str | None = None,
        limit: int = 100,
    ) -> list[WebhookDeliveryRecord]:
        """Deliveries matching every filter given, newest first."""
        ...


def within_quotas(
    candidates: Iterable[C], limit: int, quotas: Mapping[str, int], type_of: Callable[[C], str]
) -> list[C]:
    """The first `candidates` (oldest first) that fit `limit` and each type's quota.

    The one rule every backend applies to `claim_actions(quotas=…)`: a type not named
    in `quotas` is never taken.
    """
    left = dict(quotas)
    chosen: list[C] = []
    for candidate in candidates:
        if len(chosen) >= limit:
            break
        action_type = type_of(candidate)
        if left.get(action_type, 0) > 0:
            left[action_type] -= 1
            chosen.append(candidate)
    return chosen


def open_quotas(quotas: Mapping[str, int] | None, limit: int) -> dict[str, int] | None:
    """The quotas worth a query: each capped at `limit`, zeros dropped (None: no quotas)."""
    if quotas is None:
        return None
    return {t: min(q, limit) for t, q in quotas.items() if q > 0}

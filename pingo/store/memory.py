"""An in-memory `Store`: the simulator's real store, and the reference backend.

Every method is a coroutine that never awaits, so under asyncio each call runs
to completion without interleaving: a compare-and-set is atomic without a
lock. It is not thread-safe, and nothing survives the process.

Records are frozen dataclasses kept as they are returned (no copying); a
change replaces the record. Actions and datasets are also indexed by state, in
the order of their last update, so the scraper and the deletor do not scan the
whole store on every pass.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from pingo import errors, states
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store import _common, _cursor, _room, rules, utcnow
from pingo.store.protocol import (
    ActionChanges,
    ActionRecord,
    Clock,
    DatasetChanges,
    DatasetMove,
    DatasetPlan,
    DatasetRecord,
    DeliveryChanges,
    EventRecord,
    Finished,
    NewEvent,
    Page,
    Persisted,
    PlannedAction,
    ScheduleChanges,
    ScheduleRecord,
    ScheduleRunRecord,
    UserLimits,
    UserRecord,
    WebhookDeliveryRecord,
    WorkflowChanges,
    WorkflowPlan,
    WorkflowRecord,
    _Changes,
    claim_key,
    open_quotas,
)
from pingo.store.rules import plan_upgrades, revived_fields

logger = logging.getLogger(__name__)

_NO_ACTION_CHANGES = ActionChanges()
_NO_DATASET_CHANGES = DatasetChanges()
_NO_WORKFLOW_CHANGES = WorkflowChanges()

ActionKey = tuple[str, int]
K = TypeVar("K")
S = TypeVar("S")
R = TypeVar("R")


def _shares_with(
    action: ActionRecord, producer_workflow_id: str | None, producer_action_id: int | None
) -> bool:
    """Whether `action` shares with the producer named (any producer when none is)."""
    if producer_workflow_id is None or action.shared_with is None:
        return producer_workflow_id is None
    if producer_action_id is not None:
        return action.shared_with == claim_key(producer_workflow_id, producer_action_id)
    return action.shared_with.startswith(producer_workflow_id + "/")


def is_lease_expired(expires_at: datetime | None, now: datetime) -> bool:
    """A lease is expired from its expiry instant on; no lease never expires."""
    return expires_at is not None and expires_at <= now


def _merge_claims(existing: Iterable[str], added: Iterable[str]) -> tuple[str, ...]:
    merged = dict.fromkeys(existing)
    merged.update(dict.fromkeys(added))
    return tuple(merged)


def _action_age(record: ActionRecord) -> tuple[datetime, str, int]:
    return (record.updated_at, record.workflow_id, record.action_id)


def _dataset_age(record: DatasetRecord) -> tuple[datetime, str]:
    return (record.updated_at, record.id)


class _StateIndex(Generic[K, S]):
    """Keys by state, each state's keys in the order they were last updated.

    The order is the `updated_at` order as long as the clock never goes back;
    when it does (a test's clock), the state is marked unordered and readers sort.
    """

    __slots__ = ("_keys", "_last", "_ordered")

    def __init__(self) -> None:
        self._keys: dict[S, dict[K, None]] = {}
        self._last: dict[S, datetime] = {}
        self._ordered: dict[S, bool] = {}

    def add(self, state: S, key: K, updated_at: datetime) -> None:
        keys = self._keys.get(state)
        if keys is None:
            keys = self._keys[state] = {}
            self._ordered[state] = True
            self._last[state] = updated_at
        elif updated_at >= self._last[state]:
            self._last[state] = updated_at
        else:
            self._ordered[state] = False
        keys[key] = None

    def remove(self, state: S, key: K) -> None:
        keys = self._keys[state]
        del keys[key]
        if not keys:
            del self._keys[state], self._last[state], self._ordered[state]

    def keys(self, state: S) -> Collection[K]:
        return self._keys.get(state, {}).keys()

    def ordered(self, state: S) -> bool:
        return self._ordered.get(state, True)

    def count(self, state: S) -> int:
        return len(self._keys.get(state, ()))


def _settable(changes: _Changes) -> dict[str, Any]:
    """The fields `changes` sets, its times checked as the other backends' codec does."""
    updates = dict(changes.items())
    for value in updates.values():
        if isinstance(value, datetime):
            _cursor.require_aware(value)
    return updates


class MemoryStore:
    """The whole `Store` protocol in dictionaries."""

    def __init__(self, clock: Clock = utcnow) -> None:
        self.clock = clock
        self._workflows: dict[str, WorkflowRecord] = {}
        self._idempotency: dict[tuple[str, str], str] = {}
        self._actions: dict[ActionKey, ActionRecord] = {}
        self._actions_by_workflow: dict[str, list[int]] = {}
        #: Per workflow, how many actions are in each state (kept on every change).
        self._action_counts: dict[str, dict[ActionState, int]] = {}
        self._callbacks: dict[str, ActionKey] = {}
        self._action_states: _StateIndex[ActionKey, ActionState] = _StateIndex()
        self._datasets: dict[str, DatasetRecord] = {}
        self._dataset_states: _StateIndex[str, DatasetState] = _StateIndex()
        #: Total `size_bytes` by dataset state (kept on every change).
        self._bytes: dict[DatasetState, int] = {}
        self._events: list[EventRecord] = []
        self._users: dict[str, UserRecord] = {}
        self._token_hashes: dict[str, str] = {}
        self._schedules: dict[str, ScheduleRecord] = {}
        self._schedule_runs: dict[str, dict[datetime, ScheduleRunRecord]] = {}
        self._deliveries: dict[str, WebhookDeliveryRecord] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def ping(self) -> None:
        return None

    async def release_memory(self) -> None:
        return None  # everything here is the store's data, not a cache

    # ------------------------------------------------------------------ internals

    def _put_action(self, old: ActionRecord | None, new: ActionRecord) -> ActionRecord:
        # Every write of an action passes here, so the history is kept in one place:
        # opened on creation, extended when the state changes, at the update's time.
        if old is None:
            new = replace(new, history=rules.opening_history(new))
        elif old.state is not new.state:
            new = replace(new, history=rules.entered(old.history, new.state, new.updated_at))
        key = new.key
        counts = self._action_counts.setdefault(new.workflow_id, {})
        if old is not None:
            self._action_states.remove(old.state, key)
            counts[old.state] -= 1
        self._action_states.add(new.state, key, new.updated_at)
        counts[new.state] = counts.get(new.state, 0) + 1
        self._actions[key] = new
        return new

    def _put_dataset(self, old: DatasetRecord | None, new: DatasetRecord) -> DatasetRecord:
        if old is not None:
            self._dataset_states.remove(old.state, new.id)
            self._bytes[old.state] -= old.size_bytes or 0
        self._dataset_states.add(new.state, new.id, new.updated_at)
        self._bytes[new.state] = self._bytes.get(new.state, 0) + (new.size_bytes or 0)
        self._datasets[new.id] = new
        return new

    def _oldest_actions(
        self, state: ActionState, keep: Callable[[ActionRecord], bool], limit: int
    ) -> list[ActionRecord]:
        records = (self._actions[k] for k in self._action_states.keys(state))
        matching = (r for r in records if keep(r))
        if self._action_states.ordered(state):
            return list(itertools.islice(matching, limit))
        return heapq.nsmallest(limit, matching, key=_action_age)

    def _oldest_datasets(
        self, state: DatasetState, keep: Callable[[DatasetRecord], bool], limit: int | None
    ) -> list[DatasetRecord]:
        records = (self._datasets[k] for k in self._dataset_states.keys(state))
        matching = (r for r in records if keep(r))
        if self._dataset_states.ordered(state):
            return list(itertools.islice(matching, limit))
        found = sorted(matching, key=_dataset_age)
        return found if limit is None else found[:limit]

    @staticmethod
    def _page(
        records: Iterable[R],
        created_at: Callable[[R], datetime],
        item_id: Callable[[R], str],
        limit: int,
        cursor: str | None,
    ) -> Page[R]:
        if cursor is not None:
            position = _cursor.decode_cursor(cursor)
            records = (r for r in records if _cursor.is_after(created_at(r), item_id(r), position))
        found = heapq.nlargest(limit + 1, records, key=lambda r: (created_at(r), item_id(r)))
        items = tuple(found[:limit])
        more = len(found) > limit and items
        next_cursor = (
            _cursor.encode_cursor(created_at(items[-1]), item_id(items[-1])) if more else None
        )
        return Page(items=items, next_cursor=next_cursor)

    # ------------------------------------------------------------------ workflows

    async def create_workflow(self, plan: WorkflowPlan) -> WorkflowRecord:
        return (await self.persist_plan(plan)).workflow

    async def persist_plan(self, plan: WorkflowPlan) -> Persisted:
        # No await below: the checks, the sharing decision and the writes are one step.
        workflow = plan.workflow
        # Check everything before writing anything: the plan is persisted whole or not at all.
        if plan.deadline_at is not None and self.clock() > plan.deadline_at:
            raise errors.PlanExpired()
        if workflow.id in self._workflows:
            raise errors.Conflict(f"workflow {workflow.id} already exists")
        idem = (
            (workflow.owner, workflow.idempotency_key)
            if workflow.idempotency_key is not None
            else None
        )
        if idem is not None and idem in self._idempotency:
            raise errors.Conflict(
                f"{workflow.owner} already submitted a workflow with idempotency key "
                f"{workflow.idempotency_key!r}"
            )
        callbacks = {a.callback_id for a in plan.actions}
        if len(callbacks) != len(plan.actions) or not callbacks.isdisjoint(self._callbacks):
            raise errors.Conflict("an action's callback id is already in use")
        if len({a.action_id for a in plan.actions}) != len(plan.actions) or any(
            a.workflow_id != workflow.id for a in plan.actions
        ):
            raise errors.Conflict("the plan's actions do not have unique keys in the workflow")

        shared = rules.shared_actions(plan.actions, self._producers_to_share(plan))
        self._workflows[workflow.id] = workflow
        if idem is not None:
            self._idempotency[idem] = workflow.id
        for action in sorted(plan.actions, key=lambda a: a.action_id):
            action = self._put_action(None, shared.get(action.action_id, action))
            self._callbacks[action.callback_id] = action.key
        self._actions_by_workflow[workflow.id] = sorted(a.action_id for a in plan.actions)
        now = self.clock()
        for dataset in plan.datasets:
            self._persist_dataset(dataset, now)
        logger.info(
            "workflow %s created with %d actions",
            workflow.id,
            len(plan.actions),
            extra={"event": "workflow_created", "workflow_id": workflow.id},
        )
        return Persisted(workflow, tuple(self._actions[a.key] for a in shared.values()))

    def _producers_to_share(self, plan: WorkflowPlan) -> dict[str, str]:
        """Dataset id → the producer a plan's actions share (`rules.producer_to_share`)."""
        found: dict[str, str] = {}
        for dataset in plan.datasets:
            old = self._datasets.get(dataset.id)
            if old is None:
                continue
            producer = (old.producer_workflow_id, old.producer_action_id)
            record = self._actions.get(producer)
            key = rules.producer_to_share(
                plan.workflow.id, old.state, producer, None if record is None else record.state
            )
            if key is not None:
                found[dataset.id] = key
        return found

    def _persist_dataset(self, plan: DatasetPlan, now: datetime) -> None:
        old = self._datasets.get(plan.id)
        if old is None:
            self._put_dataset(
                None,
                DatasetRecord(
                    id=plan.id,
                    state=plan.state,
                    path=plan.path,
                    scope=plan.scope,
                    action_type=plan.action_type,
                    definition=plan.definition,
                    parents=plan.parents,
                    producer_workflow_id=plan.producer_workflow_id,
                    producer_action_id=plan.producer_action_id,
                    is_managed=plan.is_managed,
                    created_at=now,
                    updated_at=now,
                    claims=_merge_claims((), plan.claims),
                ),
            )
            return
        if plan_upgrades(old.state, plan.state):
            revived = old.state is DatasetState.DELETED
            new = replace(
                old,
                state=plan.state,
                claims=_merge_claims(old.claims, plan.claims),
                updated_at=now,
                version=old.version + 1,
            )
            if revived:
                new = replace(new, **revived_fields(plan))
            self._put_dataset(old, new)
        elif not set(plan.claims).issubset(old.claims):
            self._put_dataset(
                old,
                replace(
                    old,
                    claims=_merge_claims(old.claims, plan.claims),
                    updated_at=now,
                    version=old.version + 1,
                ),
            )

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        return self._workflows.get(workflow_id)

    async def find_workflow_by_idempotency_key(self, owner: str, key: str) -> WorkflowRecord | None:
        workflow_id = self._idempotency.get((owner, key))
        return None if workflow_id is None else self._workflows[workflow_id]

    async def list_unwritten_workflows(self, *, limit: int = 100) -> list[str]:
        return []  # a plan lands in one step of the event loop

    async def find_workflow_ids(
        self, prefix: str, *, owner: str | None = None, limit: int = 2
    ) -> list[str]:
        ids = (
            w.id
            for w in self._workflows.values()
            if w.id.startswith(prefix) and (owner is None or w.owner == owner)
        )
        return sorted(ids)[:limit]

    async def list_workflows(
        self,
        *,
        owner: str | None = None,
        state: WorkflowState | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[WorkflowRecord]:
        records: Iterable[WorkflowRecord] = self._workflows.values()
        if owner is not None:
            records = (w for w in records if w.owner == owner)
        if state is not None:
            records = (w for w in records if w.state is state)
        if name is not None:
            records = (w for w in records if w.name == name)
        return self._page(records, lambda w: w.created_at, lambda w: w.id, limit, cursor)

    async def transition_workflow(
        self,
        workflow_id: str,
        expected: Collection[WorkflowState],
        new: WorkflowState,
        changes: WorkflowChanges = _NO_WORKFLOW_CHANGES,
    ) -> WorkflowRecord | None:
        old = self._workflows.get(workflow_id)
        if old is None or old.state not in expected:
            _common.log_cas_lost(f"workflow {workflow_id}", new, workflow_id=workflow_id)
            return None
        record = replace(old, state=new, version=old.version + 1, **_settable(changes))
        self._workflows[workflow_id] = record
        return record

    # -------------------------------------------------------------------- actions

    async def get_action(self, workflow_id: str, action_id: int) -> ActionRecord | None:
        return self._actions.get((workflow_id, action_id))

    async def get_action_by_callback(self, callback_id: str) -> ActionRecord | None:
        key = self._callbacks.get(callback_id)
        return None if key is None else self._actions[key]

    async def get_action_and_dataset_by_callback(
        self, callback_id: str
    ) -> tuple[ActionRecord, DatasetRecord | None] | None:
        key = self._callbacks.get(callback_id)
        if key is None:
            return None
        action = self._actions[key]
        return action, self._datasets.get(action.dataset_id)

    async def list_actions(
        self, workflow_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[ActionRecord]:
        ids: Sequence[int] = self._actions_by_workflow.get(workflow_id, [])
        if after is not None:
            ids = ids[bisect.bisect_right(ids, after) :]
        if limit is not None:
            ids = ids[: max(limit, 0)]
        return [self._actions[(workflow_id, i)] for i in ids]

    async def list_planned_actions(self, workflow_id: str) -> list[PlannedAction]:
        return [
            PlannedAction(a.action_id, a.dataset_id, a.reused, a.reason)
            for a in await self.list_actions(workflow_id)
        ]

    async def twin_datasets(self, workflow_id: str) -> frozenset[str]:
        actions = await self.list_actions(workflow_id)
        computing = Counter(a.dataset_id for a in actions if not a.reused)
        return frozenset(d for d, n in computing.items() if n > 1)

    async def list_actions_in_states(
        self,
        states: Collection[ActionState],
        *,
        lease_expired: bool = False,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        now = self.clock()

        def keep(record: ActionRecord) -> bool:
            return not lease_expired or is_lease_expired(record.lease_expires_at, now)

        found = [r for s in set(states) for r in self._oldest_actions(s, keep, limit)]
        return heapq.nsmallest(limit, found, key=_action_age)

    async def count_actions(self, workflow_id: str) -> dict[ActionState, int]:
        counts = self._action_counts.get(workflow_id, {})
        return {state: n for state, n in counts.items() if n}

    async def has_actions_in(self, workflow_id: str, states: Collection[ActionState]) -> bool:
        counts = self._action_counts.get(workflow_id, {})
        return any(counts.get(state) for state in states)

    async def transition_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = _NO_ACTION_CHANGES,
        *,
        if_owner: str | None = None,
        if_attempt: int | None = None,
    ) -> ActionRecord | None:
        return self._transition_action(
            workflow_id, action_id, expected, new, changes, if_owner=if_owner, if_attempt=if_attempt
        )

    def _transition_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges,
        *,
        if_owner: str | None = None,
        if_attempt: int | None = None,
    ) -> ActionRecord | None:
        old = self._actions.get((workflow_id, action_id))
        if (
            old is None
            or old.state not in expected
            or (if_owner is not None and old.owner != if_owner)
            or (if_attempt is not None and old.attempts != if_attempt)
        ):
            _common.log_cas_lost(
                f"action {workflow_id}/{action_id}",
                new,
                workflow_id=workflow_id,
                action_id=action_id,
            )
            return None
        record = replace(
            old,
            state=new,
            updated_at=self.clock(),
            version=old.version + 1,
            **_settable(changes),
        )
        return self._put_action(old, record)

    async def transition_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = _NO_ACTION_CHANGES,
    ) -> list[ActionRecord]:
        moved = []
        for action_id in self._actions_by_workflow.get(workflow_id, ()):
            record = await self.transition_action(workflow_id, action_id, expected, new, changes)
            if record is not None:
                moved.append(record)
        return moved

    async def kill_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        changes: ActionChanges = _NO_ACTION_CHANGES,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        # No await from here on: the batch is one atomic step under asyncio.
        killed: list[ActionRecord] = []
        for action_id in self._actions_by_workflow.get(workflow_id, ()):
            if len(killed) >= limit:
                break
            current = self._actions.get((workflow_id, action_id))
            if current is None or current.state not in expected:
                continue
            record = self._transition_action(
                workflow_id, action_id, expected, ActionState.KILLED, changes
            )
            if record is not None:
                killed.append(record)
        for record in killed:
            claim = claim_key(workflow_id, record.action_id)
            for dataset_id in dict.fromkeys(record.inputs.values()):
                self._remove_dataset_claim(dataset_id, claim)
            dataset = self._datasets.get(record.dataset_id)
            if (
                dataset is not None
                and dataset.state in states.DATASET_COMPUTING
                and (dataset.producer_workflow_id, dataset.producer_action_id) == record.key
            ):
                self._put_dataset(
                    dataset,
                    replace(
                        dataset,
                        state=DatasetState.DELETED,
                        updated_at=self.clock(),
                        version=dataset.version + 1,
                    ),
                )
        return killed

    async def claim_actions(
        self,
        node_id: str,
        limit: int,
        lease_s: float,
        *,
        max_in_flight: int | None = None,
        quotas: Mapping[str, int] | None = None,
    ) -> list[ActionRecord]:
        wanted = open_quotas(quotas, limit)
        if limit <= 0 or wanted == {}:
            return []
        now = self.clock()

        def of_type(record: ActionRecord) -> bool:
            return wanted is None or record.type in wanted

        def ready_of(action_type: str | None, count: int) -> list[ActionRecord]:
            return self._oldest_actions(
                ActionState.READY,
                lambda r: (
                    (r.not_before is None or r.not_before <= now)
                    and (action_type is None or r.type == action_type)
                ),
                count,
            )

        room = self._in_flight_room(max_in_flight)
        if room.capped:
            ready = self._within_room(room, now, limit, wanted)
        elif wanted is None:
            ready = ready_of(None, limit)
        else:
            ready = [r for action_type, q in wanted.items() for r in ready_of(action_type, q)]
        expired = self._oldest_actions(
            ActionState.PROCESSING,
            lambda r: is_lease_expired(r.lease_expires_at, now) and of_type(r),
            limit,
        )
        oldest = sorted(ready + expired, key=_action_age)
        idle = []
        if room.capped:
            served = {self._workflows[r.workflow_id].owner for r in ready}
            idle = self._idle_oldest(room, served, now, wanted)
        chosen = _room.idle_first(
            room,
            oldest,
            idle,
            limit,
            wanted,
            owner_of=lambda r: self._workflows[r.workflow_id].owner,
            age=_action_age,
            type_of=lambda r: r.type,
            key=lambda r: r.key,
        )
        lease = now + timedelta(seconds=lease_s)
        claimed = []
        for old in chosen:
            record = replace(
                old,
                state=ActionState.PROCESSING,
                owner=node_id,
                lease_expires_at=lease,
                updated_at=now,
                version=old.version + 1,
            )
            claimed.append(self._put_action(old, record))
        return claimed

    def _within_room(
        self,
        room: _room.InFlightRoom,
        now: datetime,
        limit: int,
        wanted: Mapping[str, int] | None,
    ) -> list[ActionRecord]:
        """The oldest claimable READY actions whose owners have room and whose type has
        quota left (`wanted`, None: any type), using both up."""
        records = (self._actions[k] for k in self._action_states.keys(ActionState.READY))
        ready = sorted(
            (
                r
                for r in records
                if (r.not_before is None or r.not_before <= now)
                and (wanted is None or r.type in wanted)
            ),
            key=_action_age,
        )
        left = None if wanted is None else dict(wanted)
        kept: list[ActionRecord] = []
        for record in ready:
            if len(kept) >= limit:
                break
            if left is not None and left[record.type] <= 0:
                continue
            if not room.take(self._workflows[record.workflow_id].owner):
                continue
            if left is not None:
                left[record.type] -= 1
            kept.append(record)
        return kept

    def _idle_oldest(
        self,
        room: _room.InFlightRoom,
        served: Collection[str],
        now: datetime,
        wanted: Mapping[str, int] | None,
    ) -> list[ActionRecord]:
        """The oldest claimable READY action (of a `wanted` type) of each owner of a
        RUNNING workflow with nothing in flight, oldest first (`_room.idle_first`), but
        those `served` already (whose oldest is among the claim's candidates)."""
        first: dict[str, ActionRecord] = {}
        for key in self._action_states.keys(ActionState.READY):
            record = self._actions[key]
            workflow = self._workflows[record.workflow_id]
            if (
                workflow.state is WorkflowState.RUNNING
                and room.in_flight[workflow.owner] == 0
                and workflow.owner not in served
                and (record.not_before is None or record.not_before <= now)
                and (wanted is None or record.type in wanted)
            ):
                held = first.get(workflow.owner)
                if held is None or _action_age(record) < _action_age(held):
                    first[workflow.owner] = record
        return sorted(first.values(), key=_action_age)

    def _in_flight_room(self, default: int | None) -> _room.InFlightRoom:
        caps = {
            u.name: u.limits.max_in_flight_actions
            for u in self._users.values()
            if u.limits.max_in_flight_actions is not None
        }
        room = _room.InFlightRoom(caps, default)
        if room.capped:
            for state in states.ACTION_ACTIVE:
                for key in self._action_states.keys(state):
                    room.in_flight[self._workflows[key[0]].owner] += 1
        return room

    async def watch_ready(self, on_ready: Callable[[], None]) -> None:
        raise errors.Unsupported("the in-memory store has no change events; poll")

    async def renew_leases(
        self, node_id: str, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> int:
        now = self.clock()
        lease = now + timedelta(seconds=lease_s)
        held = 0
        for key in dict.fromkeys(keys):  # a key given twice is held once
            old = self._actions.get(key)
            if old is None or old.owner != node_id or old.state not in states.ACTION_ACTIVE:
                continue
            self._put_action(
                old,
                replace(old, lease_expires_at=lease, updated_at=now, version=old.version + 1),
            )
            held += 1
        return held

    async def release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        return self._release_parent(workflow_id, parent_action_id, children)

    def _release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        now = self.clock()
        ready = []
        for child_id in children:
            old = self._actions.get((workflow_id, child_id))
            if old is None:
                continue
            waiting_on = tuple(p for p in old.waiting_on if p != parent_action_id)
            # A WAITING child with nothing left to wait for flips even when this parent
            # was released before (the Mongo backend's release is not one atomic step,
            # and a retried release completes one a crash interrupted).
            becomes_ready = not waiting_on and old.state is ActionState.WAITING
            if len(waiting_on) == len(old.waiting_on) and not becomes_ready:
                continue  # released before: nothing to do
            record = self._put_action(
                old,
                replace(
                    old,
                    waiting_on=waiting_on,
                    state=ActionState.READY if becomes_ready else old.state,
                    updated_at=now,
                    version=old.version + 1,
                ),
            )
            if becomes_ready:
                ready.append(record)
        return ready

    async def finish_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        changes: ActionChanges = _NO_ACTION_CHANGES,
        *,
        if_attempt: int | None = None,
        if_waiting_on: int | None = None,
        attached_limit: int = 0,
        stored: DatasetMove | None = None,
    ) -> Finished | None:
        # No await from here on: the steps are one atomic step under asyncio.
        current = self._actions.get((workflow_id, action_id))
        if if_waiting_on is not None and (
            current is None or if_waiting_on not in current.waiting_on
        ):
            return None
        if stored is not None and self._movable(stored) is None:
            return None
        finished = self._transition_action(
            workflow_id, action_id, expected, ActionState.FINISHED, changes, if_attempt=if_attempt
        )
        if finished is None:
            return None
        if stored is not None:
            self._move_dataset(stored)  # checked movable above, with no await since
        claim = claim_key(workflow_id, action_id)
        for dataset_id in dict.fromkeys(finished.inputs.values()):
            self._remove_dataset_claim(dataset_id, claim)
        released = self._release_parent(workflow_id, action_id, finished.children)
        return Finished(finished, released, self._attached(workflow_id, action_id, attached_limit))

    async def list_attached_actions(
        self,
        producer_workflow_id: str | None = None,
        producer_action_id: int | None = None,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        return self._attached(producer_workflow_id, producer_action_id, limit)

    def _attached(
        self, producer_workflow_id: str | None, producer_action_id: int | None, limit: int
    ) -> list[ActionRecord]:
        if limit <= 0:
            return []
        found = [
            record
            for key in self._action_states.keys(ActionState.WAITING)
            if (record := self._actions[key]).is_attached
            and _shares_with(record, producer_workflow_id, producer_action_id)
        ]
        found.sort(key=lambda a: a.key)
        return found[:limit]

    # ------------------------------------------------------------------- datasets

    async def get_dataset(self, dataset_id: str) -> DatasetRecord | None:
        return self._datasets.get(dataset_id)

    async def find_dataset_ids(
        self, prefix: str, *, scopes: Collection[str] | None = None, limit: int = 2
    ) -> list[str]:
        ids = (
            d.id
            for d in self._datasets.values()
            if d.id.startswith(prefix) and (scopes is None or d.scope in scopes)
        )
        return sorted(ids)[:limit]

    async def get_datasets(self, dataset_ids: Collection[str]) -> dict[str, DatasetRecord]:
        found = {}
        for dataset_id in dataset_ids:
            record = self._datasets.get(dataset_id)
            if record is not None:
                found[dataset_id] = record
        return found

    async def list_child_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 1000
    ) -> list[DatasetRecord]:
        wanted = set(dataset_ids)
        found = [d for d in self._datasets.values() if wanted.intersection(d.parents)]
        return sorted(found, key=lambda d: d.id)[:limit]

    async def find_workflows_with_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 100
    ) -> list[str]:
        wanted = set(dataset_ids)
        found = {a.workflow_id for a in self._actions.values() if a.dataset_id in wanted}
        return sorted(found, reverse=True)[:limit]

    async def list_datasets(
        self,
        *,
        state: DatasetState | None = None,
        scopes: Collection[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[DatasetRecord]:
        records: Iterable[DatasetRecord]
        if state is None:
            records = self._datasets.values()
        else:
            records = (self._datasets[k] for k in self._dataset_states.keys(state))
        if scopes is not None:
            records = [d for d in records if d.scope in scopes]
        return self._page(records, lambda d: d.created_at, lambda d: d.id, limit, cursor)

    async def list_claimed_datasets(
        self, *, after: str | None = None, limit: int = 100
    ) -> list[DatasetRecord]:
        claimed = (
            d for d in self._datasets.values() if d.claims and (after is None or d.id > after)
        )
        return sorted(claimed, key=lambda d: d.id)[: max(0, limit)]

    async def transition_dataset(
        self,
        dataset_id: str,
        expected: Collection[DatasetState],
        new: DatasetState,
        changes: DatasetChanges = _NO_DATASET_CHANGES,
        *,
        if_unclaimed: bool = False,
        event: NewEvent | None = None,
    ) -> DatasetRecord | None:
        move = DatasetMove(dataset_id, frozenset(expected), new, changes, event)
        return self._move_dataset(move, if_unclaimed=if_unclaimed)

    def _movable(self, move: DatasetMove, *, if_unclaimed: bool = False) -> DatasetRecord | None:
        """The dataset `move` would move now, or None when its compare-and-set would lose."""
        old = self._datasets.get(move.dataset_id)
        if old is None or old.state not in move.expected or (if_unclaimed and old.claims):
            return None
        return old

    def _move_dataset(
        self, move: DatasetMove, *, if_unclaimed: bool = False
    ) -> DatasetRecord | None:
        old = self._movable(move, if_unclaimed=if_unclaimed)
        if old is None:
            _common.log_cas_lost(f"dataset {move.dataset_id}", move.new, dataset_id=move.dataset_id)
            return None
        record = replace(
            old,
            state=move.new,
            updated_at=self.clock(),
            version=old.version + 1,
            **_settable(move.changes),
        )
        moved = self._put_dataset(old, record)
        if move.event is not None:
            self._append_event(move.event)
        return moved

    def _update_dataset(self, old: DatasetRecord, **fields: Any) -> DatasetRecord:
        record = replace(old, updated_at=self.clock(), version=old.version + 1, **fields)
        return self._put_dataset(old, record)

    async def add_dataset_claim(
        self, dataset_id: str, claim: str, allowed: Collection[DatasetState]
    ) -> DatasetRecord | None:
        old = self._datasets.get(dataset_id)
        if old is None or old.state not in allowed:
            return None
        if claim in old.claims:
            return old
        return self._update_dataset(old, claims=(*old.claims, claim))

    async def remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        return self._remove_dataset_claim(dataset_id, claim)

    def _remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        old = self._datasets.get(dataset_id)
        if old is None or claim not in old.claims:
            return old
        return self._update_dataset(old, claims=tuple(c for c in old.claims if c != claim))

    async def record_dataset_uses(self, dataset_ids: Collection[str]) -> int:
        now = self.clock()
        found = [d for d in map(self._datasets.get, sorted(set(dataset_ids))) if d is not None]
        for old in found:
            self._update_dataset(old, use_count=old.use_count + 1, last_used_at=now)
        return len(found)

    async def set_dataset_pinned(self, dataset_id: str, pinned: bool) -> DatasetRecord | None:
        old = self._datasets.get(dataset_id)
        if old is None:
            return None
        if old.pinned == pinned:
            return old
        return self._update_dataset(old, pinned=pinned)

    async def list_deletable_datasets(
        self, stale_s: float, limit: int = 100
    ) -> list[DatasetRecord]:
        stale_before = self.clock() - timedelta(seconds=stale_s)

        def stale(record: DatasetRecord) -> bool:
            return record.updated_at <= stale_before

        found = [
            *self._oldest_datasets(DatasetState.STORED_TO_DELETE, lambda r: not r.claims, limit),
            *self._oldest_datasets(DatasetState.PROCESSING, stale, limit),
            *self._oldest_datasets(DatasetState.DELETING, stale, limit),
        ]
        return heapq.nsmallest(limit, found, key=_dataset_age)

    async def list_retention_candidates(self) -> list[DatasetRecord]:
        return self._oldest_datasets(DatasetState.STORED, lambda r: True, None)

    async def bytes_by_state(self) -> dict[DatasetState, int]:
        return {
            state: total
            for state, total in self._bytes.items()
            if self._dataset_states.count(state)
        }

    async def bytes_produced_by(self, owner: str) -> int:
        total = 0
        for state in states.DATASET_USING_STORAGE:
            for key in self._dataset_states.keys(state):
                record = self._datasets[key]
                producer = self._workflows.get(record.producer_workflow_id)
                if producer is not None and producer.owner == owner:
                    total += record.size_bytes or 0
        return total

    # --------------------------------------------------------------------- events

    async def append_event(
        self,
        kind: str,
        *,
        dataset_id: str | None = None,
        workflow_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> EventRecord:
        return self._append_event(NewEvent(kind, owner, workflow_id, dataset_id, payload))

    def _append_event(self, new: NewEvent) -> EventRecord:
        event = EventRecord(
            seq=len(self._events) + 1,
            kind=new.kind,
            at=self.clock(),
            dataset_id=new.dataset_id,
            workflow_id=new.workflow_id,
            payload=new.payload,
            owner=new.owner,
        )
        self._events.append(event)
        return event

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
        events: Iterable[EventRecord] = (
            self._events[max(after_seq, 0) :] if after_seq is not None else reversed(self._events)
        )
        if kind is not None:
            events = (e for e in events if e.kind == kind)
        if dataset_id is not None:
            events = (e for e in events if e.dataset_id == dataset_id)
        if owner is not None:
            events = (e for e in events if e.owner == owner)
        if before_seq is not None:
            events = (e for e in events if e.seq < before_seq)
        return list(itertools.islice(events, max(limit, 0)))

    # ---------------------------------------------------------------------- users

    async def create_user(self, user: UserRecord) -> UserRecord:
        if user.name in self._users:
            raise errors.Conflict(f"user {user.name!r} already exists")
        if user.token_hash in self._token_hashes:
            raise errors.Conflict("another user has the same token")
        self._users[user.name] = user
        self._token_hashes[user.token_hash] = user.name
        return user

    async def get_user(self, name: str) -> UserRecord | None:
        return self._users.get(name)

    async def get_user_by_token_hash(self, token_hash: str) -> UserRecord | None:
        name = self._token_hashes.get(token_hash)
        return None if name is None else self._users[name]

    async def list_users(self) -> list[UserRecord]:
        return [self._users[name] for name in sorted(self._users)]

    async def delete_user(self, name: str) -> bool:
        user = self._users.pop(name, None)
        if user is None:
            return False
        del self._token_hashes[user.token_hash]
        return True

    async def set_user_limits(self, name: str, limits: UserLimits) -> UserRecord | None:
        user = self._users.get(name)
        if user is None:
            return None
        self._users[name] = replace(user, limits=limits)
        return self._users[name]

    async def count_running_workflows(self, owner: str) -> int:
        return sum(
            1
            for w in self._workflows.values()
            if w.owner == owner and w.state not in states.WORKFLOW_TERMINAL
        )

    # ------------------------------------------------------------------ schedules

    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        if schedule.id in self._schedules:
            raise errors.Conflict(f"schedule {schedule.id!r} already exists")
        self._schedules[schedule.id] = schedule
        self._schedule_runs[schedule.id] = {}
        return schedule

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return self._schedules.get(schedule_id)

    async def list_schedules(
        self, *, owner: str | None = None, limit: int = 100
    ) -> list[ScheduleRecord]:
        found = [s for s in self._schedules.values() if owner is None or s.owner == owner]
        found.sort(key=lambda s: (s.created_at, s.id), reverse=True)
        return found[:limit]

    async def list_due_schedules(
        self,
        now: datetime,
        node_id: str,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
    ) -> list[ScheduleRecord]:
        def due(s: ScheduleRecord) -> bool:
            if after is not None:
                return (
                    s.pending_tick_at is None
                    and not s.paused
                    and s.next_fire_at is not None
                    and s.next_fire_at <= now
                    and (s.next_fire_at, s.id) > after
                )
            if s.pending_tick_at is not None:
                return s.claimed_by == node_id or is_lease_expired(s.claim_expires_at, now)
            return not s.paused and s.next_fire_at is not None and s.next_fire_at <= now

        found = [s for s in self._schedules.values() if due(s)]
        found.sort(key=lambda s: (s.pending_tick_at or s.next_fire_at or now, s.id))
        return found[:limit]

    async def update_schedule(
        self, schedule_id: str, expected_version: int, changes: ScheduleChanges
    ) -> ScheduleRecord | None:
        current = self._schedules.get(schedule_id)
        if current is None or current.version != expected_version:
            return None
        updated = replace(
            current, **_settable(changes), updated_at=self.clock(), version=current.version + 1
        )
        self._schedules[schedule_id] = updated
        return updated

    async def update_schedules(
        self, updates: Sequence[tuple[str, int, ScheduleChanges]]
    ) -> list[ScheduleRecord | None]:
        return [await self.update_schedule(i, v, c) for i, v, c in updates]

    async def delete_schedule(self, schedule_id: str) -> bool:
        self._schedule_runs.pop(schedule_id, None)
        return self._schedules.pop(schedule_id, None) is not None

    async def record_schedule_run(self, run: ScheduleRunRecord) -> ScheduleRunRecord:
        runs = self._schedule_runs.setdefault(run.schedule_id, {})
        return runs.setdefault(run.tick_at, run)

    async def list_schedule_runs(
        self, schedule_id: str, limit: int = 100
    ) -> list[ScheduleRunRecord]:
        runs = self._schedule_runs.get(schedule_id, {})
        return [runs[t] for t in sorted(runs, reverse=True)[:limit]]

    # --------------------------------------------------------- webhook deliveries

    async def create_deliveries(self, deliveries: Sequence[WebhookDeliveryRecord]) -> None:
        for delivery in deliveries:
            self._deliveries.setdefault(delivery.id, delivery)

    async def claim_deliveries(
        self, node_id: str, now: datetime, limit: int, lease_s: float
    ) -> list[WebhookDeliveryRecord]:
        due = sorted(
            (
                d
                for d in self._deliveries.values()
                if d.state == "pending"
                and d.next_attempt_at <= now
                and (d.claim_expires_at is None or d.claim_expires_at <= now)
            ),
            key=lambda d: (d.next_attempt_at, d.id),
        )[:limit]
        claimed = []
        for d in due:
            updated = replace(
                d,
                claimed_by=node_id,
                claim_expires_at=now + timedelta(seconds=lease_s),
                updated_at=now,
                version=d.version + 1,
            )
            self._deliveries[d.id] = updated
            claimed.append(updated)
        return claimed

    async def update_delivery(
        self, delivery_id: str, expected_version: int, changes: DeliveryChanges
    ) -> WebhookDeliveryRecord | None:
        current = self._deliveries.get(delivery_id)
        if current is None or current.version != expected_version:
            return None
        updated = replace(
            current, **_settable(changes), updated_at=self.clock(), version=current.version + 1
        )
        self._deliveries[delivery_id] = updated
        return updated

    async def list_deliveries(
        self,
        *,
        owner: str | None = None,
        workflow_id: str | None = None,
        schedule_id: str | None = None,
        limit: int = 100,
    ) -> list[WebhookDeliveryRecord]:
        found = [
            d
            for d in self._deliveries.values()
            if (owner is None or d.owner == owner)
            and (workflow_id is None or d.workflow_id == workflow_id)
            and (schedule_id is None or d.schedule_id == schedule_id)
        ]
        found.sort(key=lambda d: (d.created_at, d.id), reverse=True)
        return found[:limit]

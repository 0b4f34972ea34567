"""The MongoDB `Store`: PyMongo's native async client, no multi-document transactions.

Every compare-and-set is ONE `find_one_and_update` filtered on the document's
`_id` plus the expected state(s) (and owner, attempt, claims when asked), so a
transition is atomic on a standalone server and on a replica set alike, and
needs no multi-document transaction. Writes use the configured write concern
("majority" by default), so an acknowledged transition survives a primary
failover; PyMongo retries such a write once after a failover, and the server
applies it at most once.

The backend is tested against three servers: mongomock (in-process), the
`nx-27017` wire server (MongoDB's protocol on SQLite) and, when
`PINGO_TEST_MONGODB_URI` is set, a real `mongod`. Queries keep to the subset
all three implement alike; each formulation chosen because of a quirk says so
where it is used. The ones that shape the whole document layout:

- Times are stored as whole microseconds since the epoch (`*_at_us` integers),
  not as BSON dates. nx-27017 stores a datetime written by `$set` as a naive
  string (it binds it through sqlite3's default adapter), which then compares
  as text; integers compare the same everywhere, and microseconds round-trip
  exactly where BSON dates would truncate to milliseconds.
- Free-form JSON (a workflow's document, an action's definition, an event's
  payload) is stored as a JSON string: user keys such as `$ref` or `a.b` are
  not valid MongoDB field names everywhere, and nothing queries inside them.
- Keys built by the store never contain NUL: nx-27017 truncates strings there.

Query rules that follow from nx-27017 (each verified against it): an `$or` is
the only key of its filter or sits inside `$and` (it is spliced in without
parentheses otherwise); no `{field: null}` inside `$or`; "array contains x"
is `{field: x}`, "does not contain" is `$nin` (`$ne` compares the whole
array), "exactly [x]" is `$size` + `$all` (no array literals, no `$not`); no
`_id` in a compound index (every insert then fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import time
import uuid
from collections.abc import (
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar
from urllib.parse import unquote

import pymongo
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)
from pymongo.errors import ConfigurationError as MongoConfigurationError
from pymongo.write_concern import WriteConcern

from pingo import errors, states, untrusted
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store import _common, _cursor, _json, _room, lookup, rules, utcnow
from pingo.store.protocol import (
    HISTORY_LIMIT,
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
    StateEntry,
    UserLimits,
    UserRecord,
    WebhookDeliveryRecord,
    WorkflowChanges,
    WorkflowPlan,
    WorkflowRecord,
    claim_key,
    open_quotas,
)
from pingo.store.rules import plan_upgrades

logger = logging.getLogger(__name__)

Doc = dict[str, Any]
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

DEFAULT_DATABASE = "pingo"

_NO_ACTION_CHANGES = ActionChanges()
_NO_DATASET_CHANGES = DatasetChanges()
_NO_WORKFLOW_CHANGES = WorkflowChanges()

#: The longest `$in` list sent at once: nx-27017 turns each value into an SQL
#: parameter, and SQLite caps those (32,766); MongoDB caps a command at 16 MB.
_IN_CHUNK = 1000

#: A workflow document's mark while `persist_plan` writes its plan (see there): how
#: many actions the plan has.
_WRITING = "writing"
#: What `_end_writing` kills of the actions written to a workflow that ended while
#: they were being written: those not handed to an executor yet (claimed included,
#: whose SUBMITTED compare-and-set then fails), as an abort does.
_UNSTARTED = frozenset({ActionState.WAITING, ActionState.READY, ActionState.PROCESSING})

#: The server's error code for a unique index violation.
_DUPLICATE_KEY = 11000

#: How often persisting a dataset plan re-reads after losing a race before giving up.
_PLAN_RETRIES = 20

_AFTER = ReturnDocument.AFTER


# ----------------------------------------------------------------------- encoding


@dataclasses.dataclass(slots=True)
class _OwnedRoom(_room.InFlightRoom):
    """An in-flight room with the owners of the workflows it looked up: the in-flight
    counts' workflows are mostly those of the READY candidates, so a claim call asks
    for each workflow's owner once."""

    #: Workflow id → owner (a workflow's owner never changes).
    owners: dict[str, str] = dataclasses.field(default_factory=dict)


def _us(at: datetime) -> int:
    return _cursor.to_micros(at)


def _opt_us(at: datetime | None) -> int | None:
    return None if at is None else _us(at)


def _at(micros: int) -> datetime:
    return _cursor.from_micros(micros)


def _opt_at(micros: int | None) -> datetime | None:
    return None if micros is None else _cursor.from_micros(micros)


def _dump_json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else _json.dumps(value)


def _load_json(text: str | None) -> Any:
    return None if text is None else untrusted.loads(text)


def _idempotency(owner: str, key: str) -> str:
    # One string for the unique index: a compound (owner, key) index cannot skip
    # workflows without a key everywhere (mongomock ignores partialFilterExpression
    # when checking uniqueness), and a sparse single-field index can. JSON, not a
    # NUL separator: nx-27017 truncates strings at NUL.
    return json.dumps([owner, key], separators=(",", ":"))


def _action_id(workflow_id: str, action_id: int) -> str:
    return claim_key(workflow_id, action_id)


def _workflow_doc(record: WorkflowRecord) -> Doc:
    doc: Doc = {
        "_id": record.id,
        "id": record.id,  # the last sort key of listings (see _create_indexes)
        "name": record.name,
        "owner": record.owner,
        "state": record.state.value,
        "document": _json.dumps_document(record.document),
        "scope": record.scope,
        "on_failure": record.on_failure,
        "end_dataset_id": record.end_dataset_id,
        "created_at_us": _us(record.created_at),
        "finished_at_us": _opt_us(record.finished_at),
        "idempotency_key": record.idempotency_key,
        "rerun_of": record.rerun_of,
        "error": record.error,
        "version": record.version,
    }
    if record.idempotency_key is not None:
        # Absent (not null) without a key, so the sparse unique index skips it.
        doc["idempotency"] = _idempotency(record.owner, record.idempotency_key)
    return doc


def _workflow(doc: Doc) -> WorkflowRecord:
    return WorkflowRecord(
        id=doc["_id"],
        name=doc["name"],
        owner=doc["owner"],
        state=WorkflowState(doc["state"]),
        document=untrusted.stored_object(doc["document"]),
        scope=doc["scope"],
        on_failure=doc["on_failure"],
        end_dataset_id=doc.get("end_dataset_id"),
        created_at=_at(doc["created_at_us"]),
        finished_at=_opt_at(doc.get("finished_at_us")),
        idempotency_key=doc.get("idempotency_key"),
        rerun_of=doc.get("rerun_of"),
        error=doc.get("error"),
        version=doc.get("version", 0),
    )


def _action_doc(record: ActionRecord) -> Doc:
    return {
        "_id": _action_id(record.workflow_id, record.action_id),
        "workflow_id": record.workflow_id,
        "action_id": record.action_id,
        "name": record.name,
        "type": record.type,
        "state": record.state.value,
        "dataset_id": record.dataset_id,
        "reused": record.reused,
        "reason": record.reason,
        "definition": _dump_json(record.definition),
        # BSON keys are strings; parent ids come back as ints.
        "inputs": {str(parent): dataset for parent, dataset in record.inputs.items()},
        "waiting_on": list(record.waiting_on),
        "children": list(record.children),
        "callback_id": record.callback_id,
        "created_at_us": _us(record.created_at),
        "updated_at_us": _us(record.updated_at),
        "attempts": record.attempts,
        "max_attempts": record.max_attempts,
        "owner": record.owner,
        "lease_expires_at_us": _opt_us(record.lease_expires_at),
        "not_before_us": _opt_us(record.not_before),
        "ready_at_us": _ready_at_us(record.not_before),
        "external_id": record.external_id,
        "error": record.error,
        "started_at_us": _opt_us(record.started_at),
        "finished_at_us": _opt_us(record.finished_at),
        "runtime_s": record.runtime_s,
        "version": record.version,
        # Only when set: the sparse index then holds the few actions that share.
        **({} if record.shared_with is None else {"shared_with": record.shared_with}),
        "history": [_entry_doc(e.state, _us(e.at)) for e in rules.opening_history(record)],
    }


def _entry_doc(state: ActionState, at_us: int) -> Doc:
    return {"state": state.value, "at_us": at_us}


def _entered(state: ActionState, at_us: int, *, bounded: bool = True) -> Doc:
    """The `$push` of an update that moves an action to `state`: one history entry,
    the oldest dropped past `HISTORY_LIMIT`, in the update that changes the state.

    `bounded=False` when every updated history is known to be shorter than the limit:
    a plain `$push` (nx-27017 trims with a sort of the array's elements in SQL).
    """
    if not bounded:
        return {"$push": {"history": _entry_doc(state, at_us)}}
    entry = {"$each": [_entry_doc(state, at_us)], "$slice": -HISTORY_LIMIT}
    return {"$push": {"history": entry}}


def _history(entries: Iterable[Doc | str]) -> tuple[StateEntry, ...]:
    # nx-27017 stores a document pushed into an array as its JSON text (one inserted
    # with the array comes back a document): read both.
    decoded = (json.loads(e) if isinstance(e, str) else e for e in entries)
    return tuple(StateEntry(ActionState(e["state"]), _at(e["at_us"])) for e in decoded)


def _action(doc: Doc) -> ActionRecord:
    return ActionRecord(
        workflow_id=doc["workflow_id"],
        action_id=doc["action_id"],
        name=doc["name"],
        type=doc["type"],
        state=ActionState(doc["state"]),
        dataset_id=doc["dataset_id"],
        reused=doc["reused"],
        reason=doc["reason"],
        definition=_load_json(doc["definition"]),
        inputs={int(parent): dataset for parent, dataset in doc["inputs"].items()},
        waiting_on=tuple(doc["waiting_on"]),
        children=tuple(doc["children"]),
        callback_id=doc["callback_id"],
        created_at=_at(doc["created_at_us"]),
        updated_at=_at(doc["updated_at_us"]),
        attempts=doc.get("attempts", 0),
        max_attempts=doc.get("max_attempts", 3),
        owner=doc.get("owner"),
        lease_expires_at=_opt_at(doc.get("lease_expires_at_us")),
        not_before=_opt_at(doc.get("not_before_us")),
        external_id=doc.get("external_id"),
        error=doc.get("error"),
        started_at=_opt_at(doc.get("started_at_us")),
        finished_at=_opt_at(doc.get("finished_at_us")),
        runtime_s=doc.get("runtime_s"),
        version=doc.get("version", 0),
        shared_with=doc.get("shared_with"),
        history=_history(doc.get("history", ())),
    )


def _dataset_doc(plan: DatasetPlan, now_us: int) -> Doc:
    return {
        "_id": plan.id,
        "id": plan.id,  # the last sort key of listings (see _create_indexes)
        "state": plan.state.value,
        "path": plan.path,
        "scope": plan.scope,
        "action_type": plan.action_type,
        "definition": _dump_json(plan.definition),
        "parents": list(plan.parents),
        "producer_workflow_id": plan.producer_workflow_id,
        "producer_action_id": plan.producer_action_id,
        "is_managed": plan.is_managed,
        "created_at_us": now_us,
        "updated_at_us": now_us,
        "claims": list(dict.fromkeys(plan.claims)),
        "size_bytes": None,
        "digest": None,
        "compute_s": None,
        "use_count": 0,
        "last_used_at_us": None,
        "stored_at_us": None,
        "pinned": False,
        "version": 0,
    }


def _dataset(doc: Doc) -> DatasetRecord:
    return DatasetRecord(
        id=doc["_id"],
        state=DatasetState(doc["state"]),
        path=doc["path"],
        scope=doc["scope"],
        action_type=doc["action_type"],
        definition=_load_json(doc["definition"]),
        parents=tuple(doc["parents"]),
        producer_workflow_id=doc["producer_workflow_id"],
        producer_action_id=doc["producer_action_id"],
        is_managed=doc["is_managed"],
        created_at=_at(doc["created_at_us"]),
        updated_at=_at(doc["updated_at_us"]),
        claims=tuple(doc.get("claims", ())),
        size_bytes=doc.get("size_bytes"),
        digest=doc.get("digest"),
        compute_s=doc.get("compute_s"),
        use_count=doc.get("use_count", 0),
        last_used_at=_opt_at(doc.get("last_used_at_us")),
        stored_at=_opt_at(doc.get("stored_at_us")),
        pinned=doc.get("pinned", False),
        version=doc.get("version", 0),
    )


def _event(doc: Doc) -> EventRecord:
    return EventRecord(
        seq=doc["_id"],
        kind=doc["kind"],
        at=_at(doc["at_us"]),
        dataset_id=doc.get("dataset_id"),
        workflow_id=doc.get("workflow_id"),
        payload=_load_json(doc.get("payload")),
        owner=doc.get("owner"),
    )


def _schedule_doc(record: ScheduleRecord) -> Doc:
    return {
        "_id": record.id,
        "id": record.id,
        "owner": record.owner,
        "name": record.name,
        "spec": _dump_json(record.spec),
        "paused": record.paused,
        "next_fire_at_us": _opt_us(record.next_fire_at),
        "pending_tick_at_us": _opt_us(record.pending_tick_at),
        "claimed_by": record.claimed_by,
        "claim_expires_at_us": _opt_us(record.claim_expires_at) or 0,
        "created_at_us": _us(record.created_at),
        "updated_at_us": _us(record.updated_at),
        "version": record.version,
    }


def _schedule(doc: Doc) -> ScheduleRecord:
    return ScheduleRecord(
        id=doc["_id"],
        owner=doc["owner"],
        name=doc["name"],
        spec=_load_json(doc["spec"]),
        paused=bool(doc["paused"]),
        next_fire_at=_opt_at(doc.get("next_fire_at_us")),
        pending_tick_at=_opt_at(doc.get("pending_tick_at_us")),
        claimed_by=doc.get("claimed_by"),
        claim_expires_at=_opt_at(doc.get("claim_expires_at_us") or None),
        created_at=_at(doc["created_at_us"]),
        updated_at=_at(doc["updated_at_us"]),
        version=doc["version"],
    )


def _run_doc(run: ScheduleRunRecord) -> Doc:
    tick_us = _us(run.tick_at)
    return {
        "_id": f"{run.schedule_id}/{tick_us}",
        "schedule_id": run.schedule_id,
        "tick_at_us": tick_us,
        "outcome": run.outcome,
        "recorded_at_us": _us(run.recorded_at),
        "workflow_id": run.workflow_id,
        "reason": run.reason,
    }


def _run(doc: Doc) -> ScheduleRunRecord:
    return ScheduleRunRecord(
        schedule_id=doc["schedule_id"],
        tick_at=_at(doc["tick_at_us"]),
        outcome=doc["outcome"],
        recorded_at=_at(doc["recorded_at_us"]),
        workflow_id=doc.get("workflow_id"),
        reason=doc.get("reason"),
    )


def _delivery_doc(d: WebhookDeliveryRecord) -> Doc:
    return {
        "_id": d.id,
        "id": d.id,
        "owner": d.owner,
        "workflow_id": d.workflow_id,
        "schedule_id": d.schedule_id,
        "url": d.url,
        "event": d.event,
        # Text, not binary: the body is UTF-8 JSON, and text survives every wire server.
        "body": d.body.decode(),
        "state": d.state,
        "attempts": d.attempts,
        "next_attempt_at_us": _us(d.next_attempt_at),
        "created_at_us": _us(d.created_at),
        "updated_at_us": _us(d.updated_at),
        "last_status": d.last_status,
        "last_error": d.last_error,
        "claimed_by": d.claimed_by,
        "claim_expires_at_us": _opt_us(d.claim_expires_at) or 0,
        "version": d.version,
    }


def _delivery(doc: Doc) -> WebhookDeliveryRecord:
    return WebhookDeliveryRecord(
        id=doc["_id"],
        owner=doc["owner"],
        workflow_id=doc["workflow_id"],
        schedule_id=doc.get("schedule_id"),
        url=doc["url"],
        event=doc["event"],
        body=doc["body"].encode(),
        state=doc["state"],
        attempts=doc["attempts"],
        next_attempt_at=_at(doc["next_attempt_at_us"]),
        created_at=_at(doc["created_at_us"]),
        updated_at=_at(doc["updated_at_us"]),
        last_status=doc.get("last_status"),
        last_error=doc.get("last_error"),
        claimed_by=doc.get("claimed_by"),
        claim_expires_at=_opt_at(doc.get("claim_expires_at_us") or None),
        version=doc["version"],
    )


def _us_changes(changes: Iterable[tuple[str, Any]]) -> Doc:
    """A `$set` document for schedule or delivery changes (times as `*_us` fields).

    No claim is stored as expiry 0, not null: nx-27017 matches no null in an `$or`.
    """
    update: Doc = {}
    for name, value in changes:
        if name == "claim_expires_at":
            update["claim_expires_at_us"] = _opt_us(value) or 0
        elif isinstance(value, datetime) or (value is None and name.endswith("_at")):
            update[f"{name}_us"] = _opt_us(value)
        else:
            update[name] = value
    return update


def _user_doc(record: UserRecord) -> Doc:
    return {
        "_id": record.name,
        "token_hash": record.token_hash,
        "is_admin": record.is_admin,
        "created_at_us": _us(record.created_at),
        **_limits_doc(record.limits),
    }


def _limits_doc(limits: UserLimits) -> Doc:
    return {
        "max_workflows": limits.max_workflows,
        "max_in_flight_actions": limits.max_in_flight_actions,
        "submissions_per_minute": limits.submissions_per_minute,
        "max_storage_bytes": limits.max_storage_bytes,
    }


def _user(doc: Doc) -> UserRecord:
    return UserRecord(
        name=doc["_id"],
        token_hash=doc["token_hash"],
        is_admin=doc["is_admin"],
        created_at=_at(doc["created_at_us"]),
        # Users stored before limits existed have none of these fields.
        limits=UserLimits(
            max_workflows=doc.get("max_workflows"),
            max_in_flight_actions=doc.get("max_in_flight_actions"),
            submissions_per_minute=doc.get("submissions_per_minute"),
            max_storage_bytes=doc.get("max_storage_bytes"),
        ),
    )


def _ready_at_us(not_before: datetime | None) -> int:
    """When a READY action becomes claimable: `not_before`, or the epoch when it has none.

    A null-free copy of `not_before_us` for the claim filter: nx-27017 never
    matches `{field: null}` inside `$or` (it does at the top level).
    """
    return 0 if not_before is None else _us(not_before)


def _changes_set(changes: Iterable[tuple[str, Any]]) -> Doc:
    """`$set` fields for a `*Changes` object: datetimes become `*_us` integers."""
    fields: Doc = {}
    for name, value in changes:
        if name == "not_before":
            fields["not_before_us"] = _opt_us(value)
            fields["ready_at_us"] = _ready_at_us(value)
        elif name.endswith("_at"):
            fields[f"{name}_us"] = _opt_us(value)
        else:
            fields[name] = value
    return fields


def _values(items: Iterable[ActionState | DatasetState | WorkflowState]) -> list[str]:
    return sorted({item.value for item in items})


def _split_url(url: str) -> tuple[str, set[str]]:
    """The database named in a MongoDB URL ("" for none) and its option names, lower-cased.

    Parsed by hand: pymongo's `parse_uri` resolves `mongodb+srv://` names through
    DNS, and opening a store must not do I/O before it is entered.
    """
    _, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    _, _, database = rest.partition("/")
    options = {pair.partition("=")[0].lower() for pair in query.split("&") if pair}
    return unquote(database), options


def parse_write_concern(text: str) -> WriteConcern:
    """`majority` (or another tag set name), or a node count such as `1`; never unacknowledged."""
    text = text.strip()
    if text.isdigit():
        count = int(text)
        if count < 1:
            # A compare-and-set must know whether it won: w=0 acknowledges nothing.
            raise errors.ConfigurationError("mongo write concern must be at least 1 (or majority)")
        return WriteConcern(w=count)
    if not text:
        raise errors.ConfigurationError("mongo write concern is empty: use majority or a number")
    return WriteConcern(w=text)


# ------------------------------------------------------------------------- errors


def _translated(
    method: Callable[Concatenate[MongoStore, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[MongoStore, P], Coroutine[Any, Any, R]]:
    """Translate driver errors into `pingo.errors` at the edge of the store."""

    @functools.wraps(method)
    async def wrapper(self: MongoStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(self, *args, **kwargs)
        except DuplicateKeyError as exc:
            raise errors.Conflict(f"already exists: {_short(exc)}") from exc
        except BulkWriteError as exc:
            codes = {e.get("code") for e in exc.details.get("writeErrors", [])}
            if codes == {_DUPLICATE_KEY}:
                raise errors.Conflict(f"already exists: {_short(exc)}") from exc
            raise errors.PingoError(f"MongoDB error in {method.__name__}: {_short(exc)}") from exc
        # ConnectionFailure covers AutoReconnect, NetworkTimeout and ServerSelectionTimeoutError.
        # The outcome of a write that fails so is unknown (a WriteConcernError means the
        # primary applied it): callers retry, and every transition is idempotent.
        except (ConnectionFailure, WriteConcernError, ExecutionTimeout) as exc:
            logger.warning(
                "mongo store unavailable: %s",
                _short(exc),
                extra={"event": "store_unavailable", "operation": method.__name__},
            )
            raise errors.StoreUnavailable(f"MongoDB is unavailable: {_short(exc)}") from exc
        except PyMongoError as exc:
            raise errors.PingoError(f"MongoDB error in {method.__name__}: {_short(exc)}") from exc

    return wrapper


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "…"


# -------------------------------------------------------------------------- store


class MongoStore:
    """The `Store` protocol on MongoDB (replica set, standalone, or a wire-compatible server)."""

    def __init__(
        self,
        client: AsyncMongoClient[Doc],
        database: str = DEFAULT_DATABASE,
        *,
        clock: Clock = utcnow,
        write_concern: str = "majority",
        owns_client: bool = False,
    ) -> None:
        self.clock = clock
        self._client = client
        self._owns_client = owns_client
        self._db: AsyncDatabase[Doc] = client.get_database(
            database, write_concern=parse_write_concern(write_concern)
        )
        self._workflows: AsyncCollection[Doc] = self._db["workflows"]
        self._actions: AsyncCollection[Doc] = self._db["actions"]
        self._datasets: AsyncCollection[Doc] = self._db["datasets"]
        self._events: AsyncCollection[Doc] = self._db["events"]
        self._users: AsyncCollection[Doc] = self._db["users"]
        self._counters: AsyncCollection[Doc] = self._db["counters"]
        self._schedules: AsyncCollection[Doc] = self._db["schedules"]
        self._schedule_runs: AsyncCollection[Doc] = self._db["schedule_runs"]
        self._deliveries: AsyncCollection[Doc] = self._db["webhook_deliveries"]
        #: Whether a claim reads its candidates and the users' caps in one aggregation
        #: (`_claim_reads`); False once the server refused `$unionWith`.
        self._union_claim_reads = True
        #: The owners of RUNNING workflows, and when they were read (`time.monotonic`):
        #: who may be idle (`_idle_oldest`), read at most every `_RUNNING_OWNERS_S`
        #: (first read a moment after start, so a claim of a fresh store costs no more).
        self._running_owners: tuple[float, list[str]] = (time.monotonic(), [])

    @classmethod
    def from_url(
        cls, url: str, *, clock: Clock = utcnow, write_concern: str = "majority"
    ) -> MongoStore:
        """A store on `mongodb://host/db` (database `pingo` when the URL names none).

        Creating the client does not connect (nor resolve a `mongodb+srv://` name);
        the first operation (index creation on `__aenter__`) does.
        """
        database, options = _split_url(url)
        extra: dict[str, Any] = {"tz_aware": True, "appname": "pingo"}
        if "serverselectiontimeoutms" not in options:
            # Fail a request in seconds, not the driver's 30 s, when the store is down.
            extra["serverSelectionTimeoutMS"] = 10_000
        try:
            client: AsyncMongoClient[Doc] = AsyncMongoClient(url, **extra)
        except (MongoConfigurationError, ValueError) as exc:  # InvalidURI is a ConfigurationError
            raise errors.ConfigurationError(f"invalid MongoDB URL: {exc}") from exc
        return cls(
            client,
            database or DEFAULT_DATABASE,
            clock=clock,
            write_concern=write_concern,
            owns_client=True,
        )

    @_translated
    async def __aenter__(self) -> Self:
        try:
            await self._create_indexes()
        except BaseException:
            # `async with` does not call __aexit__ when __aenter__ fails.
            if self._owns_client:
                await self._client.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owns_client:
            await self._client.close()

    async def _create_indexes(self) -> None:
        # create_index is idempotent for an identical spec, so every node runs it at start.
        asc = pymongo.ASCENDING
        desc = pymongo.DESCENDING
        actions, datasets, workflows = self._actions, self._datasets, self._workflows
        # Every sorted query has an index that yields its whole sort order, so a claim
        # or a page reads a few index entries instead of sorting every match. Sort
        # keys end with a copy of `_id` (`id`, `seq`): nx-27017 fails every insert
        # into a collection that has `_id` in a compound index.
        #
        # The scraper's claim: an $or over READY and PROCESSING, each branch an
        # equality on state then the (updated_at, workflow, action) order, which a
        # server merges from two scans of this index; also list_actions_in_states.
        await actions.create_index(
            [("state", asc), ("updated_at_us", asc), ("workflow_id", asc), ("action_id", asc)],
            name="claimable",
        )
        # Claims by capacity: each type's oldest READY actions (issue 16).
        await actions.create_index(
            [
                ("state", asc),
                ("type", asc),
                ("updated_at_us", asc),
                ("workflow_id", asc),
                ("action_id", asc),
            ],
            name="claimable_by_type",
        )
        # The reaper: claim states whose lease expired.
        await actions.create_index(
            [("state", asc), ("lease_expires_at_us", asc)], name="lease_expiry"
        )
        await actions.create_index([("callback_id", asc)], name="callback_id", unique=True)
        await actions.create_index([("workflow_id", asc), ("action_id", asc)], name="workflow")
        # Whether a workflow has work left (has_actions_in), without reading its actions.
        await actions.create_index([("workflow_id", asc), ("state", asc)], name="workflow_state")
        # A dataset's page: the workflows that computed or reused it, newest first.
        await actions.create_index([("dataset_id", asc), ("workflow_id", desc)], name="dataset")
        # In-flight deduplication (issue 16): the actions still WAITING that share with a
        # producer. Partial: only the actions that share are in it (most share with none),
        # and the state prefix keeps the settled ones (the history) out of every lookup.
        await actions.create_index(
            [("state", asc), ("shared_with", asc), ("workflow_id", asc), ("action_id", asc)],
            name="waiting_shared",
            partialFilterExpression={"shared_with": {"$exists": True}},
        )
        # The deletor and retention: by state, oldest update first.
        await datasets.create_index(
            [("state", asc), ("updated_at_us", asc), ("id", asc)], name="state_age"
        )
        # Newest-first listings, unfiltered and by each filter.
        newest = [("created_at_us", desc), ("id", desc)]
        await datasets.create_index(newest, name="newest")
        # Lineage downwards: the datasets computed from one (a multikey index).
        await datasets.create_index([("parents", asc)], name="parents")
        # Finds a user's datasets for `bytes_produced_by`; on the producer alone, which a
        # state change leaves alone, so the hot path never writes it.
        await datasets.create_index([("producer_workflow_id", asc)], name="producer")
        await datasets.create_index([("state", asc), *newest], name="state_newest")
        await workflows.create_index(newest, name="newest")
        await workflows.create_index([("owner", asc), *newest], name="owner_newest")
        await workflows.create_index([("state", asc), *newest], name="state_newest")
        await workflows.create_index(
            [("idempotency", asc)], name="idempotency", unique=True, sparse=True
        )
        # The few workflows whose plan is being written (or was left half-written).
        await workflows.create_index([(_WRITING, asc)], name="writing", sparse=True)
        await self._users.create_index([("token_hash", asc)], name="token_hash", unique=True)
        await self._events.create_index([("kind", asc), ("seq", desc)], name="kind")
        await self._events.create_index([("dataset_id", asc), ("seq", desc)], name="dataset")
        await self._events.create_index([("owner", asc), ("seq", desc)], name="owner")
        await self._schedules.create_index([("next_fire_at_us", asc)], name="next_fire")
        await self._schedules.create_index([("pending_tick_at_us", asc)], name="pending")
        await self._schedules.create_index([("owner", asc), *newest], name="owner_newest")
        await self._schedule_runs.create_index(
            [("schedule_id", asc), ("tick_at_us", desc)], name="schedule"
        )
        await self._deliveries.create_index(
            [("state", asc), ("next_attempt_at_us", asc)], name="due"
        )
        await self._deliveries.create_index([("owner", asc), *newest], name="owner_newest")
        await self._deliveries.create_index([("workflow_id", asc), *newest], name="workflow")

    def _now(self) -> tuple[datetime, int]:
        now = self.clock()
        return now, _us(now)

    @_translated
    async def ping(self) -> None:
        await self._db.command("ping")

    async def release_memory(self) -> None:
        return None  # the driver caches no documents

    # ------------------------------------------------------------------ workflows

    async def create_workflow(self, plan: WorkflowPlan) -> WorkflowRecord:
        return (await self.persist_plan(plan)).workflow

    @_translated
    async def persist_plan(self, plan: WorkflowPlan) -> Persisted:
        workflow = plan.workflow
        read_at, running = self._running_owners
        if workflow.owner not in running:
            # Maybe idle, for this node's next claim (other nodes' within `_RUNNING_OWNERS_S`).
            self._running_owners = (read_at, [*running, workflow.owner])
        if len({a.action_id for a in plan.actions}) != len(plan.actions) or any(
            a.workflow_id != workflow.id for a in plan.actions
        ):
            raise errors.Conflict("the plan's actions do not have unique keys in the workflow")
        callbacks = [a.callback_id for a in plan.actions]
        if len(set(callbacks)) != len(callbacks):
            raise errors.Conflict("an action's callback id is already in use")
        # Check what can be checked before writing anything, so a duplicate submission
        # (the common retry) writes nothing. The unique indexes still decide a race.
        if await self._workflows.find_one({"_id": workflow.id}, {"_id": 1}) is not None:
            raise errors.Conflict(f"workflow {workflow.id} already exists")
        if workflow.idempotency_key is not None:
            existing = await self.find_workflow_by_idempotency_key(
                workflow.owner, workflow.idempotency_key
            )
            if existing is not None:
                raise errors.Conflict(
                    f"{workflow.owner} already submitted a workflow with idempotency key "
                    f"{workflow.idempotency_key!r}"
                )
        for chunk in _chunks(callbacks):
            if await self._actions.find_one({"callback_id": {"$in": chunk}}, {"_id": 1}):
                raise errors.Conflict("an action's callback id is already in use")

        # No multi-document transaction (a standalone server has none), so the order
        # of the writes is what keeps readers safe:
        #   1. the workflow: its unique _id and idempotency index settle a racing
        #      duplicate before any dataset or action is touched;
        #   2. the datasets (created, upgraded, claimed): they exist before any
        #      action that computes or reads them;
        #   3. the actions, last, in one ordered insert_many: a READY action is
        #      only ever visible with its workflow and datasets in place.
        # The datasets' unique _id is also what decides which of two plans of one
        # dataset written at once computes it: the one whose insert (or revival of a
        # DELETED one) lands first; the other finds it computing when it merges, and
        # its actions are written sharing that computation (`rules.as_sharer`) before
        # any of them can be claimed. Its producer's actions may not be written yet:
        # `rules.producer_to_share` shares with a producer not found.
        # The crash window: a node dying between 1 and 3 leaves a RUNNING workflow
        # with missing actions (and maybe datasets planned or claimed for it), never
        # a runnable action of a workflow that does not exist. So the workflow's record
        # is written marked `writing` (with the plan's number of actions), and the mark
        # is dropped once its last action is in. The reaper fails a workflow still
        # missing actions once its planning is past the deadline and a lease
        # (`list_unwritten_workflows`, `OutcomeService.abandon_unwritten`), and the
        # deletor then drops the claims of the actions that never came.
        # The deadline is checked last, right before the first write: from the workflow's
        # document on, the deletor finds the workflow and keeps its claims (until the
        # reaper fails it); before, it may release them once the deadline and a lease
        # have passed (docs/states.md).
        if plan.deadline_at is not None and self.clock() > plan.deadline_at:
            raise errors.PlanExpired()
        await self._workflows.insert_one({**_workflow_doc(workflow), _WRITING: len(plan.actions)})
        _, now_us = self._now()
        merged = await self._persist_datasets(plan.datasets, now_us)
        shared = rules.shared_actions(
            plan.actions, await self._producers_to_share(workflow.id, merged)
        )
        if plan.actions:
            docs = [
                _action_doc(shared.get(a.action_id, a))
                for a in sorted(plan.actions, key=lambda a: a.action_id)
            ]
            await self._actions.insert_many(docs, ordered=True)
        await self._end_writing(workflow)
        logger.info(
            "workflow %s created with %d actions",
            workflow.id,
            len(plan.actions),
            extra={"event": "workflow_created", "workflow_id": workflow.id},
        )
        return Persisted(workflow, tuple(shared.values()))

    async def _end_writing(self, workflow: WorkflowRecord) -> None:
        """Drop the workflow's `writing` mark now that its plan is written whole.

        The workflow may have ended while its actions were being written (its user
        killed it, or the reaper gave up on a write that outlived the planning deadline
        and a lease): the actions written after that ending, not yet started, are killed
        here, since the sweep that ended it could not see them.
        """
        before = await self._workflows.find_one_and_update(
            {"_id": workflow.id}, {"$unset": {_WRITING: ""}}, projection={"state": 1}
        )
        running = WorkflowState.RUNNING
        if before is None or workflow.state is not running or before["state"] == running.value:
            return
        changes = ActionChanges(
            finished_at=self.clock(),
            error=f"workflow {before['state'].lower()} while its actions were being written",
            owner=None,
            lease_expires_at=None,
        )
        while True:
            killed = await self.kill_actions(workflow.id, _UNSTARTED, changes, limit=_IN_CHUNK)
            if len(killed) < _IN_CHUNK:
                return

    async def _producers_to_share(
        self, workflow_id: str, merged: Mapping[str, DatasetRecord]
    ) -> dict[str, str]:
        """Dataset id → the producer a plan's actions share (`rules.producer_to_share`),
        from each merged dataset as its merge found it; one read per producer."""
        found: dict[str, str] = {}
        for dataset_id, old in merged.items():
            if old.state not in rules.SHAREABLE:
                continue
            producer = (old.producer_workflow_id, old.producer_action_id)
            doc = await self._actions.find_one({"_id": _action_id(*producer)}, {"state": 1})
            key = rules.producer_to_share(
                workflow_id,
                old.state,
                producer,
                None if doc is None else ActionState(doc["state"]),
            )
            if key is not None:
                found[dataset_id] = key
        return found

    async def _persist_datasets(
        self, plans: Sequence[DatasetPlan], now_us: int
    ) -> dict[str, DatasetRecord]:
        """Create the planned datasets that are new, in bulk; merge the others one by one.

        Returns each merged dataset (by id) as it stood when its merge landed."""
        if not plans:
            return {}
        existing: list[DatasetPlan] = []
        try:
            # Unordered: every new dataset is inserted even when some already exist.
            await self._datasets.insert_many(
                [_dataset_doc(p, now_us) for p in plans], ordered=False
            )
        except BulkWriteError as exc:
            failed = exc.details.get("writeErrors", [])
            if not failed or any(e.get("code") != _DUPLICATE_KEY for e in failed):
                raise
            existing = [plans[e["index"]] for e in failed]
        merged: dict[str, DatasetRecord] = {}
        for plan in existing:
            old = await self._merge_dataset(plan, now_us)
            if old is not None:
                merged[plan.id] = old
        return merged

    async def _merge_dataset(self, plan: DatasetPlan, now_us: int) -> DatasetRecord | None:
        """Apply a plan to a dataset that exists: upgrade its state and/or add claims.

        Returns the dataset as the merge found it (None when it had to create it)."""
        claims = list(dict.fromkeys(plan.claims))
        for _ in range(_PLAN_RETRIES):
            doc = await self._datasets.find_one({"_id": plan.id})
            if doc is None:  # Removed meanwhile (nothing deletes records today): recreate.
                try:
                    await self._datasets.insert_one(_dataset_doc(plan, now_us))
                    return None
                except DuplicateKeyError:
                    continue
            old = _dataset(doc)
            update: Doc = {"$set": {"updated_at_us": now_us}, "$inc": {"version": 1}}
            if claims:
                # $each appends in order and skips claims already present.
                update["$addToSet"] = {"claims": {"$each": claims}}
            if plan_upgrades(old.state, plan.state):
                update["$set"]["state"] = plan.state.value
                if old.state is DatasetState.DELETED:
                    revived = rules.revived_fields(plan)
                    revived["stored_at_us"] = revived.pop("stored_at")
                    update["$set"].update(revived)
            elif set(claims).issubset(old.claims):
                return old
            # Conditional on the state read, so the decision above still holds when it lands.
            if await self._datasets.find_one_and_update(
                {"_id": plan.id, "state": old.state.value}, update
            ):
                return old
        raise errors.StoreUnavailable(f"dataset {plan.id} kept changing while persisting a plan")

    @_translated
    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        doc = await self._workflows.find_one({"_id": workflow_id})
        return None if doc is None else _workflow(doc)

    @_translated
    async def find_workflow_ids(
        self, prefix: str, *, owner: str | None = None, limit: int = 2
    ) -> list[str]:
        return await _find_ids(self._workflows, "owner", prefix, owner, limit)

    @_translated
    async def list_unwritten_workflows(self, *, limit: int = 100) -> list[str]:
        marked = await self._workflows.find(
            {_WRITING: {"$exists": True}, "state": WorkflowState.RUNNING.value},
            {_WRITING: 1},
            sort=[("_id", 1)],
            limit=limit,
        ).to_list(None)
        unwritten = []
        for doc in marked:
            # The mark holds how many actions the plan has: a writer that died after its
            # last action and before dropping the mark wrote its plan whole.
            if await self._actions.count_documents({"workflow_id": doc["_id"]}) < doc[_WRITING]:
                unwritten.append(doc["_id"])
            else:
                await self._workflows.update_one({"_id": doc["_id"]}, {"$unset": {_WRITING: ""}})
        return unwritten

    @_translated
    async def find_workflow_by_idempotency_key(self, owner: str, key: str) -> WorkflowRecord | None:
        doc = await self._workflows.find_one({"idempotency": _idempotency(owner, key)})
        return None if doc is None else _workflow(doc)

    @_translated
    async def list_workflows(
        self,
        *,
        owner: str | None = None,
        state: WorkflowState | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[WorkflowRecord]:
        query: Doc = {}
        if owner is not None:
            query["owner"] = owner
        if state is not None:
            query["state"] = state.value
        if name is not None:
            query["name"] = name
        docs = await self._page(self._workflows, query, limit, cursor)
        return _make_page([_workflow(d) for d in docs], limit)

    @staticmethod
    async def _page(
        collection: AsyncCollection[Doc], query: Doc, limit: int, cursor: str | None
    ) -> list[Doc]:
        """Up to `limit + 1` documents after `cursor`, newest first by (created_at, id)."""
        if limit <= 0:
            return []
        if cursor is not None:
            at, item_id = _cursor.decode_cursor(cursor)
            at_us = _us(at)
            after = {
                "$or": [
                    {"created_at_us": {"$lt": at_us}},
                    {"created_at_us": at_us, "id": {"$lt": item_id}},
                ]
            }
            # $and, not sibling keys: nx-27017 would join `filters AND a OR b`.
            query = {"$and": [query, after]} if query else after
        found = collection.find(
            query, sort=[("created_at_us", pymongo.DESCENDING), ("id", pymongo.DESCENDING)]
        ).limit(limit + 1)
        return await found.to_list(None)

    @_translated
    async def transition_workflow(
        self,
        workflow_id: str,
        expected: Collection[WorkflowState],
        new: WorkflowState,
        changes: WorkflowChanges = _NO_WORKFLOW_CHANGES,
    ) -> WorkflowRecord | None:
        doc = await self._workflows.find_one_and_update(
            {"_id": workflow_id, "state": {"$in": _values(expected)}},
            {"$set": {"state": new.value, **_changes_set(changes.items())}, "$inc": {"version": 1}},
            return_document=_AFTER,
        )
        if doc is None:
            _common.log_cas_lost(f"workflow {workflow_id}", new, workflow_id=workflow_id)
            return None
        return _workflow(doc)

    # -------------------------------------------------------------------- actions

    @_translated
    async def get_action(self, workflow_id: str, action_id: int) -> ActionRecord | None:
        doc = await self._actions.find_one({"_id": _action_id(workflow_id, action_id)})
        return None if doc is None else _action(doc)

    @_translated
    async def get_action_by_callback(self, callback_id: str) -> ActionRecord | None:
        doc = await self._actions.find_one({"callback_id": callback_id})
        return None if doc is None else _action(doc)

    @_translated
    async def get_action_and_dataset_by_callback(
        self, callback_id: str
    ) -> tuple[ActionRecord, DatasetRecord | None] | None:
        # Two round trips: the dataset's id is in the action.
        action = await self.get_action_by_callback(callback_id)
        if action is None:
            return None
        return action, await self.get_dataset(action.dataset_id)

    @_translated
    async def list_actions(
        self, workflow_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[ActionRecord]:
        query: dict[str, Any] = {"workflow_id": workflow_id}
        if after is not None:
            query["action_id"] = {"$gt": after}
        if limit is not None and limit <= 0:
            return []
        found = self._actions.find(query, sort=[("action_id", 1)], limit=limit or 0)
        return [_action(d) for d in await found.to_list(None)]

    @_translated
    async def list_planned_actions(self, workflow_id: str) -> list[PlannedAction]:
        found = self._actions.find(
            {"workflow_id": workflow_id},
            {"action_id": 1, "dataset_id": 1, "reused": 1, "reason": 1, "_id": 0},
            sort=[("action_id", 1)],
        )
        return [
            PlannedAction(d["action_id"], d["dataset_id"], d["reused"], d["reason"])
            for d in await found.to_list(None)
        ]

    @_translated
    async def list_actions_in_states(
        self,
        states: Collection[ActionState],
        *,
        lease_expired: bool = False,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        if limit <= 0 or not states:
            return []
        query: Doc = {"state": {"$in": _values(states)}}
        if lease_expired:
            # A null lease never matches $lte on a number, so "no lease" never expires.
            query["lease_expires_at_us"] = {"$lte": self._now()[1]}
        found = self._actions.find(query, sort=_OLDEST_ACTION).limit(limit)
        return [_action(d) for d in await found.to_list(None)]

    @_translated
    async def twin_datasets(self, workflow_id: str) -> frozenset[str]:
        groups = await _aggregate(
            self._actions,
            [
                {"$match": {"workflow_id": workflow_id, "reused": False}},
                {"$group": {"_id": "$dataset_id", "count": {"$sum": 1}}},
                {"$match": {"count": {"$gt": 1}}},
            ],
        )
        return frozenset(str(g["_id"]) for g in groups)

    @_translated
    async def count_actions(self, workflow_id: str) -> dict[ActionState, int]:
        # One $group in the server (the callback path counts after every action):
        # nx-27017 turns it into SQL GROUP BY, where fetching the states took 300 ms for
        # 5,000 actions and a count_documents per state 1 s each.
        groups = await _aggregate(
            self._actions,
            [
                {"$match": {"workflow_id": workflow_id}},
                {"$group": {"_id": "$state", "count": {"$sum": 1}}},
            ],
        )
        return {ActionState(g["_id"]): g["count"] for g in groups if g["count"]}

    @_translated
    async def has_actions_in(self, workflow_id: str, states: Collection[ActionState]) -> bool:
        # One index probe (workflow_state), where counting groups every action of the
        # workflow: asked after each action's outcome, a $group made a workflow's
        # callbacks cost the square of its size (issue 15).
        if not states:
            return False
        found = await self._actions.find_one(
            {"workflow_id": workflow_id, "state": {"$in": [s.value for s in states]}},
            {"_id": 1},
        )
        return found is not None

    @_translated
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
        return await self._transition_action(
            workflow_id, action_id, expected, new, changes, if_owner=if_owner, if_attempt=if_attempt
        )

    async def _transition_action(
        self,
        workflow_id: str,
        action_id: int,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges,
        *,
        if_owner: str | None = None,
        if_attempt: int | None = None,
        if_waiting_on: int | None = None,
    ) -> ActionRecord | None:
        query: Doc = {
            "_id": _action_id(workflow_id, action_id),
            "state": {"$in": _values(expected)},
        }
        if if_owner is not None:
            query["owner"] = if_owner
        if if_attempt is not None:
            query["attempts"] = if_attempt
        if if_waiting_on is not None:
            query["waiting_on"] = if_waiting_on  # an array field matches any element
        if new in expected and len(expected) > 1:
            # The history grows only when the state changes, and an update cannot
            # push on a condition without a pipeline (which nx-27017 lacks): two
            # compare-and-sets, the one that changes the state first.
            others = [s for s in expected if s is not new]
            cas = functools.partial(
                self._transition_action,
                workflow_id,
                action_id,
                new=new,
                changes=changes,
                if_owner=if_owner,
                if_attempt=if_attempt,
                if_waiting_on=if_waiting_on,
            )
            return await cas(others) or await cas({new})
        _, now_us = self._now()
        fields = {"state": new.value, "updated_at_us": now_us, **_changes_set(changes.items())}
        update: Doc = {"$set": fields, "$inc": {"version": 1}}
        if new not in expected:
            update.update(_entered(new, now_us))
        doc = await self._actions.find_one_and_update(query, update, return_document=_AFTER)
        if doc is None:
            _common.log_cas_lost(
                f"action {workflow_id}/{action_id}",
                new,
                workflow_id=workflow_id,
                action_id=action_id,
            )
            return None
        return _action(doc)

    @_translated
    async def transition_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = _NO_ACTION_CHANGES,
    ) -> list[ActionRecord]:
        if not expected:
            return []
        found = self._actions.find(
            {"workflow_id": workflow_id, "state": {"$in": _values(expected)}},
            {"action_id": 1, "_id": 0},
            sort=[("action_id", 1)],
        )
        moved = []
        for doc in await found.to_list(None):
            record = await self._transition_action(
                workflow_id, doc["action_id"], expected, new, changes
            )
            if record is not None:
                moved.append(record)
        return moved

    @_translated
    async def kill_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        changes: ActionChanges = _NO_ACTION_CHANGES,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        """Ordered steps (no multi-document transactions): the compare-and-sets, then claims
        and datasets, one update_many each. A node that dies in between leaves claims that
        `OutcomeService.recover_workflow` and the deletor's orphan-claim sweep drop, and
        datasets the next kill of the (KILLED) workflow gives up."""
        if not expected or limit <= 0:
            return []
        found = await self._actions.find(
            {"workflow_id": workflow_id, "state": {"$in": _values(expected)}},
            {"action_id": 1, "_id": 0},
            sort=[("action_id", 1)],
            limit=limit,
        ).to_list(None)
        moved = await asyncio.gather(
            *(
                self._transition_action(
                    workflow_id, doc["action_id"], expected, ActionState.KILLED, changes
                )
                for doc in found
            )
        )
        killed = sorted((r for r in moved if r is not None), key=lambda a: a.action_id)
        if not killed:
            return killed
        _, now_us = self._now()
        stamp = {"$set": {"updated_at_us": now_us}, "$inc": {"version": 1}}
        # Whole-batch updates (each document atomically): pulling every killed action's
        # claim key from every input of the batch removes exactly their claims.
        keys = [claim_key(a.workflow_id, a.action_id) for a in killed]
        inputs = sorted({ds for a in killed for ds in a.inputs.values()})
        if inputs:
            await self._datasets.update_many(
                {"_id": {"$in": inputs}, "claims": {"$in": keys}},
                {"$pull": {"claims": {"$in": keys}}, **stamp},
            )
        # A producer computes its own dataset, so "produced by a killed action" is
        # "the dataset of a killed action, whose producer is one of them".
        await self._datasets.update_many(
            {
                "_id": {"$in": sorted({a.dataset_id for a in killed})},
                "state": {"$in": _values(states.DATASET_COMPUTING)},
                "producer_workflow_id": workflow_id,
                "producer_action_id": {"$in": [a.action_id for a in killed]},
            },
            {
                "$set": {"state": DatasetState.DELETED.value, "updated_at_us": now_us},
                "$inc": {"version": 1},
            },
        )
        return killed

    @_translated
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
        claimed: list[ActionRecord] = []
        # MongoDB has no transaction here: nodes that claim at the same instant may
        # each see the same room and overshoot a user's cap by their batches. The room
        # is read with the first batch's candidates (None: not read yet).
        room: _OwnedRoom | None = None
        while len(claimed) < limit and wanted != {}:
            batch, read, room = await self._claim_batch(
                node_id, limit - len(claimed), lease_s, wanted, room, max_in_flight
            )
            claimed.extend(batch)
            if len(batch) == read:
                # Won all it read, and it read all that was claimable (within the caps
                # and quotas): reading again would find nothing (or only what became
                # claimable since, which the next claim gets).
                break
            if wanted is not None:
                # What another node won meanwhile is retried within what is left.
                for record in batch:
                    wanted[record.type] -= 1
                wanted = {t: q for t, q in wanted.items() if q > 0}
        if claimed:
            logger.debug(
                "node %s claimed %d actions",
                node_id,
                len(claimed),
                extra={"event": "actions_claimed", "node_id": node_id, "count": len(claimed)},
            )
        return claimed

    async def _caps(self) -> dict[str, int]:
        """The users' own in-flight caps (`UserLimits.max_in_flight_actions`)."""
        capped = self._users.find(_CAPPED_USERS, {_CAP: 1})
        return {d["_id"]: d[_CAP] for d in await capped.to_list(None)}

    async def _in_flight_room(
        self,
        default: int | None,
        caps: Mapping[str, int] | None = None,
        counted: list[Doc] | None = None,
    ) -> _OwnedRoom:
        """Who has room for more in flight: `caps` (read when None), and when anyone is
        capped, every owner's actions in flight now (`counted` per workflow by
        `_IN_FLIGHT_PER_WORKFLOW`, read when None)."""
        room = _OwnedRoom(await self._caps() if caps is None else caps, default)
        if room.capped:
            if counted is None:
                counted = await _aggregate(self._actions, _IN_FLIGHT_PER_WORKFLOW)
            per_workflow = {d["_id"]: d["count"] for d in counted}
            room.owners.update(await self._owners(per_workflow))
            for workflow_id, count in per_workflow.items():
                room.in_flight[room.owners.get(workflow_id, "")] += count
        return room

    async def _owners(self, workflow_ids: Collection[str]) -> dict[str, str]:
        """Workflow id → owner, for `workflow_ids`."""
        owners: dict[str, str] = {}
        for chunk in _chunks(list(workflow_ids)):
            found = self._workflows.find({"_id": {"$in": chunk}}, {"owner": 1})
            owners.update({d["_id"]: d["owner"] for d in await found.to_list(None)})
        return owners

    async def _ready_within_room(
        self, room: _OwnedRoom, now_us: int, limit: int, wanted: Mapping[str, int] | None
    ) -> list[Doc]:
        """The oldest claimable READY actions whose owners have room and whose type has
        quota left (`wanted`, None: any type), using both up.

        Each wanted type is read apart, up to its own quota: one read across the types
        fetched `limit` actions of the first type even when it had room for one.
        """
        if wanted is None:
            return await self._ready_of_type(room, now_us, limit, None)
        chosen: list[Doc] = []
        for action_type, quota in wanted.items():
            chosen += await self._ready_of_type(room, now_us, min(quota, limit), action_type)
        return chosen

    async def _ready_of_type(
        self, room: _OwnedRoom, now_us: int, limit: int, action_type: str | None
    ) -> list[Doc]:
        """Up to `limit` of the oldest claimable READY actions (of `action_type`, None:
        any) whose owners have room, taking it.

        Each round leaves out the RUNNING workflows of owners already full and the
        actions already chosen, so it ends after at most one round per owner.
        """
        chosen: list[Doc] = []
        owners = room.owners
        while len(chosen) < limit:
            query: Doc = {"state": ActionState.READY.value, "ready_at_us": {"$lte": now_us}}
            if action_type is not None:
                query["type"] = action_type
            # Only the filters needed: an empty $nin still costs nx-27017 its index.
            if full := room.full():
                running = self._workflows.find(
                    {"owner": {"$in": full}, "state": WorkflowState.RUNNING.value}, {"_id": 1}
                )
                query["workflow_id"] = {"$nin": [d["_id"] for d in await running.to_list(None)]}
            if chosen:
                query["_id"] = {"$nin": [d["_id"] for d in chosen]}
            page = limit - len(chosen)
            found = self._actions.find(query, sort=_CLAIMABLE_READY).limit(page)
            docs = await found.to_list(None)
            owners.update(await self._owners({d["workflow_id"] for d in docs} - owners.keys()))
            for doc in docs:
                if len(chosen) < limit and room.take(owners.get(doc["workflow_id"], "")):
                    chosen.append(doc)
            if len(docs) < page:
                break
        return chosen

    async def _claimable(
        self,
        now_us: int,
        limit: int,
        wanted: Mapping[str, int] | None,
        room: _OwnedRoom | None,
        default: int | None = None,
    ) -> tuple[list[Doc], _OwnedRoom]:
        """The `limit` oldest actions READY past their backoff or PROCESSING past their
        lease, within `room`, and the room (read here when None, with the server-wide
        cap `default`).

        Index-served queries (expired leases; READY by state, or by state and type for
        each of `wanted`'s types), merged oldest first, rather than one $or: nx-27017
        serves neither branch of an $or from an index and took 25 ms per query over
        1,000 READY actions. A claim's first batch reads the room with them
        (`_first_claimable`, `_first_claimable_capped`); its later batches reuse it
        (`_claimable_within`).
        """
        expired_query: Doc = {
            "state": ActionState.PROCESSING.value,
            "lease_expires_at_us": {"$lte": now_us},
        }
        ready_queries = [
            ({"state": ActionState.READY.value, "ready_at_us": {"$lte": now_us}, **by}, count)
            for by, count in (
                [({}, limit)] if wanted is None else [({"type": t}, q) for t, q in wanted.items()]
            )
        ]
        if room is not None:
            expired, ready = await self._claimable_within(
                room, expired_query, ready_queries, now_us, limit, wanted
            )
        elif default is not None:
            expired, ready, room = await self._first_claimable_capped(
                default, expired_query, now_us, limit, wanted
            )
        else:
            expired, ready, room = await self._first_claimable(
                expired_query, ready_queries, now_us, limit, wanted
            )
        oldest = sorted([*ready, *expired], key=_oldest_action)
        idle: list[Doc] = []
        if room.capped:
            served = {room.owners.get(doc["workflow_id"], "") for doc in ready}
            idle = await self._idle_oldest(room, served, now_us, wanted)
        chosen = _room.idle_first(
            room,
            oldest,
            idle,
            limit,
            wanted,
            owner_of=lambda doc: room.owners.get(doc["workflow_id"], ""),
            age=_oldest_action,
            type_of=lambda doc: str(doc["type"]),
            key=lambda doc: doc["_id"],
        )
        return chosen, room

    async def _idle_oldest(
        self,
        room: _OwnedRoom,
        served: Collection[str],
        now_us: int,
        wanted: Mapping[str, int] | None,
    ) -> list[Doc]:
        """The oldest claimable READY action (of a `wanted` type) of each owner of a
        RUNNING workflow with nothing in flight, oldest first (`_room.idle_first`), but
        those `served` already (whose oldest is among the claim's candidates).

        Who owns a RUNNING workflow is read at most every `_RUNNING_OWNERS_S` (a claim's
        round trips are its cost); this node adds the owner of each workflow it stores:
        an owner who has just submitted through another node goes first within that time.
        """
        read_at, running = self._running_owners
        if time.monotonic() - read_at >= _RUNNING_OWNERS_S:
            found = await self._workflows.distinct("owner", {"state": WorkflowState.RUNNING.value})
            running = [str(owner) for owner in found]
            self._running_owners = (time.monotonic(), running)
        idle = [owner for owner in room.idle(running) if owner not in served]
        if not idle:
            return []
        workflows = self._workflows.find(
            {"owner": {"$in": idle}, "state": WorkflowState.RUNNING.value}, {"owner": 1}
        )
        by_owner: dict[str, list[str]] = {}
        for doc in await workflows.to_list(None):
            by_owner.setdefault(doc["owner"], []).append(doc["_id"])
        oldest: list[Doc] = []
        for ids in by_owner.values():
            query: Doc = {
                "state": ActionState.READY.value,
                "ready_at_us": {"$lte": now_us},
                "workflow_id": {"$in": ids},
            }
            if wanted is not None:
                query["type"] = {"$in": sorted(wanted)}
            found_docs = self._actions.find(query, sort=_CLAIMABLE_READY).limit(1)
            oldest += await found_docs.to_list(None)
        return sorted(oldest, key=_oldest_action)

    async def _first_claimable(
        self,
        expired_query: Doc,
        ready_queries: Sequence[tuple[Doc, int]],
        now_us: int,
        limit: int,
        wanted: Mapping[str, int] | None,
    ) -> tuple[list[Doc], list[Doc], _OwnedRoom]:
        """The expired leases, the READY actions and the room, with no server-wide cap:
        the users' caps are read with the READY actions, all in one `$unionWith`
        aggregation (`_claim_reads`), and those stand unless some user has a cap."""
        read = await self._claim_reads(expired_query, limit, ready_queries)
        if read is None:
            caps, (expired, *ready_lists) = await asyncio.gather(
                self._caps(),
                asyncio.gather(
                    self._expired_docs(expired_query, limit), *self._ready_docs(ready_queries)
                ),
            )
        else:
            caps, expired, ready_lists = read
        room = await self._in_flight_room(None, caps)
        if room.capped:
            return expired, await self._ready_within_room(room, now_us, limit, wanted), room
        return expired, [doc for docs in ready_lists for doc in docs], room

    async def _first_claimable_capped(
        self,
        default: int,
        expired_query: Doc,
        now_us: int,
        limit: int,
        wanted: Mapping[str, int] | None,
    ) -> tuple[list[Doc], list[Doc], _OwnedRoom]:
        """The expired leases, the READY actions and the room, under the server-wide cap
        `default`: the caps and the in-flight counts are read with the expired leases in
        one aggregation (`_capped_claim_reads`), then the READY ones within the room."""
        capped = await self._capped_claim_reads(expired_query, limit)
        if capped is None:
            room = await self._in_flight_room(default)
            expired, ready = await asyncio.gather(
                self._expired_docs(expired_query, limit),
                self._ready_within_room(room, now_us, limit, wanted),
            )
            return expired, ready, room
        caps, counted, expired = capped
        room = await self._in_flight_room(default, caps, counted)
        return expired, await self._ready_within_room(room, now_us, limit, wanted), room

    async def _claimable_within(
        self,
        room: _OwnedRoom,
        expired_query: Doc,
        ready_queries: Sequence[tuple[Doc, int]],
        now_us: int,
        limit: int,
        wanted: Mapping[str, int] | None,
    ) -> tuple[list[Doc], list[Doc]]:
        """The expired leases and the READY actions of a later batch, within the room an
        earlier one read."""
        expired_docs = self._expired_docs(expired_query, limit)
        if room.capped:
            expired, ready = await asyncio.gather(
                expired_docs, self._ready_within_room(room, now_us, limit, wanted)
            )
            return expired, ready
        expired, *ready_lists = await asyncio.gather(expired_docs, *self._ready_docs(ready_queries))
        return expired, [doc for docs in ready_lists for doc in docs]

    def _expired_docs(self, expired_query: Doc, limit: int) -> Coroutine[Any, Any, list[Doc]]:
        """PROCESSING actions past their lease, the oldest lease first."""
        return self._actions.find(expired_query, sort=_LEASE_EXPIRY).limit(limit).to_list(None)

    def _ready_docs(
        self, ready_queries: Sequence[tuple[Doc, int]]
    ) -> Iterator[Coroutine[Any, Any, list[Doc]]]:
        """Each READY query's oldest actions, up to its count."""
        for query, count in ready_queries:
            yield self._actions.find(query, sort=_CLAIMABLE_READY).limit(count).to_list(None)

    async def _claim_reads(
        self, expired_query: Doc, limit: int, ready_queries: Sequence[tuple[Doc, int]]
    ) -> tuple[dict[str, int], list[Doc], list[list[Doc]]] | None:
        """The users' caps, the expired leases and each READY query's actions in ONE
        round trip (`_union_reads`; 2 ms on nx-27017 against 3-5 ms for the three reads,
        even sent at once: the server runs one command at a time). None when the server
        has no `$unionWith`."""
        ready_parts: list[tuple[str, list[Doc]]] = [
            (
                self._actions.name,
                [{"$match": query}, {"$sort": dict(_CLAIMABLE_READY)}, {"$limit": count}],
            )
            for query, count in ready_queries
        ]
        found = await self._union_reads(
            [
                (self._actions.name, _expired_leases(expired_query, limit)),
                *ready_parts,
                (self._users.name, _USERS_CAPS),
            ]
        )
        if found is None:
            return None
        # Users have no `workflow_id`; every action has one, READY or PROCESSING.
        caps = {d["_id"]: d[_CAP] for d in found if "workflow_id" not in d}
        actions = [d for d in found if "workflow_id" in d]
        expired = [d for d in actions if d["state"] != ActionState.READY.value]
        ready = [d for d in actions if d["state"] == ActionState.READY.value]
        return caps, expired, [ready]

    async def _capped_claim_reads(
        self, expired_query: Doc, limit: int
    ) -> tuple[dict[str, int], list[Doc], list[Doc]] | None:
        """The users' caps, the in-flight counts per workflow and the expired leases in
        ONE round trip (`_union_reads`); None when the server has no `$unionWith`."""
        found = await self._union_reads(
            [
                (self._actions.name, _IN_FLIGHT_PER_WORKFLOW),
                (self._users.name, _USERS_CAPS),
                (self._actions.name, _expired_leases(expired_query, limit)),
            ]
        )
        if found is None:
            return None
        # Actions have a `workflow_id`, the counts a `count`, the users neither.
        expired = [d for d in found if "workflow_id" in d]
        counted = [d for d in found if "workflow_id" not in d and "count" in d]
        caps = {d["_id"]: d[_CAP] for d in found if "workflow_id" not in d and "count" not in d}
        return caps, counted, expired

    async def _union_reads(self, parts: Sequence[tuple[str, list[Doc]]]) -> list[Doc] | None:
        """Several reads in one aggregation: the first part's pipeline on the actions
        (its collection is always that one), each other part's appended with
        `$unionWith` (each still served by its index, in its order). None when the
        server has no `$unionWith` (MongoDB before 4.4, mongomock): the caller reads them
        apart, as every later claim of this store does.
        """
        if not self._union_claim_reads:
            return None
        (_, first), *others = parts
        pipeline = [
            *first,
            *({"$unionWith": {"coll": coll, "pipeline": part}} for coll, part in others),
        ]
        try:
            return await _aggregate(self._actions, pipeline)
        except NotImplementedError:
            self._union_claim_reads = False
            return None
        except OperationFailure as exc:
            if exc.code == _UNKNOWN_PIPELINE_STAGE:
                self._union_claim_reads = False
            return None

    async def _claim_batch(
        self,
        node_id: str,
        limit: int,
        lease_s: float,
        wanted: Mapping[str, int] | None,
        room: _OwnedRoom | None,
        default: int | None = None,
    ) -> tuple[list[ActionRecord], int, _OwnedRoom]:
        """Up to `limit` claimable actions, in two round trips, with how many were read
        (candidates: more than the actions won when another node won some meanwhile)
        and the in-flight room (`_claimable`), for the next batch.

        Reads the oldest candidates, then claims them all with ONE update_many whose filter
        names each candidate with the version it was read at: each document is still its
        own compare-and-set, so one that changed meanwhile (another node took it) is
        skipped. When every candidate was won (the common case), the records are the read
        documents with the claim applied; otherwise one more read fetches the ones this
        claim won, recognised by its token.
        """
        now, now_us = self._now()
        lease_us = _us(now + timedelta(seconds=lease_s))
        candidates, room = await self._claimable(now_us, limit, wanted, room, default)
        if not candidates:
            return [], 0, room
        claim = {
            "state": ActionState.PROCESSING.value,
            "owner": node_id,
            "lease_expires_at_us": lease_us,
            "updated_at_us": now_us,
            "claim_token": uuid.uuid4().hex,
        }
        # Unchanged since the read (same version) means still claimable: READY past its
        # backoff or PROCESSING past its lease stay so as time passes. A reclaim keeps
        # its history (its state does not change): one update_many for each kind.
        ready = [d for d in candidates if d["state"] == ActionState.READY.value]
        reclaimed = [d for d in candidates if d["state"] != ActionState.READY.value]
        # Versions pinned, so the histories read are the ones updated.
        full = any(len(d.get("history", ())) >= HISTORY_LIMIT - 1 for d in ready)
        entered = _entered(ActionState.PROCESSING, now_us, bounded=full)
        modified = 0
        for docs, pushed in ((ready, entered), (reclaimed, {})):
            if docs:
                unchanged = [{"_id": doc["_id"], "version": doc["version"]} for doc in docs]
                result = await self._actions.update_many(
                    {"$or": unchanged}, {"$set": claim, "$inc": {"version": 1}, **pushed}
                )
                modified += result.modified_count
        if modified == len(candidates):
            claimed = [
                _action({**doc, **claim, "version": doc["version"] + 1}) for doc in candidates
            ]
            return (
                [
                    replace(a, history=rules.entered(a.history, ActionState.PROCESSING, now))
                    if doc["state"] == ActionState.READY.value
                    else a
                    for doc, a in zip(candidates, claimed, strict=True)
                ],
                len(candidates),
                room,
            )
        order = {doc["_id"]: i for i, doc in enumerate(candidates)}
        won = self._actions.find({"_id": {"$in": list(order)}, "claim_token": claim["claim_token"]})
        return (
            [
                _action(doc)
                for doc in sorted(await won.to_list(None), key=lambda d: order[d["_id"]])
            ],
            len(candidates),
            room,
        )

    @_translated
    async def watch_ready(self, on_ready: Callable[[], None]) -> None:
        # A change stream needs a replica set (or a sharded cluster). A standalone
        # mongod refuses the aggregation, but a wire server may accept it and never
        # deliver an event (nx-27017 does): ask the deployment what it is first.
        try:
            hello = await self._db.command("hello")
        except (OperationFailure, NotImplementedError) as exc:
            raise errors.Unsupported(f"no MongoDB change streams: {_short(exc)}") from exc
        if not hello.get("setName") and hello.get("msg") != "isdbgrid":
            raise errors.Unsupported("no MongoDB change streams: not a replica set")
        try:
            stream = await self._actions.watch(_READY_EVENTS)
        except (OperationFailure, NotImplementedError) as exc:
            raise errors.Unsupported(f"no MongoDB change streams: {_short(exc)}") from exc
        async with stream:
            logger.info(
                "watching READY actions through a change stream",
                extra={"event": "ready_watch_started"},
            )
            try:
                async for _ in stream:
                    on_ready()
            except OperationFailure as exc:
                raise errors.Unsupported(f"the change stream ended: {_short(exc)}") from exc

    @_translated
    async def renew_leases(
        self, node_id: str, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> int:
        now, now_us = self._now()
        held = 0
        for chunk in _chunks(sorted({_action_id(w, a) for w, a in keys})):
            result = await self._actions.update_many(
                {
                    "_id": {"$in": chunk},
                    "owner": node_id,
                    "state": {"$in": _values(states.ACTION_ACTIVE)},
                },
                {
                    "$set": {
                        "lease_expires_at_us": _us(now + timedelta(seconds=lease_s)),
                        "updated_at_us": now_us,
                    },
                    "$inc": {"version": 1},
                },
            )
            held += result.matched_count
        return held

    @_translated
    async def release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        return await self._release_parent(workflow_id, parent_action_id, children)

    async def _release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        ready = []
        for child_id in children:
            record = await self._release_child(workflow_id, parent_action_id, child_id)
            if record is not None:
                ready.append(record)
        return ready

    async def _release_child(
        self, workflow_id: str, parent: int, child_id: int
    ) -> ActionRecord | None:
        """Release `parent` from one child; the child's record when it became READY."""
        _id = _action_id(workflow_id, child_id)
        _, now_us = self._now()
        touched: Doc = {"$set": {"updated_at_us": now_us}, "$inc": {"version": 1}}
        # 1. The last parent: one CAS empties the set and flips WAITING → READY.
        #    "Exactly [parent]" is written $size 1 + $all: nx-27017 cannot match an
        #    array literal (it fails binding the list) and has no $not.
        doc = await self._actions.find_one_and_update(
            {
                "_id": _id,
                "state": ActionState.WAITING.value,
                "waiting_on": {"$size": 1, "$all": [parent]},
            },
            {
                "$set": {
                    "state": ActionState.READY.value,
                    "waiting_on": [],
                    "updated_at_us": now_us,
                },
                "$inc": {"version": 1},
                **_entered(ActionState.READY, now_us),
            },
            return_document=_AFTER,
        )
        if doc is not None:
            return _action(doc)
        # 2. Otherwise pull the parent, if it is still there (so a second release changes
        #    nothing). Each $pull is atomic, so of parents finishing at once exactly one
        #    sees the set empty afterwards and does step 3.
        doc = await self._actions.find_one_and_update(
            {"_id": _id, "waiting_on": parent},
            {**touched, "$pull": {"waiting_on": parent}},
            return_document=_AFTER,
        )
        if doc is not None and (doc["waiting_on"] or doc["state"] != ActionState.WAITING.value):
            return None
        # 3. WAITING with nothing left to wait for: flip it. Reached after the last
        #    concurrent pull, or on a retried release after a crash between a pull and
        #    this CAS; otherwise it matches nothing and changes nothing.
        doc = await self._actions.find_one_and_update(
            {"_id": _id, "state": ActionState.WAITING.value, "waiting_on": {"$size": 0}},
            {
                **touched,
                "$set": {"state": ActionState.READY.value, "updated_at_us": now_us},
                **_entered(ActionState.READY, now_us),
            },
            return_document=_AFTER,
        )
        return None if doc is None else _action(doc)

    @_translated
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
        """Not atomic on MongoDB: ordered single-document steps, the CAS first (the
        dataset's, with `stored`, before the action's: it stays if the action's loses).

        Without multi-document transactions, the steps the other backends take in one
        transaction are taken one by one here. That is safe because the compare-and-set
        comes first and each later step is idempotent. A caller that loses the CAS
        changes nothing. A node that dies after the CAS leaves a FINISHED action whose
        claims or children were not all released: `OutcomeService.recover_workflow`
        (run for every RUNNING workflow when a node starts) releases the children still
        waiting on a FINISHED parent and drops the claims ended actions hold, and the
        deletor's `release_orphan_claims` drops ended actions' claims on the datasets it
        could delete. Until then a claim only delays a deletion, and a child only waits.
        """
        if stored is not None and await self._move_dataset(stored) is None:
            return None
        finished = await self._transition_action(
            workflow_id,
            action_id,
            expected,
            ActionState.FINISHED,
            changes,
            if_attempt=if_attempt,
            if_waiting_on=if_waiting_on,
        )
        if finished is None:
            return None
        # Claims, children and the attached actions are different documents: all at once
        # (round trips less on a remote server), and every input's claim in one bulk
        # update. The attached are read after the CAS, like the other backends do.
        _, ready, attached = await asyncio.gather(
            self._drop_claims(finished.inputs.values(), claim_key(workflow_id, action_id)),
            self._release_parent(workflow_id, action_id, finished.children),
            self.list_attached_actions(workflow_id, action_id, limit=attached_limit),
        )
        return Finished(finished, ready, attached)

    async def _drop_claims(self, dataset_ids: Collection[str], claim: str) -> None:
        """Remove `claim` from every dataset of `dataset_ids` holding it: one update_many."""
        if not dataset_ids:
            return
        _, now_us = self._now()
        await self._datasets.update_many(
            {"_id": {"$in": sorted(set(dataset_ids))}, "claims": claim},
            {"$pull": {"claims": claim}, "$set": {"updated_at_us": now_us}, "$inc": {"version": 1}},
        )

    # ------------------------------------------------------------------- datasets

    @_translated
    async def list_attached_actions(
        self,
        producer_workflow_id: str | None = None,
        producer_action_id: int | None = None,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        if limit <= 0:
            return []
        # `$exists` in every form: a query must imply the partial index's filter to use it.
        shared: Doc = {"$exists": True}
        if producer_workflow_id is None:
            shared["$gt"] = ""  # every claim key
        elif producer_action_id is None:
            # A range on the index: every claim key of the workflow, '/' then digits.
            shared.update({"$gte": producer_workflow_id + "/", "$lt": producer_workflow_id + "0"})
        else:
            shared["$eq"] = claim_key(producer_workflow_id, producer_action_id)
        query: Doc = {"state": ActionState.WAITING.value, "shared_with": shared}
        found = self._actions.find(query, sort=[("workflow_id", 1), ("action_id", 1)])
        # "Its own id in waiting_on" compares two fields of one document: filtered here
        # (the candidates are the few WAITING actions sharing with the producer).
        attached = [a for a in map(_action, await found.to_list(None)) if a.is_attached]
        return attached[:limit]

    @_translated
    async def get_dataset(self, dataset_id: str) -> DatasetRecord | None:
        doc = await self._datasets.find_one({"_id": dataset_id})
        return None if doc is None else _dataset(doc)

    @_translated
    async def find_dataset_ids(
        self, prefix: str, *, scopes: Collection[str] | None = None, limit: int = 2
    ) -> list[str]:
        return await _find_ids(self._datasets, "scope", prefix, scopes, limit)

    @_translated
    async def get_datasets(self, dataset_ids: Collection[str]) -> dict[str, DatasetRecord]:
        found: dict[str, DatasetRecord] = {}
        for chunk in _chunks(sorted(set(dataset_ids))):
            docs = await self._datasets.find({"_id": {"$in": chunk}}).to_list(None)
            found.update((d["_id"], _dataset(d)) for d in docs)
        return found

    @_translated
    async def list_child_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 1000
    ) -> list[DatasetRecord]:
        found: dict[str, DatasetRecord] = {}
        for chunk in _chunks(sorted(set(dataset_ids))):
            cursor = self._datasets.find({"parents": {"$in": chunk}}).sort("_id", 1).limit(limit)
            found.update((d["_id"], _dataset(d)) for d in await cursor.to_list(None))
        return [found[i] for i in sorted(found)[:limit]]

    @_translated
    async def find_workflows_with_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 100
    ) -> list[str]:
        found: set[str] = set()
        for chunk in _chunks(sorted(set(dataset_ids))):
            # A popular dataset has many workflows: walk them newest first and stop at
            # `limit` (each chunk's newest `limit` hold the overall newest `limit`).
            cursor = self._actions.find(
                {"dataset_id": {"$in": chunk}}, {"workflow_id": 1, "_id": 0}
            ).sort("workflow_id", -1)
            in_chunk: set[str] = set()
            async for doc in cursor:
                in_chunk.add(doc["workflow_id"])
                if len(in_chunk) >= limit:
                    break
            found.update(in_chunk)
        return sorted(found, reverse=True)[:limit]

    @_translated
    async def list_datasets(
        self,
        *,
        state: DatasetState | None = None,
        scopes: Collection[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[DatasetRecord]:
        query: Doc = {} if state is None else {"state": state.value}
        if scopes is not None:
            query["scope"] = {"$in": sorted(scopes)}
        docs = await self._page(self._datasets, query, limit, cursor)
        return _make_page([_dataset(d) for d in docs], limit)

    @_translated
    async def list_claimed_datasets(
        self, *, after: str | None = None, limit: int = 100
    ) -> list[DatasetRecord]:
        if limit <= 0:
            return []
        # $expr rather than {"claims.0": {"$exists": true}}, and under $and beside the
        # _id range rather than next to it: nx-27017 answers both other forms wrongly.
        # No index helps either way; the scan goes by _id (a sweep every ten leases).
        query: Doc = {"$expr": {"$gt": [{"$size": "$claims"}, 0]}}
        if after is not None:
            query = {"$and": [{"_id": {"$gt": after}}, query]}
        docs = await self._datasets.find(query).sort("_id", 1).limit(limit).to_list(limit)
        return [_dataset(d) for d in docs]

    @_translated
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
        return await self._move_dataset(move, if_unclaimed=if_unclaimed)

    async def _move_dataset(
        self, move: DatasetMove, *, if_unclaimed: bool = False
    ) -> DatasetRecord | None:
        query: Doc = {"_id": move.dataset_id, "state": {"$in": _values(move.expected)}}
        if if_unclaimed:
            query["claims"] = {"$size": 0}
        _, now_us = self._now()
        fields = {
            "state": move.new.value,
            "updated_at_us": now_us,
            **_changes_set(move.changes.items()),
        }
        doc = await self._datasets.find_one_and_update(
            query, {"$set": fields, "$inc": {"version": 1}}, return_document=_AFTER
        )
        if doc is None:
            _common.log_cas_lost(f"dataset {move.dataset_id}", move.new, dataset_id=move.dataset_id)
            return None
        if move.event is not None:
            await self._append_after(move.event)
        return _dataset(doc)

    async def _append_after(self, event: NewEvent) -> None:
        """Append `event` after the write it goes with: no transaction holds both here,
        and that write is done, so a failure is logged rather than raised."""
        try:
            await self.append_event(
                event.kind,
                owner=event.owner,
                workflow_id=event.workflow_id,
                dataset_id=event.dataset_id,
                payload=event.payload,
            )
        except errors.PingoError as exc:
            _common.log_event_lost(event.kind, event.workflow_id, exc.message)

    async def _update_dataset(self, query: Doc, update: Doc) -> DatasetRecord | None:
        _, now_us = self._now()
        update = {**update, "$inc": {**update.get("$inc", {}), "version": 1}}
        update["$set"] = {**update.get("$set", {}), "updated_at_us": now_us}
        doc = await self._datasets.find_one_and_update(query, update, return_document=_AFTER)
        return None if doc is None else _dataset(doc)

    @_translated
    async def add_dataset_claim(
        self, dataset_id: str, claim: str, allowed: Collection[DatasetState]
    ) -> DatasetRecord | None:
        if not allowed:
            return None
        in_allowed: Doc = {"_id": dataset_id, "state": {"$in": _values(allowed)}}
        # "Not already claimed" is $nin, not $ne: nx-27017 applies $ne to the array as
        # a whole (so it always matches) but $nin element-wise, like MongoDB.
        added = await self._update_dataset(
            {**in_allowed, "claims": {"$nin": [claim]}}, {"$addToSet": {"claims": claim}}
        )
        if added is not None:
            return added
        # Already claimed (an idempotent repeat), or not in an allowed state (None).
        doc = await self._datasets.find_one({**in_allowed, "claims": claim})
        return None if doc is None else _dataset(doc)

    @_translated
    async def remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        return await self._remove_dataset_claim(dataset_id, claim)

    async def _remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        removed = await self._update_dataset(
            {"_id": dataset_id, "claims": claim}, {"$pull": {"claims": claim}}
        )
        if removed is not None:
            return removed
        doc = await self._datasets.find_one({"_id": dataset_id})
        return None if doc is None else _dataset(doc)

    @_translated
    async def record_dataset_uses(self, dataset_ids: Collection[str]) -> int:
        wanted = sorted(set(dataset_ids))
        if not wanted:
            return 0
        _, now_us = self._now()
        result = await self._datasets.update_many(
            {"_id": {"$in": wanted}},
            {
                "$inc": {"use_count": 1, "version": 1},
                "$set": {"last_used_at_us": now_us, "updated_at_us": now_us},
            },
        )
        return int(result.matched_count)

    @_translated
    async def set_dataset_pinned(self, dataset_id: str, pinned: bool) -> DatasetRecord | None:
        changed = await self._update_dataset(
            {"_id": dataset_id, "pinned": not pinned}, {"$set": {"pinned": pinned}}
        )
        if changed is not None:
            return changed
        doc = await self._datasets.find_one({"_id": dataset_id})
        return None if doc is None else _dataset(doc)

    @_translated
    async def list_deletable_datasets(
        self, stale_s: float, limit: int = 100
    ) -> list[DatasetRecord]:
        if limit <= 0:
            return []
        now, _ = self._now()
        stale_us = _us(now - timedelta(seconds=stale_s))
        found = self._datasets.find(
            {
                "$or": [
                    {"state": DatasetState.STORED_TO_DELETE.value, "claims": {"$size": 0}},
                    {
                        "state": {"$in": _values({DatasetState.PROCESSING, DatasetState.DELETING})},
                        "updated_at_us": {"$lte": stale_us},
                    },
                ]
            },
            sort=_OLDEST_DATASET,
        ).limit(limit)
        return [_dataset(d) for d in await found.to_list(None)]

    @_translated
    async def list_retention_candidates(self) -> list[DatasetRecord]:
        found = self._datasets.find({"state": DatasetState.STORED.value}, sort=_OLDEST_DATASET)
        return [_dataset(d) for d in await found.to_list(None)]

    @_translated
    async def bytes_by_state(self) -> dict[DatasetState, int]:
        groups = await _aggregate(
            self._datasets, [{"$group": {"_id": "$state", "bytes": {"$sum": "$size_bytes"}}}]
        )
        # $sum skips nulls; SQL's SUM (nx-27017) makes an all-null group null, not 0.
        return {DatasetState(g["_id"]): int(g["bytes"] or 0) for g in groups}

    # --------------------------------------------------------------------- events

    @_translated
    async def append_event(
        self,
        kind: str,
        *,
        dataset_id: str | None = None,
        workflow_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> EventRecord:
        # A counter document hands out sequence numbers; a crash between the two writes
        # leaves a gap in the sequence, never a duplicate (`pingo.events.settled` waits
        # a moment before a feed skips a gap, for an insert still on its way).
        counter = await self._counters.find_one_and_update(
            {"_id": "events"}, {"$inc": {"seq": 1}}, upsert=True, return_document=_AFTER
        )
        assert counter is not None  # an upsert with return_document=AFTER returns the document
        now, now_us = self._now()
        event = EventRecord(
            seq=counter["seq"],
            kind=kind,
            at=now,
            dataset_id=dataset_id,
            workflow_id=workflow_id,
            payload=payload,
            owner=owner,
        )
        await self._events.insert_one(
            {
                "_id": event.seq,
                "seq": event.seq,
                "kind": kind,
                "at_us": now_us,
                "dataset_id": dataset_id,
                "workflow_id": workflow_id,
                "payload": _dump_json(payload),
                "owner": owner,
            }
        )
        return event

    @_translated
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
        if limit <= 0:
            return []
        query: Doc = {}
        for field, value in (("kind", kind), ("dataset_id", dataset_id), ("owner", owner)):
            if value is not None:
                query[field] = value
        bounds: Doc = {}
        if before_seq is not None:
            bounds["$lt"] = before_seq
        if after_seq is not None:
            bounds["$gt"] = after_seq
        if bounds:
            query["seq"] = bounds
        order = pymongo.ASCENDING if after_seq is not None else pymongo.DESCENDING
        found = self._events.find(query, sort=[("seq", order)]).limit(limit)
        return [_event(d) for d in await found.to_list(None)]

    # ---------------------------------------------------------------------- users

    @_translated
    async def create_user(self, user: UserRecord) -> UserRecord:
        try:
            await self._users.insert_one(_user_doc(user))
        except DuplicateKeyError as exc:
            if await self._users.find_one({"_id": user.name}, {"_id": 1}) is not None:
                raise errors.Conflict(f"user {user.name!r} already exists") from exc
            raise errors.Conflict("another user has the same token") from exc
        return user

    @_translated
    async def get_user(self, name: str) -> UserRecord | None:
        doc = await self._users.find_one({"_id": name})
        return None if doc is None else _user(doc)

    @_translated
    async def get_user_by_token_hash(self, token_hash: str) -> UserRecord | None:
        doc = await self._users.find_one({"token_hash": token_hash})
        return None if doc is None else _user(doc)

    @_translated
    async def list_users(self) -> list[UserRecord]:
        found = self._users.find({}, sort=[("_id", pymongo.ASCENDING)])
        return [_user(d) for d in await found.to_list(None)]

    @_translated
    async def delete_user(self, name: str) -> bool:
        result = await self._users.delete_one({"_id": name})
        return result.deleted_count > 0

    @_translated
    async def set_user_limits(self, name: str, limits: UserLimits) -> UserRecord | None:
        doc = await self._users.find_one_and_update(
            {"_id": name}, {"$set": _limits_doc(limits)}, return_document=_AFTER
        )
        return None if doc is None else _user(doc)

    @_translated
    async def bytes_produced_by(self, owner: str) -> int:
        produced = [doc["_id"] async for doc in self._workflows.find({"owner": owner}, {"_id": 1})]
        charged = [s.value for s in states.DATASET_USING_STORAGE]
        total = 0
        for chunk in _chunks(produced):
            groups = await _aggregate(
                self._datasets,
                [
                    {
                        "$match": {
                            "producer_workflow_id": {"$in": list(chunk)},
                            "state": {"$in": charged},
                        }
                    },
                    {"$group": {"_id": None, "bytes": {"$sum": "$size_bytes"}}},
                ],
            )
            total += sum(int(g["bytes"] or 0) for g in groups)
        return total

    @_translated
    async def count_running_workflows(self, owner: str) -> int:
        return await self._workflows.count_documents(
            {"owner": owner, "state": WorkflowState.RUNNING.value}
        )

    # ------------------------------------------------------------------ schedules

    @_translated
    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        try:
            await self._schedules.insert_one(_schedule_doc(schedule))
        except DuplicateKeyError as exc:
            raise errors.Conflict(f"schedule {schedule.id!r} already exists") from exc
        return schedule

    @_translated
    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        doc = await self._schedules.find_one({"_id": schedule_id})
        return None if doc is None else _schedule(doc)

    @_translated
    async def list_schedules(
        self, *, owner: str | None = None, limit: int = 100
    ) -> list[ScheduleRecord]:
        if limit <= 0:
            return []
        query: Doc = {} if owner is None else {"owner": owner}
        found = self._schedules.find(
            query, sort=[("created_at_us", pymongo.DESCENDING), ("id", pymongo.DESCENDING)]
        ).limit(limit)
        return [_schedule(d) for d in await found.to_list(None)]

    @_translated
    async def list_due_schedules(
        self,
        now: datetime,
        node_id: str,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
    ) -> list[ScheduleRecord]:
        now_us = _us(now)
        order = [("next_fire_at_us", pymongo.ASCENDING), ("_id", pymongo.ASCENDING)]
        if after is not None:
            # The cursor's own instant, then what comes after it, rather than one `$or`
            # (nx-27017 matches no null in an `$or`); the ties' ids compared here, since
            # nx-27017 did not match `_id: {"$gt": …}` beside the instant either.
            at, last_id = _us(after[0]), after[1]
            waiting = {"pending_tick_at_us": None, "paused": False}
            ties = self._schedules.find({**waiting, "next_fire_at_us": at}, sort=order)
            later = self._schedules.find(
                {**waiting, "next_fire_at_us": {"$gt": at, "$lte": now_us}}, sort=order
            ).limit(limit)
            page = [_schedule(d) for d in await ties.to_list(None) if d["_id"] > last_id]
            page += [_schedule(d) for d in await later.to_list(None)]
            return page[:limit]
        pending = self._schedules.find(
            {
                "pending_tick_at_us": {"$ne": None},
                "$or": [{"claimed_by": node_id}, {"claim_expires_at_us": {"$lte": now_us}}],
            }
        ).limit(limit)
        due = self._schedules.find(
            {"next_fire_at_us": {"$lte": now_us}, "pending_tick_at_us": None, "paused": False},
            sort=order,
        ).limit(limit)
        found = [_schedule(d) for d in await pending.to_list(None)]
        found += [_schedule(d) for d in await due.to_list(None)]
        return found[:limit]

    @_translated
    async def update_schedule(
        self, schedule_id: str, expected_version: int, changes: ScheduleChanges
    ) -> ScheduleRecord | None:
        update = _us_changes(changes.items())
        update["updated_at_us"] = _us(self.clock())
        doc = await self._schedules.find_one_and_update(
            {"_id": schedule_id, "version": expected_version},
            {"$set": update, "$inc": {"version": 1}},
            return_document=_AFTER,
        )
        return None if doc is None else _schedule(doc)

    @_translated
    async def update_schedules(
        self, updates: Sequence[tuple[str, int, ScheduleChanges]]
    ) -> list[ScheduleRecord | None]:
        # One compare-and-set per document (MongoDB has no multi-document CAS that
        # returns each outcome), sent together rather than one round trip after another.
        return list(await asyncio.gather(*(self.update_schedule(i, v, c) for i, v, c in updates)))

    @_translated
    async def delete_schedule(self, schedule_id: str) -> bool:
        result = await self._schedules.delete_one({"_id": schedule_id})
        await self._schedule_runs.delete_many({"schedule_id": schedule_id})
        return result.deleted_count > 0

    @_translated
    async def record_schedule_run(self, run: ScheduleRunRecord) -> ScheduleRunRecord:
        doc = _run_doc(run)
        try:
            await self._schedule_runs.insert_one(doc)
        except DuplicateKeyError:
            existing = await self._schedule_runs.find_one({"_id": doc["_id"]})
            if existing is not None:
                return _run(existing)
            raise
        return run

    @_translated
    async def list_schedule_runs(
        self, schedule_id: str, limit: int = 100
    ) -> list[ScheduleRunRecord]:
        if limit <= 0:
            return []
        found = self._schedule_runs.find(
            {"schedule_id": schedule_id}, sort=[("tick_at_us", pymongo.DESCENDING)]
        ).limit(limit)
        return [_run(d) for d in await found.to_list(None)]

    # --------------------------------------------------------- webhook deliveries

    @_translated
    async def create_deliveries(self, deliveries: Sequence[WebhookDeliveryRecord]) -> None:
        for delivery in deliveries:
            with contextlib.suppress(DuplicateKeyError):
                await self._deliveries.insert_one(_delivery_doc(delivery))

    @_translated
    async def claim_deliveries(
        self, node_id: str, now: datetime, limit: int, lease_s: float
    ) -> list[WebhookDeliveryRecord]:
        now_us = _us(now)
        claimable: Doc = {
            "state": "pending",
            "next_attempt_at_us": {"$lte": now_us},
            "claim_expires_at_us": {"$lte": now_us},
        }
        candidates = self._deliveries.find(
            claimable, {"_id": 1}, sort=[("next_attempt_at_us", pymongo.ASCENDING)]
        ).limit(limit)
        claimed = []
        for candidate in await candidates.to_list(None):
            doc = await self._deliveries.find_one_and_update(
                {"_id": candidate["_id"], **claimable},
                {
                    "$set": {
                        "claimed_by": node_id,
                        "claim_expires_at_us": now_us + int(lease_s * 1e6),
                        "updated_at_us": now_us,
                    },
                    "$inc": {"version": 1},
                },
                return_document=_AFTER,
            )
            if doc is not None:
                claimed.append(_delivery(doc))
        return claimed

    @_translated
    async def update_delivery(
        self, delivery_id: str, expected_version: int, changes: DeliveryChanges
    ) -> WebhookDeliveryRecord | None:
        update = _us_changes(changes.items())
        update["updated_at_us"] = _us(self.clock())
        doc = await self._deliveries.find_one_and_update(
            {"_id": delivery_id, "version": expected_version},
            {"$set": update, "$inc": {"version": 1}},
            return_document=_AFTER,
        )
        return None if doc is None else _delivery(doc)

    @_translated
    async def list_deliveries(
        self,
        *,
        owner: str | None = None,
        workflow_id: str | None = None,
        schedule_id: str | None = None,
        limit: int = 100,
    ) -> list[WebhookDeliveryRecord]:
        if limit <= 0:
            return []
        query: Doc = {}
        for name, value in (
            ("owner", owner),
            ("workflow_id", workflow_id),
            ("schedule_id", schedule_id),
        ):
            if value is not None:
                query[name] = value
        found = self._deliveries.find(
            query, sort=[("created_at_us", pymongo.DESCENDING), ("id", pymongo.DESCENDING)]
        ).limit(limit)
        return [_delivery(d) for d in await found.to_list(None)]


#: Seconds a claim trusts its last read of the owners of RUNNING workflows.
_RUNNING_OWNERS_S = 1.0
#: Oldest update first; ties in the memory store's order (workflow id, then action id).
_OLDEST_ACTION = [("updated_at_us", 1), ("workflow_id", 1), ("action_id", 1)]
#: The same among READY actions: the `claimable` index after its `state` (or
#: `claimable_by_type` after `state` and `type`), which every query sorted this way pins
#: by equality. A sort must not name a field its filter pins:
#: nx-27017's SQLite then reads every match and sorts it in a temporary B-tree (its
#: planner even picks `lease_expiry` for it), 8 ms at 3,000 READY actions instead of
#: 0.05 ms for the first ten in index order; MongoDB serves either spelling from the index.
_CLAIMABLE_READY = _OLDEST_ACTION
#: Change events that may make an action READY: a READY insert, or an update setting READY.
_READY_EVENTS: list[Doc] = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert", "fullDocument.state": ActionState.READY.value},
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.state": ActionState.READY.value,
                },
            ]
        }
    }
]
#: Expired leases, soonest expiry first (the `lease_expiry` index after its pinned `state`).
_LEASE_EXPIRY = [("lease_expires_at_us", 1)]
#: The users with an in-flight cap of their own, and the field that holds it.
_CAP = "max_in_flight_actions"
_CAPPED_USERS: Doc = {_CAP: {"$ne": None}}
#: The users' own caps, as a pipeline (`_union_reads`).
_USERS_CAPS: list[Doc] = [{"$match": _CAPPED_USERS}, {"$project": {_CAP: 1}}]
#: `{_id: workflow id, count}` of the actions in flight: counted in the server, one
#: document per workflow, not per action.
_IN_FLIGHT_PER_WORKFLOW: list[Doc] = [
    {"$match": {"state": {"$in": _values(states.ACTION_ACTIVE)}}},
    {"$group": {"_id": "$workflow_id", "count": {"$sum": 1}}},
]
#: MongoDB's error for a pipeline stage it does not know (`$unionWith` before 4.4).
_UNKNOWN_PIPELINE_STAGE = 40324
#: Oldest update first, then by id.
_OLDEST_DATASET = [("updated_at_us", 1), ("id", 1)]


async def _aggregate(collection: AsyncCollection[Doc], pipeline: list[Doc]) -> list[Doc]:
    """Run an aggregation pipeline and return every result document."""
    cursor: Any = collection.aggregate(pipeline)
    # PyMongo's aggregate is a coroutine returning a cursor; mongomock-motor's (the
    # in-process test server) returns the cursor itself.
    if inspect.isawaitable(cursor):
        cursor = await cursor
    results: list[Doc] = await cursor.to_list(None)
    return results


def _expired_leases(query: Doc, limit: int) -> list[Doc]:
    """The pipeline of the expired-leases read (`query`), soonest expiry first."""
    return [{"$match": query}, {"$sort": dict(_LEASE_EXPIRY)}, {"$limit": limit}]


def _oldest_action(doc: Doc) -> tuple[int, str, int]:
    """The `_OLDEST_ACTION` order, in Python (to merge two sorted query results)."""
    return doc["updated_at_us"], doc["workflow_id"], doc["action_id"]


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """`items` in slices, for `$in` lists that stay small on every server."""
    return _common.chunks(items, _IN_CHUNK)


def _make_page(items: list[R], limit: int) -> Page[R]:
    """A page of `limit` items out of up to `limit + 1` fetched newest first."""
    page = tuple(items[:limit])
    if len(items) > limit and page:
        last: Any = page[-1]
        return Page(items=page, next_cursor=_cursor.encode_cursor(last.created_at, last.id))
    return Page(items=page, next_cursor=None)


async def _find_ids(
    collection: AsyncCollection[Doc],
    field: str,
    prefix: str,
    allowed: Collection[str] | str | None,
    limit: int,
) -> list[str]:
    """Ids in `collection` starting with `prefix` (a range on `_id`), filtered on `field`
    being `allowed` (one value or several) when given."""
    low, high = lookup.prefix_bounds(prefix)
    query: Doc = {"_id": {"$gte": low, "$lt": high}}
    if allowed is not None:
        query[field] = allowed if isinstance(allowed, str) else {"$in": sorted(allowed)}
    cursor = collection.find(query, {"_id": 1}).sort("_id", 1).limit(limit)
    return [str(doc["_id"]) for doc in await cursor.to_list(None)]

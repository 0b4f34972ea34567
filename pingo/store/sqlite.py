"""The embedded default `Store`: one SQLite file, shareable by several processes.

Threading. Each process opens ONE connection and uses it from ONE dedicated
worker thread. Every protocol method is a whole synchronous function (its
statements and, for a write, its commit) that runs there in a single hop from
the event loop. aiosqlite hops to its thread once per statement and once per
commit; for a compare-and-set that is three hops instead of one, and the hops
(not SQLite) dominate the cost of a small transaction.

Group commit. Calls made while the worker is busy queue up; the worker takes
them all at once and, when any of them writes, runs them in ONE transaction
(each write inside its own SAVEPOINT, so a failing call is undone alone; a
one-statement write, such as a compare-and-set, needs none, since SQLite undoes
a failed statement by itself) with ONE commit, then wakes the event loop once
to hand back every result. A call is acknowledged only after the commit that
holds it. A lone call costs what it would cost alone; under load, N calls cost
one commit and two thread switches.

Concurrency between processes. The file is in WAL mode: readers never block
the writer. A write transaction starts with BEGIN IMMEDIATE, which takes the
write lock up front, so two processes never deadlock upgrading a read
transaction to a write one (SQLITE_BUSY_SNAPSHOT, which no amount of waiting
resolves). A writer waits up to `busy_timeout_s` for the lock; past that the
call raises `StoreUnavailable`. A scraper poll that finds nothing to claim
takes no write lock at all.

Durability. `synchronous` comes from the settings:
- NORMAL (default): a commit returns once its WAL frames are written to the
  file (not fsynced). An acknowledged transition survives `kill -9` of the
  process, since the frames are in the OS page cache, but the last
  transactions may be lost on power loss or an OS crash. The database is never
  corrupted either way (tests/unit/test_sqlite_durability.py kills a writer).
- FULL: the WAL is fsynced at every commit: an acknowledged transition also
  survives power loss, at the cost of one fsync per commit (shared by a group).

Layout. Timestamps are integer microseconds since the epoch (exact, and
ordered as numbers). An action is two rows: `actions` holds what transitions
change (small, so a compare-and-set rewrites and logs little) and
`action_specs` what planning fixed (definitions, inputs, children), written
once and cached decoded per process. Documents and maps are JSON text, never
rewritten by a transition. An action's `waiting_on` and a dataset's `claims`
are JSON arrays changed by read-modify-write under the write lock, so each
change is atomic.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import queue
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, overload

from pingo import errors, heap, states, untrusted
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store import _common, _cursor, _json, _room, _rows, lookup, rules, utcnow
from pingo.store.protocol import (
    HISTORY_LIMIT,
    KEEP,
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
    _Changes,
    claim_key,
    open_quotas,
)
from pingo.store.rules import plan_upgrades

logger = logging.getLogger(__name__)

T = TypeVar("T")

_NO_ACTION_CHANGES = ActionChanges()
_NO_DATASET_CHANGES = DatasetChanges()
_NO_WORKFLOW_CHANGES = WorkflowChanges()

_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
#: The page cache when none is asked for (`Settings.sqlite_cache_mb`'s default).
DEFAULT_CACHE_MB = 8

#: When an existing action entered its current state, as far as its row says (the
#: history migration's back-fill).
_BACKFILL_AT = (
    "(CASE WHEN state IN ('FINISHED', 'FAILED', 'KILLED', 'UPSTREAM_FAILED') "
    "AND finished_at IS NOT NULL THEN finished_at ELSE updated_at END)"
)

#: Schema migrations: step i brings `PRAGMA user_version` from i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE workflows (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            owner TEXT NOT NULL,
            state TEXT NOT NULL,
            document TEXT NOT NULL,
            scope TEXT NOT NULL,
            on_failure TEXT NOT NULL,
            end_dataset_id TEXT,
            created_at INTEGER NOT NULL,
            finished_at INTEGER,
            idempotency_key TEXT,
            rerun_of TEXT,
            error TEXT,
            version INTEGER NOT NULL
        )""",
        # NULL keys are distinct in a UNIQUE index: workflows without a key never collide.
        "CREATE UNIQUE INDEX workflows_idempotency ON workflows (owner, idempotency_key)",
        "CREATE INDEX workflows_created ON workflows (created_at, id)",
        "CREATE INDEX workflows_owner ON workflows (owner, created_at, id)",
        "CREATE INDEX workflows_state ON workflows (state, created_at, id)",
        "CREATE INDEX workflows_name ON workflows (name, created_at, id)",
        # An action is split in two: the columns a transition changes (small rows, so a
        # compare-and-set rewrites little and its commit writes few WAL bytes), and the
        # ones fixed at planning, written once (definitions can be large).
        """CREATE TABLE actions (
            workflow_id TEXT NOT NULL,
            action_id INTEGER NOT NULL,
            state TEXT NOT NULL,
            waiting_on TEXT NOT NULL,
            updated_at INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            owner TEXT,
            lease_expires_at INTEGER,
            not_before INTEGER,
            external_id TEXT,
            error TEXT,
            started_at INTEGER,
            finished_at INTEGER,
            runtime_s REAL,
            version INTEGER NOT NULL,
            PRIMARY KEY (workflow_id, action_id)
        )""",
        # The scraper's READY scan and list_actions_in_states (oldest update first).
        "CREATE INDEX actions_state_updated ON actions (state, updated_at)",
        # The scraper's reclaim of expired PROCESSING leases, polled as often as READY.
        # Partial: only rows entering or leaving PROCESSING touch it. The reaper's
        # SUBMITTED/RUNNING lease scan goes by state (those are bounded by executor slots).
        "CREATE INDEX actions_processing_lease ON actions (state, lease_expires_at) "
        "WHERE state = 'PROCESSING'",
        # Per-workflow counts by state: the callback path asks "is anything left to
        # run?" after every action, and counting a big workflow's rows each time would
        # make finishing a workflow quadratic. A trigger keeps them on state changes;
        # rows are only inserted by create_workflow, which adds its counts in bulk.
        """CREATE TABLE action_counts (
            workflow_id TEXT NOT NULL,
            state TEXT NOT NULL,
            count INTEGER NOT NULL,
            PRIMARY KEY (workflow_id, state)
        ) WITHOUT ROWID""",
        """CREATE TRIGGER action_counts_update AFTER UPDATE OF state ON actions
        WHEN old.state IS NOT new.state BEGIN
            UPDATE action_counts SET count = count - 1
            WHERE workflow_id = old.workflow_id AND state = old.state;
            INSERT INTO action_counts (workflow_id, state, count)
            VALUES (new.workflow_id, new.state, 1)
            ON CONFLICT (workflow_id, state) DO UPDATE SET count = count + 1;
        END""",
        """CREATE TABLE action_specs (
            workflow_id TEXT NOT NULL,
            action_id INTEGER NOT NULL,
            name TEXT NOT NULL,
            type TEXT NOT NULL,
            dataset_id TEXT NOT NULL,
            reused INTEGER NOT NULL,
            reason TEXT NOT NULL,
            definition TEXT NOT NULL,
            inputs TEXT NOT NULL,
            children TEXT NOT NULL,
            callback_id TEXT NOT NULL UNIQUE,
            created_at INTEGER NOT NULL,
            max_attempts INTEGER NOT NULL,
            PRIMARY KEY (workflow_id, action_id)
        )""",
        """CREATE TABLE datasets (
            id TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            path TEXT NOT NULL,
            scope TEXT NOT NULL,
            action_type TEXT NOT NULL,
            definition TEXT NOT NULL,
            parents TEXT NOT NULL,
            producer_workflow_id TEXT NOT NULL,
            producer_action_id INTEGER NOT NULL,
            is_managed INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            claims TEXT NOT NULL,
            size_bytes INTEGER,
            compute_s REAL,
            use_count INTEGER NOT NULL,
            last_used_at INTEGER,
            stored_at INTEGER,
            pinned INTEGER NOT NULL,
            version INTEGER NOT NULL
        )""",
        # Totals by state, for the retention loop's every pass: a trigger keeps them on
        # changes; create_workflow adds the datasets it inserts in bulk.
        """CREATE TABLE dataset_totals (
            state TEXT PRIMARY KEY,
            count INTEGER NOT NULL,
            bytes INTEGER NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TRIGGER dataset_totals_update AFTER UPDATE OF state, size_bytes ON datasets
        WHEN old.state IS NOT new.state OR old.size_bytes IS NOT new.size_bytes BEGIN
            UPDATE dataset_totals
            SET count = count - 1, bytes = bytes - COALESCE(old.size_bytes, 0)
            WHERE state = old.state;
            INSERT INTO dataset_totals (state, count, bytes)
            VALUES (new.state, 1, COALESCE(new.size_bytes, 0))
            ON CONFLICT (state) DO UPDATE
            SET count = count + 1, bytes = bytes + COALESCE(new.size_bytes, 0);
        END""",
        # The deletor and retention scans (by state, oldest update first).
        "CREATE INDEX datasets_state_updated ON datasets (state, updated_at)",
        "CREATE INDEX datasets_created ON datasets (created_at, id)",
        "CREATE INDEX datasets_state_created ON datasets (state, created_at, id)",
        """CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            at INTEGER NOT NULL,
            dataset_id TEXT,
            workflow_id TEXT,
            payload TEXT
        )""",
        "CREATE INDEX events_kind ON events (kind, seq)",
        "CREATE INDEX events_dataset ON events (dataset_id, seq)",
        """CREATE TABLE users (
            name TEXT PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            is_admin INTEGER NOT NULL,
            created_at INTEGER NOT NULL
        )""",
    ),
    # Datasets record a content digest at commit (pingo.datasets.integrity).
    ("ALTER TABLE datasets ADD COLUMN digest TEXT",),
    (
        # Per-user limits (NULL: the server's default) and the index that counts a
        # user's RUNNING workflows at each submission.
        "ALTER TABLE users ADD COLUMN max_workflows INTEGER",
        "ALTER TABLE users ADD COLUMN max_in_flight_actions INTEGER",
        "ALTER TABLE users ADD COLUMN submissions_per_minute INTEGER",
        "CREATE INDEX workflows_owner_state ON workflows (owner, state)",
        # A claim under in-flight caps pages through READY past the actions of users
        # already full: covering, so skipping one costs an index step, not a row fetch.
        "CREATE INDEX actions_ready_scan ON actions "
        "(updated_at, workflow_id, action_id, not_before, state) WHERE state = 'READY'",
    ),
    # Claim by capacity: a node claims READY actions per type (issue 16), so the type
    # joins the hot row, where an index on the READY rows alone serves each type's
    # oldest-first scan. Partial: only rows entering or leaving READY touch it.
    (
        "ALTER TABLE actions ADD COLUMN action_type TEXT NOT NULL DEFAULT ''",
        "UPDATE actions SET action_type = (SELECT s.type FROM action_specs s "
        "WHERE s.workflow_id = actions.workflow_id AND s.action_id = actions.action_id)",
        "CREATE INDEX actions_ready_type ON actions (action_type, updated_at) "
        "WHERE state = 'READY'",
    ),
    # Schedules (issue 18): recurring workflows, their ticks' outcomes, and webhook
    # deliveries. A schedule's definition is one JSON column; only what the
    # scheduler filters and compares-and-sets on has a column of its own.
    (
        """CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            paused INTEGER NOT NULL,
            next_fire_at INTEGER,
            pending_tick_at INTEGER,
            claimed_by TEXT,
            claim_expires_at INTEGER,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            version INTEGER NOT NULL
        )""",
        "CREATE INDEX schedules_next_fire ON schedules (next_fire_at)",
        "CREATE INDEX schedules_pending ON schedules (pending_tick_at)",
        "CREATE INDEX schedules_owner ON schedules (owner, created_at, id)",
        """CREATE TABLE schedule_runs (
            schedule_id TEXT NOT NULL,
            tick_at INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            recorded_at INTEGER NOT NULL,
            workflow_id TEXT,
            reason TEXT,
            PRIMARY KEY (schedule_id, tick_at)
        ) WITHOUT ROWID""",
        """CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            workflow_id TEXT NOT NULL,
            schedule_id TEXT,
            url TEXT NOT NULL,
            event TEXT NOT NULL,
            body BLOB NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            last_status INTEGER,
            last_error TEXT,
            claimed_by TEXT,
            claim_expires_at INTEGER,
            version INTEGER NOT NULL
        )""",
        "CREATE INDEX deliveries_due ON webhook_deliveries (state, next_attempt_at)",
        "CREATE INDEX deliveries_owner ON webhook_deliveries (owner, created_at)",
        "CREATE INDEX deliveries_workflow ON webhook_deliveries (workflow_id, created_at)",
        "CREATE INDEX deliveries_schedule ON webhook_deliveries (schedule_id, created_at)",
    ),
    # Lineage downwards and the workflows that used a dataset (the UI's dataset page):
    # parent → child pairs kept by a trigger, since `parents` is JSON text; filled for
    # the datasets that exist already. A dataset's parents never change (its id hashes them).
    (
        """CREATE TABLE dataset_parents (
            parent TEXT NOT NULL,
            child TEXT NOT NULL,
            PRIMARY KEY (parent, child)
        ) WITHOUT ROWID""",
        "INSERT OR IGNORE INTO dataset_parents (parent, child) "
        "SELECT j.value, d.id FROM datasets d, json_each(d.parents) j",
        """CREATE TRIGGER dataset_parents_insert AFTER INSERT ON datasets
        BEGIN
            INSERT OR IGNORE INTO dataset_parents (parent, child)
            SELECT value, new.id FROM json_each(new.parents);
        END""",
        "CREATE INDEX action_specs_dataset ON action_specs (dataset_id, workflow_id)",
    ),
    # In-flight deduplication (issue 16): the action another workflow computes this
    # action's dataset in, fixed at planning. On the hot row, so that a partial index
    # holds exactly the actions still WAITING that share: a producer's outcome and the
    # reaper's backstop read those few, never every WAITING action nor the history.
    (
        "ALTER TABLE actions ADD COLUMN shared_with TEXT",
        "CREATE INDEX actions_waiting_shared ON actions (shared_with, workflow_id, action_id) "
        "WHERE shared_with IS NOT NULL AND state = 'WAITING'",
    ),
    # Each user's feed of their workflows' events (issue 18): events carry the user
    # whose feed shows them, and the feed pages by sequence number.
    (
        "ALTER TABLE events ADD COLUMN owner TEXT",
        "CREATE INDEX events_owner ON events (owner, seq) WHERE owner IS NOT NULL",
    ),
    # Each action's recorded state history (issue 17): [[state, micros], …], oldest
    # first, appended by the UPDATE that changes the state (`_HISTORY_SET`). Actions
    # that exist already get what their timestamps say: the last submission
    # (started_at), then the current state, at finished_at when it ended (a reused
    # action's is its planning), else at its last update. Earlier steps (the opening
    # WAITING or READY, earlier attempts) were never kept and are left out.
    (
        "ALTER TABLE actions ADD COLUMN history TEXT NOT NULL DEFAULT '[]'",
        f"""UPDATE actions SET history = CASE
            WHEN state = 'SUBMITTED' AND started_at IS NOT NULL
                THEN json_array(json_array(state, started_at))
            WHEN started_at IS NOT NULL AND started_at <= {_BACKFILL_AT}
                THEN json_array(json_array('SUBMITTED', started_at),
                                json_array(state, {_BACKFILL_AT}))
            ELSE json_array(json_array(state, {_BACKFILL_AT}))
        END""",
    ),
    # A claim under in-flight caps pages through each wanted type's READY actions
    # apart: covering per type, so a type with nothing READY costs one index probe,
    # and one whose quota is used up is no longer scanned (the single scan across
    # types paged through every READY action of the others).
    (
        "CREATE INDEX actions_ready_typed ON actions "
        "(action_type, updated_at, workflow_id, action_id, not_before, state) "
        "WHERE state = 'READY'",
        "DROP INDEX actions_ready_type",
    ),
    # A claim serves users with nothing in flight first (`_room.idle_first`): their
    # READY actions are found from their RUNNING workflows, not by walking everyone's.
    (
        "CREATE INDEX actions_ready_workflow ON actions "
        "(workflow_id, updated_at, action_id, not_before, action_type, state) "
        "WHERE state = 'READY'",
    ),
    # Storage quotas: a user's own, and the index that sums the bytes their workflows
    # produced (`bytes_produced_by`) from their workflows, not from every dataset. On the
    # producer alone, which a state change leaves alone: the hot path never writes it.
    (
        "ALTER TABLE users ADD COLUMN max_storage_bytes INTEGER",
        "CREATE INDEX datasets_producer ON datasets (producer_workflow_id)",
    ),
)

_WORKFLOW_COLUMNS = (
    "id, name, owner, state, document, scope, on_failure, end_dataset_id, created_at, "
    "finished_at, idempotency_key, rerun_of, error, version"
)
#: The columns a transition may change (table `actions`), then those fixed at planning
#: (table `action_specs`); `_action` reads a row of both, in this order.
#: The same, with NULL for the document (for a workflow whose document is cached).
_WORKFLOW_NO_DOCUMENT = _WORKFLOW_COLUMNS.replace("document", "NULL")
_HOT_COLUMNS = (
    "workflow_id, action_id, state, waiting_on, updated_at, attempts, owner, "
    "lease_expires_at, not_before, external_id, error, started_at, finished_at, runtime_s, "
    "version, shared_with, history"
)
_SPEC_COLUMNS = (
    "name, type, dataset_id, reused, reason, definition, inputs, children, callback_id, "
    "created_at, max_attempts"
)
_ACTION_SELECT = (
    f"SELECT {_HOT_COLUMNS}, {_SPEC_COLUMNS} FROM actions "
    "JOIN action_specs USING (workflow_id, action_id)"
)
_DATASET_COLUMNS = (
    "id, state, path, scope, action_type, definition, parents, producer_workflow_id, "
    "producer_action_id, is_managed, created_at, updated_at, claims, size_bytes, compute_s, "
    "use_count, last_used_at, stored_at, pinned, version, digest"
)

#: Tables whose rows are built from their records' fields (`_rows`).
_EVENTS = _rows.Rows(EventRecord, {"at": _rows.TIME, "payload": _rows.OPTIONAL_JSON})
_USERS = _rows.Rows(UserRecord, {"is_admin": _rows.BOOL, "created_at": _rows.TIME})
_SCHEDULES = _rows.Rows(
    ScheduleRecord,
    {
        # The scheduler reads due schedules several times a second; their definitions
        # (a whole workflow each, up to the body limit) are parsed once per node
        # (`ScheduleService.spec`), so a long one stays text until then.
        "spec": _rows.DOCUMENT,
        "paused": _rows.BOOL,
        "next_fire_at": _rows.OPTIONAL_TIME,
        "pending_tick_at": _rows.OPTIONAL_TIME,
        "claim_expires_at": _rows.OPTIONAL_TIME,
        "created_at": _rows.TIME,
        "updated_at": _rows.TIME,
    },
)
_RUNS = _rows.Rows(ScheduleRunRecord, {"tick_at": _rows.TIME, "recorded_at": _rows.TIME})
_DELIVERIES = _rows.Rows(
    WebhookDeliveryRecord,
    {
        "body": _rows.BYTES,
        "next_attempt_at": _rows.TIME,
        "created_at": _rows.TIME,
        "updated_at": _rows.TIME,
        "claim_expires_at": _rows.OPTIONAL_TIME,
    },
)

_HOT_INSERT = f"INSERT INTO actions ({_HOT_COLUMNS}, action_type) VALUES ({', '.join('?' * 18)})"
#: `, history = …` for an UPDATE of actions that sets the state; its parameters are
#: `_history_args`. It appends [new state, now] unless the row is in that state
#: already (SET sees the row before the update), dropping the oldest entry past
#: `HISTORY_LIMIT`: the history changes in the statement that changes the state.
_HISTORY_SET = (
    ", history = CASE WHEN state = ? THEN history ELSE json_insert("
    f"CASE WHEN json_array_length(history) < {HISTORY_LIMIT} THEN history "
    "ELSE json_remove(history, '$[0]') END, '$[#]', json_array(?, ?)) END"
)
_SPEC_INSERT = (
    "INSERT INTO action_specs (workflow_id, action_id, "
    f"{_SPEC_COLUMNS}) VALUES ({', '.join('?' * 13)})"
)
_DATASET_INSERT = f"INSERT INTO datasets ({_DATASET_COLUMNS}) VALUES ({', '.join('?' * 21)})"

#: Changes fields stored as timestamps (microseconds).
_TIME_FIELDS = frozenset(
    {
        "lease_expires_at",
        "not_before",
        "started_at",
        "finished_at",
        "stored_at",
        "last_used_at",
        "next_fire_at",
        "pending_tick_at",
        "claim_expires_at",
        "next_attempt_at",
    }
)

_EPOCH = _cursor.from_micros(0)
_US = timedelta(microseconds=1)

#: An action's fields fixed at planning, decoded: name, type, dataset_id, reused, reason,
#: definition, inputs, children, callback_id, created_at, max_attempts.
_Spec = tuple[
    str,
    str,
    str,
    bool,
    str,
    Mapping[str, Any],
    Mapping[int, str],
    tuple[int, ...],
    str,
    datetime,
    int,
]
#: JSON text (characters) of the running workflows' documents kept decoded per process.
_DOCUMENT_CACHE_CHARS = 8_000_000
_TERMINAL_WORKFLOW_STATES = frozenset(s.value for s in states.WORKFLOW_TERMINAL)

#: A dataset's decoded definition and parents: fixed by its id (a provenance hash).
_DatasetFixed = tuple[Mapping[str, Any], tuple[str, ...]]
_EMPTY: tuple[Any, ...] = ()

#: Decoded specs kept per process (they never change, so a cached one is never stale);
#: bounded so that memory does not grow with the number of actions ever seen.
_SPEC_CACHE_SIZE = 8192
#: A read of more actions than this (all of a big workflow's) is a bulk read: see
#: `_all_actions`.
_BULK_ROWS = 2000


_dumps = _json.dumps
"""Compact JSON (one encoder for all calls: building one per call costs more than small
values take to encode)."""


def _cut_element(text: str, token: str) -> str | None:
    """Compact JSON array `text` without its elements `token` (an encoded string);
    `text` itself when it holds none, None when it is not a compact JSON array."""
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    start = text.find(token)
    while start >= 0:
        end = start + len(token)
        if text[start - 1] in "[," and text[end] in ",]":
            if text[start - 1] == ",":
                start -= 1  # the comma before it
            elif text[end] == ",":
                end += 1  # the first element: the comma after it
            text = text[:start] + text[end:]
        else:
            start += 1
        start = text.find(token, start)
    return text


def _qualified(table: str, columns: str) -> str:
    """`columns` (comma-separated) each prefixed with `table.`."""
    return ", ".join(f"{table}.{c.strip()}" for c in columns.split(","))


#: `list_attached_actions`, built once: every success asks it. From the partial index:
#: the planner would otherwise scan every WAITING action (a big workflow has many) for
#: the few that share.
_ATTACHED_SELECT = (
    f"SELECT {_qualified('a', _HOT_COLUMNS)}, {_qualified('s', _SPEC_COLUMNS)} "
    "FROM actions AS a INDEXED BY actions_waiting_shared "
    "CROSS JOIN action_specs AS s "
    "ON s.workflow_id = a.workflow_id AND s.action_id = a.action_id "
    "WHERE a.shared_with IS NOT NULL AND a.state = 'WAITING' AND {where} "
    "AND EXISTS (SELECT 1 FROM json_each(a.waiting_on) WHERE value = a.action_id) "
    "ORDER BY a.workflow_id, a.action_id LIMIT ?"
)


def _ints(values: Sequence[int]) -> str:
    """A JSON array of ints (waiting_on, children), without the JSON encoder."""
    return "[" + ",".join(map(str, values)) + "]" if values else "[]"


def _us(at: datetime) -> int:
    return _cursor.to_micros(at)


def _us_or_none(at: datetime | None) -> int | None:
    return None if at is None else _cursor.to_micros(at)


def _dt(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + micros * _US


def _dt_req(micros: int) -> datetime:
    return _EPOCH + micros * _US


def _chunks(values: Sequence[T]) -> Iterable[Sequence[T]]:
    """`values` in slices small enough to bind: SQLite binds a limited number of parameters."""
    return _common.chunks(values, 500)


def _placeholders(count: int) -> str:
    return ", ".join("?" * count)


def _ready_pages(
    conn: sqlite3.Connection,
    room: _room.InFlightRoom,
    owners: dict[str, str],
    limit: int,
    action_type: str | None,
    now: int,
) -> list[Any]:
    """Up to `limit` of the oldest claimable READY actions (of `action_type`, None: any)
    whose owners have room, taking it; `owners` caches workflow id → owner."""
    chosen: list[Any] = []
    after: tuple[int, str, int] = (-1, "", -1)
    index, typed = (
        ("actions_ready_scan", "")
        if action_type is None
        else ("actions_ready_typed", "AND action_type = ? ")
    )
    while len(chosen) < limit:
        full = room.full()
        rows = conn.execute(
            "SELECT updated_at, workflow_id, action_id, rowid, action_type FROM actions "
            f"INDEXED BY {index} "
            "WHERE state = 'READY' " + typed + "AND (not_before IS NULL OR not_before <= ?) "
            "AND (updated_at, workflow_id, action_id) > (?, ?, ?) "
            "AND workflow_id NOT IN (SELECT id FROM workflows WHERE state = 'RUNNING' "
            f"AND owner IN ({_placeholders(len(full))})) "
            "ORDER BY updated_at, workflow_id, action_id LIMIT ?",
            (*((action_type,) if action_type is not None else ()), now, *after, *full, limit),
        ).fetchall()
        unknown = sorted({row[1] for row in rows} - owners.keys())
        for chunk in _chunks(unknown):
            owners.update(
                conn.execute(
                    f"SELECT id, owner FROM workflows WHERE id IN ({_placeholders(len(chunk))})",
                    chunk,
                ).fetchall()
            )
        for row in rows:
            if len(chosen) < limit and room.take(owners.get(row[1], "")):
                chosen.append(row)
        if len(rows) < limit:
            break
        after = (rows[-1][0], rows[-1][1], rows[-1][2])
    return chosen


#: Users with a RUNNING workflow: one probe of `workflows_owner_state` per user.
_RUNNING_OWNERS = (
    "SELECT name FROM users u WHERE EXISTS (SELECT 1 FROM workflows w "
    "INDEXED BY workflows_owner_state WHERE w.owner = u.name AND w.state = 'RUNNING')"
)


#: Seconds an idle owner found with nothing claimable is not looked up again.
_IDLE_EMPTY_S = 1.0
#: READY rows of a workflow an idle owner's lookup looks at, oldest first: past them,
#: rows held back by a retry's backoff (`not_before`) would be walked one by one (a
#: red-team review's 200,000 cost 30 ms a claim). A workflow whose oldest are all held
#: back is claimed in age order, as before the idle-first rule.
_IDLE_LOOKAHEAD = 64


def _idle_oldest(
    conn: sqlite3.Connection,
    room: _room.InFlightRoom,
    served: Collection[str],
    wanted: Mapping[str, int] | None,
    now: int,
    empty: dict[str, float],
) -> list[Any]:
    """The oldest claimable READY action (of a `wanted` type; None: any) of each user
    with a RUNNING workflow and nothing in flight, oldest first (`_room.idle_first`),
    but those `served` already (whose oldest is among the claim's candidates).

    The first claimable READY row of each of their RUNNING workflows, in the order of
    `actions_ready_workflow`: never through another user's backlog, nor through all of
    their own."""
    running = (row[0] for row in conn.execute(_RUNNING_OWNERS))
    clock = time.monotonic()
    idle = [
        owner
        for owner in room.idle(running)
        if owner not in served and clock - empty.get(owner, -_IDLE_EMPTY_S) >= _IDLE_EMPTY_S
    ]
    if not idle:
        return []
    types = () if wanted is None else tuple(sorted(wanted))
    typed = f"AND a.action_type IN ({_placeholders(len(types))}) " if types else ""
    # Each RUNNING workflow's first claimable READY row among its oldest
    # `_IDLE_LOOKAHEAD`, in index order: a backlog of 200,000 costs a few steps, where a
    # window over the owner's rows read every one (and rows held back by a retry's
    # backoff are walked past only so far).
    first: dict[str, list[int]] = {}
    for chunk in _chunks(idle):
        for owner, rowid in conn.execute(
            "SELECT w.owner, (SELECT rid FROM (SELECT a.rowid AS rid, a.not_before, "
            "a.action_type FROM actions a INDEXED BY actions_ready_workflow "
            "WHERE a.workflow_id = w.id AND a.state = 'READY' "
            "ORDER BY a.updated_at, a.action_id LIMIT ?) a "
            "WHERE (a.not_before IS NULL OR a.not_before <= ?) " + typed + "LIMIT 1) "
            "FROM workflows w INDEXED BY workflows_owner_state "
            f"WHERE w.owner IN ({_placeholders(len(chunk))}) AND w.state = 'RUNNING'",
            (_IDLE_LOOKAHEAD, now, *types, *chunk),
        ):
            if rowid is not None:
                first.setdefault(owner, []).append(rowid)
    rows: list[Any] = []
    for rowids in first.values():
        found = conn.execute(
            "SELECT updated_at, workflow_id, action_id, rowid, action_type FROM actions "
            f"WHERE rowid IN ({_placeholders(len(rowids))})",
            rowids,
        ).fetchall()
        rows.append(min(found))
    for owner in idle:
        if owner in first:
            empty.pop(owner, None)
        else:
            empty[owner] = clock
    if len(empty) > 10_000:  # owners come and go: keep the recent ones
        for owner in [o for o, at in empty.items() if clock - at >= _IDLE_EMPTY_S]:
            del empty[owner]
    return sorted(rows)


def _workflow(row: Sequence[Any], document: Mapping[str, Any]) -> WorkflowRecord:
    return WorkflowRecord(
        id=row[0],
        name=row[1],
        owner=row[2],
        state=WorkflowState(row[3]),
        document=document,
        scope=row[5],
        on_failure=row[6],
        end_dataset_id=row[7],
        created_at=_dt_req(row[8]),
        finished_at=_dt(row[9]),
        idempotency_key=row[10],
        rerun_of=row[11],
        error=row[12],
        version=row[13],
    )


def _workflow_params(w: WorkflowRecord) -> tuple[Any, ...]:
    return (
        w.id,
        w.name,
        w.owner,
        w.state.value,
        _json.dumps_document(w.document),
        w.scope,
        w.on_failure,
        w.end_dataset_id,
        _us(w.created_at),
        _us_or_none(w.finished_at),
        w.idempotency_key,
        w.rerun_of,
        w.error,
        w.version,
    )


def _hot_params(a: ActionRecord) -> tuple[Any, ...]:
    return (
        a.workflow_id,
        a.action_id,
        a.state.value,
        _ints(a.waiting_on),
        _us(a.updated_at),
        a.attempts,
        a.owner,
        _us_or_none(a.lease_expires_at),
        _us_or_none(a.not_before),
        a.external_id,
        a.error,
        _us_or_none(a.started_at),
        _us_or_none(a.finished_at),
        a.runtime_s,
        a.version,
        a.shared_with,
        _history_text(rules.opening_history(a)),
        a.type,
    )


def _history_text(history: Iterable[StateEntry]) -> str:
    """A JSON array of [state, microseconds] pairs, without the JSON encoder (one call
    per action of a plan cost more than the text): state names need no escaping."""
    return "[" + ",".join(f'["{entry.state.value}",{_us(entry.at)}]' for entry in history) + "]"


class _LazyTuple(Sequence[T]):
    """A tuple kept as its JSON text until something reads it, then decoded once.

    Most reads of a row never look at these columns: an action's history (claims,
    submissions and outcomes RETURN every transition; decoding it on each cost the
    no-op engine about 4 % more CPU per action, issue 17) and a dataset's claims (one
    per reader, 1,482 on one of Montage's; decoding them was ~12 % of the SQLite
    thread's Python in the no-op engine, issue 15).
    """

    __slots__ = ("_decode", "_items", "_text")

    def __init__(self, text: str, decode: Callable[[Any], T]) -> None:
        self._text = text
        self._decode = decode
        self._items: tuple[T, ...] | None = None

    def _decoded(self) -> tuple[T, ...]:
        if self._items is None:
            self._items = tuple(self._decode(item) for item in json.loads(self._text))
        return self._items

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        return self._decoded()[index]

    def __len__(self) -> int:
        return len(self._decoded())

    def __contains__(self, value: object) -> bool:
        return value in self._decoded()

    def __iter__(self) -> Iterator[T]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._decoded() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._decoded())

    def __repr__(self) -> str:
        return repr(self._decoded())


def _state_entry(item: list[Any]) -> StateEntry:
    return StateEntry(ActionState(item[0]), _dt_req(item[1]))


def _claim(item: Any) -> str:
    return str(item)


def _history_args(new: ActionState, now: int) -> tuple[Any, ...]:
    """The parameters of `_HISTORY_SET` for an update to `new` at `now`."""
    return (new.value, new.value, now)


def _spec_params(a: ActionRecord) -> tuple[Any, ...]:
    return (
        a.workflow_id,
        a.action_id,
        a.name,
        a.type,
        a.dataset_id,
        int(a.reused),
        a.reason,
        _dumps(a.definition),
        _dumps([[parent, dataset] for parent, dataset in a.inputs.items()]),
        _ints(a.children),
        a.callback_id,
        _us(a.created_at),
        a.max_attempts,
    )


def _spec(row: Sequence[Any], *, lazy: bool = False) -> _Spec:
    """Decode the `_SPEC_COLUMNS` of a row (with `lazy`, the definition on first use)."""
    return (
        row[0],
        row[1],
        row[2],
        bool(row[3]),
        row[4],
        untrusted.LazyObject(row[5]) if lazy else json.loads(row[5]),
        {parent: dataset for parent, dataset in json.loads(row[6])},
        tuple(json.loads(row[7])),
        row[8],
        _dt_req(row[9]),
        row[10],
    )


def _record(hot: Sequence[Any], spec: _Spec) -> ActionRecord:
    return ActionRecord(
        workflow_id=hot[0],
        action_id=hot[1],
        name=spec[0],
        type=spec[1],
        state=ActionState(hot[2]),
        dataset_id=spec[2],
        reused=spec[3],
        reason=spec[4],
        definition=spec[5],
        inputs=spec[6],
        waiting_on=_EMPTY if hot[3] == "[]" else tuple(json.loads(hot[3])),
        children=spec[7],
        callback_id=spec[8],
        created_at=spec[9],
        updated_at=_dt_req(hot[4]),
        attempts=hot[5],
        max_attempts=spec[10],
        owner=hot[6],
        lease_expires_at=_dt(hot[7]),
        not_before=_dt(hot[8]),
        external_id=hot[9],
        error=hot[10],
        started_at=_dt(hot[11]),
        finished_at=_dt(hot[12]),
        runtime_s=hot[13],
        version=hot[14],
        shared_with=hot[15],
        history=_LazyTuple(hot[16], _state_entry),
    )


def _new_dataset_params(plan: DatasetPlan, now: int) -> tuple[Any, ...]:
    return (
        plan.id,
        plan.state.value,
        plan.path,
        plan.scope,
        plan.action_type,
        _dumps(plan.definition),
        _dumps(list(plan.parents)),
        plan.producer_workflow_id,
        plan.producer_action_id,
        int(plan.is_managed),
        now,
        now,
        _dumps(list(dict.fromkeys(plan.claims))),
        None,
        None,
        0,
        None,
        None,
        0,
        0,
        None,
    )


class _Undone(Exception):
    """Raised in a write call to take back what it wrote (its savepoint is rolled back),
    and caught by the method that made the call."""


def _dataset_move_statement(
    move: DatasetMove, now: int, *, if_unclaimed: bool = False
) -> tuple[str, list[Any]]:
    """The compare-and-set of `move`, RETURNING the row as `_DATASET_COLUMNS`."""
    sets, params = _set_clause(move.changes)
    sql = (
        f"UPDATE datasets SET state = ?, updated_at = ?, version = version + 1{sets} "
        f"WHERE id = ? AND state IN ({_placeholders(len(move.expected))})"
    )
    if if_unclaimed:
        sql += " AND claims = '[]'"
    sql += f" RETURNING {_DATASET_COLUMNS}"
    args = [move.new.value, now, *params, move.dataset_id, *(s.value for s in move.expected)]
    return sql, args


_EVENT_INSERT = (
    "INSERT INTO events (kind, at, dataset_id, workflow_id, payload, owner) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def _event_params(event: NewEvent, at: int) -> tuple[Any, ...]:
    payload = None if event.payload is None else _dumps(event.payload)
    return (event.kind, at, event.dataset_id, event.workflow_id, payload, event.owner)


def _dataset(row: Sequence[Any], fixed: _DatasetFixed) -> DatasetRecord:
    return DatasetRecord(
        id=row[0],
        state=DatasetState(row[1]),
        path=row[2],
        scope=row[3],
        action_type=row[4],
        definition=fixed[0],
        parents=fixed[1],
        producer_workflow_id=row[7],
        producer_action_id=row[8],
        is_managed=bool(row[9]),
        created_at=_dt_req(row[10]),
        updated_at=_dt_req(row[11]),
        claims=_EMPTY if row[12] == "[]" else _LazyTuple(row[12], _claim),
        size_bytes=row[13],
        compute_s=row[14],
        use_count=row[15],
        last_used_at=_dt(row[16]),
        stored_at=_dt(row[17]),
        pinned=bool(row[18]),
        version=row[19],
        digest=row[20],
    )


#: The columns of a user's own limits, one per field of `UserLimits`.
_LIMIT_FIELDS = tuple(f.name for f in fields(UserLimits))


def _limit_values(limits: UserLimits) -> tuple[int | None, ...]:
    return tuple(getattr(limits, name) for name in _LIMIT_FIELDS)


def _column_value(name: str, value: Any) -> Any:
    if name in _TIME_FIELDS or name == "created_at":
        return _us_or_none(value)
    return value


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _set_clause(changes: _Changes) -> tuple[str, list[Any]]:
    """`, col = ?…` for the changed fields and their column values."""
    kind = type(changes)
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(changes))
    sql = []
    params = []
    for name in names:
        value = getattr(changes, name)
        if value is not KEEP:
            sql.append(f", {name} = ?")
            params.append(_column_value(name, value))
    return "".join(sql), params


def _transition_action_statement(
    workflow_id: str,
    action_id: int,
    expected: Collection[ActionState],
    new: ActionState,
    changes: ActionChanges,
    now: int,
    *,
    if_owner: str | None = None,
    if_attempt: int | None = None,
    if_waiting_on: int | None = None,
) -> tuple[str, list[Any]]:
    """The compare-and-set UPDATE of one action (RETURNING `_HOT_COLUMNS`) and its parameters."""
    sets, params = _set_clause(changes)
    sql = (
        f"UPDATE actions SET state = ?, updated_at = ?, version = version + 1"
        f"{_HISTORY_SET}{sets} WHERE workflow_id = ? AND action_id = ? "
        f"AND state IN ({_placeholders(len(expected))})"
    )
    args: list[Any] = [new.value, now, *_history_args(new, now), *params, workflow_id, action_id]
    args.extend(s.value for s in expected)
    if if_owner is not None:
        sql += " AND owner = ?"
        args.append(if_owner)
    if if_attempt is not None:
        sql += " AND attempts = ?"
        args.append(if_attempt)
    if if_waiting_on is not None:
        sql += " AND EXISTS (SELECT 1 FROM json_each(waiting_on) WHERE value = ?)"
        args.append(if_waiting_on)
    sql += f" RETURNING {_HOT_COLUMNS}"
    return sql, args


def path_from_url(url: str) -> str:
    """The file path of `sqlite:///abs/path.db` (also `sqlite:////abs/path.db`)."""
    if not url.startswith("sqlite://"):
        raise errors.ConfigurationError(f"not a sqlite URL: {url!r}")
    rest = url[len("sqlite://") :].split("?", 1)[0]
    if rest.startswith("/"):
        rest = "/" + rest.lstrip("/")
    if not rest:
        raise errors.ConfigurationError(f"the sqlite URL {url!r} names no file")
    return rest


#: Most requests the worker runs in one transaction (one commit, one hop back).
_MAX_BATCH = 256


def _chained(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


@dataclass(slots=True)
class _Request:
    """One protocol call waiting for the worker thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    #: True: writes. False: only reads. None: writes only when it finds work; run in a
    #: batch without writes it takes the write lock itself (BEGIN IMMEDIATE … COMMIT),
    #: in a batch with writes it is one of them.
    write: bool | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None
    #: One statement: SQLite undoes a failed statement alone (its statement journal),
    #: so in a batch it needs no SAVEPOINT of its own.
    single: bool = False


def _resolve(requests: list[_Request]) -> None:
    """In the event loop: hand each caller its result (unless it gave up waiting)."""
    for request in requests:
        if request.future.done():
            continue
        if request.error is not None:
            request.future.set_exception(request.error)
        else:
            request.future.set_result(request.result)


class _Worker(threading.Thread):
    """The thread that owns the connection and runs every call, with group commit.

    Calls queue up while the thread works; it takes every queued call (up to
    `_MAX_BATCH`) at once. When any of them writes, they all run in ONE
    BEGIN IMMEDIATE transaction, each write of several statements inside its
    own SAVEPOINT (so one that fails is undone alone), then ONE commit. Only after that commit are
    results handed back, in one wake-up of the event loop: an acknowledged call
    is a committed one. Under load this turns N commits and 2N thread switches
    into one commit and two switches; a lone call costs what it did before.
    """

    def __init__(self, store: SQLiteStore) -> None:
        super().__init__(name="pingo-sqlite", daemon=True)
        self.store = store
        #: Lists of calls (one per event-loop iteration), or None to stop.
        self.requests: queue.SimpleQueue[list[_Request] | None] = queue.SimpleQueue()

    def run(self) -> None:
        stopping = False
        while not stopping:
            first = self.requests.get()
            if first is None:
                return
            batch = list(first)
            while len(batch) < _MAX_BATCH:
                try:
                    more = self.requests.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.extend(more)
            live = [r for r in batch if not r.future.cancelled()]
            try:
                if any(r.write for r in live):
                    self._run_writes(live)
                else:
                    for request in live:
                        self._run_one(request)
                        self._abandon_transaction()
            except BaseException as exc:
                # The worker's own BEGIN/SAVEPOINT/ROLLBACK failed: no write of the batch
                # was committed. The thread must survive to serve the next calls.
                failure = self.store._translate(exc)
                for request in live:
                    if request.write is not False or (
                        request.error is None and request.result is None
                    ):
                        request.error = failure
                self._abandon_transaction()
            self._hand_back(live)

    def _abandon_transaction(self) -> None:
        """Roll back what a read-batch call left open (it failed inside its own BEGIN)."""
        conn = self.store._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.warning(
                    "sqlite rollback failed",
                    exc_info=True,
                    extra={"event": "store_rollback_failed"},
                )

    def _run_one(self, request: _Request) -> bool:
        try:
            request.result = request.fn(*request.args)
        except BaseException as exc:
            request.error = self.store._translate(exc)
            return False
        return True

    def _run_writes(self, batch: list[_Request]) -> None:
        conn = self.store._conn
        if conn is None:
            for request in batch:
                request.error = errors.StoreUnavailable("the sqlite store is not open")
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            failure = self.store._translate(exc)
            for request in batch:
                request.error = failure
            return
        alone = len(batch) == 1
        done: list[_Request] = []
        for request in batch:
            if not conn.in_transaction:
                # A failure made SQLite roll the whole transaction back.
                request.error = errors.StoreUnavailable("the transaction was rolled back")
                continue
            writes = request.write is not False
            savepoint = writes and not alone and not request.single
            if savepoint:
                conn.execute("SAVEPOINT call")
            if self._run_one(request):
                if savepoint:
                    conn.execute("RELEASE call")
                done.append(request)
            elif conn.in_transaction and writes and (alone or not request.single):
                # Undo this call's partial work, and only this call's (a single
                # statement that failed left none).
                if savepoint:
                    conn.execute("ROLLBACK TO call")
                    conn.execute("RELEASE call")
                else:
                    conn.execute("ROLLBACK")
        if not conn.in_transaction:
            # Rolled back (by SQLite, or a lone call that failed): nothing of it stays,
            # and what the batch read may have included it.
            for request in done:
                request.error = errors.StoreUnavailable("the transaction was rolled back")
            return
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            failure = self.store._translate(exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for request in done:
                request.error = failure

    @staticmethod
    def _hand_back(batch: list[_Request]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        for request in batch:
            by_loop.setdefault(request.loop, []).append(request)
        for loop, requests in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, requests)
            except RuntimeError:
                # The caller's loop is closed: nobody is waiting any more.
                logger.debug(
                    "sqlite result dropped: event loop closed",
                    extra={"event": "store_result_dropped"},
                )


class SQLiteStore:
    """The `Store` protocol on one SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock = utcnow,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 10.0,
        cache_mb: int | None = None,
    ) -> None:
        sync = synchronous.upper()
        if cache_mb is not None and cache_mb < 1:
            raise errors.ConfigurationError(f"sqlite cache must be at least 1 MiB, not {cache_mb}")
        if sync not in _SYNCHRONOUS:
            raise errors.ConfigurationError(
                f"sqlite synchronous must be one of {sorted(_SYNCHRONOUS)}, not {synchronous!r}"
            )
        self.clock = clock
        self.path = str(path)
        self.synchronous = sync
        self.busy_timeout_s = busy_timeout_s
        self.cache_mb = DEFAULT_CACHE_MB if cache_mb is None else cache_mb
        self._worker: _Worker | None = None
        #: Calls made during the current event-loop iteration, not yet handed over.
        self._pending: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        self._conn: sqlite3.Connection | None = None
        self._specs: dict[tuple[str, int], _Spec] = {}
        self._dataset_fixed: dict[str, _DatasetFixed] = {}
        #: Decoded workflow documents (fixed at submission), least recently used first,
        #: and the length of their JSON text: polling a big workflow's state must not
        #: decode its whole document every time.
        self._documents: OrderedDict[str, tuple[Mapping[str, Any], int]] = OrderedDict()
        self._documents_size = 0
        #: Idle owners a claim found nothing claimable for (`_idle_oldest`), and when
        #: (`time.monotonic`): not looked up again for `_IDLE_EMPTY_S`.
        self._idle_empty: dict[str, float] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        clock: Clock = utcnow,
        synchronous: str = "NORMAL",
        cache_mb: int | None = None,
    ) -> SQLiteStore:
        """A store on the file `sqlite:///path` names (not opened yet)."""
        return cls(path_from_url(url), clock=clock, synchronous=synchronous, cache_mb=cache_mb)

    # ------------------------------------------------------------ life cycle

    async def __aenter__(self) -> Self:
        if self._worker is not None:
            raise errors.ConfigurationError("the store is already open")
        # Another file may sit at this path since the last time: forget what was decoded.
        self._specs.clear()
        self._dataset_fixed.clear()
        self._documents.clear()
        self._documents_size = 0
        worker = _Worker(self)
        worker.start()
        self._worker = worker
        try:
            await self._run(self._open)
        except BaseException:
            await self._stop_worker(worker)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        worker = self._worker
        if worker is None:
            return
        try:
            await self._run(self._close)
        finally:
            await self._stop_worker(worker)

    async def _stop_worker(self, worker: _Worker) -> None:
        self._worker = None
        worker.requests.put(None)
        await asyncio.to_thread(worker.join)

    def _open(self) -> None:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_s,
            isolation_level=None,  # autocommit: the worker opens transactions explicitly
            check_same_thread=True,  # only the worker thread ever touches it
            cached_statements=1024,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal" and self.path != ":memory:":
                raise errors.StoreUnavailable(f"{self.path}: cannot use WAL (got {mode})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA temp_store = MEMORY")
            # Negative: in KiB rather than pages. Bounded, so memory stays flat however
            # many finished workflows the file holds.
            conn.execute(f"PRAGMA cache_size = -{self.cache_mb * 1024}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        logger.info(
            "sqlite store %s open (synchronous=%s)",
            self.path,
            self.synchronous,
            extra={"event": "store_opened", "path": self.path},
        )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # Under the write lock, so processes starting together migrate once.
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise errors.StoreUnavailable(
                    f"{self.path} has schema version {version}, newer than this Pingo "
                    f"({len(MIGRATIONS)})"
                )
            for step in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
                logger.info(
                    "sqlite store %s migrated to schema version %d",
                    self.path,
                    step + 1,
                    extra={"event": "store_migrated", "path": self.path},
                )
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _submit(
        self, write: bool | None, fn: Callable[..., T], args: tuple[Any, ...], single: bool = False
    ) -> T:
        worker = self._worker
        if worker is None:
            raise errors.StoreUnavailable("the sqlite store is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        request = _Request(fn, args, write, loop, future, single=single)
        pending = self._pending.get(loop)
        if pending is None:
            # Hand over everything this loop iteration asks for in one put: each put
            # that wakes the idle worker is a futex call and a GIL handover, which
            # cost more than the small statement itself.
            self._pending[loop] = [request]
            loop.call_soon(self._flush, loop, worker)
        else:
            pending.append(request)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop, worker: _Worker) -> None:
        requests = self._pending.pop(loop, None)
        if requests:
            worker.requests.put(requests)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (reads only) in the worker thread."""
        return await self._submit(False, fn, args)

    async def _run_write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in the worker thread inside a write transaction, committed."""
        return await self._submit(True, fn, args)

    async def _run_statement(
        self, convert: Callable[[Sequence[Any]], T], sql: str, params: Sequence[Any]
    ) -> T | None:
        """Run ONE write statement (`_one`), committed: in a batch, without a SAVEPOINT."""
        return await self._submit(True, self._one, (convert, sql, params), single=True)

    def _with_db(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._db)

    @property
    def _db(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            raise errors.StoreUnavailable("the sqlite store is not open")
        return conn

    def _translate(self, exc: BaseException) -> BaseException:
        """Driver exceptions become Pingo's own at the edge; others pass as they are."""
        if isinstance(exc, sqlite3.IntegrityError):
            return _chained(errors.Conflict(str(exc)), exc)
        if isinstance(exc, sqlite3.Error):
            return _chained(errors.StoreUnavailable(f"sqlite store {self.path}: {exc}"), exc)
        return exc

    def _cache_spec(self, key: tuple[str, int], spec: _Spec) -> _Spec:
        if len(self._specs) >= _SPEC_CACHE_SIZE:
            self._specs.clear()
        self._specs[key] = spec
        return spec

    def _workflow(self, row: Sequence[Any]) -> WorkflowRecord:
        """The record of a row of `_WORKFLOW_COLUMNS`."""
        if row[3] in _TERMINAL_WORKFLOW_STATES:
            # Over: nothing polls it any more, so the process keeps nothing of it (memory
            # stays flat however many workflows have finished).
            cached = self._forget_document(row[0])
            if cached is None:
                cached = untrusted.stored_object(row[4])
            return _workflow(row, cached)
        cached_entry = self._documents.get(row[0])
        if cached_entry is not None:
            self._documents.move_to_end(row[0])
            return _workflow(row, cached_entry[0])
        text: str = row[4]
        # Strict, like every JSON the server reads: a NaN must not come back out. One
        # too big to cache is left undecoded until read (see `untrusted.stored_object`).
        document = untrusted.stored_object(text)
        self._cache_document(row[0], document, len(text))
        return _workflow(row, document)

    def _forget_document(self, workflow_id: str) -> Mapping[str, Any] | None:
        """Drop a workflow's decoded document from the cache; the document, if it was there."""
        entry = self._documents.pop(workflow_id, None)
        if entry is None:
            return None
        self._documents_size -= entry[1]
        return entry[0]

    def _cache_document(self, workflow_id: str, document: Mapping[str, Any], size: int) -> None:
        if size > _DOCUMENT_CACHE_CHARS or workflow_id in self._documents:
            return
        self._documents[workflow_id] = (document, size)
        self._documents_size += size
        while self._documents_size > _DOCUMENT_CACHE_CHARS:
            _, (_, evicted) = self._documents.popitem(last=False)
            self._documents_size -= evicted

    def _dataset(self, row: Sequence[Any], *, cache: bool = True) -> DatasetRecord:
        """The record of a row of `_DATASET_COLUMNS`. Without `cache` (a bulk read), a
        cached definition is used but none is added."""
        fixed = self._dataset_fixed.get(row[0])
        if fixed is None:
            fixed = (json.loads(row[5]), tuple(json.loads(row[6])))
            if cache:
                if len(self._dataset_fixed) >= _SPEC_CACHE_SIZE:
                    self._dataset_fixed.clear()
                self._dataset_fixed[row[0]] = fixed
        return _dataset(row, fixed)

    def _action(self, row: Sequence[Any], *, cache: bool = True) -> ActionRecord:
        """The record of a row of `_ACTION_SELECT` (both tables).

        Without `cache` (a bulk read), the definition is decoded only if something reads
        it: a workflow's document and its kill, the bulk readers, never do.
        """
        key = (row[0], row[1])
        spec = self._specs.get(key)
        if spec is None:
            spec = _spec(row[17:], lazy=not cache)
            if cache:
                self._cache_spec(key, spec)
        return _record(row, spec)

    def _action_hot(self, row: Sequence[Any]) -> ActionRecord:
        """The record of a row of `_HOT_COLUMNS` (an UPDATE … RETURNING)."""
        return self._actions_hot([row])[0]

    def _actions_hot(self, rows: Sequence[Sequence[Any]]) -> list[ActionRecord]:
        """The records of rows of `_HOT_COLUMNS`, fetching missing specs in one query.

        Bulk (a kill of a whole big workflow) as in `_all_actions`: no full collection
        meanwhile, the specs it decodes are not cached, and definitions stay text
        until read.
        """
        if len(rows) <= _BULK_ROWS:
            return self._actions_hot_specs(rows, bulk=False)
        with heap.full_collections_deferred():
            return self._actions_hot_specs(rows, bulk=True)

    def _actions_hot_specs(
        self, rows: Sequence[Sequence[Any]], *, bulk: bool
    ) -> list[ActionRecord]:
        specs: dict[tuple[str, int], _Spec] = {}
        missing = []
        for row in rows:
            key = (row[0], row[1])
            spec = self._specs.get(key)
            if spec is None:
                missing.append(key)
            else:
                specs[key] = spec
        by_workflow: dict[str, list[int]] = {}
        for workflow_id, action_id in missing:
            by_workflow.setdefault(workflow_id, []).append(action_id)
        for workflow_id, action_ids in by_workflow.items():
            # By workflow: a row-value IN over (workflow_id, action_id) pairs is a full
            # scan in SQLite, this is a primary-key search per action.
            for start in range(0, len(action_ids), 500):
                chunk = action_ids[start : start + 500]
                found = self._db.execute(
                    f"SELECT action_id, {_SPEC_COLUMNS} FROM action_specs "
                    f"WHERE workflow_id = ? AND action_id IN ({_placeholders(len(chunk))})",
                    [workflow_id, *chunk],
                ).fetchall()
                for spec_row in found:
                    key = (workflow_id, spec_row[0])
                    spec = _spec(spec_row[1:], lazy=bulk)
                    specs[key] = spec if bulk else self._cache_spec(key, spec)
        return [_record(row, specs[(row[0], row[1])]) for row in rows]

    async def ping(self) -> None:
        await self._run(self._ping)

    def _ping(self) -> None:
        self._db.execute("SELECT 1").fetchone()

    async def release_memory(self) -> None:
        await self._run(self._shrink_memory)

    def _shrink_memory(self) -> None:
        # The page cache (up to `cache_mb`) was filled by whatever was read last; the
        # pages stay in the system's file cache, so re-reading them costs little.
        self._db.execute("PRAGMA shrink_memory")

    # ------------------------------------------------------------------ workflows

    async def create_workflow(self, plan: WorkflowPlan) -> WorkflowRecord:
        return (await self.persist_plan(plan)).workflow

    async def persist_plan(self, plan: WorkflowPlan) -> Persisted:
        now = _us(self.clock())
        shared = await self._run_write(
            self._with_db, lambda conn: self._create_workflow(conn, plan, now)
        )
        logger.info(
            "workflow %s created with %d actions",
            plan.workflow.id,
            len(plan.actions),
            extra={"event": "workflow_created", "workflow_id": plan.workflow.id},
        )
        return Persisted(plan.workflow, shared)

    def _create_workflow(
        self, conn: sqlite3.Connection, plan: WorkflowPlan, now: int
    ) -> tuple[ActionRecord, ...]:
        """Write the plan in the caller's write transaction; return the actions it made
        share another workflow's computation (read in that transaction: atomic)."""
        workflow = plan.workflow
        # Read in the write transaction: the deletor, which releases the claims of a
        # planning past its deadline whose workflow it does not find, either finds this
        # one committed or makes its claims' release and this refusal agree.
        if plan.deadline_at is not None and self.clock() > plan.deadline_at:
            raise errors.PlanExpired()
        if conn.execute("SELECT 1 FROM workflows WHERE id = ?", (workflow.id,)).fetchone():
            raise errors.Conflict(f"workflow {workflow.id} already exists")
        if (
            workflow.idempotency_key is not None
            and conn.execute(
                "SELECT 1 FROM workflows WHERE owner = ? AND idempotency_key = ?",
                (workflow.owner, workflow.idempotency_key),
            ).fetchone()
        ):
            raise errors.Conflict(
                f"{workflow.owner} already submitted a workflow with idempotency key "
                f"{workflow.idempotency_key!r}"
            )
        if any(a.workflow_id != workflow.id for a in plan.actions):
            raise errors.Conflict("the plan's actions belong to another workflow")
        shared = rules.shared_actions(plan.actions, self._producers_to_share(conn, plan))
        actions = [shared.get(a.action_id, a) for a in plan.actions] if shared else plan.actions
        params = _workflow_params(workflow)
        conn.execute(
            f"INSERT INTO workflows ({_WORKFLOW_COLUMNS}) VALUES ({_placeholders(14)})", params
        )
        # Each list is emptied a slice at a time once written: freed in one go, a big
        # workflow's rows would hold the GIL (and the event loop) for tens of ms.
        hot = [_hot_params(a) for a in actions]
        conn.executemany(_HOT_INSERT, hot)
        heap.dismantle(hot)
        specs = [_spec_params(a) for a in actions]
        conn.executemany(_SPEC_INSERT, specs)
        heap.dismantle(specs)
        counts: dict[str, int] = {}
        for a in actions:
            counts[a.state.value] = counts.get(a.state.value, 0) + 1
        conn.executemany(
            "INSERT INTO action_counts (workflow_id, state, count) VALUES (?, ?, ?) "
            "ON CONFLICT (workflow_id, state) DO UPDATE SET count = count + excluded.count",
            [(workflow.id, state, n) for state, n in counts.items()],
        )
        self._persist_datasets(conn, plan.datasets, now)
        # The node that plans a workflow usually runs it: no need to read this back.
        # (Ids are unique, so an entry left by a rolled-back plan is never read.)
        self._cache_document(workflow.id, workflow.document, len(params[4]))
        if len(plan.actions) > _BULK_ROWS:
            # A big workflow's actions run a few at a time, long after this: caching all
            # their specs now would evict the hot ones, and the last 8,192 would keep
            # the submission's objects (and the heap's arenas under them) alive after
            # the workflow has gone (issue 13).
            return tuple(shared.values())
        for a in actions:
            if a.reused:
                continue  # it never runs: no claim, submission or outcome reads it
            self._cache_spec(
                a.key,
                (
                    a.name,
                    a.type,
                    a.dataset_id,
                    a.reused,
                    a.reason,
                    a.definition,
                    a.inputs,
                    a.children,
                    a.callback_id,
                    a.created_at,
                    a.max_attempts,
                ),
            )
        return tuple(shared.values())

    def _producers_to_share(self, conn: sqlite3.Connection, plan: WorkflowPlan) -> dict[str, str]:
        """Dataset id → the producer a plan's actions share (`rules.producer_to_share`).

        One read of the datasets being computed (most of a new plan's are absent),
        then one per producer found: the usual plan shares nothing and pays one query.
        """
        found: dict[str, str] = {}
        ids = list(dict.fromkeys(p.id for p in plan.datasets))
        computing = {s.value for s in rules.SHAREABLE}
        for chunk in _chunks(ids):
            # The state is filtered here, not in SQL: given `state IN (…)` SQLite walks
            # the state index, every dataset being computed, instead of the ids.
            rows = conn.execute(
                "SELECT id, state, producer_workflow_id, producer_action_id FROM datasets "
                f"WHERE id IN ({_placeholders(len(chunk))})",
                chunk,
            ).fetchall()
            for dataset_id, state, producer_workflow, producer_action in rows:
                if state not in computing:
                    continue
                row = conn.execute(
                    "SELECT state FROM actions WHERE workflow_id = ? AND action_id = ?",
                    (producer_workflow, producer_action),
                ).fetchone()
                key = rules.producer_to_share(
                    plan.workflow.id,
                    DatasetState(state),
                    (producer_workflow, producer_action),
                    None if row is None else ActionState(row[0]),
                )
                if key is not None:
                    found[dataset_id] = key
        return found

    def _persist_datasets(
        self, conn: sqlite3.Connection, plans: Sequence[DatasetPlan], now: int
    ) -> None:
        """Create the planned datasets that are new, in bulk; merge the others one by one."""
        existing: dict[str, tuple[str, str]] = {}
        ids = list(dict.fromkeys(p.id for p in plans))
        for chunk in _chunks(ids):
            for row in conn.execute(
                f"SELECT id, state, claims FROM datasets WHERE id IN ({_placeholders(len(chunk))})",
                chunk,
            ):
                existing[row[0]] = (row[1], row[2])
        new: dict[str, DatasetPlan] = {}
        merges: list[DatasetPlan] = []
        for plan in plans:
            if plan.id in existing or plan.id in new:
                merges.append(plan)  # exists, or planned twice: the second one merges
            else:
                new[plan.id] = plan
        rows = [_new_dataset_params(p, now) for p in new.values()]
        conn.executemany(_DATASET_INSERT, rows)
        heap.dismantle(rows)
        totals: dict[str, int] = {}
        for plan in new.values():
            totals[plan.state.value] = totals.get(plan.state.value, 0) + 1
        conn.executemany(
            "INSERT INTO dataset_totals (state, count, bytes) VALUES (?, ?, 0) "
            "ON CONFLICT (state) DO UPDATE SET count = count + excluded.count",
            list(totals.items()),
        )
        for plan in merges:
            row = conn.execute(
                "SELECT state, claims FROM datasets WHERE id = ?", (plan.id,)
            ).fetchone()
            self._merge_dataset(conn, plan, row, now)

    def _merge_dataset(
        self, conn: sqlite3.Connection, plan: DatasetPlan, row: Sequence[Any], now: int
    ) -> None:
        """Apply a plan to a dataset that exists: upgrade its state and/or add claims."""
        old_state = DatasetState(row[0])
        old_claims: list[str] = json.loads(row[1])
        claims = list(dict.fromkeys([*old_claims, *plan.claims]))
        if plan_upgrades(old_state, plan.state):
            if old_state is DatasetState.DELETED:
                # Column names are the record's field names, from `rules`, never a user's.
                revived = rules.revived_fields(plan)
                assignments = "".join(f", {column} = ?" for column in revived)
                conn.execute(
                    "UPDATE datasets SET state = ?, claims = ?, updated_at = ?, "
                    f"version = version + 1{assignments} WHERE id = ?",
                    (plan.state.value, _dumps(claims), now, *revived.values(), plan.id),
                )
            else:
                conn.execute(
                    "UPDATE datasets SET state = ?, claims = ?, updated_at = ?, "
                    "version = version + 1 WHERE id = ?",
                    (plan.state.value, _dumps(claims), now, plan.id),
                )
        elif len(claims) != len(old_claims):
            conn.execute(
                "UPDATE datasets SET claims = ?, updated_at = ?, version = version + 1 "
                "WHERE id = ?",
                (_dumps(claims), now, plan.id),
            )

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        return await self._run(self._get_workflow, workflow_id)

    def _get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        # A decoded document in the cache: do not even copy its text out of SQLite.
        columns = _WORKFLOW_NO_DOCUMENT if workflow_id in self._documents else _WORKFLOW_COLUMNS
        return self._one(
            self._workflow, f"SELECT {columns} FROM workflows WHERE id = ?", (workflow_id,)
        )

    def _one(
        self, convert: Callable[[Sequence[Any]], T], sql: str, params: Sequence[Any]
    ) -> T | None:
        row = self._db.execute(sql, params).fetchone()
        return None if row is None else convert(row)

    def _all_hot(self, sql: str, params: Sequence[Any]) -> list[ActionRecord]:
        return self._actions_hot(self._db.execute(sql, params).fetchall())

    def _all_actions(
        self, sql: str, params: Sequence[Any], *, paged: bool = False
    ) -> list[ActionRecord]:
        """The records of rows of `_ACTION_SELECT`; a bulk read leaves the caches alone.

        A bulk read builds a million objects: a full garbage collection meanwhile walks
        them all with the GIL held (the event loop stalls, issue 13), and caching their
        specs would evict the hot ones and keep scattered objects that hold the heap's
        pages long after the workflow has gone. A page of a big workflow (`paged`) is
        one slice of such a read: it caches nothing either.
        """
        rows = self._db.execute(sql, params).fetchall()
        if paged:
            return [self._action(row, cache=False) for row in rows]
        if len(rows) <= _BULK_ROWS:
            return [self._action(row) for row in rows]
        with heap.full_collections_deferred():
            records = [self._action(row, cache=False) for row in rows]
            heap.dismantle(rows)
            return records

    def _all(
        self, convert: Callable[[Sequence[Any]], T], sql: str, params: Sequence[Any]
    ) -> list[T]:
        return [convert(row) for row in self._db.execute(sql, params).fetchall()]

    async def list_unwritten_workflows(self, *, limit: int = 100) -> list[str]:
        return []  # a plan lands in one transaction

    async def find_workflow_ids(
        self, prefix: str, *, owner: str | None = None, limit: int = 2
    ) -> list[str]:
        return await self._run(self._find_ids, "workflows", "owner", prefix, owner, limit)

    def _find_ids(
        self,
        table: str,
        column: str,
        prefix: str,
        allowed: Collection[str] | str | None,
        limit: int,
    ) -> list[str]:
        """Ids in `table` starting with `prefix` (a range on the primary key), filtered on
        `column` being `allowed` (one value or several) when given."""
        low, high = lookup.prefix_bounds(prefix)
        sql = f"SELECT id FROM {table} WHERE id >= ? AND id < ?"
        params: list[Any] = [low, high]
        if allowed is not None:
            values = [allowed] if isinstance(allowed, str) else sorted(allowed)
            if not values:
                return []
            sql += f" AND {column} IN ({_placeholders(len(values))})"
            params.extend(values)
        rows = self._db.execute(f"{sql} ORDER BY id LIMIT ?", [*params, limit]).fetchall()
        return [str(row[0]) for row in rows]

    async def find_workflow_by_idempotency_key(self, owner: str, key: str) -> WorkflowRecord | None:
        return await self._run(
            self._one,
            self._workflow,
            f"SELECT {_WORKFLOW_COLUMNS} FROM workflows WHERE owner = ? AND idempotency_key = ?",
            (owner, key),
        )

    def _page(
        self,
        convert: Callable[[Sequence[Any]], T],
        table: str,
        columns: str,
        where: list[str],
        params: list[Any],
        limit: int,
        cursor: str | None,
        position: Callable[[T], tuple[datetime, str]],
    ) -> Page[T]:
        where = list(where)
        params = list(params)
        if cursor is not None:
            at, item_id = _cursor.decode_cursor(cursor)
            micros = _us(at)
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            params.extend((micros, micros, item_id))
        sql = f"SELECT {columns} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        params.append(limit + 1)
        found = self._all(convert, sql, params)
        items = tuple(found[:limit])
        next_cursor = None
        if len(found) > limit and items:
            next_cursor = _cursor.encode_cursor(*position(items[-1]))
        return Page(items=items, next_cursor=next_cursor)

    async def list_workflows(
        self,
        *,
        owner: str | None = None,
        state: WorkflowState | None = None,
        name: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[WorkflowRecord]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("owner", owner), ("state", state), ("name", name)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(str(value))
        return await self._run(
            self._page,
            self._workflow,
            "workflows",
            _WORKFLOW_COLUMNS,
            where,
            params,
            limit,
            cursor,
            lambda w: (w.created_at, w.id),
        )

    async def transition_workflow(
        self,
        workflow_id: str,
        expected: Collection[WorkflowState],
        new: WorkflowState,
        changes: WorkflowChanges = _NO_WORKFLOW_CHANGES,
    ) -> WorkflowRecord | None:
        if not expected:
            return None
        sets, params = _set_clause(changes)
        sql = (
            f"UPDATE workflows SET state = ?, version = version + 1{sets} "
            f"WHERE id = ? AND state IN ({_placeholders(len(expected))}) "
            f"RETURNING {_WORKFLOW_COLUMNS}"
        )
        record = await self._run_statement(
            self._workflow,
            sql,
            [new.value, *params, workflow_id, *(s.value for s in expected)],
        )
        if record is None:
            _common.log_cas_lost(f"workflow {workflow_id}", new, workflow_id=workflow_id)
        return record

    # -------------------------------------------------------------------- actions

    async def get_action(self, workflow_id: str, action_id: int) -> ActionRecord | None:
        return await self._run(
            self._one,
            self._action,
            f"{_ACTION_SELECT} WHERE workflow_id = ? AND action_id = ?",
            (workflow_id, action_id),
        )

    async def get_action_by_callback(self, callback_id: str) -> ActionRecord | None:
        return await self._run(
            self._one,
            self._action,
            f"{_ACTION_SELECT} WHERE callback_id = ?",
            (callback_id,),
        )

    async def get_action_and_dataset_by_callback(
        self, callback_id: str
    ) -> tuple[ActionRecord, DatasetRecord | None] | None:
        return await self._run(self._action_and_dataset, callback_id)

    def _action_and_dataset(
        self, callback_id: str
    ) -> tuple[ActionRecord, DatasetRecord | None] | None:
        """Both reads in one hop to the worker thread (every success starts with them)."""
        action = self._one(self._action, f"{_ACTION_SELECT} WHERE callback_id = ?", (callback_id,))
        if action is None:
            return None
        dataset = self._one(
            self._dataset,
            f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE id = ?",
            (action.dataset_id,),
        )
        return action, dataset

    async def list_actions(
        self, workflow_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[ActionRecord]:
        sql = f"{_ACTION_SELECT} WHERE workflow_id = ?"
        params: list[Any] = [workflow_id]
        if after is not None:
            sql += " AND action_id > ?"
            params.append(after)
        sql += " ORDER BY action_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(limit, 0))
        return await self._run(
            functools.partial(self._all_actions, paged=limit is not None), sql, params
        )

    async def list_planned_actions(self, workflow_id: str) -> list[PlannedAction]:
        return await self._run(
            self._all,
            lambda row: PlannedAction(row[0], row[1], bool(row[2]), row[3]),
            "SELECT action_id, dataset_id, reused, reason FROM action_specs "
            "WHERE workflow_id = ? ORDER BY action_id",
            (workflow_id,),
        )

    async def twin_datasets(self, workflow_id: str) -> frozenset[str]:
        found = await self._run(
            self._all,
            lambda row: str(row[0]),
            "SELECT dataset_id FROM action_specs WHERE workflow_id = ? AND reused = 0 "
            "GROUP BY dataset_id HAVING COUNT(*) > 1",
            (workflow_id,),
        )
        return frozenset(found)

    async def list_actions_in_states(
        self,
        states: Collection[ActionState],
        *,
        lease_expired: bool = False,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        if not states:
            return []
        sql = f"{_ACTION_SELECT} WHERE state IN ({_placeholders(len(states))})"
        params: list[Any] = [s.value for s in states]
        if lease_expired:
            sql += " AND lease_expires_at <= ?"
            params.append(_us(self.clock()))
        sql += " ORDER BY updated_at, workflow_id, action_id LIMIT ?"
        params.append(limit)
        return await self._run(self._all, self._action, sql, params)

    async def count_actions(self, workflow_id: str) -> dict[ActionState, int]:
        rows = await self._run(
            self._all,
            tuple,
            "SELECT state, count FROM action_counts WHERE workflow_id = ? AND count > 0",
            (workflow_id,),
        )
        return {ActionState(state): count for state, count in rows}

    async def has_actions_in(self, workflow_id: str, states: Collection[ActionState]) -> bool:
        if not states:
            return False
        row = await self._run(
            self._one,
            tuple,
            "SELECT 1 FROM action_counts WHERE workflow_id = ? "
            f"AND state IN ({_placeholders(len(states))}) AND count > 0 LIMIT 1",
            (workflow_id, *(s.value for s in states)),
        )
        return row is not None

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
        if not expected:
            return None
        sql, args = _transition_action_statement(
            workflow_id,
            action_id,
            expected,
            new,
            changes,
            _us(self.clock()),
            if_owner=if_owner,
            if_attempt=if_attempt,
        )
        record = await self._run_statement(self._action_hot, sql, args)
        if record is None:
            _common.log_cas_lost(
                f"action {workflow_id}/{action_id}",
                new,
                workflow_id=workflow_id,
                action_id=action_id,
            )
        return record

    async def transition_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        new: ActionState,
        changes: ActionChanges = _NO_ACTION_CHANGES,
    ) -> list[ActionRecord]:
        if not expected:
            return []
        sets, params = _set_clause(changes)
        # One UPDATE: each row is its own compare-and-set on its state, all in one commit.
        sql = (
            f"UPDATE actions SET state = ?, updated_at = ?, version = version + 1"
            f"{_HISTORY_SET}{sets} WHERE workflow_id = ? "
            f"AND state IN ({_placeholders(len(expected))}) RETURNING {_HOT_COLUMNS}"
        )
        now = _us(self.clock())
        args = [new.value, now, *_history_args(new, now), *params, workflow_id]
        args.extend(s.value for s in expected)
        moved = await self._run_write(self._all_hot, sql, args)
        return sorted(moved, key=lambda a: a.action_id)

    async def kill_actions(
        self,
        workflow_id: str,
        expected: Collection[ActionState],
        changes: ActionChanges = _NO_ACTION_CHANGES,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        if not expected or limit <= 0:
            return []
        now = _us(self.clock())
        sets, params = _set_clause(changes)
        in_expected = _placeholders(len(expected))
        # Each row is its own compare-and-set on its state; the batch is one transaction.
        sql = (
            f"UPDATE actions SET state = ?, updated_at = ?, version = version + 1"
            f"{_HISTORY_SET}{sets} WHERE workflow_id = ? AND state IN ({in_expected}) "
            "AND action_id IN ("
            f"SELECT action_id FROM actions WHERE workflow_id = ? AND state IN ({in_expected}) "
            f"ORDER BY action_id LIMIT ?) RETURNING {_HOT_COLUMNS}"
        )
        values = [s.value for s in expected]
        killed_at = _history_args(ActionState.KILLED, now)
        args = [ActionState.KILLED.value, now, *killed_at, *params, workflow_id, *values]
        args += [workflow_id, *values, limit]
        killed: list[ActionRecord] = await self._run_write(
            self._with_db, lambda conn: self._kill_actions(conn, sql, args, now)
        )
        return killed

    def _kill_actions(
        self, conn: sqlite3.Connection, sql: str, args: list[Any], now: int
    ) -> list[ActionRecord]:
        # Never cached: a killed action's spec is not read again, and a kill sweeps a big
        # workflow a batch at a time, so caching would fill the cache with specs that pin
        # the heap's arenas long after the workflow has gone (issue 13).
        rows = conn.execute(sql, args).fetchall()
        killed = sorted(self._actions_hot_specs(rows, bulk=True), key=lambda a: a.action_id)
        gone: dict[str, set[str]] = {}
        for action in killed:
            claim = claim_key(action.workflow_id, action.action_id)
            for dataset_id in action.inputs.values():
                gone.setdefault(dataset_id, set()).add(claim)
        for dataset_id, claims in gone.items():
            self._drop_claims(conn, dataset_id, claims, now)
        computing = [s.value for s in states.DATASET_COMPUTING]
        conn.executemany(
            "UPDATE datasets SET state = ?, updated_at = ?, version = version + 1 "
            f"WHERE id = ? AND state IN ({_placeholders(len(computing))}) "
            "AND producer_workflow_id = ? AND producer_action_id = ?",
            [(DatasetState.DELETED.value, now, a.dataset_id, *computing, *a.key) for a in killed],
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
        lease = now + timedelta(seconds=lease_s)
        # It takes the write lock only when there is something to claim.
        return await self._submit(
            None,
            self._claim_actions,
            (node_id, limit, wanted, _us(now), _us(lease), max_in_flight),
        )

    def _claimable(
        self,
        conn: sqlite3.Connection,
        limit: int,
        wanted: Mapping[str, int] | None,
        now: int,
        max_in_flight: int | None,
        *,
        ordered: bool = True,
    ) -> list[Any]:
        """The rows to claim, in the order to claim them; with `ordered` False, only
        whether there are any (who goes first, `_idle_oldest`, is not looked up: any
        idle owner's claimable row is among the age-ordered ones when there are none)."""
        # Index range scans (one per state, or per type) rather than one OR that no index serves.
        room = self._in_flight_room(conn, max_in_flight)
        #: Workflow id → owner, of the READY candidates (capped claims only).
        owners: dict[str, str] = {}
        if room.capped:
            ready = self._ready_within_room(conn, room, owners, limit, wanted, now)
        elif wanted is None:
            ready = conn.execute(
                "SELECT updated_at, workflow_id, action_id, rowid, action_type FROM actions "
                "WHERE state = 'READY' AND (not_before IS NULL OR not_before <= ?) "
                "ORDER BY updated_at LIMIT ?",
                (now, limit),
            ).fetchall()
        else:
            ready = [
                row
                for action_type, quota in wanted.items()
                for row in conn.execute(
                    "SELECT updated_at, workflow_id, action_id, rowid, action_type FROM actions "
                    "WHERE state = 'READY' AND action_type = ? "
                    "AND (not_before IS NULL OR not_before <= ?) "
                    "ORDER BY updated_at LIMIT ?",
                    (action_type, now, quota),
                ).fetchall()
            ]
        expired = conn.execute(
            "SELECT updated_at, workflow_id, action_id, rowid, action_type FROM actions "
            "WHERE state = 'PROCESSING' AND lease_expires_at <= ? "
            "ORDER BY lease_expires_at LIMIT ?",
            (now, limit),
        ).fetchall()
        oldest = sorted(ready + expired)
        idle = []
        if room.capped and ordered:
            served = {owners[row[1]] for row in ready if row[1] in owners}
            idle = _idle_oldest(conn, room, served, wanted, now, self._idle_empty)
        return _room.idle_first(
            room,
            oldest,
            idle,
            limit,
            wanted,
            owner_of=lambda row: owners.get(row[1], ""),
            age=lambda row: row,
            type_of=lambda row: str(row[4]),
            key=lambda row: row[3],
        )

    @staticmethod
    def _in_flight_room(conn: sqlite3.Connection, default: int | None) -> _room.InFlightRoom:
        caps = conn.execute(
            "SELECT name, max_in_flight_actions FROM users WHERE max_in_flight_actions IS NOT NULL"
        ).fetchall()
        room = _room.InFlightRoom(dict(caps), default)
        if room.capped:
            # From the actions in flight themselves, each joined to its workflow: O(actions
            # in flight), which claims by capacity keep to what the nodes run, where the
            # RUNNING workflows (10,000 of one user, with its limit lifted) made every
            # claim read them all. Actions of a workflow that was just killed or failed,
            # still stopping, are not counted. CROSS JOIN keeps SQLite from starting
            # at the workflows.
            active = sorted(s.value for s in states.ACTION_ACTIVE)
            counts = conn.execute(
                "SELECT w.owner, COUNT(*) FROM actions a INDEXED BY actions_state_updated "
                "CROSS JOIN workflows w ON w.id = a.workflow_id "
                f"WHERE a.state IN ({_placeholders(len(active))}) AND w.state = ? "
                "GROUP BY w.owner",
                (*active, WorkflowState.RUNNING.value),
            ).fetchall()
            room.in_flight.update({owner: n for owner, n in counts if n})
        return room

    @staticmethod
    def _ready_within_room(
        conn: sqlite3.Connection,
        room: _room.InFlightRoom,
        owners: dict[str, str],
        limit: int,
        wanted: Mapping[str, int] | None,
        now: int,
    ) -> list[Any]:
        """The oldest claimable READY actions whose owners have room and whose type has
        quota left (`wanted`, None: any type), using both up.

        Pages through READY in age order, leaving out owners already full, so one
        user's backlog of thousands costs a page or two, not a scan per claim. Each
        wanted type is paged apart, up to its quota: a type whose quota is used up
        must not make the others' pages walk through its backlog. `owners` caches
        workflow id → owner, for the caller too.
        """
        if wanted is None:
            return _ready_pages(conn, room, owners, limit, None, now)
        return [
            row
            for action_type, quota in wanted.items()
            for row in _ready_pages(conn, room, owners, min(quota, limit), action_type, now)
        ]

    def _claim_actions(
        self,
        node_id: str,
        limit: int,
        wanted: Mapping[str, int] | None,
        now: int,
        lease: int,
        max_in_flight: int | None,
    ) -> list[ActionRecord]:
        conn = self._db
        if conn.in_transaction:
            # Batched with writes: the worker's transaction holds the write lock already.
            chosen = self._claimable(conn, limit, wanted, now, max_in_flight)
            return self._claim_chosen(conn, node_id, chosen, now, lease)
        # A poll that finds nothing (the common case) takes no write lock, so idle
        # scrapers of several processes never queue behind each other.
        if not self._claimable(conn, limit, wanted, now, max_in_flight, ordered=False):
            return []
        conn.execute("BEGIN IMMEDIATE")
        # Under the write lock now: what we read is what we update; in-flight counts
        # too, so nodes sharing the file cannot overshoot a user's cap together.
        chosen = self._claimable(conn, limit, wanted, now, max_in_flight)
        claimed = self._claim_chosen(conn, node_id, chosen, now, lease)
        conn.execute("COMMIT")
        return claimed

    def _claim_chosen(
        self, conn: sqlite3.Connection, node_id: str, chosen: list[Any], now: int, lease: int
    ) -> list[ActionRecord]:
        if not chosen:
            return []
        rows = []
        for chunk in _chunks(chosen):
            rows.extend(
                conn.execute(
                    # A reclaim (PROCESSING past its lease) keeps its history as is.
                    "UPDATE actions SET state = 'PROCESSING', owner = ?, lease_expires_at = ?, "
                    f"updated_at = ?, version = version + 1{_HISTORY_SET} "
                    f"WHERE rowid IN ({_placeholders(len(chunk))}) RETURNING {_HOT_COLUMNS}",
                    [
                        node_id,
                        lease,
                        now,
                        *_history_args(ActionState.PROCESSING, now),
                        *(c[3] for c in chunk),
                    ],
                ).fetchall()
            )
        order = {(c[1], c[2]): i for i, c in enumerate(chosen)}
        return sorted(self._actions_hot(rows), key=lambda a: order[a.key])

    async def watch_ready(self, on_ready: Callable[[], None]) -> None:
        raise errors.Unsupported("SQLite has no change events across processes; poll")

    async def renew_leases(
        self, node_id: str, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> int:
        if not keys:
            return 0
        now = self.clock()
        lease = _us(now + timedelta(seconds=lease_s))
        active = sorted(s.value for s in states.ACTION_ACTIVE)
        sql = (
            "UPDATE actions SET lease_expires_at = ?, updated_at = ?, version = version + 1 "
            "WHERE workflow_id = ? AND action_id = ? AND owner = ? "
            f"AND state IN ({_placeholders(len(active))})"
        )
        # A key given twice is held once.
        params = [(lease, _us(now), wf, aid, node_id, *active) for wf, aid in dict.fromkeys(keys)]

        def renew(conn: sqlite3.Connection) -> int:
            return conn.executemany(sql, params).rowcount

        return await self._run_write(self._with_db, renew)

    async def release_parent(
        self, workflow_id: str, parent_action_id: int, children: Sequence[int]
    ) -> list[ActionRecord]:
        if not children:
            return []
        now = _us(self.clock())
        return await self._run_write(
            self._with_db,
            lambda conn: self._release_parent(conn, workflow_id, parent_action_id, children, now),
        )

    def _release_parent(
        self,
        conn: sqlite3.Connection,
        workflow_id: str,
        parent_action_id: int,
        children: Sequence[int],
        now: int,
    ) -> list[ActionRecord]:
        rows = []
        # In chunks: a fan-out action may have more children than SQLite binds at once.
        for chunk in _chunks(children):
            rows.extend(
                conn.execute(
                    "SELECT action_id, state, waiting_on FROM actions "
                    f"WHERE workflow_id = ? AND action_id IN ({_placeholders(len(chunk))})",
                    [workflow_id, *chunk],
                ).fetchall()
            )
        still_waiting = []
        ready_ids = []
        for action_id, state, waiting_json in rows:
            waiting: list[int] = json.loads(waiting_json)
            left = [p for p in waiting if p != parent_action_id]
            # Like the other backends: a WAITING child with nothing left to wait for
            # flips even if this parent was released before.
            if not left and state == ActionState.WAITING.value:
                ready_ids.append(action_id)
            elif len(left) != len(waiting):
                still_waiting.append((_dumps(left), now, workflow_id, action_id))
            # else: released before, nothing to do
        if still_waiting:
            conn.executemany(
                "UPDATE actions SET waiting_on = ?, updated_at = ?, version = version + 1 "
                "WHERE workflow_id = ? AND action_id = ?",
                still_waiting,
            )
        ready = []
        for chunk in _chunks(ready_ids):
            ready.extend(
                conn.execute(
                    "UPDATE actions SET waiting_on = '[]', state = 'READY', updated_at = ?, "
                    f"version = version + 1{_HISTORY_SET} WHERE workflow_id = ? "
                    f"AND action_id IN ({_placeholders(len(chunk))}) RETURNING {_HOT_COLUMNS}",
                    [now, *_history_args(ActionState.READY, now), workflow_id, *chunk],
                ).fetchall()
            )
        return sorted(self._actions_hot(ready), key=lambda a: a.action_id)

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
        if not expected:
            return None
        now = _us(self.clock())
        sql, args = _transition_action_statement(
            workflow_id,
            action_id,
            expected,
            ActionState.FINISHED,
            changes,
            now,
            if_attempt=if_attempt,
            if_waiting_on=if_waiting_on,
        )

        def finish(conn: sqlite3.Connection) -> Finished | None:
            if stored is not None and self._move_dataset(conn, stored, now) is None:
                return None
            done = self._finish_action(conn, workflow_id, action_id, sql, args, now, attached_limit)
            if done is None and stored is not None:
                raise _Undone  # the dataset's move goes back with this call's savepoint
            return done

        try:
            outcome: Finished | None = await self._run_write(self._with_db, finish)
        except _Undone:
            outcome = None
        if outcome is None:
            _common.log_cas_lost(
                f"action {workflow_id}/{action_id}",
                ActionState.FINISHED,
                workflow_id=workflow_id,
                action_id=action_id,
            )
        return outcome

    def _finish_action(
        self,
        conn: sqlite3.Connection,
        workflow_id: str,
        action_id: int,
        sql: str,
        args: list[Any],
        now: int,
        attached_limit: int = 0,
    ) -> Finished | None:
        # One call, so one transaction: the compare-and-set, then (only if it won) the
        # claims and the children. A failure undoes all three together. The attached
        # actions are read in it too: one hop to this thread less per success.
        finished = self._one(self._action_hot, sql, args)
        if finished is None:
            return None
        if finished.inputs:
            self._drop_claim_from(
                conn, sorted(set(finished.inputs.values())), claim_key(workflow_id, action_id), now
            )
        released = self._release_parent(conn, workflow_id, action_id, finished.children, now)
        attached = []
        if attached_limit > 0:
            sql = _ATTACHED_SELECT.format(where="a.shared_with = ?")
            key = claim_key(workflow_id, action_id)
            attached = self._all(self._action, sql, [key, attached_limit])
        return Finished(finished, released, attached)

    @staticmethod
    def _drop_claim_from(
        conn: sqlite3.Connection, dataset_ids: Sequence[str], claim: str, now: int
    ) -> None:
        """Remove `claim` from every dataset of `dataset_ids` holding it.

        It runs for every finished action, on the worker thread whose Python time the
        event loop waits for, and a dataset many actions read holds one claim per
        reader (1,482 on one of Montage's): so the claims are not parsed. They are
        compact JSON (`_dumps`), in which `"key"` between `[` or `,` and `,` or `]`
        can only be that element (a quote inside a string is escaped), so the element
        and one comma are cut out of the text: one SELECT per chunk, a search, one
        UPDATE per dataset that held it, ~25 µs at 1,000 claims where filtering the
        array with `json_each` in SQL took ~500 µs (SQLite's string functions count
        characters on every call). Text with whitespace (not written by Pingo) and
        keys that JSON would escape are decoded and filtered (`_drop_claims`). The
        claims keep their order.
        """
        token = _dumps(claim)
        plain = token == f'"{claim}"'
        for chunk in _chunks(dataset_ids):
            rows = conn.execute(
                f"SELECT id, claims FROM datasets WHERE id IN ({_placeholders(len(chunk))})",
                chunk,
            ).fetchall()
            for dataset_id, text in rows:
                kept = _cut_element(text, token) if plain and " " not in text else None
                if kept is None:
                    SQLiteStore._drop_claims(conn, dataset_id, (claim,), now)
                elif kept != text:
                    conn.execute(
                        "UPDATE datasets SET claims = ?, updated_at = ?, "
                        "version = version + 1 WHERE id = ?",
                        (kept, now, dataset_id),
                    )

    @staticmethod
    def _drop_claim(conn: sqlite3.Connection, dataset_id: str, claim: str, now: int) -> None:
        """`_remove_dataset_claim` for a caller that needs no record back (finish_action)."""
        SQLiteStore._drop_claims(conn, dataset_id, (claim,), now)

    @staticmethod
    def _drop_claims(
        conn: sqlite3.Connection, dataset_id: str, gone: Collection[str], now: int
    ) -> None:
        """Remove the claims `gone` from one dataset, with no record back.

        Reads and writes the claims alone: it runs for every input of every finished
        action, on the worker thread whose Python time the event loop waits for.
        """
        row = conn.execute("SELECT claims FROM datasets WHERE id = ?", (dataset_id,)).fetchone()
        if row is None:
            return
        claims: list[str] = json.loads(row[0])
        kept = [c for c in claims if c not in gone]
        if len(kept) == len(claims):
            return
        conn.execute(
            "UPDATE datasets SET claims = ?, updated_at = ?, version = version + 1 WHERE id = ?",
            (_dumps(kept), now, dataset_id),
        )

    async def list_attached_actions(
        self,
        producer_workflow_id: str | None = None,
        producer_action_id: int | None = None,
        *,
        limit: int = 1000,
    ) -> list[ActionRecord]:
        if limit <= 0:
            return []
        if producer_workflow_id is None:
            where, params = "1", []
        elif producer_action_id is None:
            # A range on the index: every claim key of the workflow, '/' then digits.
            where = "a.shared_with >= ? AND a.shared_with < ?"
            params = [producer_workflow_id + "/", producer_workflow_id + "0"]
        else:
            where = "a.shared_with = ?"
            params = [claim_key(producer_workflow_id, producer_action_id)]
        sql = _ATTACHED_SELECT.format(where=where)
        return await self._run(self._all, self._action, sql, [*params, limit])

    # ------------------------------------------------------------------- datasets

    async def get_dataset(self, dataset_id: str) -> DatasetRecord | None:
        return await self._run(
            self._one,
            self._dataset,
            f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE id = ?",
            (dataset_id,),
        )

    async def find_dataset_ids(
        self, prefix: str, *, scopes: Collection[str] | None = None, limit: int = 2
    ) -> list[str]:
        return await self._run(self._find_ids, "datasets", "scope", prefix, scopes, limit)

    async def get_datasets(self, dataset_ids: Collection[str]) -> dict[str, DatasetRecord]:
        return await self._run(self._get_datasets, dataset_ids)

    def _get_datasets(self, dataset_ids: Collection[str]) -> dict[str, DatasetRecord]:
        # Deduplicated here, in the store's thread: a big workflow's ids are 100,000.
        ids = list(dict.fromkeys(dataset_ids))
        found: dict[str, DatasetRecord] = {}
        # A big workflow's planning reads all its datasets once: cached, the last 8,192
        # would evict the hot ones and pin the heap's arenas afterwards (issue 13).
        convert = functools.partial(self._dataset, cache=len(ids) <= _BULK_ROWS)
        # Stay well under SQLite's limit on bound parameters.
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for record in self._all(
                convert,
                f"SELECT {_DATASET_COLUMNS} FROM datasets "
                f"WHERE id IN ({_placeholders(len(chunk))})",
                chunk,
            ):
                found[record.id] = record
        return found

    async def list_child_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 1000
    ) -> list[DatasetRecord]:
        return await self._run(self._list_child_datasets, list(dict.fromkeys(dataset_ids)), limit)

    def _list_child_datasets(self, ids: list[str], limit: int) -> list[DatasetRecord]:
        children: set[str] = set()
        for chunk in _chunks(ids):
            # Each chunk's first `limit` hold the overall first `limit`: a popular
            # dataset's many children are never all read.
            rows = self._db.execute(
                "SELECT DISTINCT child FROM dataset_parents "
                f"WHERE parent IN ({_placeholders(len(chunk))}) ORDER BY child LIMIT ?",
                [*chunk, limit],
            )
            children.update(row[0] for row in rows)
        chosen = sorted(children)[:limit]
        found = self._get_datasets(chosen)
        return [found[i] for i in chosen if i in found]

    async def find_workflows_with_datasets(
        self, dataset_ids: Collection[str], *, limit: int = 100
    ) -> list[str]:
        ids = list(dict.fromkeys(dataset_ids))
        return await self._run(self._find_workflows_with_datasets, ids, limit)

    def _find_workflows_with_datasets(self, ids: list[str], limit: int) -> list[str]:
        found: set[str] = set()
        for chunk in _chunks(ids):
            rows = self._db.execute(
                "SELECT DISTINCT workflow_id FROM action_specs "
                f"WHERE dataset_id IN ({_placeholders(len(chunk))}) "
                "ORDER BY workflow_id DESC LIMIT ?",
                [*chunk, limit],
            )
            found.update(row[0] for row in rows)
        return sorted(found, reverse=True)[:limit]

    async def list_datasets(
        self,
        *,
        state: DatasetState | None = None,
        scopes: Collection[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page[DatasetRecord]:
        where = [] if state is None else ["state = ?"]
        params: list[Any] = [] if state is None else [state.value]
        if scopes is not None:
            where.append(f"scope IN ({_placeholders(len(scopes))})")
            params.extend(sorted(scopes))
        return await self._run(
            self._page,
            self._dataset,
            "datasets",
            _DATASET_COLUMNS,
            where,
            params,
            limit,
            cursor,
            lambda d: (d.created_at, d.id),
        )

    async def list_claimed_datasets(
        self, *, after: str | None = None, limit: int = 100
    ) -> list[DatasetRecord]:
        if limit <= 0:
            return []
        # By the primary key, skipping the unclaimed rows: claims are a JSON list, and
        # no index tells the few claimed datasets apart (a sweep every ten leases).
        sql = (
            f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE claims != '[]' AND id > ? "
            "ORDER BY id LIMIT ?"
        )
        return await self._run(
            self._all, self._dataset, sql, ("" if after is None else after, limit)
        )

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
        if not expected:
            return None
        now = _us(self.clock())
        move = DatasetMove(dataset_id, frozenset(expected), new, changes, event)
        if event is None:
            sql, args = _dataset_move_statement(move, now, if_unclaimed=if_unclaimed)
            record = await self._run_statement(self._dataset, sql, args)
        else:
            record = await self._run_write(
                self._with_db,
                lambda conn: self._move_dataset(conn, move, now, if_unclaimed=if_unclaimed),
            )
        if record is None:
            _common.log_cas_lost(f"dataset {dataset_id}", new, dataset_id=dataset_id)
        return record

    def _move_dataset(
        self, conn: sqlite3.Connection, move: DatasetMove, now: int, *, if_unclaimed: bool = False
    ) -> DatasetRecord | None:
        """`transition_dataset` in the caller's write transaction: the compare-and-set,
        then its event if it moved."""
        sql, args = _dataset_move_statement(move, now, if_unclaimed=if_unclaimed)
        moved = self._one(self._dataset, sql, args)
        if moved is not None and move.event is not None:
            conn.execute(_EVENT_INSERT, _event_params(move.event, now))
        return moved

    async def add_dataset_claim(
        self, dataset_id: str, claim: str, allowed: Collection[DatasetState]
    ) -> DatasetRecord | None:
        allowed_values = {s.value for s in allowed}
        now = _us(self.clock())

        def add(conn: sqlite3.Connection) -> DatasetRecord | None:
            row = conn.execute(
                "SELECT state, claims FROM datasets WHERE id = ?", (dataset_id,)
            ).fetchone()
            if row is None or row[0] not in allowed_values:
                return None
            claims: list[str] = json.loads(row[1])
            if claim in claims:
                return self._one(
                    self._dataset,
                    f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE id = ?",
                    (dataset_id,),
                )
            claims.append(claim)
            return self._update_dataset(conn, dataset_id, now, "claims = ?", [_dumps(claims)])

        return await self._run_write(self._with_db, add)

    def _update_dataset(
        self, conn: sqlite3.Connection, dataset_id: str, now: int, sets: str, params: list[Any]
    ) -> DatasetRecord | None:
        row = conn.execute(
            f"UPDATE datasets SET {sets}, updated_at = ?, version = version + 1 "
            f"WHERE id = ? RETURNING {_DATASET_COLUMNS}",
            [*params, now, dataset_id],
        ).fetchone()
        return None if row is None else self._dataset(row)

    async def remove_dataset_claim(self, dataset_id: str, claim: str) -> DatasetRecord | None:
        now = _us(self.clock())
        return await self._run_write(
            self._with_db, lambda conn: self._remove_dataset_claim(conn, dataset_id, claim, now)
        )

    def _remove_dataset_claim(
        self, conn: sqlite3.Connection, dataset_id: str, claim: str, now: int
    ) -> DatasetRecord | None:
        self._drop_claim(conn, dataset_id, claim, now)
        return self._one(
            self._dataset, f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE id = ?", (dataset_id,)
        )

    async def record_dataset_uses(self, dataset_ids: Collection[str]) -> int:
        now = _us(self.clock())
        sql = (
            "UPDATE datasets SET use_count = use_count + 1, last_used_at = ?, updated_at = ?, "
            "version = version + 1 WHERE id = ?"
        )
        params = [(now, now, dataset_id) for dataset_id in sorted(set(dataset_ids))]
        if not params:
            return 0

        def count(conn: sqlite3.Connection) -> int:
            return conn.executemany(sql, params).rowcount

        return await self._run_write(self._with_db, count)

    async def set_dataset_pinned(self, dataset_id: str, pinned: bool) -> DatasetRecord | None:
        now = _us(self.clock())

        def pin(conn: sqlite3.Connection) -> DatasetRecord | None:
            row = conn.execute(
                "UPDATE datasets SET pinned = ?, updated_at = ?, version = version + 1 "
                f"WHERE id = ? AND pinned != ? RETURNING {_DATASET_COLUMNS}",
                (int(pinned), now, dataset_id, int(pinned)),
            ).fetchone()
            if row is not None:
                return self._dataset(row)
            # Already as asked (or absent): nothing changes.
            return self._one(
                self._dataset,
                f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE id = ?",
                (dataset_id,),
            )

        return await self._run_write(self._with_db, pin)

    async def list_deletable_datasets(
        self, stale_s: float, limit: int = 100
    ) -> list[DatasetRecord]:
        stale_before = _us(self.clock() - timedelta(seconds=stale_s))
        sql = (
            f"SELECT {_DATASET_COLUMNS} FROM datasets "
            "WHERE state = 'STORED_TO_DELETE' AND claims = '[]' "
            f"UNION ALL SELECT {_DATASET_COLUMNS} FROM datasets "
            "WHERE state IN ('PROCESSING', 'DELETING') AND updated_at <= ? "
            "ORDER BY updated_at, id LIMIT ?"
        )
        return await self._run(self._all, self._dataset, sql, (stale_before, limit))

    async def list_retention_candidates(self) -> list[DatasetRecord]:
        return await self._run(
            self._all,
            self._dataset,
            f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE state = 'STORED' "
            "ORDER BY updated_at, id",
            (),
        )

    async def bytes_by_state(self) -> dict[DatasetState, int]:
        rows = await self._run(
            self._all,
            tuple,
            "SELECT state, bytes FROM dataset_totals WHERE count > 0",
            (),
        )
        return {DatasetState(state): int(total) for state, total in rows}

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
        params = _event_params(
            NewEvent(kind, owner, workflow_id, dataset_id, payload), _us(self.clock())
        )
        event: EventRecord | None = await self._run_statement(
            _EVENTS.record, f"{_EVENT_INSERT} RETURNING {_EVENTS.columns}", params
        )
        assert event is not None  # an INSERT … RETURNING returns its row
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
        where = []
        params: list[Any] = []
        for column, value in (("kind", kind), ("dataset_id", dataset_id), ("owner", owner)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if before_seq is not None:
            where.append("seq < ?")
            params.append(before_seq)
        if after_seq is not None:
            where.append("seq > ?")
            params.append(after_seq)
        sql = f"SELECT {_EVENTS.columns} FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq {'ASC' if after_seq is not None else 'DESC'} LIMIT ?"
        params.append(max(limit, 0))
        return await self._run(self._all, _EVENTS.record, sql, params)

    # ---------------------------------------------------------------------- users

    async def create_user(self, user: UserRecord) -> UserRecord:
        try:
            await self._run_write(
                self._one,
                tuple,
                f"INSERT INTO users ({_USERS.columns}) VALUES ({_USERS.placeholders})",
                _USERS.row(user),
            )
        except errors.Conflict as exc:
            raise errors.Conflict(f"user {user.name!r} (or its token) already exists") from exc
        return user

    async def get_user(self, name: str) -> UserRecord | None:
        return await self._run(
            self._one, _USERS.record, f"SELECT {_USERS.columns} FROM users WHERE name = ?", (name,)
        )

    async def get_user_by_token_hash(self, token_hash: str) -> UserRecord | None:
        return await self._run(
            self._one,
            _USERS.record,
            f"SELECT {_USERS.columns} FROM users WHERE token_hash = ?",
            (token_hash,),
        )

    async def list_users(self) -> list[UserRecord]:
        return await self._run(
            self._all, _USERS.record, f"SELECT {_USERS.columns} FROM users ORDER BY name", ()
        )

    async def delete_user(self, name: str) -> bool:
        deleted = await self._run_write(
            self._one, tuple, "DELETE FROM users WHERE name = ? RETURNING name", (name,)
        )
        return deleted is not None

    async def set_user_limits(self, name: str, limits: UserLimits) -> UserRecord | None:
        return await self._run_write(
            self._one,
            _USERS.record,
            f"UPDATE users SET {', '.join(f'{n} = ?' for n in _LIMIT_FIELDS)} "
            f"WHERE name = ? RETURNING {_USERS.columns}",
            (*_limit_values(limits), name),
        )

    async def bytes_produced_by(self, owner: str) -> int:
        charged = tuple(s.value for s in states.DATASET_USING_STORAGE)
        row = await self._run(
            self._one,
            tuple,
            # The owner's workflows first, then each one's datasets: never a walk of
            # every dataset in a state (CROSS JOIN fixes the order in SQLite).
            "SELECT TOTAL(d.size_bytes) FROM workflows w "
            "CROSS JOIN datasets d INDEXED BY datasets_producer "
            "ON d.producer_workflow_id = w.id "
            f"WHERE w.owner = ? AND d.state IN ({', '.join('?' * len(charged))})",
            (owner, *charged),
        )
        assert row is not None
        return int(row[0])

    async def count_running_workflows(self, owner: str) -> int:
        row = await self._run(
            self._one,
            tuple,
            "SELECT COUNT(*) FROM workflows WHERE owner = ? AND state = ?",
            (owner, WorkflowState.RUNNING.value),
        )
        assert row is not None
        return int(row[0])

    # ------------------------------------------------------------------ schedules

    async def create_schedule(self, schedule: ScheduleRecord) -> ScheduleRecord:
        s = schedule
        try:
            await self._run_write(
                self._one,
                tuple,
                f"INSERT INTO schedules ({_SCHEDULES.columns}) VALUES ({_SCHEDULES.placeholders})",
                _SCHEDULES.row(s),
            )
        except errors.Conflict as exc:
            raise errors.Conflict(f"schedule {s.id!r} already exists") from exc
        return schedule

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return await self._run(
            self._one,
            _SCHEDULES.record,
            f"SELECT {_SCHEDULES.columns} FROM schedules WHERE id = ?",
            (schedule_id,),
        )

    async def list_schedules(
        self, *, owner: str | None = None, limit: int = 100
    ) -> list[ScheduleRecord]:
        where, params = ("WHERE owner = ? ", [owner]) if owner is not None else ("", [])
        return await self._run(
            self._all,
            _SCHEDULES.record,
            f"SELECT {_SCHEDULES.columns} FROM schedules {where}"
            "ORDER BY created_at DESC, id DESC LIMIT ?",
            [*params, limit],
        )

    async def list_due_schedules(
        self,
        now: datetime,
        node_id: str,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
    ) -> list[ScheduleRecord]:
        at = _us(now)
        if after is not None:
            return await self._run(
                self._all,
                _SCHEDULES.record,
                f"SELECT {_SCHEDULES.columns} FROM schedules "
                "WHERE next_fire_at <= ? AND pending_tick_at IS NULL AND paused = 0 "
                "AND (next_fire_at, id) > (?, ?) ORDER BY next_fire_at, id LIMIT ?",
                (at, _us(after[0]), after[1], limit),
            )
        # Two index ranges (pending ticks, due ticks) rather than one OR over both.
        return await self._run(
            self._all,
            _SCHEDULES.record,
            f"SELECT {_SCHEDULES.columns} FROM schedules WHERE pending_tick_at IS NOT NULL "
            "AND (claimed_by = ? OR claim_expires_at IS NULL OR claim_expires_at <= ?) "
            f"UNION ALL SELECT {_SCHEDULES.columns} FROM schedules "
            "WHERE next_fire_at <= ? AND pending_tick_at IS NULL AND paused = 0 "
            "ORDER BY 6, 1 LIMIT ?",
            (node_id, at, at, limit),
        )

    async def update_schedule(
        self, schedule_id: str, expected_version: int, changes: ScheduleChanges
    ) -> ScheduleRecord | None:
        sets, params = _set_clause(changes)
        record = await self._run_write(
            self._one,
            _SCHEDULES.record,
            f"UPDATE schedules SET version = version + 1, updated_at = ?{sets} "
            f"WHERE id = ? AND version = ? RETURNING {_SCHEDULES.columns}",
            [_us(self.clock()), *params, schedule_id, expected_version],
        )
        if record is None:
            _common.log_cas_lost(f"schedule {schedule_id}", None, schedule_id=schedule_id)
        return record

    async def update_schedules(
        self, updates: Sequence[tuple[str, int, ScheduleChanges]]
    ) -> list[ScheduleRecord | None]:
        now = _us(self.clock())

        def update_all(conn: sqlite3.Connection) -> list[ScheduleRecord | None]:
            results: list[ScheduleRecord | None] = []
            for schedule_id, expected_version, changes in updates:
                sets, params = _set_clause(changes)
                row = conn.execute(
                    f"UPDATE schedules SET version = version + 1, updated_at = ?{sets} "
                    f"WHERE id = ? AND version = ? RETURNING {_SCHEDULES.columns}",
                    [now, *params, schedule_id, expected_version],
                ).fetchone()
                results.append(None if row is None else _SCHEDULES.record(row))
            return results

        if not updates:
            return []
        # One transaction: a pass's claims cost one hop to the writer thread and one commit.
        return await self._run_write(self._with_db, update_all)

    async def delete_schedule(self, schedule_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM schedule_runs WHERE schedule_id = ?", (schedule_id,))
            gone = conn.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,))
            return gone.rowcount > 0

        return await self._run_write(self._with_db, delete)

    async def record_schedule_run(self, run: ScheduleRunRecord) -> ScheduleRunRecord:
        def record(conn: sqlite3.Connection) -> ScheduleRunRecord:
            conn.execute(
                f"INSERT INTO schedule_runs ({_RUNS.columns}) VALUES ({_RUNS.placeholders}) "
                "ON CONFLICT (schedule_id, tick_at) DO NOTHING",
                _RUNS.row(run),
            )
            row = conn.execute(
                f"SELECT {_RUNS.columns} FROM schedule_runs WHERE schedule_id = ? AND tick_at = ?",
                (run.schedule_id, _us(run.tick_at)),
            ).fetchone()
            return _RUNS.record(row)

        return await self._run_write(self._with_db, record)

    async def list_schedule_runs(
        self, schedule_id: str, limit: int = 100
    ) -> list[ScheduleRunRecord]:
        return await self._run(
            self._all,
            _RUNS.record,
            f"SELECT {_RUNS.columns} FROM schedule_runs WHERE schedule_id = ? "
            "ORDER BY tick_at DESC LIMIT ?",
            (schedule_id, limit),
        )

    # --------------------------------------------------------- webhook deliveries

    async def create_deliveries(self, deliveries: Sequence[WebhookDeliveryRecord]) -> None:
        rows = [_DELIVERIES.row(d) for d in deliveries]
        if not rows:
            return

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany(
                f"INSERT INTO webhook_deliveries ({_DELIVERIES.columns}) "
                f"VALUES ({_DELIVERIES.placeholders}) ON CONFLICT (id) DO NOTHING",
                rows,
            )

        await self._run_write(self._with_db, insert)

    async def claim_deliveries(
        self, node_id: str, now: datetime, limit: int, lease_s: float
    ) -> list[WebhookDeliveryRecord]:
        at = _us(now)
        return await self._run_write(
            self._all,
            _DELIVERIES.record,
            "UPDATE webhook_deliveries SET claimed_by = ?, claim_expires_at = ?, "
            "updated_at = ?, version = version + 1 WHERE id IN ("
            "SELECT id FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= ? "
            "AND (claim_expires_at IS NULL OR claim_expires_at <= ?) "
            f"ORDER BY next_attempt_at, id LIMIT ?) RETURNING {_DELIVERIES.columns}",
            (node_id, at + int(lease_s * 1e6), at, at, at, limit),
        )

    async def update_delivery(
        self, delivery_id: str, expected_version: int, changes: DeliveryChanges
    ) -> WebhookDeliveryRecord | None:
        sets, params = _set_clause(changes)
        return await self._run_write(
            self._one,
            _DELIVERIES.record,
            f"UPDATE webhook_deliveries SET version = version + 1, updated_at = ?{sets} "
            f"WHERE id = ? AND version = ? RETURNING {_DELIVERIES.columns}",
            [_us(self.clock()), *params, delivery_id, expected_version],
        )

    async def list_deliveries(
        self,
        *,
        owner: str | None = None,
        workflow_id: str | None = None,
        schedule_id: str | None = None,
        limit: int = 100,
    ) -> list[WebhookDeliveryRecord]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("owner", owner),
            ("workflow_id", workflow_id),
            ("schedule_id", schedule_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {_DELIVERIES.columns} FROM webhook_deliveries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        return await self._run(self._all, _DELIVERIES.record, sql, [*params, limit])

"""What is particular to the SQLite backend: file, schema, locking, group commit, plans."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import sqlite3
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pingo import errors, untrusted
from pingo.states import ActionState, DatasetState, WorkflowState
from pingo.store import open_store, sqlite
from pingo.store.protocol import (
    NO_LIMITS,
    ActionRecord,
    DatasetPlan,
    StateEntry,
    UserLimits,
    UserRecord,
    WorkflowPlan,
    WorkflowRecord,
)
from pingo.store.sqlite import MIGRATIONS, SQLiteStore, path_from_url
from tests.contract.conftest import FakeClock
from tests.contract.test_schedules import make_schedule

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _plan(workflow_id: str, count: int, *, callback_prefix: str | None = None) -> WorkflowPlan:
    workflow = WorkflowRecord(
        id=workflow_id,
        name="unit",
        owner="alice",
        state=WorkflowState.RUNNING,
        document={"name": "unit"},
        scope="server",
        on_failure="abort",
        end_dataset_id=None,
        created_at=NOW,
    )
    prefix = callback_prefix or workflow_id
    actions = tuple(
        ActionRecord(
            workflow_id=workflow_id,
            action_id=i,
            name=f"a{i}",
            type="command-line",
            state=ActionState.READY,
            dataset_id=f"ds-{workflow_id}-{i}",
            reused=False,
            reason="absent",
            definition={"command": ["true", str(i)]},
            inputs={},
            waiting_on=(),
            children=(),
            callback_id=f"{prefix}-cb-{i}",
            created_at=NOW,
            updated_at=NOW,
        )
        for i in range(count)
    )
    return WorkflowPlan(workflow, actions, ())


def _user(name: str) -> UserRecord:
    return UserRecord(name=name, token_hash=f"hash-{name}", is_admin=False, created_at=NOW)


def _pragma(path: Path, name: str) -> object:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


def test_path_from_url() -> None:
    assert path_from_url("sqlite:///abs/path.db") == "/abs/path.db"
    assert path_from_url("sqlite:////abs/path.db") == "/abs/path.db"
    assert path_from_url("sqlite://relative.db") == "relative.db"
    assert path_from_url("sqlite:///abs/path.db?mode=x") == "/abs/path.db"
    with pytest.raises(errors.ConfigurationError):
        path_from_url("sqlite://")
    with pytest.raises(errors.ConfigurationError):
        path_from_url("mongodb://x")


def test_synchronous_must_be_a_sqlite_level() -> None:
    with pytest.raises(errors.ConfigurationError):
        SQLiteStore("x.db", synchronous="SOMETIMES")
    assert SQLiteStore("x.db", synchronous="full").synchronous == "FULL"


@pytest.mark.parametrize(("setting", "level"), [("NORMAL", 1), ("FULL", 2)])
async def test_opening_sets_wal_synchronous_and_schema(
    tmp_path: Path, setting: str, level: int
) -> None:
    path = tmp_path / "p.db"
    async with SQLiteStore(path, synchronous=setting) as store:

        def pragmas() -> tuple[object, object]:
            conn = store._db
            return (
                conn.execute("PRAGMA synchronous").fetchone()[0],
                conn.execute("PRAGMA busy_timeout").fetchone()[0],
            )

        assert await store._run(pragmas) == (level, 10_000)
    assert _pragma(path, "journal_mode") == "wal"
    assert _pragma(path, "user_version") == len(MIGRATIONS)


async def test_the_page_cache_is_bounded_by_the_setting(tmp_path: Path) -> None:
    from pingo.config import Settings

    settings = Settings.from_env({"PINGO_HOME": str(tmp_path), "PINGO_SQLITE_CACHE_MB": "3"})
    assert settings.sqlite_cache_mb == 3
    url = f"sqlite:///{tmp_path / 'c.db'}"
    async with open_store(url, sqlite_cache_mb=settings.sqlite_cache_mb) as store:
        assert isinstance(store, SQLiteStore)
        size = await store._run(lambda: store._db.execute("PRAGMA cache_size").fetchone()[0])
        assert size == -3 * 1024  # negative: KiB
    async with open_store(url) as store:
        size = await store._run(lambda: store._db.execute("PRAGMA cache_size").fetchone()[0])
        assert size == -sqlite.DEFAULT_CACHE_MB * 1024
    with pytest.raises(errors.ConfigurationError):
        SQLiteStore("x.db", cache_mb=0)


@pytest.mark.skipif(ctypes.util.find_library("sqlite3") is None, reason="no libsqlite3")
async def test_releasing_memory_empties_the_page_cache(tmp_path: Path) -> None:
    library = ctypes.util.find_library("sqlite3")
    assert library is not None
    used = ctypes.CDLL(library).sqlite3_memory_used  # the library the module loaded
    used.restype = ctypes.c_int64
    async with open_store(f"sqlite:///{tmp_path / 'm.db'}") as store:
        assert isinstance(store, SQLiteStore)

        def fill() -> None:  # 6 MB of pages, read through the cache (8 MiB)
            store._db.execute("CREATE TABLE filler (x BLOB)")
            store._db.executemany("INSERT INTO filler VALUES (?)", [(bytes(1000),)] * 6000)
            store._db.execute("SELECT sum(length(x)) FROM filler").fetchone()

        await store._run(fill)
        full = used()
        await store.release_memory()
        assert used() < full - 4 * 2**20
        assert (
            await store._run(lambda: store._db.execute("SELECT count(*) FROM filler").fetchone()[0])
            == 6000
        )


async def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    async with open_store(url) as store:
        await store.create_workflow(_plan("wf-1", 3))
    async with open_store(url) as store:
        assert len(await store.list_actions("wf-1")) == 3
    assert _pragma(tmp_path / "p.db", "user_version") == len(MIGRATIONS)


async def test_a_store_from_before_digests_migrates_and_keeps_its_datasets(
    tmp_path: Path,
) -> None:
    """A version-1 file (no digest column) opens: its datasets read back with no digest."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute(
        "INSERT INTO datasets VALUES ('d1', 'STORED', '/p', 'server', 'command-line', '{}', "
        "'[]', 'wf-1', 1, 1, 0, 0, '[]', 7, NULL, 0, NULL, 0, 0, 0)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    async with SQLiteStore(path) as store:
        record = await store.get_dataset("d1")
        assert record is not None
        assert (record.size_bytes, record.digest) == (7, None)
    assert _pragma(path, "user_version") == len(MIGRATIONS)


async def test_users_of_the_first_schema_get_limits_on_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO users VALUES ('old', ?, 0, 0)", ("ab" * 32,))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    async with SQLiteStore(path) as store:
        old = await store.get_user("old")
        assert old is not None and old.limits == NO_LIMITS
        changed = await store.set_user_limits("old", UserLimits(max_workflows=2))
        assert changed is not None and changed.limits.max_workflows == 2
    assert _pragma(path, "user_version") == len(MIGRATIONS)


def _old_action(
    conn: sqlite3.Connection,
    action_id: int,
    state: str,
    *,
    updated: int,
    started: int | None = None,
    finished: int | None = None,
    reused: bool = False,
) -> None:
    """An action row as the schema before the history column wrote it (times in µs)."""
    conn.execute(
        "INSERT INTO actions (workflow_id, action_id, state, waiting_on, updated_at, attempts, "
        "started_at, finished_at, version) VALUES ('wf-old', ?, ?, '[]', ?, 1, ?, ?, 1)",
        (action_id, state, updated, started, finished),
    )
    conn.execute(
        "INSERT INTO action_specs VALUES ('wf-old', ?, 'a', 'command-line', 'd', ?, 'absent', "
        "'{}', '[]', '[]', ?, 0, 3)",
        (action_id, int(reused), f"cb-old-{action_id}"),
    )


async def test_the_history_migration_back_fills_what_the_timestamps_say(
    tmp_path: Path,
) -> None:
    path = tmp_path / "before-history.db"
    conn = sqlite3.connect(path)
    history = next(i for i, step in enumerate(MIGRATIONS) if "ADD COLUMN history" in step[0])
    for step in MIGRATIONS[:history]:
        for statement in step:
            conn.execute(statement)
    _old_action(conn, 1, "FINISHED", updated=9, finished=5, reused=True)
    _old_action(conn, 2, "FAILED", updated=40, started=20, finished=30)
    _old_action(conn, 3, "SUBMITTED", updated=60, started=50)
    _old_action(conn, 4, "READY", updated=70)
    _old_action(conn, 5, "READY", updated=90, started=80)  # waits to retry
    conn.execute(f"PRAGMA user_version = {history}")
    conn.commit()
    conn.close()

    def at(micros: int) -> datetime:
        return datetime.fromtimestamp(micros / 1e6, UTC)

    expected = {
        1: [StateEntry(ActionState.FINISHED, at(5))],
        2: [StateEntry(ActionState.SUBMITTED, at(20)), StateEntry(ActionState.FAILED, at(30))],
        3: [StateEntry(ActionState.SUBMITTED, at(50))],
        4: [StateEntry(ActionState.READY, at(70))],
        5: [StateEntry(ActionState.SUBMITTED, at(80)), StateEntry(ActionState.READY, at(90))],
    }
    async with SQLiteStore(path) as store:
        for action_id, history in expected.items():
            action = await store.get_action("wf-old", action_id)
            assert action is not None
            assert list(action.history) == history, action_id
        # New entries follow the back-filled ones.
        moved = await store.transition_action("wf-old", 4, {ActionState.READY}, ActionState.KILLED)
        assert moved is not None
        assert [e.state for e in moved.history] == [ActionState.READY, ActionState.KILLED]
    assert _pragma(path, "user_version") == len(MIGRATIONS)


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    async with SQLiteStore(path):
        pass
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(errors.StoreUnavailable, match="newer"):
        async with SQLiteStore(path):
            pass


async def test_an_unopenable_file_is_store_unavailable(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreUnavailable):
        async with SQLiteStore(tmp_path / "missing-dir" / "p.db"):
            pass
    not_a_db = tmp_path / "junk.db"
    not_a_db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(errors.StoreUnavailable):
        async with SQLiteStore(not_a_db):
            pass


async def test_a_closed_store_is_unavailable(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "p.db")
    with pytest.raises(errors.StoreUnavailable):
        await store.ping()
    async with store:
        await store.ping()
    with pytest.raises(errors.StoreUnavailable):
        await store.get_workflow("x")


async def test_a_lock_held_past_the_busy_timeout_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    async with SQLiteStore(path, busy_timeout_s=0.2) as store:
        await store.create_workflow(_plan("wf-1", 2))
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process writing, for too long
            started = time.monotonic()
            with pytest.raises(errors.StoreUnavailable, match="locked"):
                await store.transition_action("wf-1", 0, {ActionState.READY}, ActionState.KILLED)
            assert time.monotonic() - started >= 0.15
            # WAL: reads go on while another connection writes.
            record = await store.get_action("wf-1", 0)
            assert record is not None and record.state is ActionState.READY
        finally:
            other.execute("ROLLBACK")
            other.close()
        # The lock is gone: writes work again.
        moved = await store.transition_action("wf-1", 0, {ActionState.READY}, ActionState.KILLED)
        assert moved is not None


async def _stall_worker(store: SQLiteStore, seconds: float) -> asyncio.Task[None]:
    """Keep the worker thread busy so that the next calls queue up into one batch."""
    stall = asyncio.ensure_future(store._run(time.sleep, seconds))
    await asyncio.sleep(0.02)
    return stall


async def test_a_failing_call_in_a_batch_is_undone_alone(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(_plan("wf-1", 3))
        await store.create_user(_user("bob"))
        stall = await _stall_worker(store, 0.3)
        results = await asyncio.gather(
            store.transition_action("wf-1", 0, {ActionState.READY}, ActionState.PROCESSING),
            store.create_user(_user("bob")),  # Conflict
            # A multi-statement write failing half-way: the workflow row is inserted,
            # then the actions clash on callback ids.
            store.create_workflow(_plan("wf-2", 2, callback_prefix="wf-1")),
            store.create_user(_user("carol")),
            store.transition_action("wf-1", 1, {ActionState.WAITING}, ActionState.READY),
            store.transition_action("wf-1", 2, {ActionState.READY}, ActionState.KILLED),
            return_exceptions=True,
        )
        await stall
        moved, dup, clash, carol, lost, killed = results
        assert isinstance(moved, ActionRecord) and moved.state is ActionState.PROCESSING
        assert isinstance(dup, errors.Conflict)
        assert isinstance(clash, errors.Conflict)
        assert carol == _user("carol")
        assert lost is None
        assert isinstance(killed, ActionRecord)
        assert await store.get_workflow("wf-2") is None
        assert await store.list_actions("wf-2") == []

    # Everything acknowledged was committed.
    async with SQLiteStore(tmp_path / "p.db") as store:
        states = [a.state for a in await store.list_actions("wf-1")]
        assert states == [ActionState.PROCESSING, ActionState.READY, ActionState.KILLED]
        assert [u.name for u in await store.list_users()] == ["bob", "carol"]


async def test_a_failing_single_statement_in_a_batch_is_undone_alone(tmp_path: Path) -> None:
    """A one-statement write runs without a SAVEPOINT: SQLite undoes it by itself.

    The UPDATE renames both users: the first row is changed, the second clashes on
    the primary key. The statement's own journal must undo the first row too, while
    the batch's other writes commit.
    """
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(_plan("wf-1", 2))
        await store.create_user(_user("bob"))
        await store.create_user(_user("carol"))
        stall = await _stall_worker(store, 0.3)
        results = await asyncio.gather(
            store.transition_action("wf-1", 0, {ActionState.READY}, ActionState.PROCESSING),
            store._run_statement(tuple, "UPDATE users SET name = 'dave' RETURNING name", ()),
            store.transition_action("wf-1", 1, {ActionState.READY}, ActionState.KILLED),
            return_exceptions=True,
        )
        await stall
        moved, clash, killed = results
        assert isinstance(moved, ActionRecord) and moved.state is ActionState.PROCESSING
        assert isinstance(clash, errors.Conflict)
        assert isinstance(killed, ActionRecord) and killed.state is ActionState.KILLED

    async with SQLiteStore(tmp_path / "p.db") as store:
        states = [a.state for a in await store.list_actions("wf-1")]
        assert states == [ActionState.PROCESSING, ActionState.KILLED]
        assert [u.name for u in await store.list_users()] == ["bob", "carol"]


async def test_a_cancelled_caller_does_not_stop_the_worker(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(_plan("wf-1", 2))
        stall = await _stall_worker(store, 0.2)
        waiting = asyncio.ensure_future(store.get_action("wf-1", 0))
        await asyncio.sleep(0)
        waiting.cancel()
        await stall
        record = await store.get_action("wf-1", 1)
        assert record is not None


async def test_two_handles_share_one_file(tmp_path: Path) -> None:
    """Specs cached by one handle never hide the other's writes."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    async with open_store(url) as first, open_store(url) as second:
        await first.create_workflow(_plan("wf-1", 20))
        claimed = await second.claim_actions("node-b", 5, lease_s=30)
        assert [a.action_id for a in claimed] == [0, 1, 2, 3, 4]
        assert all(a.definition == {"command": ["true", str(a.action_id)]} for a in claimed)
        mine = await first.claim_actions("node-a", 100, lease_s=30)
        assert [a.action_id for a in mine] == list(range(5, 20))
        again = await first.get_action("wf-1", 0)
        assert again is not None and again.owner == "node-b"
        assert again == claimed[0]


def _plan_of(store: SQLiteStore, sql: str, params: tuple[object, ...]) -> list[str]:
    rows = store._db.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    return [str(r[3]) for r in rows]


async def test_scraper_and_deletor_queries_use_indexes(tmp_path: Path) -> None:
    queries = [
        (
            "SELECT rowid FROM actions WHERE state = 'READY' "
            "AND (not_before IS NULL OR not_before <= ?) ORDER BY updated_at LIMIT ?",
            (0, 10),
            "actions_state_updated",
        ),
        (
            "SELECT rowid FROM actions WHERE state = 'PROCESSING' AND lease_expires_at <= ? "
            "ORDER BY lease_expires_at LIMIT ?",
            (0, 10),
            "actions_processing_lease",
        ),
        (
            f"{sqlite._ACTION_SELECT} WHERE state IN (?, ?) ORDER BY updated_at LIMIT ?",
            ("SUBMITTED", "RUNNING", 10),
            "actions_state_updated",
        ),
        (
            f"{sqlite._ACTION_SELECT} WHERE callback_id = ?",
            ("cb",),
            "sqlite_autoindex_action_specs",
        ),
        (
            "SELECT id FROM datasets WHERE state = 'STORED_TO_DELETE' AND claims = '[]' "
            "ORDER BY updated_at",
            (),
            "datasets_state_updated",
        ),
        (
            "SELECT id FROM workflows WHERE owner = ? AND idempotency_key = ?",
            ("alice", "k"),
            "workflows_idempotency",
        ),
        (
            "SELECT id FROM workflows WHERE owner = ? ORDER BY created_at DESC, id DESC LIMIT 5",
            ("alice",),
            "workflows_owner",
        ),
    ]
    async with SQLiteStore(tmp_path / "p.db") as store:
        for sql, params, index in queries:
            steps = await store._run(_plan_of, store, sql, params)
            assert any(index in step for step in steps), (sql, steps)
            # A full scan of a table would make the scraper's poll grow with history.
            assert not any(step.startswith("SCAN") for step in steps), (sql, steps)


async def test_a_claim_batched_with_writes_is_committed_with_them(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(_plan("wf-1", 6))
        stall = await _stall_worker(store, 0.2)
        claimed, moved, user, idle = await asyncio.gather(
            store.claim_actions("node-a", 3, lease_s=30),
            store.transition_action("wf-1", 5, {ActionState.READY}, ActionState.KILLED),
            store.create_user(_user("dora")),
            store.claim_actions("node-b", 3, lease_s=30),
        )
        await stall
        assert [a.action_id for a in claimed] == [0, 1, 2]
        assert moved is not None
        assert [a.action_id for a in idle] == [3, 4]  # 5 was killed before this claim
    async with SQLiteStore(tmp_path / "p.db") as store:
        owners = [(a.state, a.owner) for a in await store.list_actions("wf-1")]
        assert owners == [
            *[(ActionState.PROCESSING, "node-a")] * 3,
            *[(ActionState.PROCESSING, "node-b")] * 2,
            (ActionState.KILLED, None),
        ]
        assert await store.get_user("dora") == user


async def test_release_parent_beyond_sqlites_bound_parameter_limit(tmp_path: Path) -> None:
    """A fan-out wider than the bound parameters SQLite takes per statement.

    SQLite before 3.32 (still some systems' library) binds at most 999; the
    connection is set to that limit here, whatever this build's default.
    """
    width = 2_500
    plan = _plan("wf-1", width + 1)
    children = tuple(range(1, width + 1))
    wide = replace(
        plan,
        actions=(
            replace(plan.actions[0], children=children),
            *(replace(a, state=ActionState.WAITING, waiting_on=(0,)) for a in plan.actions[1:]),
        ),
    )
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(wide)
        await store._run(lambda: store._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999))
        ready = await store.release_parent("wf-1", 0, children)
        assert len(ready) == width
        assert await store.count_actions("wf-1") == {ActionState.READY: width + 1}
        found = await store.get_datasets([f"ds-{i}" for i in range(width)])
        assert found == {}


async def test_a_finished_workflows_document_is_not_kept_decoded(tmp_path: Path) -> None:
    # Memory flat in finished work: the decoded-document cache serves polling of running
    # workflows only; a workflow that ended leaves it, and reading it again does not refill it.
    async with SQLiteStore(tmp_path / "d.db") as store:
        await store.create_workflow(_plan("wf-run", 1))
        await store.create_workflow(_plan("wf-done", 1))
        assert {"wf-run", "wf-done"} <= set(store._documents)
        ended = await store.transition_workflow(
            "wf-done", {WorkflowState.RUNNING}, WorkflowState.SUCCEEDED
        )
        assert ended is not None and ended.document == {"name": "unit"}
        assert "wf-done" not in store._documents
        again = await store.get_workflow("wf-done")
        assert again is not None and again.document == {"name": "unit"}
        assert "wf-done" not in store._documents
        assert "wf-run" in store._documents
        assert store._documents_size == sum(size for _, size in store._documents.values())


@pytest.mark.parametrize("claim", ["w/2", 'w"/2'])
@pytest.mark.parametrize("separator", [",", ", "])
@pytest.mark.parametrize(
    ("claims", "kept"),
    [
        (["K"], []),
        (["K", "w/20", "xw/2"], ["w/20", "xw/2"]),
        (["w/20", "K", "xw/2"], ["w/20", "xw/2"]),
        (["w/20", "xw/2", "K"], ["w/20", "xw/2"]),
        (["w/20", "xw/2"], None),
        ([], None),
        # The key's text inside another element (`"a\\",\\"w/2"` holds `"w/2"`).
        (['a","w/2', "K"], ['a","w/2']),
        (['a","w/2'], None),
    ],
)
def test_drop_claim_from_the_claims_text(
    claim: str, separator: str, claims: list[str], kept: list[str] | None
) -> None:
    """`_drop_claim_from` removes exactly that element (`K`), keeping the others' order,
    whether the text is Pingo's compact JSON (a text replace) or not, or the key is one
    JSON escapes (`json_each`); a dataset not holding it is not written."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE datasets (id TEXT, claims TEXT, updated_at INT, version INT)")
    text = json.dumps([claim if c == "K" else c for c in claims], separators=(separator, ":"))
    conn.execute("INSERT INTO datasets VALUES ('d', ?, 0, 1)", (text,))

    SQLiteStore._drop_claim_from(conn, ["d", "absent"], claim, 5)

    after, updated_at, version = conn.execute(
        "SELECT claims, updated_at, version FROM datasets"
    ).fetchone()
    if kept is None:
        assert (after, updated_at, version) == (text, 0, 1)
    else:
        assert (json.loads(after), updated_at, version) == (kept, 5, 2)


def test_claims_read_back_behave_as_the_tuple_they_encode() -> None:
    """A dataset's claims are decoded on first use (`_LazyTuple`): equal, hashed,
    searched, sized and iterated as the tuple."""
    claims = sqlite._LazyTuple('["w/1","w/2"]', sqlite._claim)
    assert claims == ("w/1", "w/2") and ("w/1", "w/2") == claims
    assert claims != ("w/2", "w/1") and claims != ("w/1",)
    assert hash(claims) == hash(("w/1", "w/2"))
    assert "w/2" in claims and "w/3" not in claims
    assert (len(claims), list(claims), claims[1], claims[:1]) == (
        2,
        ["w/1", "w/2"],
        "w/2",
        ("w/1",),
    )


async def test_a_big_workflow_leaves_the_process_caches_as_they_were(tmp_path: Path) -> None:
    # Issue 13: the last 8,192 specs or dataset definitions of a big workflow, cached by
    # its creation, its kill or its planning's reads, kept the submission's objects (and
    # the heap's arenas under them) after the workflow had gone. Small reads still cache.
    count = sqlite._BULK_ROWS + 500
    plan = _plan("wf-big", count)
    datasets = tuple(
        DatasetPlan(
            id=a.dataset_id,
            state=DatasetState.TO_DELETE,
            path=f"/data/{a.dataset_id}",
            scope="server",
            action_type="command-line",
            definition={"command": ["true", str(a.action_id)]},
            parents=(),
            producer_workflow_id="wf-big",
            producer_action_id=a.action_id,
            is_managed=True,
        )
        for a in plan.actions
    )
    async with SQLiteStore(tmp_path / "d.db") as store:
        await store.create_workflow(replace(plan, datasets=datasets))
        assert not store._specs and not store._dataset_fixed
        found = await store.get_datasets([d.id for d in datasets])
        assert len(found) == count and not store._dataset_fixed
        killed = 0
        while batch := await store.kill_actions("wf-big", {ActionState.READY}, limit=1000):
            killed += len(batch)
        assert killed == count and not store._specs
        assert len(await store.list_actions("wf-big")) == count and not store._specs
        await store.get_datasets([datasets[0].id])
        assert set(store._dataset_fixed) == {datasets[0].id}


def _claim_steps(
    store: SQLiteStore, limit: int, wanted: dict[str, int] | None
) -> tuple[int, list[object]]:
    """The claim's read (`_claimable`, under a 1,000-action cap) and how much work it
    did, in thousands of SQLite VM instructions: a count, not a time."""
    ticks = 0

    def tick() -> int:
        nonlocal ticks
        ticks += 1
        return 0

    store._db.set_progress_handler(tick, 1000)
    try:
        chosen = store._claimable(store._db, limit, wanted, 2**62, 1000)
    finally:
        store._db.set_progress_handler(None, 0)
    return ticks, chosen


async def test_a_capped_claim_costs_the_same_whatever_the_backlog(tmp_path: Path) -> None:
    """Under the per-user cap, a claim reads what it claims and what is in flight, not
    the backlog: not every READY action when one wanted type's quota is used up (it
    paged through them all, 64 at a time), nor every RUNNING workflow (one user's
    thousands, with their limit lifted, made each claim slower than running `true`)."""
    wanted = {"command-line": 1, "spark": 64}
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.create_workflow(_plan("wf-small", 3))
        before, chosen = await store._run(_claim_steps, store, 64, wanted)
        assert len(chosen) == 1
        await asyncio.gather(*(store.create_workflow(_plan(f"wf-{i}", 1)) for i in range(2000)))
        after, chosen = await store._run(_claim_steps, store, 64, wanted)
        assert len(chosen) == 1
        assert after <= before + 5, (before, after)


async def test_a_long_schedule_definition_is_decoded_only_when_read(tmp_path: Path) -> None:
    """The scheduler reads due schedules several times a second; a definition holding a
    big workflow stays text until a reader looks into it (`untrusted.stored_object`)."""
    clock = FakeClock()
    actions = [{"id": i, "name": f"a{i}", "command": ["echo", "x" * 100]} for i in range(4000)]
    spec = {"cron": "* * * * * *", "workflow": {"name": "big", "actions": actions}}
    async with open_store(f"sqlite:///{tmp_path / 'pingo.db'}", clock=clock) as store:
        await store.create_schedule(make_schedule(clock, id="sch-big", spec=spec))
        await store.create_schedule(make_schedule(clock, id="sch-small"))
        due = {
            s.id: s for s in await store.list_due_schedules(clock() + timedelta(hours=1), "node")
        }
        big = due["sch-big"].spec
        assert untrusted.is_large(big) and big.undecoded  # type: ignore[attr-defined]
        assert not untrusted.is_large(due["sch-small"].spec)
        assert big["workflow"]["actions"][3999] == actions[3999]
        assert dict(big) == spec


def test_an_opening_history_is_written_as_the_json_encoder_would() -> None:
    # Formatted by hand (one encoder call per planned action cost more than the text).
    history = [
        StateEntry(state, NOW + timedelta(microseconds=i)) for i, state in enumerate(ActionState)
    ]
    text = sqlite._history_text(history)
    assert text == json.dumps(
        [[entry.state.value, sqlite._us(entry.at)] for entry in history], separators=(",", ":")
    )
    assert sqlite._history_text([]) == "[]"

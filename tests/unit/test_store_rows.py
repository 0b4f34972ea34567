"""SQLite rows built from records' fields (`pingo.store._rows`)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pingo.store import _rows, sqlite
from pingo.store.protocol import (
    EventRecord,
    ScheduleRecord,
    ScheduleRunRecord,
    UserLimits,
    UserRecord,
    WebhookDeliveryRecord,
)
from pingo.store.sqlite import SQLiteStore

AT = datetime(2026, 11, 24, 3, 0, 0, 123_456, tzinfo=UTC)

TABLES = [
    ("events", sqlite._EVENTS),
    ("users", sqlite._USERS),
    ("schedules", sqlite._SCHEDULES),
    ("schedule_runs", sqlite._RUNS),
    ("webhook_deliveries", sqlite._DELIVERIES),
]


@pytest.mark.parametrize(("table", "rows"), TABLES)
async def test_every_field_is_a_column_of_the_migrated_table(
    tmp_path: Path, table: str, rows: _rows.Rows[object]
) -> None:
    path = tmp_path / "p.db"
    async with SQLiteStore(path):
        pass
    with sqlite3.connect(path) as conn:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    assert set(rows.names) <= columns


RECORDS: list[tuple[_rows.Rows[object], object]] = [
    (sqlite._EVENTS, EventRecord(7, "workflow.submitted", AT, None, "wf-1", {"a": [1]}, "ann")),
    (sqlite._EVENTS, EventRecord(8, "dataset.stored", AT, "d" * 64)),
    (sqlite._USERS, UserRecord("ann", "h", True, AT, UserLimits(3, None, 60))),
    (
        sqlite._SCHEDULES,
        ScheduleRecord(
            "s1", "ann", "nightly", {"cron": "0 2 * * *"}, False, AT, None, None, None, AT, AT, 4
        ),
    ),
    (sqlite._RUNS, ScheduleRunRecord("s1", AT, "submitted", AT, "wf-1")),
    (
        sqlite._DELIVERIES,
        WebhookDeliveryRecord(
            "d1",
            "ann",
            "wf-1",
            None,
            "https://x/",
            "workflow.ended",
            b"{}",
            "PENDING",
            0,
            AT,
            AT,
            AT,
        ),
    ),
]


@pytest.mark.parametrize(("rows", "record"), RECORDS)
def test_a_record_survives_its_row(rows: _rows.Rows[object], record: object) -> None:
    row = rows.row(record)
    assert len(row) == len(rows.names)
    assert rows.record(row) == record


def test_a_nested_record_spreads_over_its_fields_columns() -> None:
    user = UserRecord("ann", "h", False, AT, UserLimits(1, 2, 3, 4))
    assert sqlite._USERS.names[-4:] == (
        "max_workflows",
        "max_in_flight_actions",
        "submissions_per_minute",
        "max_storage_bytes",
    )
    assert sqlite._USERS.row(user)[2:] == (0, 1_795_489_200_123_456, 1, 2, 3, 4)

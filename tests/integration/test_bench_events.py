"""`bench_events` measures the API as it is: a small run of it, end to end over HTTP.

It once stopped measuring for days unnoticed: its audit entries lacked a field the
API's reader requires, so `GET /api/v1/audit` answered 500 and `make bench` reported
the module failed. The benchmark's sizes are cut down here; its code path is not.
"""

from __future__ import annotations

import pytest

from bench import bench_events


def test_the_events_benchmark_measures_every_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_events, "EVENTS_STORED", 400)
    monkeypatch.setattr(bench_events, "PAGES", 3)
    monkeypatch.setattr(bench_events, "SSE_EVENTS", 2)
    figures = bench_events.measure()
    assert set(figures) == {
        "events_append_per_s",
        "events_page_p99_ms",
        "events_page_p50_ms",
        "audit_page_p99_ms",
        "events_sse_lag_p99_ms",
        "events_sse_lag_p50_ms",
    }
    assert all(value > 0 for value in figures.values()), figures

"""The events feed and the audit log (issue 18), on one SQLite file.

events_append_per_s        feed events appended/s (`Store.append_event`, 16 coroutines,
                           owners spread over 50 users): the price every submission,
                           dataset store and workflow end now pays once
events_page_p99_ms         `GET /api/v1/events?limit=100` for one of 50 users with
                           EVENTS_STORED events in the store (2 % of them theirs), over
                           real HTTP: the 99th percentile of PAGES pages, cursor-followed
audit_page_p99_ms          `GET /api/v1/audit?limit=100` as the admin, the same way (the
                           audit entries are 1 in 10 of the events)
events_sse_lag_p99_ms      from `append_event` to the event arriving on an open
                           `Accept: text/event-stream` response of its owner (real HTTP):
                           the 99th percentile over SSE_EVENTS events appended 50 ms apart;
                           bounded below by the stream's 0.5 s poll (expect ~250 ms mean)

Every figure is ONE run; the harness repeats `measure()` and reports the median.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from pingo import events
from pingo.api import runtime
from pingo.api.app import create_app
from pingo.config import Settings
from pingo.store.protocol import Store

RUNS = 3
USERS = 50
EVENTS_STORED = 20_000
PAGES = 60
SSE_EVENTS = 40
ADMIN_TOKEN = "bench-events-admin-token"


def _store(app: web.Application) -> Store:
    node = app[runtime.STATE_KEY].node
    assert node is not None
    return node.store


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _fill(app: web.Application) -> float:
    """Append EVENTS_STORED events; returns the append rate."""
    store = _store(app)
    queue = list(range(EVENTS_STORED))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            if i % 10 == 0:
                # As the API's audit middleware writes them (`pingo.api.audit`).
                await events.audit(
                    store,
                    actor=f"user{i % USERS}",
                    action="workflow.submit",
                    remote="127.0.0.1",
                    target={"location": f"/api/v1/workflows/wf-{i}"},
                    status=201,
                )
            else:
                await store.append_event(
                    events.DATASET_STORED,
                    owner=f"user{i % USERS}",
                    workflow_id=f"wf-{i}",
                    payload={"actionId": 1, "actionName": "a", "workflowName": "w"},
                )

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(16)))
    return EVENTS_STORED / (time.perf_counter() - began)


async def _pages(session: aiohttp.ClientSession, url: str, token: str) -> list[float]:
    """Milliseconds per page, following `next` (from the first page again at the end)."""
    took: list[float] = []
    cursor: str | None = None
    headers = {"Authorization": f"Bearer {token}"}
    while len(took) < PAGES:
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        began = time.perf_counter()
        async with session.get(url, params=params, headers=headers) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        took.append((time.perf_counter() - began) * 1000)
        cursor = page["next"]
    return took


async def _sse_lag(
    app: web.Application, session: aiohttp.ClientSession, base: str, token: str
) -> list[float]:
    store = _store(app)
    sent: dict[str, float] = {}
    lags: list[float] = []
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    async with session.get(f"{base}/api/v1/events", headers=headers) as response:
        assert response.status == 200

        async def produce() -> None:
            await asyncio.sleep(0.6)
            for i in range(SSE_EVENTS):
                event = await store.append_event(
                    events.WORKFLOW_FINISHED, owner="user0", workflow_id=f"wf-sse-{i}"
                )
                sent[str(event.seq)] = time.perf_counter()
                await asyncio.sleep(0.05)

        producer = asyncio.create_task(produce())
        while len(lags) < SSE_EVENTS:
            line = (await response.content.readline()).decode().strip()
            if line.startswith("id: "):
                lags.append((time.perf_counter() - sent[line[4:]]) * 1000)
        await producer
    return lags


async def _run(root: Path) -> dict[str, float]:
    settings = Settings(
        home=root / "home",
        store_url=f"sqlite:///{root / 'pingo.db'}",
        admin_token=ADMIN_TOKEN,
        host="127.0.0.1",
        port=0,
    )
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        base = f"http://127.0.0.1:{port}"
        tokens: dict[str, str] = {}
        async with aiohttp.ClientSession() as session:
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            for name in ("user0", "user1"):
                async with session.post(
                    f"{base}/api/v1/users", json={"name": name}, headers=admin
                ) as response:
                    tokens[name] = (await response.json())["token"]
            append_rate = await _fill(app)
            feed = await _pages(session, f"{base}/api/v1/events", tokens["user1"])
            audit = await _pages(session, f"{base}/api/v1/audit", ADMIN_TOKEN)
            lags = await _sse_lag(app, session, base, tokens["user0"])
    finally:
        await runner.cleanup()
    return {
        "events_append_per_s": append_rate,
        "events_page_p99_ms": _p99(feed),
        "events_page_p50_ms": statistics.median(feed),
        "audit_page_p99_ms": _p99(audit),
        "events_sse_lag_p99_ms": _p99(lags),
        "events_sse_lag_p50_ms": statistics.median(lags),
    }


def measure() -> dict[str, float]:
    """ONE run of every events figure."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-events-") as tmp:
        return asyncio.run(_run(Path(tmp)))


if __name__ == "__main__":
    for name, value in measure().items():
        print(f"{name:28} {value:12.1f}")

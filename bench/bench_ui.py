"""The web UI: rendering a large workflow's page.

ui_montage_render_ms  the live part of the workflow page for the 1,738-action Montage
                      workflow: the DAG layout (layers, barycenter sweeps, failed branch,
                      critical path), the action summary and the Jinja2
                      rendering of its SVG and action table, median of 3; target < 2,000 ms

ui_montage_page_ms    the whole page as a browser gets it: GET /workflows/{id} of the
                      submitted Montage workflow over HTTP with a signed-in session cookie
                      (store read of 1,738 actions, document, ETag, layout, rendering),
                      median of 3 after a warm-up; target < 2,000 ms

For the first figure, action records are built from the trace document (no store, no
HTTP): the UI's own work, which is what grows with a workflow's size. The second runs
`create_app` on embedded SQLite with the node's loops stopped (as bench_api's submission
figures do), so nothing else competes with the page being measured.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import jinja2

from bench import _workloads
from bench.bench_api import TOKEN, _Server
from pingo import states, ui
from pingo.api import documents
from pingo.store.protocol import ActionRecord
from pingo.ui import dag

RUNS = 3


def _actions() -> list[ActionRecord]:
    document = _workloads.montage()
    now = datetime.now(UTC)
    return [
        ActionRecord(
            workflow_id="wf",
            action_id=action_id,
            name=f"action-{action_id}",
            type="command-line",
            state=states.ActionState.FINISHED,
            dataset_id=f"d{action_id}",
            reused=False,
            reason="absent",
            definition={},
            inputs={p: f"d{p}" for p in parents},
            waiting_on=(),
            children=(),
            callback_id=f"c{action_id}",
            created_at=now,
            updated_at=now,
        )
        for action_id, parents in _workloads.parents(document).items()
    ]


def _render_ms(template: jinja2.Template, actions: list[ActionRecord]) -> float:
    started = time.perf_counter()
    workflow = {
        "id": "wf",
        "name": "montage",
        "owner": "admin",
        "state": "RUNNING",
        "createdAt": None,
        "actions": [documents.action_summary(a) for a in actions],
    }
    template.render(
        workflow=workflow, summary=ui.summarize(actions), dag=dag.layout(actions), csrf="x"
    )
    return (time.perf_counter() - started) * 1000


async def _page_ms() -> list[float]:
    """GET of the Montage workflow's page over HTTP, RUNS times after one warm-up."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-ui-") as tmp:
        # unsafe=True: aiohttp keeps no cookie of an IP address (127.0.0.1) otherwise,
        # and every GET would measure the redirect to the login page instead.
        jar = aiohttp.CookieJar(unsafe=True)
        async with (
            _Server(Path(tmp), run_node=False) as url,
            aiohttp.ClientSession(cookie_jar=jar) as session,
        ):
            posted = await session.post(
                f"{url}/api/v1/workflows",
                json=_workloads.montage(),
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert posted.status == 201, await posted.text()
            page = f"{url}/workflows/{(await posted.json())['id']}"
            signed_in = await session.post(f"{url}/login", data={"token": TOKEN})
            assert signed_in.status == 200, await signed_in.text()
            timings = []
            for _ in range(RUNS + 1):
                started = time.perf_counter()
                async with session.get(page, allow_redirects=False) as response:
                    body = await response.read()
                    assert response.status == 200, response.status
                assert body.count(b"<circle") == len(_workloads.montage()["actions"])
                timings.append((time.perf_counter() - started) * 1000)
            return timings[1:]


def measure() -> dict[str, float]:
    """The median of RUNS renders (and of RUNS page loads), after one untimed warm-up each."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pingo.ui", "templates"),
        autoescape=jinja2.select_autoescape(default=True),
    )
    template = env.get_template("workflow_live.html")
    actions = _actions()
    _render_ms(template, actions)
    return {
        "ui_montage_render_ms": statistics.median(
            _render_ms(template, actions) for _ in range(RUNS)
        ),
        "ui_montage_page_ms": statistics.median(asyncio.run(_page_ms())),
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

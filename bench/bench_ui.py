"""The web UI: rendering a large workflow's page.

ui_montage_render_ms  the live part of the workflow page for the 1,738-action Montage
                      workflow: the DAG layout (layers, barycenter sweeps, failed branch,
                      critical path), the action summary and the Jinja2
                      rendering of its SVG and action table, median of 3; target < 2,000 ms

ui_montage_page_ms    the whole page as a browser gets it: GET /workflows/{id} of the
                      submitted Montage workflow over HTTP with a signed-in session cookie
                      (store read of 1,738 actions, document, ETag, layout, rendering),
                      median of 3 after a warm-up; target < 2,000 ms

ui_workflows_list_ms  GET /workflows listing a full page (50) of RUNNING layered-1000
                      workflows, the first time after the server started: each row's
                      reuse counts read from its 1,000 actions (then kept, as planning
                      fixed them)
ui_workflows_list_warm_ms
                      the same page again: per-state counts only (what each open tab's
                      poll costs while something changed), median of 3
ui_workflows_poll_304_ms
                      the list's live fragment polled with its ETag while nothing changed
                      (304, no rendering), median of 3
ui_lineage_up_ms      GET /datasets/{id} of the last dataset of a 1,000-action lattice
                      (100 layers of 10, two parents each, every action its own
                      computation) that ran on a no-op executor: ~1,000 ancestors laid
                      out, named and drawn, median of 3 after a warm-up; target < 2,000 ms
ui_lineage_down_ms    the same for its first dataset: descendants, cut at the page's
                      300, median of 3 after a warm-up; target < 2,000 ms

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
        "actions": [documents.as_dict(documents.action_summary(a)) for a in actions],
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


LISTED = 50


async def _list_ms() -> dict[str, float]:
    """The workflows list of a full page of RUNNING workflows: cold, warm, and a 304 poll."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-ui-") as tmp:
        jar = aiohttp.CookieJar(unsafe=True)
        async with (
            _Server(Path(tmp), run_node=False) as url,
            aiohttp.ClientSession(cookie_jar=jar) as session,
        ):
            for i in range(LISTED):
                document = {**_workloads.layered_1000(), "name": f"listed-{i}"}
                posted = await session.post(
                    f"{url}/api/v1/workflows",
                    json=document,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
                assert posted.status == 201, await posted.text()
            # Not following the redirect: its GET /workflows would be the cold one.
            signed_in = await session.post(
                f"{url}/login", data={"token": TOKEN}, allow_redirects=False
            )
            assert signed_in.status == 303, await signed_in.text()

            async def get(path: str, headers: dict[str, str] | None = None) -> tuple[float, str]:
                started = time.perf_counter()
                async with session.get(f"{url}{path}", headers=headers or {}) as response:
                    body = await response.text()
                    etag = response.headers.get("ETag", "")
                    assert response.status in (200, 304), response.status
                elapsed = (time.perf_counter() - started) * 1000
                if response.status == 200:
                    assert body.count("listed-") == LISTED
                return elapsed, etag

            cold, _ = await get("/workflows")
            warm = [(await get("/workflows"))[0] for _ in range(RUNS)]
            _, etag = await get("/workflows/live")
            unchanged = {"If-None-Match": etag}
            polls = [(await get("/workflows/live", unchanged))[0] for _ in range(RUNS)]
            return {
                "ui_workflows_list_ms": cold,
                "ui_workflows_list_warm_ms": statistics.median(warm),
                "ui_workflows_poll_304_ms": statistics.median(polls),
            }


def _lattice(width: int = 10, layers: int = 100) -> dict[str, object]:
    """Each action reads two of the layer above; distinct commands, so no reuse."""
    actions: list[dict[str, object]] = []
    for i in range(width * layers):
        layer, column = divmod(i, width)
        action: dict[str, object] = {
            "id": i + 1,
            "name": f"a{i}",
            "type": "command-line",
            "command": ["true", str(i)],
        }
        if layer:
            above = (layer - 1) * width
            action["parentActions"] = [
                {"id": above + column + 1},
                {"id": above + (column + 1) % width + 1},
            ]
        actions.append(action)
    return {"name": "lattice", "startActionId": 1, "endActionId": len(actions), "actions": actions}


async def _lineage_ms() -> dict[str, float]:
    """The dataset page at both ends of a finished lattice."""
    with tempfile.TemporaryDirectory(prefix="pingo-bench-ui-") as tmp:
        jar = aiohttp.CookieJar(unsafe=True)
        async with (
            _Server(Path(tmp), run_node=True) as url,
            aiohttp.ClientSession(cookie_jar=jar) as session,
        ):
            auth = {"Authorization": f"Bearer {TOKEN}"}
            posted = await session.post(f"{url}/api/v1/workflows", json=_lattice(), headers=auth)
            assert posted.status == 201, await posted.text()
            status = f"{url}/api/v1/workflows/{(await posted.json())['id']}"
            for _ in range(3000):  # ten minutes at most
                document = await (await session.get(status, headers=auth)).json()
                if document["state"] != "RUNNING":
                    break
                await asyncio.sleep(0.2)
            assert document["state"] == "SUCCEEDED", document["state"]
            signed_in = await session.post(
                f"{url}/login", data={"token": TOKEN}, allow_redirects=False
            )
            assert signed_in.status == 303, await signed_in.text()
            figures = {}
            ends = {"up": document["endDatasetId"], "down": document["actions"][0]["datasetId"]}
            for way, dataset_id in ends.items():
                timings = []
                for _ in range(RUNS + 1):
                    started = time.perf_counter()
                    async with session.get(f"{url}/datasets/{dataset_id}") as response:
                        body = await response.read()
                        assert response.status == 200, response.status
                    timings.append((time.perf_counter() - started) * 1000)
                assert body.count(b"<circle") >= 300
                figures[f"ui_lineage_{way}_ms"] = statistics.median(timings[1:])
            return figures


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
        **asyncio.run(_list_ms()),
        **asyncio.run(_lineage_ms()),
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

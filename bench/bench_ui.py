"""The web UI: rendering a large workflow's page.

ui_montage_render_ms  the live part of the workflow page for the 1,738-action Montage
                      workflow: the DAG layout (layers, barycenter sweeps, failed branch,
                      critical path), the action summary and the Jinja2
                      rendering of its SVG and action table, median of 3; target < 2,000 ms

Action records are built from the trace document (no store, no HTTP): the figure is
the UI's own work, which is what grows with a workflow's size.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime

import jinja2

from bench import _workloads
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


def measure() -> dict[str, float]:
    """The median of RUNS renders, after one untimed warm-up."""
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
        )
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))

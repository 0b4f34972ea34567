"""Why an action failed, and why it has no log, said in the workflow document and by /logs."""

from __future__ import annotations

from pingo.states import ActionState
from pingo.store.protocol import ActionChanges
from tests.api.conftest import Api, chain, command_workflow


async def _logs(api: Api, workflow_id: str, action_id: int) -> tuple[int, dict[str, str]]:
    response = await api.client.get(
        f"/api/v1/workflows/{workflow_id}/actions/{action_id}/logs", headers=api.auth("admin")
    )
    return response.status, await response.json()


async def test_the_document_says_why_an_action_and_its_workflow_failed(api: Api) -> None:
    document = command_workflow(
        {1: ["sh", "-c", "echo 'no <b>input</b> [red]here[/red]' >&2; exit 3"]},
        extra={1: {"maxAttempts": 1}},
    )
    done = await api.wait((await api.submit(document))["id"])

    assert done["state"] == "FAILED"
    action = done["actions"][0]
    assert action["state"] == "FAILED"
    assert "exited with status 3" in action["error"]
    assert "no <b>input</b> [red]here[/red]" in action["error"]
    assert done["error"].startswith("action 1 (step1) failed: exited with status 3")


async def test_logs_of_an_action_that_never_runs_use_the_reuse_words(api: Api) -> None:
    await api.wait((await api.submit(chain("logs-reuse")))["id"])
    again = await api.submit(chain("logs-reuse"))

    status, problem = await _logs(api, again["id"], 1)
    assert (status, problem["code"]) == (404, "NOT_FOUND")
    assert problem["detail"] == "action 1 (step1) never runs: its dataset was not needed"
    status, problem = await _logs(api, again["id"], 3)
    assert problem["detail"] == "action 3 (step3) never runs: its dataset was reused"


async def test_logs_of_a_failed_submission_show_its_error(api: Api) -> None:
    """An attempt that failed before its process started has no log: its error stands in."""
    document = chain("logs-submit", 2)
    document["actions"][0]["command"] = ["sh", "-c", "sleep 30"]
    workflow = await api.submit(document)
    store = api.node.store
    failed = await store.transition_action(
        workflow["id"],
        2,
        {ActionState.WAITING},
        ActionState.FAILED,
        ActionChanges(attempts=1, error="submission failed: no slot on the moon"),
    )
    assert failed is not None

    status, problem = await _logs(api, workflow["id"], 2)

    assert status == 404
    assert problem["detail"] == (
        "attempt 1 of action 2 (step2) left no log; "
        "it failed: submission failed: no slot on the moon"
    )
    await api.client.post(f"/api/v1/workflows/{workflow['id']}/kill", headers=api.auth("admin"))

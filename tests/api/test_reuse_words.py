"""The reuse vocabulary over HTTP: computed, shared, reused, not needed (pingo.workflows.reuse)."""

from __future__ import annotations

from tests.api.conftest import Api, command_workflow

TWINS = command_workflow(
    {
        1: ["sh", "-c", 'echo twin > "$PINGO_OUTPUT"'],
        2: ["sh", "-c", 'echo twin > "$PINGO_OUTPUT"'],
    },
    name="twins",
)


async def test_twins_in_one_workflow_are_computed_and_shared(api: Api) -> None:
    dry = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=TWINS, headers=api.auth("admin")
    )
    plan = await dry.json()
    assert [a["reuse"] for a in plan["actions"]] == ["computed", "shared"]
    assert plan["summary"] == {"computed": 1, "shared": 1, "reused": 0, "notNeeded": 0}

    submitted = await api.submit(TWINS)
    assert [a["reuse"] for a in submitted["actions"]] == ["computed", "shared"]
    assert submitted["reuse"] == plan["summary"]
    for action_id, word in ((1, "computed"), (2, "shared")):
        detail = await api.client.get(
            f"/api/v1/workflows/{submitted['id']}/actions/{action_id}", headers=api.auth("admin")
        )
        assert (await detail.json())["reuse"] == word
    done = await api.wait(submitted["id"])
    assert done["state"] == "SUCCEEDED"
    assert [a["reuse"] for a in done["actions"]] == ["computed", "shared"]

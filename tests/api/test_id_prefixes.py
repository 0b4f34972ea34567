"""Ids by unique prefix (git-style, 8+ characters), over HTTP, and what they must not reveal."""

from __future__ import annotations

from typing import Any

import pytest

from pingo.api.app import create_app
from tests.api.conftest import (
    ADMIN_TOKEN,
    AiohttpClient,
    Api,
    Settings,
    bearer,
    chain,
    make_settings,
)


async def _get(api: Api, path: str, user: str) -> tuple[int, dict[str, Any]]:
    response = await api.client.get(path, headers=api.auth(user))
    return response.status, await response.json()


def _common(ids: list[str]) -> str:
    first, last = min(ids), max(ids)
    size = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), 0)
    return first[:size]


async def _sharing(api: Api, owners: list[str], tag: str) -> tuple[list[str], str]:
    """Workflows of `owners` (in order) whose ids share a prefix of 8+ characters.

    Ids start with the creation time in base36: 8 characters span about 28 minutes,
    so a second try is only needed when the first crossed such a boundary.
    """
    for attempt in range(2):
        ids = [
            (await api.submit(chain(f"{tag}-{attempt}-{i}"), user=owner))["id"]
            for i, owner in enumerate(owners)
        ]
        if len(_common(ids)) >= 8:
            return ids, _common(ids)
    raise AssertionError(f"no shared prefix in {ids}")


async def test_a_unique_prefix_names_the_workflow_everywhere(users_api: Api) -> None:
    api = users_api
    workflow = await api.wait((await api.submit(chain("prefix-all"), user="alice"))["id"])
    short = workflow["id"][:-4]

    status, found = await _get(api, f"/api/v1/workflows/{short}", "alice")
    assert (status, found["id"]) == (200, workflow["id"])
    status, action = await _get(api, f"/api/v1/workflows/{short}/actions/1", "alice")
    assert (status, action["actionId"]) == (200, 1)
    logs = await api.client.get(
        f"/api/v1/workflows/{short}/actions/1/logs", headers=api.auth("alice")
    )
    assert logs.status == 200
    rerun = await api.client.post(f"/api/v1/workflows/{short}/rerun", headers=api.auth("alice"))
    assert rerun.status == 201
    assert (await rerun.json())["id"] != workflow["id"]


async def test_a_dataset_id_as_the_cli_prints_it(users_api: Api) -> None:
    api = users_api
    workflow = await api.wait((await api.submit(chain("prefix-ds"), user="alice"))["id"])
    dataset_id = workflow["endDatasetId"]

    for short in (dataset_id[:12], dataset_id[:8]):
        status, found = await _get(api, f"/api/v1/datasets/{short}", "alice")
        assert (status, found["id"]) == (200, dataset_id)
    status, lineage = await _get(api, f"/api/v1/datasets/{dataset_id[:12]}/lineage", "alice")
    assert status == 200 and lineage["nodes"]


async def test_short_or_odd_prefixes_are_not_found(users_api: Api) -> None:
    api = users_api
    workflow = await api.submit(chain("prefix-short"), user="alice")
    for ref in (workflow["id"][:7], "wf-%25", "wf-_____", "WF-" + workflow["id"][3:12], "%00" * 8):
        status, problem = await _get(api, f"/api/v1/workflows/{ref}", "alice")
        assert (status, problem["code"]) == (404, "NOT_FOUND"), ref


async def test_an_ambiguous_prefix_names_the_candidates(users_api: Api) -> None:
    api = users_api
    ids, prefix = await _sharing(api, ["alice", "alice"], "ambiguous")

    status, problem = await _get(api, f"/api/v1/workflows/{prefix}", "alice")

    assert (status, problem["code"]) == (400, "AMBIGUOUS_ID")
    assert problem["title"] == "Bad Request"
    assert all(i in problem["detail"] for i in ids)


async def test_bob_learns_nothing_from_alices_ids(users_api: Api) -> None:
    api = users_api
    (first, second), prefix = await _sharing(api, ["alice", "alice"], "foreign")
    unknown_status, unknown = await _get(api, "/api/v1/workflows/wf-zzzzzzzzz", "bob")

    # Alice's two share the prefix: for bob it is unknown, not ambiguous.
    for ref in (prefix, first[:-4], first):
        for suffix in ("", "/actions/1", "/actions/1/logs"):
            status, problem = await _get(api, f"/api/v1/workflows/{ref}{suffix}", "bob")
            assert (
                (status, problem["code"])
                == (unknown_status, unknown["code"])
                == (
                    404,
                    "NOT_FOUND",
                )
            ), (ref, suffix)
        for verb in ("kill", "rerun"):
            response = await api.client.post(
                f"/api/v1/workflows/{ref}/{verb}", headers=api.auth("bob")
            )
            assert response.status == 404, (ref, verb)
    assert second.startswith(prefix)


async def test_bobs_own_workflow_wins_over_alices(users_api: Api) -> None:
    api = users_api
    (_, _, bobs), prefix = await _sharing(api, ["alice", "alice", "bob"], "mixed")

    status, found = await _get(api, f"/api/v1/workflows/{prefix}", "bob")
    assert (status, found["id"]) == (200, bobs)
    # The admin sees all three: ambiguous.
    status, problem = await _get(api, f"/api/v1/workflows/{prefix}", "admin")
    assert (status, problem["code"]) == (400, "AMBIGUOUS_ID")


@pytest.mark.parametrize("length", [8, 12, 63])
async def test_private_datasets_stay_private_by_prefix(
    aiohttp_client: AiohttpClient, tmp_path: Any, length: int
) -> None:
    settings: Settings = make_settings(tmp_path, sharing_scope="user")
    app = create_app(settings)
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    alice = await api.wait((await api.submit(chain("secret"), user="alice"))["id"])
    short = alice["endDatasetId"][:length]

    hidden = await api.client.get(f"/api/v1/datasets/{short}", headers=api.auth("bob"))
    assert hidden.status == 404
    assert (await hidden.json())["code"] == "NOT_FOUND"
    for verb in ("pin", "unpin"):
        response = await api.client.post(
            f"/api/v1/datasets/{short}/{verb}", headers=api.auth("bob")
        )
        assert response.status == 404
    mine = await api.client.get(f"/api/v1/datasets/{short}", headers=bearer(api.tokens["alice"]))
    assert mine.status == 200

"""Bob against Alice over real HTTP: reuse crosses users, views never do.

In the `server` sharing scope Bob may reuse Alice's datasets, but nothing he
can request reveals her workflow ids, her documents or her `env` values; and
a workflow of hers answers exactly like one that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pingo.api import runtime
from pingo.api.app import create_app
from pingo.retention.policy import DECLINE_EVENT, EVICT_EVENT
from tests.api.conftest import AiohttpClient, Api, bearer, command_workflow, make_settings
from tests.ui.test_pages import SCRIPT, sign_in

ENV_SECRET = "alice-env-value-7f3e9c"
COMMAND_SECRET = "alice-command-arg-51b2"


def _alices(tag: str, *, name: str = "extract") -> dict[str, Any]:
    """Alice's two-step workflow: a first action with env and a telling argv, and a reader."""
    document = command_workflow(
        {
            1: ["sh", "-c", f'echo {tag} > "$PINGO_OUTPUT" # {COMMAND_SECRET}'],
            2: ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"'],
        },
        {2: [1]},
        name="alices",
        extra={1: {"env": {"API_KEY": ENV_SECRET}, "name": name}},
    )
    return document


def _leaks(body: str, *secrets: str) -> list[str]:
    return [s for s in secrets if s in body]


async def _get(api: Api, url: str, user: str) -> tuple[int, str]:
    response = await api.client.get(url, headers=api.auth(user))
    return response.status, await response.text()


@pytest.fixture
async def shared(users_api: Api) -> tuple[Api, dict[str, Any], dict[str, Any]]:
    """Alice's finished workflow, and Bob's that reused her first dataset."""
    api = users_api
    alices = await api.wait((await api.submit(_alices("shared"), user="alice"))["id"])
    assert alices["state"] == "SUCCEEDED"
    # Bob's own reader of the same first action: planning reuses Alice's dataset.
    bobs_document = _alices("shared")
    bobs_document["actions"][1]["command"] = ["sh", "-c", 'wc -c "$PINGO_INPUT_1" > $PINGO_OUTPUT']
    bobs = await api.wait((await api.submit(bobs_document, user="bob"))["id"])
    assert bobs["state"] == "SUCCEEDED"
    assert bobs["actions"][0]["reused"] is True
    assert bobs["actions"][0]["datasetId"] == alices["actions"][0]["datasetId"]
    return api, alices, bobs


async def test_a_foreign_dataset_shows_name_and_type_never_its_producer(
    shared: tuple[Api, dict[str, Any], dict[str, Any]],
) -> None:
    api, alices, _ = shared
    dataset_id = alices["actions"][0]["datasetId"]
    secrets = (alices["id"], ENV_SECRET, COMMAND_SECRET)
    status, body = await _get(api, f"/api/v1/datasets/{dataset_id}", "bob")
    assert status == 200
    assert _leaks(body, *secrets) == []
    document = json.loads(body)
    assert document["producedBy"] == {"name": "extract", "type": "command-line"}
    assert "claims" not in document and document["claimCount"] == 0
    assert document["digest"].startswith("sha256:")
    # ?verify=true answers Bob too, with nothing more.
    status, body = await _get(api, f"/api/v1/datasets/{dataset_id}?verify=true", "bob")
    assert status == 200 and _leaks(body, *secrets) == []
    assert json.loads(body)["verification"]["status"] == "match"
    # Every other view of it: the list, the lineage (from Alice's leaf down), the plan.
    for url in (
        "/api/v1/datasets",
        f"/api/v1/datasets/{alices['endDatasetId']}/lineage",
        f"/api/v1/datasets/{dataset_id}/lineage",
        "/api/v1/storage",
    ):
        status, body = await _get(api, url, "bob")
        assert status == 200, url
        assert _leaks(body, *secrets) == [], url
    lineage = json.loads((await _get(api, f"/api/v1/datasets/{alices['endDatasetId']}/lineage",
                                     "bob"))[1])  # fmt: skip
    assert {n.get("actionName") for n in lineage["nodes"]} == {"extract", "step2"}
    assert all("producerWorkflowId" not in n for n in lineage["nodes"])


async def test_the_owner_and_admins_see_their_producer(
    shared: tuple[Api, dict[str, Any], dict[str, Any]],
) -> None:
    api, alices, bobs = shared
    dataset_id = alices["actions"][0]["datasetId"]
    for user in ("alice", "admin"):
        response = await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth(user))
        document = await response.json()
        assert document["producedBy"]["workflowId"] == alices["id"]
        assert document["producedBy"]["definition"]["spec"]["env"] == {"API_KEY": ENV_SECRET}
        # Bob's workflow is his: even the producer's owner never learns its id.
        assert bobs["id"] not in await response.text()
    lineage = await (
        await api.client.get(
            f"/api/v1/datasets/{alices['endDatasetId']}/lineage", headers=api.auth("alice")
        )
    ).json()
    assert {n["producerWorkflowId"] for n in lineage["nodes"]} == {alices["id"]}


async def test_a_readers_claim_never_shows_the_owner_the_readers_workflow(
    users_api: Api,
) -> None:
    api = users_api
    alices = await api.wait((await api.submit(_alices("claimed"), user="alice"))["id"])
    dataset_id = alices["actions"][0]["datasetId"]
    # Bob's reader sleeps, holding its claim on Alice's dataset while we look.
    bobs_document = _alices("claimed")
    bobs_document["actions"][1]["command"] = ["sh", "-c", 'sleep 30; cat "$PINGO_INPUT_1"']
    bobs = await api.submit(bobs_document, user="bob")
    await api.wait_action(bobs["id"], 2, {"RUNNING", "SUBMITTED"})
    for user in ("alice", "bob"):
        document = await (
            await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth(user))
        ).json()
        assert document["claimCount"] == 1
        assert "claims" not in document
    admin = await (
        await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth("admin"))
    ).json()
    assert admin["claims"] == [f"{bobs['id']}/2"]
    killed = await api.client.post(f"/api/v1/workflows/{bobs['id']}/kill", headers=api.auth("bob"))
    assert killed.status == 200


def _scrub(body: str, workflow_id: str) -> str:
    return body.replace(workflow_id, "WORKFLOW")


@pytest.mark.parametrize(
    ("method", "template", "body"),
    [
        ("GET", "/api/v1/workflows/{wf}", None),
        ("POST", "/api/v1/workflows/{wf}/kill", None),
        ("POST", "/api/v1/workflows/{wf}/rerun", {"force": ["extract"]}),
        ("GET", "/api/v1/workflows/{wf}/actions/1", None),
        ("GET", "/api/v1/workflows/{wf}/actions/1/logs", None),
        ("GET", "/api/v1/workflows/{wf}/actions/1/logs?attempt=1", None),
        ("GET", "/workflows/{wf}", None),
        ("GET", "/workflows/{wf}/live", None),
        ("GET", "/workflows/{wf}/actions/1", None),
    ],
)
async def test_another_users_workflow_answers_like_one_that_does_not_exist(
    shared: tuple[Api, dict[str, Any], dict[str, Any]],
    method: str,
    template: str,
    body: dict[str, Any] | None,
) -> None:
    api, alices, _ = shared
    missing = "wf-000000000-0000000000"
    if template.startswith("/api/"):
        kwargs: dict[str, Any] = {"headers": api.auth("bob")}
        if body is not None:
            kwargs["json"] = body
        answers = []
        for wf in (alices["id"], missing):
            response = await api.client.request(method, template.format(wf=wf), **kwargs)
            answers.append((response.status, _scrub(await response.text(), wf)))
    else:
        await sign_in(api, "bob")
        answers = []
        for wf in (alices["id"], missing):
            response = await api.client.request(method, template.format(wf=wf))
            answers.append((response.status, _scrub(await response.text(), wf)))
    assert answers[0] == answers[1]
    assert answers[0][0] == 404
    # And nothing changed for Alice.
    assert (await api.workflow(alices["id"], user="alice"))["state"] == "SUCCEEDED"


async def test_bobs_own_views_of_his_reuse_name_nothing_of_alices(
    shared: tuple[Api, dict[str, Any], dict[str, Any]],
) -> None:
    api, alices, bobs = shared
    # (Bob's own action 1 shows his own env, which is the same value: same provenance.)
    secrets = (alices["id"],)
    for url in (
        f"/api/v1/workflows/{bobs['id']}",
        f"/api/v1/workflows/{bobs['id']}/actions/1",
        f"/api/v1/workflows/{bobs['id']}/actions/2",
        f"/api/v1/workflows/{bobs['id']}/actions/2/logs",
        "/api/v1/workflows",
        "/api/v1/workflows?owner=alice",
    ):
        status, body = await _get(api, url, "bob")
        assert status == 200, (url, body)
        assert _leaks(body, *secrets) == [], url
    listing = (await _get(api, "/api/v1/workflows?owner=alice", "bob"))[1]
    assert '"items": []' in listing or '"items":[]' in listing


async def test_changing_a_foreign_dataset_is_forbidden_and_says_nothing_more(
    shared: tuple[Api, dict[str, Any], dict[str, Any]],
) -> None:
    api, alices, _ = shared
    dataset_id = alices["actions"][0]["datasetId"]
    for method, url in (
        ("DELETE", f"/api/v1/datasets/{dataset_id}?force=true"),
        ("POST", f"/api/v1/datasets/{dataset_id}/pin"),
        ("POST", f"/api/v1/datasets/{dataset_id}/unpin"),
    ):
        response = await api.client.request(method, url, headers=api.auth("bob"))
        # 403, not 404: Bob may see the dataset (it is in his sharing scope).
        assert response.status == 403
        assert _leaks(await response.text(), alices["id"], ENV_SECRET) == []
    document = await (
        await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth("alice"))
    ).json()
    assert document["state"] == "STORED" and document["pinned"] is False


async def test_the_dataset_pages_escape_names_and_hide_the_producer(users_api: Api) -> None:
    api = users_api
    alices = await api.wait((await api.submit(_alices("ui", name=SCRIPT), user="alice"))["id"])
    dataset_id = alices["actions"][0]["datasetId"]
    await sign_in(api, "bob")
    for url in (f"/datasets/{dataset_id}", f"/datasets/{alices['endDatasetId']}", "/datasets"):
        page = await (await api.client.get(url)).text()
        assert SCRIPT not in page, url
        assert _leaks(page, alices["id"], ENV_SECRET, COMMAND_SECRET) == [], url
    page = await (await api.client.get(f"/datasets/{dataset_id}")).text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    digest = (
        await (
            await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth("bob"))
        ).json()
    )["digest"]
    assert digest in page
    await sign_in(api, "alice")
    own = await (await api.client.get(f"/datasets/{dataset_id}")).text()
    assert f"/workflows/{alices['id']}/actions/1" in own


async def test_in_per_user_scopes_another_users_dataset_does_not_exist(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = create_app(make_settings(tmp_path, sharing_scope="user"))
    client = await aiohttp_client(app)
    api = Api(client=client, app=app, tokens={"admin": "admin-token-for-tests"})
    await api.add_user("alice")
    await api.add_user("bob")
    alices = await api.wait((await api.submit(_alices("scoped"), user="alice"))["id"])
    dataset_id = alices["actions"][0]["datasetId"]
    missing = "f" * 64
    for template in (
        "/api/v1/datasets/{ds}",
        "/api/v1/datasets/{ds}?verify=true",
        "/api/v1/datasets/{ds}/lineage",
    ):
        answers = []
        for ds in (dataset_id, missing):
            response = await client.get(template.format(ds=ds), headers=bearer(api.tokens["bob"]))
            answers.append((response.status, (await response.text()).replace(ds, "DS")))
        assert answers[0] == answers[1] and answers[0][0] == 404, template
    for method, suffix in (("DELETE", ""), ("POST", "/pin")):
        answers = []
        for ds in (dataset_id, missing):
            response = await client.request(
                method, f"/api/v1/datasets/{ds}{suffix}", headers=bearer(api.tokens["bob"])
            )
            answers.append((response.status, (await response.text()).replace(ds, "DS")))
        assert answers[0] == answers[1] and answers[0][0] == 404
    listing = await (await client.get("/api/v1/datasets", headers=api.auth("bob"))).text()
    assert dataset_id not in listing
    # Nor in a cursor: a red-team review paged with limit=1 and read Alice's dataset id
    # (and its creation time) from `next` of an empty page.
    for state in ("", "&state=LEAF"):
        response = await client.get(f"/api/v1/datasets?limit=1{state}", headers=api.auth("bob"))
        assert await response.json() == {"items": [], "next": None}
    # A retention decision about Alice's dataset, eviction or decline, is not shown to Bob.
    store = app[runtime.STATE_KEY].node
    assert store is not None
    for kind in (EVICT_EVENT, DECLINE_EVENT):
        await store.store.append_event(
            kind, dataset_id=dataset_id, payload={"policy": "lru", "reason": "test"}
        )
    for user, shown in (("bob", False), ("alice", True), ("admin", True)):
        body = await (await client.get("/api/v1/storage", headers=api.auth(user))).text()
        assert (dataset_id in body) is shown, user
    await sign_in(api, "bob")
    page = await (await client.get("/storage")).text()
    assert dataset_id not in page
    assert re.search(r"None yet", page)


def _merge(first: str, second: str) -> dict[str, Any]:
    """Two producers and a merge of their outputs, in parent order (`{inputs:sh}`)."""
    return command_workflow(
        {
            1: ["sh", "-c", f'echo {first} > "$PINGO_OUTPUT"'],
            2: ["sh", "-c", f'echo {second} > "$PINGO_OUTPUT"'],
            3: ["sh", "-c", 'cat {inputs:sh} > "$PINGO_OUTPUT"'],
        },
        {3: [1, 2]},
        name="merge",
    )


async def test_a_merge_with_its_parents_numbered_the_other_way_round_is_not_reused(
    users_api: Api,
) -> None:
    """A red-team review's poisoning: Bob numbers the same two producers the other way
    round, so his merge reads them in the other order. It must not be handed to Alice
    as hers (it was: the dataset id ignored which parent was which)."""
    api = users_api
    bobs = await api.wait((await api.submit(_merge("deny", "allow"), user="bob"))["id"])
    assert bobs["state"] == "SUCCEEDED"
    alices = await api.wait((await api.submit(_merge("allow", "deny"), user="alice"))["id"])
    assert alices["state"] == "SUCCEEDED"
    reuse = {a["actionId"]: a["reuse"] for a in alices["actions"]}
    assert reuse == {1: "reused", 2: "reused", 3: "computed"}, reuse
    dataset_id = alices["actions"][2]["datasetId"]
    response = await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth("alice"))
    stored = Path((await response.json())["path"])
    assert await asyncio.to_thread(stored.read_text) == "allow\ndeny\n"


async def test_an_action_that_reads_the_world_never_gets_another_users_answer(
    users_api: Api,
) -> None:
    """Bob runs Alice's command first, his answer in place of the world's (a red-team
    review served his own `localhost`). Alice's action says it reads the world
    (`isDeterministic: false`): it is computed for her, and so is her merge below it;
    her own second submission computes both again too."""
    api = users_api
    fetch = ["sh", "-c", 'echo "$WHO" > "$PINGO_OUTPUT"']
    merge = ["sh", "-c", 'cat {inputs:sh} > "$PINGO_OUTPUT"']

    def document(who: str, deterministic: bool) -> dict[str, Any]:
        extra: dict[int, dict[str, Any]] = {1: {"env": {"WHO": who}}}
        if not deterministic:
            extra[1]["isDeterministic"] = False
        return command_workflow({1: fetch, 2: merge}, {2: [1]}, name="fetch", extra=extra)

    bobs = await api.wait((await api.submit(document("bob", True), user="bob"))["id"])
    assert bobs["state"] == "SUCCEEDED"
    # Without the flag, the same definition is Bob's dataset, handed to Alice.
    handed = await api.submit(document("bob", True), user="alice")
    assert [a["reuse"] for a in handed["actions"]] == ["not needed", "reused"]
    for _ in range(2):
        alices = await api.wait((await api.submit(document("bob", False), user="alice"))["id"])
        assert alices["state"] == "SUCCEEDED"
        assert [a["reuse"] for a in alices["actions"]] == ["computed", "computed"]
        ids = {a["datasetId"] for a in alices["actions"]}
        assert not ids & {a["datasetId"] for a in bobs["actions"]}

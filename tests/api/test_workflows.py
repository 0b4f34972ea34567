"""Workflows over real HTTP: submit, document shape, dry run, idempotency, pages, kill, rerun."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema

from pingo.api import runtime
from pingo.api.runtime import CachedDocument, DocumentCache
from pingo.states import ActionState

from .conftest import REPO, Api, chain, command_workflow, sleeper

WORKFLOW_KEYS = [
    "id",
    "name",
    "owner",
    "state",
    "createdAt",
    "finishedAt",
    "error",
    "counts",
    "reuse",
    "endDatasetId",
    "actions",
]
ACTION_KEYS = [
    "actionId",
    "name",
    "type",
    "state",
    "datasetId",
    "reused",
    "reuse",
    "sharedWith",
    "attempts",
    "startedAt",
    "finishedAt",
    "error",
]


async def test_submit_answers_201_with_location_and_the_workflow_document(api: Api) -> None:
    response = await api.client.post(
        "/api/v1/workflows", json=chain("shape"), headers=api.auth("admin")
    )
    assert response.status == 201
    document = await response.json()
    assert response.headers["Location"] == f"/api/v1/workflows/{document['id']}"
    assert list(document) == WORKFLOW_KEYS
    assert document["owner"] == "admin"
    assert document["name"] == "chain"
    assert [a["actionId"] for a in document["actions"]] == [1, 2, 3]
    assert all(list(a) == ACTION_KEYS for a in document["actions"])
    assert set(document["counts"]) == {s.value for s in ActionState}
    assert sum(document["counts"].values()) == 3
    assert document["endDatasetId"] == document["actions"][-1]["datasetId"]

    done = await api.wait(document["id"])
    assert done["state"] == "SUCCEEDED"
    assert done["finishedAt"] is not None
    assert done["counts"]["FINISHED"] == 3
    assert all(a["attempts"] == 1 and not a["reused"] for a in done["actions"])
    assert all(a["startedAt"] and a["finishedAt"] for a in done["actions"])


async def test_resubmission_reuses_every_action(api: Api) -> None:
    first = await api.submit(chain("reuse"))
    assert (await api.wait(first["id"]))["state"] == "SUCCEEDED"
    again = await api.submit(chain("reuse"))
    assert again["state"] == "SUCCEEDED"
    assert again["id"] != first["id"]
    assert all(a["reused"] and a["attempts"] == 0 for a in again["actions"])
    assert [a["datasetId"] for a in again["actions"]] == [a["datasetId"] for a in first["actions"]]


async def test_the_201_of_a_workflow_ended_at_submission_is_what_the_store_holds(
    api: Api,
) -> None:
    """Built from the actions the submission wrote, not read back: the same bytes."""
    first = await api.submit(chain("written", n=4))
    assert (await api.wait(first["id"]))["state"] == "SUCCEEDED"
    await api.add_user("bob")
    response = await api.client.post(
        "/api/v1/workflows", json=chain("written", n=4), headers=api.auth("bob")
    )
    assert response.status == 201
    created = await response.read()
    assert json.loads(created)["state"] == "SUCCEEDED"
    # Forget the cached body the 201 left, so the GET reads the store.
    api.app[runtime.STATE_KEY].finished_documents = DocumentCache()
    stored = await api.client.get(response.headers["Location"], headers=api.auth("bob"))
    assert await stored.read() == created


async def test_dry_run_returns_the_plan_and_stores_nothing(api: Api) -> None:
    response = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=chain("dry"), headers=api.auth("admin")
    )
    assert response.status == 200
    plan = await response.json()
    assert [a["actionId"] for a in plan["actions"]] == [1, 2, 3]
    assert plan["summary"] == {"computed": 3, "shared": 0, "reused": 0, "notNeeded": 0}
    assert all(a["compute"] and a["reason"] == "absent" for a in plan["actions"])
    assert all(a["reuse"] == "computed" for a in plan["actions"])
    listing = await api.client.get("/api/v1/workflows", headers=api.auth("admin"))
    assert (await listing.json())["items"] == []
    datasets = await api.client.get("/api/v1/datasets", headers=api.auth("admin"))
    assert (await datasets.json())["items"] == []

    # After a real run, the dry run says every action would be skipped.
    done = await api.wait((await api.submit(chain("dry")))["id"])
    assert done["state"] == "SUCCEEDED"
    again = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=chain("dry"), headers=api.auth("admin")
    )
    replanned = await again.json()
    assert not any(a["compute"] for a in replanned["actions"])
    # One vocabulary: the end action's dataset is reused, its ancestors are not needed.
    assert [a["reuse"] for a in replanned["actions"]] == ["not needed", "not needed", "reused"]
    assert replanned["summary"] == {"computed": 0, "shared": 0, "reused": 1, "notNeeded": 2}
    submitted = await api.submit(chain("dry"))
    assert submitted["reuse"] == replanned["summary"]
    assert [a["reuse"] for a in submitted["actions"]] == ["not needed", "not needed", "reused"]


async def test_idempotency_key_returns_the_same_workflow(users_api: Api) -> None:
    api = users_api
    headers = {**api.auth("alice"), "Idempotency-Key": "order-42"}
    first = await api.client.post("/api/v1/workflows", json=chain("idem"), headers=headers)
    second = await api.client.post("/api/v1/workflows", json=chain("idem"), headers=headers)
    assert first.status == second.status == 201
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert (await first.json())["id"] == (await second.json())["id"]
    assert first.headers["Location"] == second.headers["Location"]

    # The same key with another document is refused, and stores nothing.
    other = await api.client.post("/api/v1/workflows", json=chain("other"), headers=headers)
    assert other.status == 422
    assert (await other.json())["code"] == "IDEMPOTENCY_KEY_REUSED"

    # Keys are per user: bob's "order-42" is his own workflow.
    bob = await api.client.post(
        "/api/v1/workflows",
        json=chain("idem"),
        headers={**api.auth("bob"), "Idempotency-Key": "order-42"},
    )
    assert bob.status == 201
    assert (await bob.json())["id"] != (await first.json())["id"]
    listing = await api.client.get("/api/v1/workflows", headers=api.auth("admin"))
    assert len((await listing.json())["items"]) == 2


async def test_concurrent_retries_with_one_key_make_one_workflow(api: Api) -> None:
    headers = {**api.auth("admin"), "Idempotency-Key": "burst"}
    responses = await asyncio.gather(
        *(
            api.client.post("/api/v1/workflows", json=chain("burst"), headers=headers)
            for _ in range(5)
        )
    )
    assert {r.status for r in responses} == {201}
    ids = {(await r.json())["id"] for r in responses}
    assert len(ids) == 1


async def test_pagination_is_stable_while_workflows_are_added(api: Api) -> None:
    before = [(await api.submit(chain(f"page{i}", n=1)))["id"] for i in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    added = 0
    while True:
        query = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        response = await api.client.get(
            "/api/v1/workflows", params=query, headers=api.auth("admin")
        )
        assert response.status == 200
        page = await response.json()
        assert len(page["items"]) <= 3
        seen.extend(item["id"] for item in page["items"])
        # Newer workflows arrive between pages; they must not shift or repeat items.
        await api.submit(chain(f"late{added}", n=1))
        added += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == list(reversed(before))
    assert len(set(seen)) == len(seen)


async def test_list_filters_by_state_and_name_and_checks_parameters(api: Api) -> None:
    ok = await api.submit(chain("filter-ok", n=1, name="good"))
    bad = await api.submit(
        command_workflow({1: ["sh", "-c", "exit 3"]}, name="bad", extra={1: {"maxAttempts": 1}})
    )
    assert (await api.wait(ok["id"]))["state"] == "SUCCEEDED"
    assert (await api.wait(bad["id"]))["state"] == "FAILED"

    async def ids(query: dict[str, str]) -> list[str]:
        response = await api.client.get(
            "/api/v1/workflows", params=query, headers=api.auth("admin")
        )
        assert response.status == 200
        return [w["id"] for w in (await response.json())["items"]]

    assert await ids({"state": "FAILED"}) == [bad["id"]]
    assert await ids({"state": "succeeded"}) == [ok["id"]]
    assert await ids({"name": "good"}) == [ok["id"]]
    assert await ids({"name": "none"}) == []
    for query in (
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "x"},
        {"state": "DONE"},
        {"cursor": "not-a-cursor"},
    ):
        response = await api.client.get(
            "/api/v1/workflows", params=query, headers=api.auth("admin")
        )
        assert response.status == 400, query
        problem = await response.json()
        assert problem["code"] == "INVALID_PARAMETER"
        assert response.content_type == "application/problem+json"


async def test_failed_action_shows_its_error_and_log(api: Api) -> None:
    document = command_workflow(
        {1: ["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7"]},
        extra={1: {"maxAttempts": 2}},
    )
    submitted = await api.submit(document)
    done = await api.wait(submitted["id"])
    assert done["state"] == "FAILED"
    action = done["actions"][0]
    assert action["state"] == "FAILED"
    assert action["attempts"] == 2
    detail = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/1", headers=api.auth("admin")
    )
    body = await detail.json()
    assert body["error"]
    assert body["callbackId"]
    assert body["definition"]["command"] == document["actions"][0]["command"]
    assert set(body) >= {"callbackId", "externalId", "definition", "error"}

    log = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/1/logs", headers=api.auth("admin")
    )
    assert log.status == 200
    assert log.content_type == "text/plain"
    text = await log.text()
    assert "to-stdout" in text and "to-stderr" in text
    first = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/1/logs?attempt=1", headers=api.auth("admin")
    )
    assert first.status == 200
    missing = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/1/logs?attempt=3", headers=api.auth("admin")
    )
    assert missing.status == 404  # a valid attempt number that has not happened
    nothing = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/9", headers=api.auth("admin")
    )
    assert nothing.status == 404


async def test_reused_action_has_no_log(api: Api) -> None:
    await api.wait((await api.submit(chain("nolog", n=1)))["id"])
    again = await api.submit(chain("nolog", n=1))
    response = await api.client.get(
        f"/api/v1/workflows/{again['id']}/actions/1/logs", headers=api.auth("admin")
    )
    assert response.status == 404
    assert (await response.json())["code"] == "NOT_FOUND"


async def test_kill_stops_a_running_workflow(api: Api) -> None:
    submitted = await api.submit(sleeper("kill"))
    await api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"})
    response = await api.client.post(
        f"/api/v1/workflows/{submitted['id']}/kill", headers=api.auth("admin")
    )
    assert response.status == 200
    document = await response.json()
    assert document["state"] == "KILLED"
    final = await api.wait_action(submitted["id"], 1, {"KILLED"})
    assert final["state"] == "KILLED"


async def test_rerun_makes_a_new_workflow_forcing_named_actions(api: Api) -> None:
    original = await api.wait((await api.submit(chain("rerun")))["id"])
    assert original["state"] == "SUCCEEDED"
    response = await api.client.post(
        f"/api/v1/workflows/{original['id']}/rerun",
        json={"force": ["step2"]},
        headers=api.auth("admin"),
    )
    assert response.status == 201
    rerun = await response.json()
    assert rerun["id"] != original["id"]
    assert response.headers["Location"] == f"/api/v1/workflows/{rerun['id']}"
    done = await api.wait(rerun["id"])
    assert done["state"] == "SUCCEEDED"
    by_id = {a["actionId"]: a for a in done["actions"]}
    assert by_id[1]["reused"]
    assert not by_id[2]["reused"] and by_id[2]["attempts"] == 1

    plain = await api.client.post(
        f"/api/v1/workflows/{original['id']}/rerun", headers=api.auth("admin")
    )
    assert plain.status == 201
    assert (await plain.json())["state"] == "SUCCEEDED"  # everything stored: all reused

    # The body's shape is checked first, then the planner resolves what it names.
    extra = await api.client.post(
        f"/api/v1/workflows/{original['id']}/rerun",
        json={"force": ["nope", 99], "extra": 1},
        headers=api.auth("admin"),
    )
    assert extra.status == 422
    assert {e["pointer"] for e in (await extra.json())["errors"]} == {"/extra"}
    unknown = await api.client.post(
        f"/api/v1/workflows/{original['id']}/rerun",
        json={"force": ["nope", 99]},
        headers=api.auth("admin"),
    )
    assert unknown.status == 422
    found = {(e["code"], e["pointer"]) for e in (await unknown.json())["errors"]}
    assert found == {("UNKNOWN_ACTION_NAME", "/force/0"), ("UNKNOWN_ACTION_ID", "/force/1")}


async def test_datasets_storage_and_lineage(api: Api) -> None:
    done = await api.wait((await api.submit(chain("ds")))["id"])
    end = done["endDatasetId"]
    response = await api.client.get(f"/api/v1/datasets/{end}", headers=api.auth("admin"))
    assert response.status == 200
    dataset = await response.json()
    assert dataset["state"] == "LEAF"
    assert dataset["sizeBytes"] > 0
    assert dataset["producedBy"]["workflowId"] == done["id"]
    assert dataset["producedBy"]["actionId"] == 3
    assert dataset["parents"] == [done["actions"][1]["datasetId"]]
    assert {"state", "sizeBytes", "path", "claims", "producedBy", "parents"} <= set(dataset)

    lineage = await (
        await api.client.get(f"/api/v1/datasets/{end}/lineage", headers=api.auth("admin"))
    ).json()
    assert {n["id"] for n in lineage["nodes"]} == {a["datasetId"] for a in done["actions"]}
    assert len(lineage["edges"]) == 2

    listing = await (
        await api.client.get("/api/v1/datasets?state=STORED", headers=api.auth("admin"))
    ).json()
    assert {d["id"] for d in listing["items"]} == {a["datasetId"] for a in done["actions"][:2]}
    storage = await (await api.client.get("/api/v1/storage", headers=api.auth("admin"))).json()
    assert set(storage) == {"capacityBytes", "usedBytes", "bytesByState", "ownBytes",
                            "quotaBytes", "policy", "decisions"}  # fmt: skip
    assert storage["usedBytes"] == sum(storage["bytesByState"].values())
    # The admin produced every dataset there is, and has no quota.
    assert (storage["ownBytes"], storage["quotaBytes"]) == (storage["usedBytes"], None)
    assert storage["decisions"] == []

    pinned = await api.client.post(f"/api/v1/datasets/{end}/pin", headers=api.auth("admin"))
    assert (await pinned.json())["pinned"] is True
    unpinned = await api.client.post(f"/api/v1/datasets/{end}/unpin", headers=api.auth("admin"))
    assert (await unpinned.json())["pinned"] is False

    leaf = await api.client.delete(f"/api/v1/datasets/{end}", headers=api.auth("admin"))
    assert leaf.status == 409  # a LEAF needs ?force=true
    forced = await api.client.delete(
        f"/api/v1/datasets/{end}?force=true", headers=api.auth("admin")
    )
    assert forced.status == 202
    assert (await forced.json())["state"] in {
        "STORED_TO_DELETE",
        "PROCESSING",
        "DELETING",
        "DELETED",
    }


async def test_wordcount_example_end_to_end_and_reused_on_resubmit(
    api: Api, monkeypatch: Any
) -> None:
    # The example's paths are relative to the server's working directory: the repository.
    monkeypatch.chdir(REPO)
    document = json.loads((REPO / "examples" / "wordcount.json").read_text())
    done = await api.wait((await api.submit(document))["id"])
    assert done["state"] == "SUCCEEDED", done
    assert len(done["actions"]) >= 4
    report = await (
        await api.client.get(f"/api/v1/datasets/{done['endDatasetId']}", headers=api.auth("admin"))
    ).json()
    text = await asyncio.to_thread(Path(report["path"]).read_text, encoding="utf-8")
    assert "words; the 10 most frequent" in text
    assert text.splitlines()[1].split()[0] == "the"

    again = await api.submit(document)
    assert again["state"] == "SUCCEEDED"
    assert all(a["reused"] for a in again["actions"])


def test_document_cache_is_bounded_and_lru() -> None:
    cache = DocumentCache(max_bytes=100)
    cache.put("a", CachedDocument("alice", b"x" * 20))
    cache.put("b", CachedDocument("alice", b"y" * 20))
    cache.put("huge", CachedDocument("alice", b"z" * 30))  # over a quarter: never cached
    assert cache.get("huge") is None
    assert cache.get("a") == CachedDocument("alice", b"x" * 20)  # now the most recent
    for key in ("c", "d", "e", "f"):
        cache.put(key, CachedDocument("bob", b"w" * 20))
    assert cache.get("b") is None  # evicted first
    assert cache.get("a") is not None


async def test_cached_documents_still_check_the_owner(users_api: Api) -> None:
    api = users_api
    done = await api.wait((await api.submit(chain("cached"), user="alice"))["id"])
    assert done["state"] == "SUCCEEDED"
    for _ in range(2):  # the second read is served from the cache
        mine = await api.client.get(f"/api/v1/workflows/{done['id']}", headers=api.auth("alice"))
        assert await mine.json() == done
        theirs = await api.client.get(f"/api/v1/workflows/{done['id']}", headers=api.auth("bob"))
        assert theirs.status == 404
        admin = await api.client.get(f"/api/v1/workflows/{done['id']}", headers=api.auth("admin"))
        assert admin.status == 200


async def test_forced_rerun_replaces_the_stored_file_and_directory_outputs(api: Api) -> None:
    document = command_workflow(
        {
            1: ["sh", "-c", 'date +%s%N > "$PINGO_OUTPUT"'],
            2: ["sh", "-c", 'mkdir "$PINGO_OUTPUT" && date +%s%N > "$PINGO_OUTPUT/part"'],
        },
        name="forced-replace",
    )
    original = await api.wait((await api.submit(document))["id"])
    assert original["state"] == "SUCCEEDED"
    paths = {}
    for action in original["actions"]:
        response = await api.client.get(
            f"/api/v1/datasets/{action['datasetId']}", headers=api.auth("admin")
        )
        paths[action["actionId"]] = Path((await response.json())["path"])
    before = (paths[1].read_text(), (paths[2] / "part").read_text())

    response = await api.client.post(
        f"/api/v1/workflows/{original['id']}/rerun",
        json={"force": ["step1", "step2"]},
        headers=api.auth("admin"),
    )
    assert response.status == 201
    done = await api.wait((await response.json())["id"])
    assert done["state"] == "SUCCEEDED"
    assert not any(a["reused"] for a in done["actions"])
    after = (paths[1].read_text(), (paths[2] / "part").read_text())
    assert after[0] != before[0]
    assert after[1] != before[1]
    # The old copies were swapped out, not left beside the dataset.
    assert sorted(p.name for p in paths[2].parent.iterdir() if ".replaced." in p.name) == []


async def test_an_action_document_shows_its_recorded_history(api: Api) -> None:
    """A retry's second pass and a reuse, in order, each state at its time, as the
    OpenAPI document describes it."""
    # The staging path ends with the attempt number: the first attempt fails.
    fail_once = 'case "$PINGO_OUTPUT" in *.1) exit 3;; esac; echo ok > "$PINGO_OUTPUT"'
    document = command_workflow({1: ["sh", "-c", fail_once]}, name="retried")
    done = await api.wait((await api.submit(document))["id"])
    assert done["state"] == "SUCCEEDED"
    detail = await api.client.get(
        f"/api/v1/workflows/{done['id']}/actions/1", headers=api.auth("admin")
    )
    body = await detail.json()
    served = await (await api.client.get("/openapi.json")).json()
    schema = {**served["components"]["schemas"]["ActionDetail"], "components": served["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)
    history = body["history"]
    attempt = ["READY", "PROCESSING", "SUBMITTED"]
    assert [e["state"] for e in history] == [*attempt, *attempt, "FINISHED"]
    times = [e["at"] for e in history]
    assert times == sorted(times) and all(t.endswith("Z") for t in times)
    # The store stamps the change itself, just after the outcome service's finishedAt.
    assert history[-1]["at"] >= body["finishedAt"]

    again = await api.wait((await api.submit(document))["id"])
    reused = await api.client.get(
        f"/api/v1/workflows/{again['id']}/actions/1", headers=api.auth("admin")
    )
    assert [e["state"] for e in (await reused.json())["history"]] == ["FINISHED"]


async def test_a_long_lineage_names_every_producer(api: Api) -> None:
    # Twenty or more actions of one workflow are named from one read of the whole
    # workflow (routes/datasets.py), whose records are then freed a slice at a time.
    done = await api.wait((await api.submit(chain("long-lineage", 25)))["id"], timeout_s=120)
    end = done["endDatasetId"]
    lineage = await (
        await api.client.get(f"/api/v1/datasets/{end}/lineage", headers=api.auth("admin"))
    ).json()
    names = {a["datasetId"]: a["name"] for a in done["actions"]}
    assert len(lineage["nodes"]) == 25
    assert {n["id"]: n["actionName"] for n in lineage["nodes"]} == names

"""A corpus of bad requests: each gets the right problem+json, and nothing is stored."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pingo.actions.executors import local
from pingo.api import problems
from pingo.api.app import create_app
from pingo.node import Node
from pingo.store import open_store

from .conftest import REPO, AiohttpClient, Api, bearer, chain, make_settings

PROBLEM = "application/problem+json"


async def _nothing_stored(api: Api) -> None:
    for path in ("/api/v1/workflows", "/api/v1/datasets"):
        response = await api.client.get(path, headers=api.auth("admin"))
        assert (await response.json())["items"] == [], path


def _nested(depth: int) -> dict[str, Any]:
    document = chain("deep", n=1)
    inner: Any = "bottom"
    for _ in range(depth):
        inner = {"deeper": inner}
    document["actions"][0]["metadata"] = inner
    return document


JSON = {"Content-Type": "application/json"}

#: name → (body bytes, extra headers, status, code, a pointer expected in `errors` or None)
CORPUS: dict[str, tuple[bytes, dict[str, str], int, str, str | None]] = {
    "malformed": (b'{"name": "x",', JSON, 400, "MALFORMED_JSON", ""),
    "empty": (b"", JSON, 400, "MALFORMED_JSON", ""),
    "not-utf8": (b'{"name": "\xff\xfe"}', JSON, 400, "MALFORMED_JSON", ""),
    "nan": (b'{"name": NaN}', JSON, 400, "MALFORMED_JSON", ""),
    "text-plain": (
        json.dumps(chain("t")).encode(),
        {"Content-Type": "text/plain"},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        None,
    ),
    "form": (
        b"name=x",
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        None,
    ),
    "no-content-type": (
        json.dumps(chain("t")).encode(),
        {},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        None,
    ),
    "latin1": (
        json.dumps(chain("t")).encode(),
        {"Content-Type": "application/json; charset=latin-1"},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        None,
    ),
    "deep-arrays": (b"[" * 100_000 + b"]" * 100_000, JSON, 400, "MALFORMED_JSON", ""),
    "deep-objects": (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, JSON, 400, "MALFORMED_JSON", ""),
    "deep-metadata": (json.dumps(_nested(200)).encode(), JSON, 400, "MALFORMED_JSON", ""),
    "array": (b"[]", JSON, 400, "MALFORMED_JSON", ""),
    "string": (b'"workflow"', JSON, 400, "MALFORMED_JSON", ""),
    "wrong-types": (
        json.dumps({"name": 5, "startActionId": "1", "endActionId": 1, "actions": {}}).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        "/name",
    ),
    "unknown-field": (
        json.dumps({**chain("u", n=1), "schedule": "daily"}).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        "/schedule",
    ),
    "unknown-action-field": (
        json.dumps(
            {**chain("u", n=1), "actions": [{**chain("u", n=1)["actions"][0], "retries": 3}]}
        ).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        "/actions/0/retries",
    ),
    "unhashable-type": (
        json.dumps(
            {**chain("u", n=1), "actions": [{**chain("u", n=1)["actions"][0], "type": ["x"]}]}
        ).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        "/actions/0/type",
    ),
    "no-actions": (
        json.dumps({"name": "x", "startActionId": 1, "endActionId": 1, "actions": []}).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        None,
    ),
    "cycle": (
        json.dumps(
            {
                "name": "x",
                "startActionId": 1,
                "endActionId": 2,
                "actions": [
                    {
                        "id": 1,
                        "name": "a",
                        "type": "command-line",
                        "command": ["true"],
                        "parentActions": [{"id": 2}],
                    },
                    {
                        "id": 2,
                        "name": "b",
                        "type": "command-line",
                        "command": ["true"],
                        "parentActions": [{"id": 1}],
                    },
                ],
            }
        ).encode(),
        JSON,
        422,
        "VALIDATION_FAILED",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
async def test_bad_submission(api: Api, name: str) -> None:
    body, headers, status, code, pointer = CORPUS[name]
    response = await api.client.post(
        "/api/v1/workflows", data=body, headers={**api.auth("admin"), **headers}
    )
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM
    problem = await response.json()
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["type"] == f"/docs#{code}"
    assert problem["title"] and problem["detail"]
    if pointer is not None:
        assert pointer in {e["pointer"] for e in problem["errors"]}, problem
        assert all(set(e) == {"code", "message", "pointer"} for e in problem["errors"])
    await _nothing_stored(api)


async def test_validation_reports_every_issue(api: Api) -> None:
    document = {
        "name": "",
        "startActionId": 1,
        "endActionId": 9,
        "actions": [
            {"id": 1, "name": "a", "type": "command-line", "command": ["true"]},
            {"id": 1, "name": "b", "type": "command-line", "command": ["true"]},
        ],
    }
    response = await api.client.post("/api/v1/workflows", json=document, headers=api.auth("admin"))
    assert response.status == 422
    problem = await response.json()
    codes = {e["code"] for e in problem["errors"]}
    assert len(problem["errors"]) >= 3, problem
    assert "DUPLICATE_ACTION_ID" in codes and "UNKNOWN_ACTION_ID" in codes
    await _nothing_stored(api)


async def test_titles_are_rfc_9110_names_as_the_docs_show(api: Api) -> None:
    docs = (REPO / "docs" / "api.md").read_text()
    example = json.loads(docs.split("```json\n", 1)[1].split("```", 1)[0])
    response = await api.client.post(
        "/api/v1/workflows", json={"name": 5}, headers=api.auth("admin")
    )
    problem = await response.json()
    assert (response.status, problem["title"]) == (example["status"], example["title"])
    assert problem["title"] == "Unprocessable Content"


async def test_body_over_the_limit_is_413_and_stores_nothing(api: Api) -> None:
    # 60 MB declared up front: refused before it is read.
    big = io.BytesIO(b'{"name": "' + b"x" * (60 * 2**20) + b'"}')
    response = await api.client.post(
        "/api/v1/workflows", data=big, headers={**api.auth("admin"), **JSON}
    )
    assert response.status == 413
    assert response.content_type == PROBLEM
    assert (await response.json())["code"] == "PAYLOAD_TOO_LARGE"
    assert (await response.json())["title"] == "Content Too Large"
    await _nothing_stored(api)


async def test_chunked_body_over_the_limit_is_413(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, max_body_bytes=64 * 1024)
    client = await aiohttp_client(create_app(settings))

    async def chunks() -> AsyncIterator[bytes]:
        # No Content-Length: aiohttp notices the limit while reading.
        for _ in range(64):
            yield b" " * 4096

    response = await client.post(
        "/api/v1/workflows",
        data=chunks(),
        headers={**bearer("admin-token-for-tests"), **JSON},
    )
    assert response.status == 413
    problem = await response.json()
    assert problem["code"] == "PAYLOAD_TOO_LARGE"
    listing = await client.get("/api/v1/workflows", headers=bearer("admin-token-for-tests"))
    assert (await listing.json())["items"] == []


async def test_routing_errors_are_problems(api: Api) -> None:
    unknown = await api.client.get("/nowhere")
    assert unknown.status == 404
    assert unknown.content_type == PROBLEM
    assert (await unknown.json())["code"] == "NOT_FOUND"
    method = await api.client.delete("/api/v1/workflows", headers=api.auth("admin"))
    assert method.status == 405
    assert method.content_type == PROBLEM
    assert (await method.json())["code"] == "METHOD_NOT_ALLOWED"
    assert set(method.headers["Allow"].split(", ")) >= {"GET", "POST"}
    action = await api.client.get(
        "/api/v1/workflows/x/actions/notanumber", headers=api.auth("admin")
    )
    assert action.status == 404
    bad_flag = await api.client.post(
        "/api/v1/workflows?dryRun=maybe", json=chain("f"), headers=api.auth("admin")
    )
    assert bad_flag.status == 400
    await _nothing_stored(api)


async def test_unknown_executor_is_refused_at_submission(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path)
    async with open_store(f"sqlite:///{tmp_path / 'pingo.db'}") as store:
        # This node runs command-line actions only: no Spark here.
        node = Node(settings, store, executors={"command-line": local.create})
        await node.start()
        try:
            client = await aiohttp_client(create_app(settings, node=node))
            document = chain("spark", n=2)
            document["actions"][1] = {
                "id": 2,
                "name": "spark",
                "type": "spark",
                "application": "job.py",
                "parentActions": [{"id": 1}],
            }
            for query in ("", "?dryRun=true"):
                response = await client.post(
                    f"/api/v1/workflows{query}",
                    json=document,
                    headers=bearer("admin-token-for-tests"),
                )
                assert response.status == 422, await response.text()
                problem = await response.json()
                assert problem["code"] == "UNKNOWN_EXECUTOR"
                assert problem["errors"][0]["pointer"] == "/actions/1/type"
            # With another issue too, every issue is reported.
            document["name"] = 7
            response = await client.post(
                "/api/v1/workflows", json=document, headers=bearer("admin-token-for-tests")
            )
            codes = {e["code"] for e in (await response.json())["errors"]}
            assert "UNKNOWN_EXECUTOR" in codes and len(codes) >= 2
            listing = await client.get("/api/v1/workflows", headers=bearer("admin-token-for-tests"))
            assert (await listing.json())["items"] == []
        finally:
            await node.stop()


async def test_unexpected_errors_are_500_without_internals(aiohttp_client: AiohttpClient) -> None:
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("secret database password hunter2")

    app = web.Application(middlewares=[problems.problem_middleware])
    app.router.add_get("/broken", broken)
    client = await aiohttp_client(app)
    response = await client.get("/broken")
    assert response.status == 500
    assert response.content_type == PROBLEM
    problem = await response.json()
    assert problem["code"] == "INTERNAL"
    assert "hunter2" not in await response.text()
    assert "Traceback" not in await response.text()
    assert "reference" in problem["detail"]


@pytest.mark.parametrize(
    ("user", "query"),
    [
        ("admin", {}),
        ("alice", {}),
        # Schemathesis found this one: another owner's (empty) page was answered
        # before the cursor was read.
        ("alice", {"owner": "bob", "state": "FAILED"}),
    ],
)
async def test_a_bad_cursor_is_400_for_every_listing_of_workflows(
    users_api: Api, user: str, query: dict[str, str]
) -> None:
    for cursor in ("Å\U000bc955_<å", "12.abc\n", "abc"):
        response = await users_api.client.get(
            "/api/v1/workflows", params={**query, "cursor": cursor}, headers=users_api.auth(user)
        )
        assert response.status == 400, (cursor, await response.text())
        problem = await response.json()
        assert [i["code"] for i in problem["errors"]] == ["INVALID_CURSOR"]

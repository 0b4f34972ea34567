"""The check every API test's client runs: answers must be the ones the document describes."""

from __future__ import annotations

import pytest
from aiohttp import web

from pingo.api import problems

from .conftest import AiohttpClient, Api
from .documented import ResponseCheck, Undocumented


async def test_every_answer_of_the_api_client_is_checked(
    api: Api, response_check: ResponseCheck
) -> None:
    before = response_check.checked
    await api.client.get("/healthz")
    await api.client.get("/api/v1/workflows", headers=api.auth("admin"))
    await api.client.get("/api/v1/workflows")  # 401, problem+json
    assert response_check.checked == before + 3


async def test_an_undocumented_answer_fails_the_request(aiohttp_client: AiohttpClient) -> None:
    async def teapot(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"}, status=418)

    async def wrong_shape(request: web.Request) -> web.Response:
        return web.json_response({"status": 1})

    app = web.Application()
    app.router.add_get("/healthz", teapot)
    app.router.add_get("/readyz", wrong_shape)
    client = await aiohttp_client(app)
    with pytest.raises(Undocumented, match="status not documented"):
        await client.get("/healthz")
    with pytest.raises(Undocumented, match="does not match its schema"):
        await client.get("/readyz")


def test_status_media_type_and_body_are_each_checked() -> None:
    check = ResponseCheck()
    check.check("get", "/healthz", 200, "application/json", b'{"status":"ok"}')
    with pytest.raises(Undocumented, match="status not documented"):
        check.check("get", "/healthz", 201, "application/json", b'{"status":"ok"}')
    with pytest.raises(Undocumented, match="not documented"):
        check.check("get", "/healthz", 200, "text/plain", None)
    with pytest.raises(Undocumented, match="/status"):
        check.check("get", "/healthz", 200, "application/json", b'{"status":false}')
    with pytest.raises(Undocumented, match="extra"):
        check.check("get", "/healthz", 200, "application/json", b'{"status":"ok","extra":1}')
    with pytest.raises(Undocumented, match="without a body"):
        check.check("delete", "/api/v1/users/bob", 204, "application/json", b"{}")


def test_problems_are_checked_on_unknown_routes_too() -> None:
    check = ResponseCheck()
    problem = (
        b'{"type":"about:blank","title":"Not Found","status":404,"detail":"x","code":"NOT_FOUND"}'
    )
    check.check("get", "/api/v1/nothing", 404, problems.PROBLEM_JSON, problem)
    with pytest.raises(Undocumented, match="code"):
        check.check("get", "/api/v1/nothing", 404, problems.PROBLEM_JSON, b'{"title":"x"}')
    with pytest.raises(Undocumented, match="not documented"):
        check.check("get", "/api/v1/nothing", 404, "text/html", None)
    # Pages of the web UI are left out of the document, and of the check.
    check.check("get", "/workflows", 200, "text/html", None)


def test_literal_paths_win_over_templates() -> None:
    check = ResponseCheck()
    user = (
        b'{"name":"me","admin":false,"createdAt":"2026-01-01T00:00:00Z",'
        b'"limits":{"maxWorkflows":null,"maxInFlightActions":null,"submissionsPerMinute":null,"maxStorageBytes":null},'
        b'"ownLimits":{"maxWorkflows":null,"maxInFlightActions":null,"submissionsPerMinute":null,"maxStorageBytes":null}}'
    )
    check.check("get", "/api/v1/me", 200, "application/json", user)
    # Read as `/api/v1/users/{name}` it would document a 403; `/api/v1/me` has none.
    with pytest.raises(Undocumented, match="status not documented"):
        check.check("get", "/api/v1/me", 403, problems.PROBLEM_JSON, b"{}")

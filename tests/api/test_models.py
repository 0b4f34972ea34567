"""The typed models: the OpenAPI components come from them, and they read request bodies."""

from __future__ import annotations

from typing import Any

import pytest

from pingo.api import documents, models, openapi

from .conftest import Api

#: The schemas written by hand: bodies another module validates (issue 14 leaves them).
HAND_WRITTEN = {"Workflow", "ScheduleRequest", "Trigger", "Webhook", "CallbackBody"}


def test_components_are_the_models_schemas_and_a_few_written_by_hand() -> None:
    components = openapi.document()["components"]["schemas"]
    generated = models.schemas()
    assert set(components) == set(generated) | HAND_WRITTEN
    for name, schema in generated.items():
        assert components[name] == schema, name
    # Every documented model is there under its own name.
    assert {model.__name__ for model in models.DOCUMENTED} <= set(generated)


def test_hidden_fields_are_left_out_and_nulls_are_sent() -> None:
    assert documents.encode(models.SharedWith(name="step")) == b'{"name":"step"}'
    node = models.LineageNode(id="gone", state=None)
    assert documents.encode(node) == b'{"id":"gone","state":null}'
    edge = models.LineageEdge(parent="a", child="b")
    assert documents.as_dict(edge) == {"from": "a", "to": "b"}


async def _problem(response: Any, status: int = 422) -> dict[str, Any]:
    assert response.status == status, await response.text()
    problem: dict[str, Any] = await response.json()
    assert problem["code"] == "VALIDATION_FAILED"
    return problem


def _issues(problem: dict[str, Any]) -> dict[str, str]:
    return {issue["pointer"]: issue["code"] for issue in problem["errors"]}


async def test_every_issue_of_a_new_user_is_listed(api: Api) -> None:
    response = await api.client.post(
        "/api/v1/users",
        json={"name": "no spaces", "admin": "yes", "extra": 1},
        headers=api.auth("admin"),
    )
    assert _issues(await _problem(response)) == {
        "/name": "INVALID_USER_NAME",
        "/admin": "SCHEMA_VIOLATION",
        "/extra": "SCHEMA_VIOLATION",
    }


@pytest.mark.parametrize("name", ["bob\n", "user:bob", "-bob", "b" * 65])
async def test_user_names_match_the_whole_pattern(api: Api, name: str) -> None:
    response = await api.client.post(
        "/api/v1/users", json={"name": name}, headers=api.auth("admin")
    )
    assert _issues(await _problem(response)) == {"/name": "INVALID_USER_NAME"}


async def test_every_issue_of_a_limits_update_is_listed(users_api: Api) -> None:
    api = users_api
    response = await api.client.patch(
        "/api/v1/users/alice",
        json={"limits": {"maxWorkflows": 0, "bogus": 1, "submissionsPerMinute": "9"}, "x": 2},
        headers=api.auth("admin"),
    )
    problem = await _problem(response)
    assert _issues(problem) == {
        "/limits/maxWorkflows": "INVALID_LIMIT",
        "/limits/submissionsPerMinute": "INVALID_LIMIT",
        "/limits/bogus": "SCHEMA_VIOLATION",
        "/x": "SCHEMA_VIOLATION",
    }
    by_pointer = {issue["pointer"]: issue["message"] for issue in problem["errors"]}
    assert "from 1 to" in by_pointer["/limits/maxWorkflows"]


async def test_an_integral_float_is_an_integer_as_json_schema_says(users_api: Api) -> None:
    api = users_api
    response = await api.client.patch(
        "/api/v1/users/alice",
        json={"limits": {"maxWorkflows": 3.0, "maxInFlightActions": None}},
        headers=api.auth("admin"),
    )
    assert response.status == 200, await response.text()
    own = (await response.json())["ownLimits"]
    assert own == {"maxWorkflows": 3, "maxInFlightActions": None, "submissionsPerMinute": None,
                   "maxStorageBytes": None}  # fmt: skip

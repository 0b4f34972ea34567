"""Bodies whose text cannot be encoded back (a lone surrogate in a key) still get a problem.

JSON allows `"\\ud800"`, which decodes to a lone surrogate: no UTF-8 encoder takes it.
The problem that names the offending key must still be encodable (a 4xx, never a 500).
"""

from __future__ import annotations

import pytest

from .conftest import Api

#: A JSON text whose only key is a lone surrogate, spelled as JSON's escape.
LONE_SURROGATE_KEY = b'{"\\ud800": 1}'


@pytest.mark.parametrize("route", ["/api/v1/workflows", "/api/v1/schedules", "/api/v1/users"])
async def test_a_lone_surrogate_key_gets_a_400_problem(api: Api, route: str) -> None:
    response = await api.client.post(
        route,
        data=LONE_SURROGATE_KEY,
        headers={**api.auth("admin"), "Content-Type": "application/json"},
    )
    text = await response.text()
    assert response.status == 400, text
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["status"] == 400
    assert problem["code"] != "INTERNAL"
    # The pointer (or message) names the key, escaped rather than dropped.
    assert "\\ud800" in text or "\\\\ud800" in text, text


async def test_a_lone_surrogate_in_a_nested_key_gets_a_problem(api: Api) -> None:
    body = (
        b'{"name": "w", "startActionId": 1, "endActionId": 1, "actions": [{"id": 1,'
        b' "name": "a", "type": "command-line", "command": ["true"],'
        b' "env": {"\\ud800": "v"}}]}'
    )
    response = await api.client.post(
        "/api/v1/workflows",
        data=body,
        headers={**api.auth("admin"), "Content-Type": "application/json"},
    )
    text = await response.text()
    assert 400 <= response.status < 500, text
    problem = await response.json()
    assert problem["code"] != "INTERNAL"

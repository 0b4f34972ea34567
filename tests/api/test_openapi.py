"""The OpenAPI document: valid, covering every route, built on schemas/workflow.schema.json."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import referencing
from openapi_spec_validator import validate
from referencing.jsonschema import DRAFT202012

from pingo import ui
from pingo.api import openapi
from pingo.api.app import create_app

from .conftest import REPO, Api, chain, make_settings

_PARAM = re.compile(r"\{[^}]+\}")


def _normalize(path: str) -> str:
    return _PARAM.sub("{}", path)


async def test_served_document_is_valid_openapi_31(api: Api) -> None:
    response = await api.client.get("/openapi.json")
    assert response.status == 200
    document = await response.json()
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_route_of_the_app_is_documented_and_nothing_else(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path))
    served: set[tuple[str, str]] = set()
    for route in app.router.routes():
        if route.method == "HEAD" or ui.is_ui_route(route):
            continue
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert path, route
        served.add((_normalize(path), route.method.lower()))
    documented = {
        (_normalize(path), method)
        for path, item in openapi.document()["paths"].items()
        for method in item
    }
    assert served == documented


def test_workflow_request_schema_is_the_language_schema() -> None:
    source = json.loads((REPO / "schemas" / "workflow.schema.json").read_text())
    embedded = openapi.document()["components"]["schemas"]["Workflow"]
    submit = openapi.document()["paths"]["/api/v1/workflows"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Workflow"
    }
    # The same schema, only its local references re-rooted where it now lives.
    rebased = json.loads(
        json.dumps(source).replace('"#/$defs/', '"#/components/schemas/Workflow/$defs/')
    )
    rebased.pop("$id", None)
    rebased.pop("$schema", None)
    assert embedded == rebased


def test_embedded_schema_validates_like_the_language() -> None:
    """Resolved inside the OpenAPI document, the schema accepts and rejects what the file does."""
    root = {**openapi.document(), "$id": "urn:pingo:openapi"}
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        "urn:pingo:openapi",
        referencing.Resource.from_contents(root, default_specification=DRAFT202012),
    )
    resources = jsonschema.Draft202012Validator(
        {"$ref": "urn:pingo:openapi#/components/schemas/Workflow"}, registry=registry
    )
    good: dict[str, Any] = chain("schema")
    assert list(resources.iter_errors(good)) == []
    bad = {**good, "bogus": 1}
    assert list(resources.iter_errors(bad))
    wordcount = json.loads((REPO / "examples" / "wordcount.json").read_text())
    assert list(resources.iter_errors(wordcount)) == []


async def test_docs_page_is_self_contained(api: Api) -> None:
    response = await api.client.get("/docs")
    assert response.status == 200
    assert response.content_type == "text/html"
    page = await response.text()
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']https?://""", page)
    for path in openapi.document()["paths"]:
        assert path in page
    assert 'id="MALFORMED_JSON"' in page  # problem types point here


async def test_health_readiness_and_metrics(api: Api) -> None:
    assert await (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert await (await api.client.get("/readyz")).json() == {"status": "ready", "sandbox": "on"}
    await api.wait((await api.submit(chain("metrics")))["id"])
    metrics = await api.client.get("/metrics")
    assert metrics.status == 200
    assert metrics.headers["Content-Type"].startswith("text/plain")
    text = await metrics.text()
    for name in (
        "pingo_workflow_submissions",
        "pingo_action_transitions",
        "pingo_dispatch_seconds",
        "pingo_callback_seconds",
    ):
        assert name in text, name
    # Declared but never recorded, it was removed (issue 14): nothing shows an empty metric.
    assert "pingo_store_operation_seconds" not in text

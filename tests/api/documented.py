"""Every JSON answer the API tests receive, checked against the OpenAPI document.

`ResponseCheck.middleware` is an aiohttp client middleware: the API tests' client
(`aiohttp_client` in `conftest.py`) runs every response through it, so a test that
reads a body the document does not describe fails where it made the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
from referencing.jsonschema import DRAFT202012

from pingo.api import openapi, problems

_ROOT = "urn:pingo:openapi"
_JSON_TYPES = frozenset({"application/json", problems.PROBLEM_JSON})
_PARAM = re.compile(r"\{[^}/]+\}")


class Undocumented(AssertionError):
    """A response the OpenAPI document does not describe."""


def _escape(token: str) -> str:
    """`token` as one RFC 6901 reference token."""
    return token.replace("~", "~0").replace("/", "~1")


def _closed(node: Any) -> Any:
    """A copy of `node` whose objects with listed properties take no others.

    The document leaves response objects open, as JSON Schema does by default; the
    check closes them, so that a field the server sends but the document does not
    describe fails too. Free-form objects (no `properties`) stay free.
    """
    if isinstance(node, dict):
        closed = {key: _closed(value) for key, value in node.items()}
        if "properties" in node and not {"additionalProperties", "unevaluatedProperties"} & set(
            node
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(node, list):
        return [_closed(item) for item in node]
    return node


def _pattern(template: str) -> re.Pattern[str]:
    """What a concrete (still percent-encoded) path of `template` looks like."""
    literals = (re.escape(piece) for piece in _PARAM.split(template))
    return re.compile("^" + "[^/]+".join(literals) + "$")


@dataclass(frozen=True, slots=True)
class _Operation:
    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str]


@dataclass
class ResponseCheck:
    """Checks answers against one OpenAPI document; counts what it checked."""

    document: Mapping[str, Any] = field(default_factory=openapi.document)
    checked: int = 0

    def __post_init__(self) -> None:
        root = {**_closed(self.document), "$id": _ROOT}
        self._registry: referencing.Registry[Any] = referencing.Registry().with_resource(
            _ROOT, referencing.Resource.from_contents(root, default_specification=DRAFT202012)
        )
        # Literal paths before templated ones, so `/api/v1/me` never reads as `{name}`.
        self._operations = sorted(
            (
                _Operation(
                    template,
                    _pattern(template),
                    frozenset(item),
                )
                for template, item in self.document["paths"].items()
            ),
            key=lambda op: op.template.count("{"),
        )
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def _validator(self, pointer: str) -> jsonschema.Draft202012Validator:
        validator = self._validators.get(pointer)
        if validator is None:
            validator = jsonschema.Draft202012Validator(
                {"$ref": f"{_ROOT}#{pointer}"},
                registry=self._registry,
                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
            )
            self._validators[pointer] = validator
        return validator

    def _template(self, path: str) -> str | None:
        for operation in self._operations:
            if operation.pattern.match(path):
                return operation.template
        return None

    def check(
        self, method: str, path: str, status: int, content_type: str, body: bytes | None
    ) -> None:
        """Raise `Undocumented` unless the document describes this answer.

        `body` is None for a body the check need not read (not JSON).
        """
        method = method.lower()
        template = self._template(path)
        operation = None
        if template is not None:
            operation = self.document["paths"][template].get(method)
        if operation is None:
            if content_type == problems.PROBLEM_JSON:
                # No such route or method (aiohttp's 404 or 405): a problem all the same.
                self._validate("/components/schemas/Problem", body, f"{method} {path} → {status}")
            elif path.startswith("/api/"):
                raise Undocumented(f"{method} {path} → {status} {content_type}: not documented")
            # Anything else is a web UI page, which the document leaves out.
            return
        where = f"{method} {template} → {status}"
        response = operation["responses"].get(str(status))
        if response is None:
            raise Undocumented(f"{where}: status not documented")
        content = response.get("content", {})
        if not content:
            if body:
                raise Undocumented(f"{where}: documented without a body, sent {content_type}")
            return
        if content_type not in content:
            raise Undocumented(f"{where}: {content_type} not documented (only {sorted(content)})")
        if content_type in _JSON_TYPES:
            tokens = (template, method, "responses", str(status), "content", content_type)
            pointer = "/paths/" + "/".join(map(_escape, tokens)) + "/schema"
            self._validate(pointer, body, where)

    def _validate(self, pointer: str, body: bytes | None, where: str) -> None:
        assert body is not None, where
        value = json.loads(body)
        errors = sorted(self._validator(pointer).iter_errors(value), key=lambda e: e.path)
        if errors:
            listed = "; ".join(f"/{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
            raise Undocumented(f"{where}: body does not match its schema: {listed}")
        self.checked += 1

    async def middleware(
        self, request: ClientRequest, handler: ClientHandlerType
    ) -> ClientResponse:
        """Check the answer to `request` before the test sees it."""
        response = await handler(request)
        if request.method == "HEAD":
            return response
        content_type = response.content_type
        # Only JSON is read here: a stream (server-sent events) would never end.
        body = await response.read() if content_type in _JSON_TYPES else None
        self.check(request.method, request.url.raw_path, response.status, content_type, body)
        return response

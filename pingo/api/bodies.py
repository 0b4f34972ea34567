"""Reading request bodies and query parameters, with problem+json errors for bad ones."""

from __future__ import annotations

import asyncio
import enum
import functools
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import jsonschema
import msgspec
from aiohttp import web

from pingo import errors, untrusted
from pingo.api import documents, models, problems, runtime

#: Deeper than any real workflow; shallow enough that nothing downstream recurses too far.
MAX_DEPTH = 64

E = TypeVar("E", bound=enum.Enum)
M = TypeVar("M", bound=msgspec.Struct)


def _malformed(message: str, pointer: str = "") -> problems.BadRequest:
    issue = errors.ValidationIssue("MALFORMED_JSON", message, pointer)
    return problems.BadRequest(
        f"the body is not valid JSON: {message}", [issue], code="MALFORMED_JSON"
    )


def is_json_content_type(content_type: str) -> bool:
    """application/json or any application/*+json."""
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    """The request's JSON body; None when `optional` and the body is empty.

    Raises 415 for a non-JSON content type, 413 past the body limit (aiohttp),
    400 MALFORMED_JSON for undecodable, invalid or too deeply nested JSON.
    """
    raw = await read_json_bytes(request, optional=optional)
    if raw is None:
        return None
    if len(raw) > untrusted.PIECEWISE_CHARS:
        # Seconds of CPU for a 10 MB workflow: in a thread, in pieces, so the event
        # loop keeps serving everyone else meanwhile (issue 13).
        return await asyncio.to_thread(decode_json, raw)
    return decode_json(raw)


async def read_json_bytes(request: web.Request, *, optional: bool = False) -> bytes | None:
    """`read_json`'s body undecoded (`decode_json` decodes it, wherever that runs)."""
    limit = runtime.settings(request).max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        # Refuse before reading a byte: an oversized body is never buffered.
        raise problems.PayloadTooLarge(
            f"the body has {request.content_length} bytes; this server accepts at most {limit}"
        )
    if optional and not request.body_exists:
        return None
    if not is_json_content_type(request.content_type):
        raise problems.UnsupportedMediaType(
            f"send the body as application/json, not {request.content_type or 'no content type'}"
        )
    if request.charset not in (None, "utf-8", "UTF-8"):
        raise problems.UnsupportedMediaType("JSON bodies must be UTF-8")
    raw = await request.read()
    if optional and not raw.strip():
        return None
    return raw


def decode_json(raw: bytes) -> Any:
    """The body's JSON value, or 400 MALFORMED_JSON."""
    try:
        text = untrusted.utf8(raw)
    except UnicodeDecodeError as exc:
        raise _malformed("the body is not UTF-8") from exc
    try:
        return untrusted.loads(text, max_depth=MAX_DEPTH)
    except RecursionError as exc:
        raise _malformed("nested too deeply") from exc
    except untrusted.MalformedJSON as exc:
        raise _malformed(str(exc), exc.pointer) from exc


def read_model(value: Any, model: type[M]) -> M:
    """A decoded JSON body as `model`, or 422 VALIDATION_FAILED listing every issue."""
    try:
        return msgspec.convert(value, model)
    except msgspec.ValidationError:
        pass  # msgspec names the first issue only: the schema lists them all, below
    issues = model_issues(value, model)
    if issues:
        raise errors.ValidationFailed(issues)
    # Valid for the schema, refused by msgspec: JSON Schema counts 3.0 as an integer.
    # Lax conversion takes it; the schema has already refused every other mismatch.
    return msgspec.convert(value, model, strict=False)


def model_issues(value: Any, model: type[msgspec.Struct]) -> list[errors.ValidationIssue]:
    """Every way `value` breaks `model`'s JSON Schema, each with its JSON pointer."""
    found = [issue for error in _validator(model).iter_errors(value) for issue in _issues(error)]
    return sorted(found, key=lambda issue: issue.pointer)


@functools.cache
def _validator(model: type[msgspec.Struct]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(msgspec.json.schema(model))


def _issues(error: jsonschema.ValidationError) -> list[errors.ValidationIssue]:
    """The issues one schema error stands for (one per unknown or missing field)."""
    token = untrusted.pointer_token
    at = "".join(f"/{token(part)}" for part in error.absolute_path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    code = schema.get(models.ISSUE_CODE, "SCHEMA_VIOLATION")
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, Mapping):
        known = schema.get("properties", {})
        return [
            errors.ValidationIssue(code, f"unknown field {key!r}", f"{at}/{token(key)}")
            for key in instance
            if key not in known
        ]
    if error.validator == "required" and isinstance(instance, Mapping):
        return [
            errors.ValidationIssue(code, f"{name} is required", f"{at}/{token(name)}")
            for name in error.validator_value
            if name not in instance
        ]
    if error.validator == "type":
        message = "the body must be an object" if not at else error.message
        return [errors.ValidationIssue(code, message, at)]
    # A field's description says what it takes, better than "… is not valid under any
    # of the given schemas" does.
    message = schema.get("description") or error.message
    return [errors.ValidationIssue(code, str(message), at)]


def encode_json(data: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return documents.encode(data)


def raw_json_response(
    body: bytes, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A response of already serialized JSON."""
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


#: Serialized JSON longer than this is streamed by `send_json`, in slices this long.
STREAMED_BYTES = 1 << 18


async def send_json(
    request: web.Request,
    body: bytes,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Answer `request` with serialized JSON: a long body streamed in slices (issue 13).

    A `web.Response` hands its whole body to one socket `send`: for a 100,000-action
    document (30 MB) that call alone kept the event loop away for 100 to 200 ms. Written
    a slice at a time, each write waits for the socket to drain. And aiohttp keeps a
    connection's last `web.Response` until its next request, body included: nothing of
    a streamed one outlives the handler.
    """
    if len(body) <= STREAMED_BYTES:
        return raw_json_response(body, status=status, headers=headers)
    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = "application/json"
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(view), STREAMED_BYTES):
        await response.write(view[start : start + STREAMED_BYTES])
    await response.write_eof()
    return response


def json_response(
    data: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response (compact, UTF-8)."""
    return raw_json_response(encode_json(data), status=status, headers=headers)


_INTEGER = re.compile(r"-?[0-9]+")


def _invalid(name: str, message: str) -> problems.InvalidParameter:
    issue = errors.ValidationIssue("INVALID_PARAMETER", message, f"/{name}")
    return problems.InvalidParameter(f"query parameter {name!r}: {message}", [issue])


def query_int(
    request: web.Request,
    name: str,
    *,
    default: int | None,
    minimum: int,
    maximum: int | None = None,
) -> int | None:
    """An integer query parameter within bounds (400 INVALID_PARAMETER otherwise)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        # int() would also take " 7", "1_000" and non-ASCII digits: not JSON integers.
        raise _invalid(name, f"expected an integer, got {raw!r}")
    value = int(raw)
    # Every integer the server takes is one the stores can hold (signed 64-bit).
    high = untrusted.INT64_MAX if maximum is None else min(maximum, untrusted.INT64_MAX)
    if value < max(minimum, untrusted.INT64_MIN) or value > high:
        raise _invalid(name, f"must be between {minimum} and {high}, got {value}")
    return value


def query_bool(request: web.Request, name: str) -> bool:
    """A boolean query parameter: true/false/1/0/yes/no (absent is false)."""
    raw = request.query.get(name)
    if raw is None:
        return False
    # An empty value is refused like any other unknown one: the OpenAPI document
    # declares booleans, and "" is none of them.
    raw = raw.strip().lower()
    if raw in ("false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise _invalid(name, f"expected true or false, got {raw!r}")


def query_enum(request: web.Request, name: str, enum_type: type[E]) -> E | None:
    """An enum-valued query parameter (by value), or None when absent."""
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return enum_type(raw.upper())
    except ValueError:
        allowed = ", ".join(str(m.value) for m in enum_type)
        raise _invalid(name, f"expected one of {allowed}, got {raw!r}") from None


def path_int(request: web.Request, name: str) -> int:
    """An integer path segment (404 when it is not one: no such resource)."""
    raw = request.match_info[name]
    if not _INTEGER.fullmatch(raw):
        raise errors.NotFound(f"no {name} {raw!r}")
    value = int(raw)
    if not untrusted.INT64_MIN <= value <= untrusted.INT64_MAX:
        raise errors.NotFound(f"no {name} {raw!r}")  # no store holds such an id
    return value

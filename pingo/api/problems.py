"""RFC 9457 problem details: the one middleware that turns errors into HTTP answers.

Every error leaves the API as `application/problem+json` with `type, title,
status, detail, code` (plus `errors`, the validator's `{code, message, pointer}`
list, when a document was rejected). `PingoError`s keep their stable `code`;
aiohttp's own HTTP errors (unknown route, wrong method, body too large) get one
too; anything else is a 500 that names a log reference and leaks nothing.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus

import msgspec
from aiohttp import web

from pingo import errors
from pingo.api import models

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(errors.ValidationFailed):
    """The request is malformed."""

    code = "BAD_REQUEST"

    def __init__(
        self,
        message: str,
        issues: Sequence[errors.ValidationIssue] = (),
        *,
        code: str | None = None,
    ) -> None:
        super().__init__(issues, message)
        self.code = code or type(self).code


class InvalidParameter(BadRequest):
    """A query parameter is not valid."""

    code = "INVALID_PARAMETER"


class UnsupportedMediaType(errors.PingoError):
    """The request body must be JSON (Content-Type: application/json)."""

    code = "UNSUPPORTED_MEDIA_TYPE"


class PayloadTooLarge(errors.PingoError):
    """The request body is larger than the server accepts."""

    code = "PAYLOAD_TOO_LARGE"


class UnknownExecutor(errors.ValidationFailed):
    """An action type has no executor on this node."""

    code = "UNKNOWN_EXECUTOR"

    def __init__(self, issues: Sequence[errors.ValidationIssue]) -> None:
        super().__init__(issues)
        self.code = type(self).code


#: Error class → HTTP status; the first match in this order wins (subclasses first).
_STATUS_BY_ERROR: tuple[tuple[type[errors.PingoError], HTTPStatus], ...] = (
    (BadRequest, HTTPStatus.BAD_REQUEST),
    (errors.ValidationFailed, HTTPStatus.UNPROCESSABLE_ENTITY),
    (errors.AmbiguousId, HTTPStatus.BAD_REQUEST),
    (errors.NotFound, HTTPStatus.NOT_FOUND),
    (errors.Conflict, HTTPStatus.CONFLICT),
    (errors.Unauthorized, HTTPStatus.UNAUTHORIZED),
    (errors.Forbidden, HTTPStatus.FORBIDDEN),
    (UnsupportedMediaType, HTTPStatus.UNSUPPORTED_MEDIA_TYPE),
    (PayloadTooLarge, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
    (errors.TooManyRequests, HTTPStatus.TOO_MANY_REQUESTS),
    (errors.StoreUnavailable, HTTPStatus.SERVICE_UNAVAILABLE),
    (errors.SubmissionInterrupted, HTTPStatus.SERVICE_UNAVAILABLE),
)

#: Codes for aiohttp's own HTTP errors (routing, methods, body size).
_CODE_BY_STATUS: dict[int, str] = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "VALIDATION_FAILED",
    429: "RATE_LIMITED",
    503: "SERVICE_UNAVAILABLE",
}

#: Every code the API may answer with, documented on /docs (anchors are the codes).
DOCUMENTED_CODES: dict[str, str] = {
    "BAD_REQUEST": "The request is malformed (400).",
    "MALFORMED_JSON": "The body is not JSON, not UTF-8, or nested too deeply (400).",
    "INVALID_PARAMETER": "A query parameter or cursor is not valid (400).",
    "UNAUTHORIZED": "No bearer token, an unknown one, or a callback without its token (401).",
    "FORBIDDEN": "The token does not allow this request, or a callback token is forged (403).",
    "AMBIGUOUS_ID": "An id prefix that starts several of the ids you may see (400).",
    "NOT_FOUND": "No such resource, or one that belongs to another user (404).",
    "METHOD_NOT_ALLOWED": "The route exists but not with this method (405).",
    "CONFLICT": "The resource is not in a state that allows this request (409).",
    "INVALID_TRANSITION": "The state machine does not allow this change (409).",
    "STALE_CALLBACK": "A callback for an attempt that is no longer the current one (409).",
    "PAYLOAD_TOO_LARGE": "The body exceeds PINGO_MAX_BODY_BYTES (413).",
    "UNSUPPORTED_MEDIA_TYPE": "The body must be sent as application/json (415).",
    "VALIDATION_FAILED": "The workflow document is invalid; `errors` lists every issue (422).",
    "UNKNOWN_EXECUTOR": "An action type has no executor on this node (422).",
    "IDEMPOTENCY_KEY_REUSED": "The Idempotency-Key was used for a different document (422).",
    "RATE_LIMITED": "Over a per-user or server cap (submissions a minute, open event streams,"
    " running verifications); see Retry-After (429).",
    "TOO_MANY_WORKFLOWS": "The user has their limit of RUNNING workflows; see Retry-After (429).",
    "TOO_MANY_SCHEDULES": "The user has PINGO_USER_MAX_SCHEDULES schedules; delete one (403).",
    "INTERNAL": "An unexpected error; the server log has the reference given (500).",
    "STORE_UNAVAILABLE": "The state store cannot be reached (503).",
    "SUBMISSION_INTERRUPTED": (
        "The process planning a big workflow ended first, or planning passed its deadline (503)."
    ),
}


#: RFC 9110's names where Python's `HTTPStatus` (before 3.13) still has RFC 7231's.
_RFC9110_TITLES: dict[int, str] = {413: "Content Too Large", 422: "Unprocessable Content"}


def status_title(status: int) -> str:
    """The problem `title`: the status's name in RFC 9110, the HTTP semantics in force."""
    return _RFC9110_TITLES.get(status) or HTTPStatus(status).phrase


def problem_type(code: str) -> str:
    """The problem `type` URI: the code's entry on the /docs page."""
    return f"/docs#{code}"


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    issues: Sequence[errors.ValidationIssue] = (),
    headers: dict[str, str] | None = None,
    instance: str | None = None,
) -> web.Response:
    """An `application/problem+json` response.

    Every response that reports an error is built here, so here alone its text is made
    encodable: a detail, message or pointer may quote the client's input, and JSON lets
    that hold a lone surrogate (`"\\ud800"`), which no UTF-8 encoder takes. Such
    characters are written as their escape (`\\ud800`) rather than turn a 4xx into a 500.
    """
    try:
        encoded = _encode_problem(status, code, detail, issues, instance, _same)
    except UnicodeEncodeError:
        encoded = _encode_problem(status, code, detail, issues, instance, encodable)
    return web.Response(
        status=status,
        body=encoded,
        content_type=PROBLEM_JSON,
        headers=headers,
    )


def encodable(text: str) -> str:
    """`text` with whatever UTF-8 cannot encode (lone surrogates) as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _same(text: str) -> str:
    return text


def _encode_problem(
    status: int,
    code: str,
    detail: str,
    issues: Sequence[errors.ValidationIssue],
    instance: str | None,
    text: Callable[[str], str],
) -> bytes:
    body = models.Problem(
        type=problem_type(text(code)),
        title=status_title(status),
        status=status,
        detail=text(detail),
        code=text(code),
        instance=msgspec.UNSET if instance is None else text(instance),
        errors=[
            models.ValidationIssue(
                code=text(i.code), message=text(i.message), pointer=text(i.pointer)
            )
            for i in issues
        ]
        if issues
        else msgspec.UNSET,
    )
    return msgspec.json.encode(body)


def status_for(exc: errors.PingoError) -> int:
    """The HTTP status of a Pingo error (500 for anything unmapped)."""
    if exc.code == "MALFORMED_JSON":
        # The language reports a body that is no JSON document at all this way.
        return int(HTTPStatus.BAD_REQUEST)
    for cls, status in _STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return int(status)
    return int(HTTPStatus.INTERNAL_SERVER_ERROR)


def _from_pingo_error(request: web.Request, exc: errors.PingoError) -> web.Response:
    status = status_for(exc)
    headers: dict[str, str] = {}
    if status == HTTPStatus.UNAUTHORIZED:
        headers["WWW-Authenticate"] = 'Bearer realm="pingo"'
    if isinstance(exc, errors.TooManyRequests):
        headers["Retry-After"] = exc.retry_after
    if status >= 500 and status != HTTPStatus.SERVICE_UNAVAILABLE:
        return _internal(request, exc)
    issues = exc.issues if isinstance(exc, errors.ValidationFailed) else ()
    return problem_response(
        status, exc.code, exc.message, issues=issues, headers=headers, instance=request.path
    )


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    status = exc.status
    code = _CODE_BY_STATUS.get(status, "INTERNAL" if status >= 500 else "BAD_REQUEST")
    headers: dict[str, str] = {}
    if isinstance(exc, web.HTTPMethodNotAllowed):
        headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        detail = f"{request.method} is not allowed here; use {headers['Allow']}"
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        detail = f"the request body is too large ({exc.text}); see PINGO_MAX_BODY_BYTES"
    elif isinstance(exc, web.HTTPNotFound):
        detail = f"no resource at {request.path}"
    else:
        detail = exc.text or exc.reason
    return problem_response(status, code, detail, headers=headers, instance=request.path)


def _internal(request: web.Request, exc: BaseException) -> web.Response:
    # The reference ties the client's answer to the server log without leaking internals.
    reference = secrets.token_hex(6)
    logger.error(
        "unhandled error on %s %s (reference %s)",
        request.method,
        request.path,
        reference,
        exc_info=exc,
        extra={"event": "api_internal_error", "reference": reference},
    )
    return problem_response(
        500,
        "INTERNAL",
        f"an unexpected error occurred; the server log has the details (reference {reference})",
        instance=request.path,
    )


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error as problem+json."""
    try:
        return await handler(request)
    except errors.PingoError as exc:
        return _from_pingo_error(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(request, exc)
    except RecursionError as exc:
        # A document nested deeply enough to exhaust the stack somewhere past our
        # own depth check is still the client's fault, not a crash.
        logger.warning(
            "recursion error on %s %s", request.method, request.path,
            extra={"event": "api_recursion_error"}, exc_info=exc,
        )  # fmt: skip
        return problem_response(
            400, "MALFORMED_JSON", "the document is nested too deeply", instance=request.path
        )
    except Exception as exc:
        return _internal(request, exc)

"""`/api/v1/callbacks`: the cluster reports an action's progress, signed per attempt.

Two styles, one meaning:

- `POST /callbacks/{callbackId}/{running|success|failed|killed}?attempt=N&token=T`
  (the Spark wrapper and anything that can POST; an optional JSON body carries
  `error` for `failed` and `runtimeS` for `success`);
- `GET /callbacks/{callbackId}?attempt=N&token=T&status=SUCCEEDED|FAILED|KILLED`,
  Hadoop's job-end notification, which can only GET a URL in which it
  substitutes `$jobStatus`: the executor hands it
  `…/callbacks/{id}?attempt=N&token=T&status=$jobStatus`.

The token is an HMAC of the callback id and attempt (`pingo.callbacks.tokens`):
missing is 401, forged is 403, and neither changes anything. A callback for an
attempt that is no longer current is 409 (`STALE_CALLBACK`), also changing nothing.
Callbacks are idempotent: the same one twice answers the same.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web

from pingo import errors
from pingo.api import bodies, documents, problems, runtime
from pingo.callbacks import tokens
from pingo.store.protocol import ActionRecord

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

KINDS = ("running", "success", "failed", "killed")
#: Hadoop's `$jobStatus` values (and RUNNING, for symmetry) → callback kind.
STATUS_KINDS = {
    "RUNNING": "running",
    "SUCCEEDED": "success",
    "FAILED": "failed",
    "KILLED": "killed",
}


def _verified_attempt(request: web.Request, callback_id: str) -> int:
    """The attempt the request's token was signed for; 401/400/403 otherwise."""
    token = request.query.get("token")
    if not token:
        raise errors.Unauthorized("a callback needs its ?token=")
    attempt = bodies.query_int(request, "attempt", default=None, minimum=1)
    if attempt is None:
        issue = errors.ValidationIssue("INVALID_PARAMETER", "required", "/attempt")
        raise problems.InvalidParameter("a callback needs its ?attempt=", [issue])
    if not tokens.verify(runtime.node(request).secret, callback_id, attempt, token):
        logger.warning(
            "forged callback token for %s attempt %d",
            callback_id,
            attempt,
            extra={"event": "callback_forged", "callback_id": callback_id},
        )
        raise errors.Forbidden("the callback token is not valid for this callback and attempt")
    return attempt


def _runtime_s(body: Any) -> float | None:
    if not isinstance(body, dict):
        return None
    raw = body.get("runtimeS", body.get("runtimeSeconds"))
    if raw is None or isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    # float("inf") and float("nan") parse, but neither is a runtime (nor strict JSON).
    return value if math.isfinite(value) and value >= 0 else None


def _error_text(body: Any, default: str) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]:
        return str(body["error"])[:10_000]
    return default


async def _report(
    request: web.Request, callback_id: str, attempt: int, kind: str, body: Any
) -> ActionRecord:
    # OutcomeService times each kind in pingo_callback_seconds itself; the node's
    # reporter also frees the action's slot on this node, as in-process reports do.
    service = runtime.node(request).reporter
    if kind == "running":
        return await service.running(callback_id, attempt)
    if kind == "success":
        return await service.success(callback_id, attempt, runtime_s=_runtime_s(body))
    if kind == "failed":
        error = _error_text(body, f"the executor reported attempt {attempt} failed")
        return await service.failed(callback_id, attempt, error)
    return await service.killed(callback_id, attempt)


@routes.post(PREFIX + "/callbacks/{callback_id}/{kind}", name="post_callback")
async def post_callback(request: web.Request) -> web.Response:
    """An executor reports that an attempt started, succeeded, failed or was killed."""
    callback_id = request.match_info["callback_id"]
    kind = request.match_info["kind"]
    if kind not in KINDS:
        raise errors.NotFound(f"no callback kind {kind!r}; use one of {', '.join(KINDS)}")
    attempt = _verified_attempt(request, callback_id)
    body = await bodies.read_json(request, optional=True)
    action = await _report(request, callback_id, attempt, kind, body)
    return bodies.json_response(documents.callback_answer(action))


@routes.get(PREFIX + "/callbacks/{callback_id}", name="get_callback")
async def get_callback(request: web.Request) -> web.Response:
    """Hadoop's job-end notification: `?status=SUCCEEDED|FAILED|KILLED`."""
    callback_id = request.match_info["callback_id"]
    attempt = _verified_attempt(request, callback_id)
    status = request.query.get("status", "").upper()
    kind = STATUS_KINDS.get(status)
    if kind is None:
        issue = errors.ValidationIssue(
            "INVALID_PARAMETER", f"expected one of {', '.join(STATUS_KINDS)}", "/status"
        )
        raise problems.InvalidParameter(f"unknown job status {status!r}", [issue])
    default_error = {"error": f"the cluster reported the job {status}"}
    action = await _report(request, callback_id, attempt, kind, default_error)
    return bodies.json_response(documents.callback_answer(action))

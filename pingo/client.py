"""`pingo.client.Client`: a small synchronous HTTP client of the Pingo API.

Built on the standard library (`urllib`), so scripts and the CLI need no event
loop. Configuration comes from the environment, as the CLI's does:

- `PINGO_URL` (default `http://$PINGO_HOST:$PINGO_PORT`, i.e. http://127.0.0.1:8642);
- `PINGO_TOKEN` (default: the admin token file `$PINGO_HOME/admin.token`, read only
  when the URL's host is loopback: 127.0.0.0/8, ::1 or localhost).

Every error answer (RFC 9457 problem+json) raises `ApiError` with its `code`.
Redirects are never followed: the token would go wherever the redirect points, so
one is reported as an `ApiError` (code `REDIRECT`) naming its target.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pingo import config

#: Workflow states from which a workflow never moves again.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "KILLED"})
#: Action states that count as done in progress reports.
ACTION_DONE_STATES = ("FINISHED", "FAILED", "KILLED", "UPSTREAM_FAILED")


class ClientError(Exception):
    """The client could not get an answer from Pingo."""


class Unreachable(ClientError):
    """No Pingo server answers at the configured URL."""


@dataclass(frozen=True, slots=True)
class Issue:
    """One entry of a problem's `errors` list."""

    code: str
    message: str
    pointer: str


class ApiError(ClientError):
    """Pingo answered with an error (problem+json)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        title: str = "",
        issues: Sequence[Issue] = (),
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title
        self.issues = tuple(issues)

    def with_hint(self, hint: str) -> ApiError:
        """The same error with `hint` added to its detail."""
        return ApiError(
            self.status,
            self.code,
            f"{self.detail}; {hint}",
            title=self.title,
            issues=self.issues,
        )

    def describe(self) -> str:
        """The error on one line, then one line per issue (for humans)."""
        lines = [f"{self.code} ({self.status}): {self.detail}"]
        lines.extend(f"  {i.pointer or '/'}: {i.code}: {i.message}" for i in self.issues)
        return "\n".join(lines)


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """`PINGO_URL`, else built from `PINGO_HOST` and `PINGO_PORT`."""
    env = os.environ if environ is None else environ
    if env.get("PINGO_URL"):
        return env["PINGO_URL"].rstrip("/")
    host = env.get("PINGO_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        # A server bound to every interface is reached on loopback from this machine.
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = env.get("PINGO_PORT") or "8642"
    return f"http://{host}:{port}"


def token_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where the admin token is looked for: `$PINGO_HOME/admin.token` (or the default home)."""
    env = os.environ if environ is None else environ
    home = Path(env["PINGO_HOME"]).expanduser() if env.get("PINGO_HOME") else config.default_home()
    return home / "admin.token"


def is_loopback(url: str) -> bool:
    """Whether `url`'s host is this machine: 127.0.0.0/8, ::1 or localhost."""
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return False
    if host is None:
        return False
    if host.rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_token(environ: Mapping[str, str] | None = None) -> str | None:
    """`PINGO_TOKEN`, else the admin token file in `PINGO_HOME` (or the default home).

    The file is read only when the URL (`default_url`) is loopback: the local
    server's admin token is never sent to another machine that PINGO_URL names.
    """
    env = os.environ if environ is None else environ
    if env.get("PINGO_TOKEN"):
        return env["PINGO_TOKEN"].strip()
    if not is_loopback(default_url(env)):
        return None
    try:
        return token_file(env).read_text().strip() or None
    except OSError:
        return None


def _no_token_hint(path: Path | None) -> str:
    """Why no token was sent, naming the file that was looked for."""
    if path is None:
        return (
            "no token was sent (set PINGO_TOKEN; the admin token file is used only "
            "for a loopback PINGO_URL)"
        )
    try:
        found = "is empty" if path.is_file() else "does not exist"
    except OSError:
        found = "cannot be read"
    return f"no token was sent: PINGO_TOKEN is not set and {path} {found}"


def _problem(status: int, body: bytes) -> ApiError:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        text = body.decode("utf-8", "replace").strip()[:500]
        return ApiError(status, "HTTP_ERROR", text or f"HTTP {status}")
    issues = [
        Issue(str(i.get("code", "")), str(i.get("message", "")), str(i.get("pointer", "")))
        for i in data.get("errors") or []
        if isinstance(i, dict)
    ]
    return ApiError(
        status,
        str(data.get("code", "HTTP_ERROR")),
        str(data.get("detail", data.get("title", f"HTTP {status}"))),
        title=str(data.get("title", "")),
        issues=issues,
    )


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the answer comes back as the `HTTPError` it is."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


#: urllib's opener without redirect handling (the default one follows them with the
#: request's headers, Authorization included, to any host).
_OPENER = urllib.request.build_opener(_NoRedirects)


def _redirect(status: int, location: str | None, url: str) -> ApiError:
    """A redirect, refused: where it pointed and what to do instead."""
    target = urllib.parse.urljoin(url, location) if location else "nowhere"
    return ApiError(
        status,
        "REDIRECT",
        f"{url} redirects to {target}; redirects are not followed, so that the token is "
        "never sent elsewhere: set PINGO_URL to the server's own address",
    )


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True, slots=True)
class Client:
    """A Pingo API client. `Client.from_env()` reads PINGO_URL and PINGO_TOKEN.

    Built directly, it sends only the token it is given: the environment's token, or
    the admin token file, belongs to the environment's URL, not to `base_url`.
    """

    base_url: str = field(default_factory=default_url)
    token: str | None = None
    timeout_s: float = 60.0
    #: The token file that was looked for (named in the error when no token was found).
    token_file: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Client:
        """A client configured from `PINGO_URL`/`PINGO_HOST`/`PINGO_PORT` and `PINGO_TOKEN`."""
        token = default_token(environ)
        url = default_url(environ)
        looked_at = None if token or not is_loopback(url) else token_file(environ)
        return cls(base_url=url, token=token, token_file=looked_at)

    # ------------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw_body: bytes | None = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send one request; raise `ApiError` for an error answer, `Unreachable` for none."""
        with self._open(method, path, body, raw_body, query, headers) as answer:
            try:
                return Response(answer.status, dict(answer.headers.items()), answer.read())
            except OSError as exc:
                raise self._unreachable(exc) from exc

    def stream(
        self,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        chunk_bytes: int = 1 << 20,
    ) -> Iterator[bytes]:
        """GET `path` and yield its body a chunk at a time, never holding it whole (an
        action's log may be far larger than this process's memory)."""
        with self._open("GET", path, None, None, query, headers) as answer:
            while True:
                try:
                    chunk = answer.read(chunk_bytes)
                except OSError as exc:
                    raise self._unreachable(exc) from exc
                if not chunk:
                    return
                yield chunk

    def _unreachable(self, exc: BaseException) -> Unreachable:
        reason = getattr(exc, "reason", exc)
        return Unreachable(
            f"cannot reach Pingo at {self.base_url} ({reason}); is `pingo server` running? "
            "Set PINGO_URL to point elsewhere."
        )

    @contextlib.contextmanager
    def _open(
        self,
        method: str,
        path: str,
        body: Any,
        raw_body: bytes | None,
        query: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
    ) -> Iterator[Any]:
        """The open answer to one request (errors raised as `request` says)."""
        url = self.base_url.rstrip("/") + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        all_headers = {"Accept": "application/json", **(headers or {})}
        data = raw_body
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            all_headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(url, data=data, headers=all_headers, method=method)
        if self.token:
            # Unredirected as well: even a redirect followed by mistake would not carry it.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        try:
            answer = _OPENER.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            with exc:
                if 300 <= exc.code < 400:
                    raise _redirect(exc.code, exc.headers.get("Location"), url) from None
                error = _problem(exc.code, exc.read())
            if error.status == 401 and not self.token:
                error = error.with_hint(_no_token_hint(self.token_file))
            raise error from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from exc
        with answer:
            yield answer

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    # ------------------------------------------------------------------ workflows

    def submit(
        self,
        document: Mapping[str, Any] | bytes | str,
        *,
        dry_run: bool = False,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Submit a workflow (bytes and str are sent as they are); the workflow document.

        With `dry_run`, the plan instead; nothing is stored.
        """
        raw = document.encode() if isinstance(document, str) else document
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        kwargs: dict[str, Any] = {"headers": headers}
        if isinstance(raw, bytes):
            kwargs["raw_body"] = raw
        else:
            kwargs["body"] = raw
        query = {"dryRun": "true"} if dry_run else None
        result: dict[str, Any] = self._json("POST", "/api/v1/workflows", query=query, **kwargs)
        return result

    def workflow(self, workflow_id: str) -> dict[str, Any]:
        """The workflow document."""
        result: dict[str, Any] = self._json("GET", f"/api/v1/workflows/{_q(workflow_id)}")
        return result

    def workflows(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        owner: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of workflows: `{"items": [...], "next": cursor-or-None}`."""
        query = {"state": state, "name": name, "owner": owner, "limit": limit, "cursor": cursor}
        result: dict[str, Any] = self._json("GET", "/api/v1/workflows", query=query)
        return result

    def iter_workflows(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every workflow matching `filters`, following cursors."""
        cursor: str | None = None
        while True:
            page = self.workflows(cursor=cursor, **filters)
            yield from page["items"]
            cursor = page.get("next")
            if not cursor:
                return

    def kill(self, workflow_id: str) -> dict[str, Any]:
        """Kill a workflow; the workflow document."""
        result: dict[str, Any] = self._json("POST", f"/api/v1/workflows/{_q(workflow_id)}/kill")
        return result

    def rerun(self, workflow_id: str, force: Sequence[str | int] = ()) -> dict[str, Any]:
        """Re-run a workflow as a new one, forcing the named actions; the new workflow."""
        body = {"force": list(force)} if force else None
        result: dict[str, Any] = self._json(
            "POST", f"/api/v1/workflows/{_q(workflow_id)}/rerun", body=body
        )
        return result

    def action(self, workflow_id: str, action_id: int) -> dict[str, Any]:
        """One action of a workflow, in detail."""
        result: dict[str, Any] = self._json(
            "GET", f"/api/v1/workflows/{_q(workflow_id)}/actions/{action_id}"
        )
        return result

    def logs(self, workflow_id: str, action_id: int, attempt: int | None = None) -> str:
        """The log of one attempt of an action (default: the latest)."""
        answer = self.request(
            "GET",
            f"/api/v1/workflows/{_q(workflow_id)}/actions/{action_id}/logs",
            query={"attempt": attempt},
        )
        return answer.body.decode("utf-8", "replace")

    def log_chunks(
        self,
        workflow_id: str,
        action_id: int,
        attempt: int | None = None,
        *,
        tail_bytes: int | None = None,
    ) -> Iterator[bytes]:
        """The log of one attempt as it arrives, a chunk at a time; only its last
        `tail_bytes` when given (an HTTP suffix range)."""
        return self.stream(
            f"/api/v1/workflows/{_q(workflow_id)}/actions/{action_id}/logs",
            query={"attempt": attempt},
            headers=None if tail_bytes is None else {"Range": f"bytes=-{tail_bytes}"},
        )

    def cluster_jobs(
        self, workflow_id: str, action_id: int, attempt: int | None = None
    ) -> dict[str, Any]:
        """The YARN applications, Spark drivers and URLs an attempt's cluster client printed."""
        answer = self.request(
            "GET",
            f"/api/v1/workflows/{_q(workflow_id)}/actions/{action_id}/cluster-jobs",
            query={"attempt": attempt},
        )
        document: dict[str, Any] = answer.json()
        return document

    def wait(
        self,
        workflow_id: str,
        *,
        timeout_s: float | None = None,
        poll_s: float = 0.25,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the workflow is SUCCEEDED, FAILED or KILLED; its final document.

        Raises `TimeoutError` after `timeout_s` (None waits for ever).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            document = self.workflow(workflow_id)
            if on_update is not None:
                on_update(document)
            if document["state"] in TERMINAL_STATES:
                return document
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"workflow {workflow_id} is still {document['state']}")
            time.sleep(poll_s)

    # ------------------------------------------------------------------- datasets

    def datasets(
        self, *, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of datasets."""
        query = {"state": state, "limit": limit, "cursor": cursor}
        result: dict[str, Any] = self._json("GET", "/api/v1/datasets", query=query)
        return result

    def dataset(self, dataset_id: str) -> dict[str, Any]:
        """One dataset."""
        result: dict[str, Any] = self._json("GET", f"/api/v1/datasets/{_q(dataset_id)}")
        return result

    def verify(self, dataset_id: str) -> dict[str, Any]:
        """The dataset with its files hashed again (`verification`: match, mismatch, …)."""
        result: dict[str, Any] = self._json(
            "GET", f"/api/v1/datasets/{_q(dataset_id)}", query={"verify": "true"}
        )
        return result

    def iter_datasets(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every dataset the caller may see, following the cursor."""
        cursor: str | None = None
        while True:
            page = self.datasets(cursor=cursor, **filters)
            yield from page["items"]
            cursor = page.get("next")
            if not cursor:
                return

    def lineage(self, dataset_id: str) -> dict[str, Any]:
        """The dataset's ancestor graph."""
        result: dict[str, Any] = self._json("GET", f"/api/v1/datasets/{_q(dataset_id)}/lineage")
        return result

    def delete_dataset(self, dataset_id: str, *, force: bool = False) -> dict[str, Any]:
        """Mark a dataset for deletion (LEAF datasets need `force`)."""
        result: dict[str, Any] = self._json(
            "DELETE",
            f"/api/v1/datasets/{_q(dataset_id)}",
            query={"force": "true"} if force else None,
        )
        return result

    def pin(self, dataset_id: str, pinned: bool = True) -> dict[str, Any]:
        """Pin (or unpin) a dataset."""
        verb = "pin" if pinned else "unpin"
        result: dict[str, Any] = self._json("POST", f"/api/v1/datasets/{_q(dataset_id)}/{verb}")
        return result

    def storage(self) -> dict[str, Any]:
        """Capacity, usage by state, retention policy and decisions."""
        result: dict[str, Any] = self._json("GET", "/api/v1/storage")
        return result

    # ------------------------------------------------------------------ schedules

    def create_schedule(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a schedule; the schedule's document (with its next fire times)."""
        result: dict[str, Any] = self._json("POST", "/api/v1/schedules", body=body)
        return result

    def schedules(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """The caller's schedules, newest first."""
        items: list[dict[str, Any]] = self._json(
            "GET", "/api/v1/schedules", query={"limit": limit}
        )["items"]
        return items

    def schedule(self, schedule_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/api/v1/schedules/{_q(schedule_id)}")
        return result

    def schedule_runs(self, schedule_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
        """What became of the schedule's ticks, latest first."""
        items: list[dict[str, Any]] = self._json(
            "GET", f"/api/v1/schedules/{_q(schedule_id)}/runs", query={"limit": limit}
        )["items"]
        return items

    def set_schedule_paused(self, schedule_id: str, paused: bool) -> dict[str, Any]:
        verb = "pause" if paused else "resume"
        result: dict[str, Any] = self._json("POST", f"/api/v1/schedules/{_q(schedule_id)}/{verb}")
        return result

    def delete_schedule(self, schedule_id: str) -> None:
        self.request("DELETE", f"/api/v1/schedules/{_q(schedule_id)}")

    # ---------------------------------------------------------------------- users

    def create_user(
        self, name: str, *, admin: bool = False, reclaim: bool = False
    ) -> dict[str, Any]:
        """Create a user; the answer holds its token (shown once). `reclaim` gives a
        revoked user's name, with what it owns, to the same person coming back."""
        body: dict[str, Any] = {"name": name, "admin": admin}
        if reclaim:
            body["reclaim"] = True
        result: dict[str, Any] = self._json("POST", "/api/v1/users", body=body)
        return result

    def users(self) -> list[dict[str, Any]]:
        """Every user."""
        items: list[dict[str, Any]] = self._json("GET", "/api/v1/users")["items"]
        return items

    def delete_user(self, name: str) -> None:
        """Revoke a user and its token."""
        self.request("DELETE", f"/api/v1/users/{_q(name)}")

    def user(self, name: str) -> dict[str, Any]:
        """One user and their limits (an admin, or the user themselves)."""
        result: dict[str, Any] = self._json("GET", f"/api/v1/users/{_q(name)}")
        return result

    def set_user_limits(self, name: str, limits: dict[str, int | None]) -> dict[str, Any]:
        """Change a user's limits (admin); a None value resets one to the server's default."""
        result: dict[str, Any] = self._json(
            "PATCH", f"/api/v1/users/{_q(name)}", body={"limits": limits}
        )
        return result

    def me(self) -> dict[str, Any]:
        """The user this client's token belongs to."""
        result: dict[str, Any] = self._json("GET", "/api/v1/me")
        return result

    def health(self) -> bool:
        """Whether the server answers /healthz."""
        try:
            return self.request("GET", "/healthz").status == 200
        except ClientError:
            return False


def _q(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")

"""Pingo's exception hierarchy.

Only `pingo.api` maps these to HTTP status codes; driver exceptions never leave
`pingo.store`. Each class's docstring is its default message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class PingoError(Exception):
    """Pingo failed."""

    #: Stable machine-readable code, returned by the API as-is.
    code: str = "INTERNAL"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as they are, attributes and all (a submission planned in a child process
        # raises them there): subclasses' constructors take other arguments than `args`.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[PingoError], args: tuple[Any, ...], state: dict[str, Any]) -> PingoError:
    """A pickled `PingoError` back, without calling its class's constructor."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class NotFound(PingoError):
    """The requested resource does not exist."""

    code = "NOT_FOUND"


class AmbiguousId(PingoError):
    """Several resources have ids that start with the given prefix; give more characters."""

    code = "AMBIGUOUS_ID"


class Conflict(PingoError):
    """The resource is not in a state that allows this request."""

    code = "CONFLICT"


class InvalidTransition(Conflict):
    """The state machine does not allow this transition."""

    code = "INVALID_TRANSITION"


class Unauthorized(PingoError):
    """Missing or invalid credentials."""

    code = "UNAUTHORIZED"


class Forbidden(PingoError):
    """The credentials do not allow this request."""

    code = "FORBIDDEN"


class TooManySchedules(Forbidden):
    """The user has as many schedules as the server allows (PINGO_USER_MAX_SCHEDULES):
    forbidden rather than 429, since waiting does not help, deleting one does."""

    code = "TOO_MANY_SCHEDULES"


class StorageQuotaExceeded(Forbidden):
    """The user's workflows produced as many stored bytes as their quota allows: forbidden
    rather than 429, since waiting does not help, deleting datasets does."""

    code = "STORAGE_QUOTA_EXCEEDED"


class SandboxUnavailable(Forbidden):
    """Command-line actions of non-admin users need the sandbox, which cannot run on this server."""

    code = "SANDBOX_UNAVAILABLE"


class TooManyRequests(PingoError):
    """Too many submissions; retry after `retry_after_s`."""

    code = "RATE_LIMITED"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """The `Retry-After` header: whole seconds, at least 1 (RFC 9110)."""
        return str(max(1, math.ceil(self.retry_after_s)))


class TooManyWorkflows(TooManyRequests):
    """The user has as many RUNNING workflows as their limit allows."""

    code = "TOO_MANY_WORKFLOWS"


class StoreUnavailable(PingoError):
    """The state store cannot be reached."""

    code = "STORE_UNAVAILABLE"


class SubmissionInterrupted(PingoError):
    """The process planning a big workflow ended before it answered."""

    code = "SUBMISSION_INTERRUPTED"


class PlanExpired(SubmissionInterrupted):
    """Planning took longer than PINGO_PLAN_DEADLINE_S; nothing was stored: retry."""


class Unsupported(PingoError):
    """The backend cannot do this (callers fall back to another way)."""

    code = "UNSUPPORTED"


class ConfigurationError(PingoError):
    """The configuration is invalid."""

    code = "CONFIGURATION"


@dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One problem found in a submitted document."""

    code: str
    message: str
    #: RFC 6901 JSON pointer to the offending element ("" is the whole document).
    pointer: str

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "pointer": self.pointer}


class ValidationFailed(PingoError):
    """The workflow document is invalid."""

    code = "VALIDATION_FAILED"

    def __init__(self, issues: Sequence[ValidationIssue], message: str | None = None) -> None:
        self.issues: tuple[ValidationIssue, ...] = tuple(issues)
        if message is None and self.issues:
            first = self.issues[0]
            more = f" (and {len(self.issues) - 1} more)" if len(self.issues) > 1 else ""
            message = f"{first.code} at '{first.pointer}': {first.message}{more}"
        super().__init__(message)
        # A document that is not JSON at all has its own code, which the API keeps.
        if len(self.issues) == 1 and self.issues[0].code == "MALFORMED_JSON":
            self.code = "MALFORMED_JSON"

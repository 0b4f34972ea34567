"""The executor protocol: how an action type's work is started, stopped and checked.

Executors know their cluster and nothing about the store. A submitter hands an
executor a `Submission`; the executor starts the work and returns its external
id; the work reports back through the callbacks (in-process via `Reporter` for
the local executor, over signed HTTP for the cluster). `status` lets
reconciliation resolve actions whose callback never came.

Executors register per action type through the entry-point group
`pingo.executors`: each entry point names an `ExecutorFactory`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pingo.config import Settings

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pingo.executors"


@dataclass(frozen=True, slots=True)
class Submission:
    """Everything an executor needs to run one attempt of one action."""

    workflow_id: str
    action_id: int
    attempt: int
    action_type: str
    #: The action as submitted (its type-specific fields included).
    definition: Mapping[str, Any]
    #: Where the work writes its output: a staging path promoted on success.
    output_path: str
    #: Parent action id → the path of the dataset it produced.
    inputs: Mapping[int, str]
    callback_id: str
    #: `{public_url}/api/v1/callbacks/{callback_id}`; append `/success` etc.
    callback_url: str
    #: HMAC of callback id and attempt; pass as `?token=` (with `&attempt=`).
    callback_token: str
    timeout_s: float | None
    #: Where this attempt's stdout and stderr go.
    log_path: Path


class ExecutorStatus(enum.StrEnum):
    """What an executor knows of work it started."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    #: The executor has no trace of it (a node died, the cluster forgot).
    UNKNOWN = "UNKNOWN"


class Reporter(Protocol):
    """In-process callbacks, for executors that run work on this node."""

    async def running(self, callback_id: str, attempt: int) -> object: ...

    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> object: ...

    async def failed(self, callback_id: str, attempt: int, error: str) -> object: ...

    async def killed(self, callback_id: str, attempt: int) -> object: ...


class Executor(Protocol):
    """Runs actions of one or more types."""

    async def start(self) -> None:
        """Acquire what the executor needs (slots, clients)."""
        ...

    async def close(self) -> None:
        """Stop accepting work; let running work finish or hand it back."""
        ...

    async def submit(self, submission: Submission) -> str:
        """Start the work and return its external id once it is started (not finished)."""
        ...

    async def kill(self, external_id: str) -> None:
        """Stop the work (idempotent; unknown ids are ignored)."""
        ...

    async def status(self, external_id: str) -> ExecutorStatus:
        """What the executor knows of the work."""
        ...


class ExecutorFactory(Protocol):
    """What a `pingo.executors` entry point names: builds the executor from settings."""

    def __call__(self, settings: Settings, reporter: Reporter) -> Executor: ...


def load_executor_factories() -> dict[str, ExecutorFactory]:
    """Action type → executor factory, from the `pingo.executors` entry points.

    A plug-in that fails to load is logged and skipped.
    """
    factories: dict[str, ExecutorFactory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            factories[ep.name] = ep.load()
        except Exception:
            logger.exception(
                "executor plug-in %s failed to load; skipped",
                ep.name,
                extra={"event": "executor_load_failed"},
            )
    return factories


def log_path(home: Path | str, workflow_id: str, action_id: int, attempt: int) -> Path:
    """Where attempt `attempt` of an action writes its log.

    One `Path` from one string, where joining with `/` built three (every submission
    pays it on the event loop)."""
    return Path(f"{home}/logs/{workflow_id}/{action_id}.{attempt}.log")

"""What the API's handlers share: settings and the node whose services they call."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from pingo import errors, heap, limits
from pingo.config import Settings

if TYPE_CHECKING:
    from pingo.node import Node


@dataclass(slots=True)
class ApiState:
    """Filled by the app's cleanup context once the store is open and the node started."""

    settings: Settings
    node: Node | None = None
    #: Action types this node has an executor for (submissions of others are refused).
    executor_types: frozenset[str] = field(default_factory=frozenset)
    #: Action types the language knows (from the `pingo.action_types` entry points).
    action_types: frozenset[str] = field(default_factory=frozenset)
    #: Serialized documents of SUCCEEDED workflows (which never change again), by id.
    finished_documents: DocumentCache = field(default_factory=lambda: DocumentCache())
    #: Hands the heap back to the system after a big workflow's document was built.
    trimmer: heap.Trimmer = field(default_factory=heap.Trimmer)
    #: Each user's submission rate, on this node (see `pingo.limits`).
    submission_rate: limits.SubmissionRate = field(init=False)

    def __post_init__(self) -> None:
        self.submission_rate = limits.SubmissionRate(self.settings.user_submission_burst)


@dataclass(frozen=True, slots=True)
class CachedDocument:
    """A SUCCEEDED workflow's serialized document, and whose it is (for access checks)."""

    owner: str
    body: bytes


class DocumentCache:
    """A small LRU of immutable response bodies, bounded by their total size."""

    def __init__(self, max_bytes: int = 32 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, CachedDocument] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> CachedDocument | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, item: CachedDocument) -> None:
        size = len(item.body)
        if size > self.max_bytes // 4 or key in self._items:
            return
        self._items[key] = item
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= len(evicted.body)


STATE_KEY = web.AppKey("pingo.api.state", ApiState)


def api_state(request: web.Request) -> ApiState:
    """The shared state of the app serving `request`."""
    return request.app[STATE_KEY]


def node(request: web.Request) -> Node:
    """The node whose services serve `request` (503 while it is starting)."""
    current = request.app[STATE_KEY].node
    if current is None:
        raise errors.StoreUnavailable("the server is starting; retry in a moment")
    return current


def settings(request: web.Request) -> Settings:
    """The settings of the app serving `request`."""
    return request.app[STATE_KEY].settings

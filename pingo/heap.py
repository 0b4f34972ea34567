"""Giving memory back to the system after a big workflow has come and gone (issue 13).

A 100,000-action workflow makes the server allocate hundreds of MiB of small
objects, from the event loop's thread and from worker threads (the SQLite
worker, planning and encoding threads). When they are freed, glibc keeps the
free pages inside its arenas (one per thread that allocated), so the process's
resident memory stays near its peak long after the workflow is gone.
`malloc_trim(0)` hands every whole free page of every arena back with
`madvise`; bench/README.md ("Stall") measures what it changes.

Big buffers (a 30 MB document, a request body) are another matter: glibc maps
them apart and unmaps them when freed, but only below a threshold that it raises
to the size of every mapped buffer freed, up to 32 MiB. After one big document,
the next ones came from the arenas, where a small long-lived neighbour keeps
their pages. `keep_big_buffers_mapped` fixes the threshold at glibc's own
starting value, which turns that raising off.

Elsewhere (musl, macOS) there is no `malloc_trim` nor `mallopt`, and both do nothing.

While such a workflow is alive, Python's full garbage collections are the other
cost: `full_collections_deferred` holds them off.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

#: How long after the last big piece of work the heap is trimmed: long enough for its
#: response to be sent and its objects freed, and one trim for a burst of them.
TRIM_DELAY_S = 1.0


#: A generation-2 threshold no workload reaches: that many generation-1 collections.
_NEVER = 1 << 30

#: Container allocations between two young collections (CPython 3.11's default: 700).
#: Handling one 1,000-action workflow allocates hundreds of thousands of objects that
#: live until its answer; every young collection in between scans the ones allocated
#: since the last, and promotes them to be scanned again by the next generations. At
#: 700, collections took about 20 % of a resubmission's CPU (bench/README.md).
YOUNG_COLLECTIONS_EVERY = 20_000


def space_young_collections() -> None:
    """Collect the young generation every `YOUNG_COLLECTIONS_EVERY` allocations.

    Cyclic garbage waits a little longer to be freed (at most that many containers'
    worth); the older generations keep their thresholds, relative to the young one.
    """
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTIONS_EVERY, middle, old)


_deferrals = 0
_deferrals_lock = threading.Lock()
_saved_threshold: tuple[int, int, int] | None = None


@contextlib.contextmanager
def full_collections_deferred(when: bool = True) -> Iterator[None]:
    """Hold off full (generation-2) garbage collections while a big workflow is handled.

    A full collection walks every tracked object with the GIL held, so no thread runs
    meanwhile: with a 100,000-action workflow's objects alive that is seconds (parsing
    one on the loaded VM triggered 8, the longest 4.4 s). Young collections go on; the
    next full one comes after, once the workflow's objects are gone. Nestable and
    thread-safe: the threshold is restored when the last holder leaves. With `when`
    false it does nothing (the caller's work is small).
    """
    global _deferrals, _saved_threshold
    if not when:
        yield
        return
    with _deferrals_lock:
        if _deferrals == 0:
            _saved_threshold = gc.get_threshold()
            gc.set_threshold(_saved_threshold[0], _saved_threshold[1], _NEVER)
        _deferrals += 1
    try:
        yield
    finally:
        with _deferrals_lock:
            _deferrals -= 1
            if _deferrals == 0 and _saved_threshold is not None:
                gc.set_threshold(*_saved_threshold)
                _saved_threshold = None


#: Elements `dismantle` lets go of at a time: about a millisecond of freeing.
DISMANTLE_SLICE = 1000


def dismantle(*containers: list[Any]) -> None:
    """Empty big lists a slice at a time, freeing what only they held (blocking).

    When the last reference to a 100,000-action workflow's records goes, CPython frees
    them all in one C call, with the GIL held and no thread switch: 40 ms on a quiet
    machine, 100 to 250 ms on a busy one, during which the event loop answers no one
    (issue 13). Emptied a slice at a time, the GIL can pass to the loop between two.
    Only for lists the caller owns: the list is emptied in place.
    """
    for items in containers:
        while items:
            del items[-DISMANTLE_SLICE:]


async def dismantled(*containers: list[Any]) -> None:
    """`dismantle` in a worker thread: the loop runs while the lists are emptied."""
    if any(len(items) > DISMANTLE_SLICE for items in containers):
        await asyncio.to_thread(dismantle, *containers)


_graveyard: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "pingo_heap_graveyard", default=None
)


def bury(*containers: Iterable[Any]) -> None:
    """Have the enclosing `burying()` free these containers' elements, a slice at a time.

    Call it while the containers are alive and let them go as usual: their own
    deallocation is then only reference decrements, and the elements (a big workflow's
    records, with everything they hold) are freed once the `burying()` block is over,
    off the loop and in slices. Nothing is mutated, so shared containers are safe.
    Outside a `burying()` block it does nothing.
    """
    grave = _graveyard.get()
    if grave is not None:
        for container in containers:
            grave.extend(container)


@contextlib.asynccontextmanager
async def burying() -> AsyncIterator[None]:
    """Collect what `bury` is given inside the block; free it after, in a worker thread."""
    grave: list[Any] = []
    token = _graveyard.set(grave)
    try:
        yield
    finally:
        _graveyard.reset(token)
        await dismantled(grave)


def _libc_function(name: str) -> Any | None:
    """glibc's function `name`, or None where there is none."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


#: `mallopt`'s parameter, and glibc's default starting value for it.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def keep_big_buffers_mapped() -> bool:
    """Have every allocation of `MMAP_THRESHOLD_BYTES` or more mapped apart, and so
    unmapped as soon as it is freed, for the rest of the process (see the module's
    docstring); False where the C library cannot."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def _load_malloc_trim() -> Callable[[int], int] | None:
    function = _libc_function("malloc_trim")
    if function is None:
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    # A ctypes CDLL call releases the GIL: the loop runs while glibc walks its arenas.
    trim: Callable[[int], int] = function
    return trim


_malloc_trim = _load_malloc_trim()


def trim() -> bool:
    """Return free heap pages to the system now; False where the C library cannot."""
    if _malloc_trim is None:
        return False
    started = time.perf_counter()
    released = bool(_malloc_trim(0))
    logger.debug(
        "heap trimmed in %.1f ms (%s)",
        (time.perf_counter() - started) * 1000,
        "pages released" if released else "nothing to release",
        extra={"event": "heap_trimmed"},
    )
    return True


class Trimmer:
    """Trims the heap once, `delay_s` after the last of a burst of `soon()` calls.

    `release`, if set, is awaited first: caches that big work filled and that refill on
    demand (the store's page cache) hand their memory to the heap before it is trimmed.
    """

    def __init__(
        self,
        delay_s: float = TRIM_DELAY_S,
        release: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.release = release
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[bool] | None = None

    def soon(self) -> None:
        """Ask for a trim once the current big work is over (call from the event loop)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._trim(), name="heap-trim")

    async def _trim(self) -> bool:
        if self.release is not None:
            try:
                await self.release()
            except Exception:
                # Memory not given back is no reason to fail: trim what is free anyway.
                logger.warning("releasing cached memory failed", exc_info=True)
        return await asyncio.to_thread(trim)

    async def close(self) -> None:
        """Cancel a pending trim and wait for a running one (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

"""Trimming the heap after a big workflow: it runs on glibc, once per burst, after a delay;
big buffers stay mapped apart."""

from __future__ import annotations

import asyncio
import gc
import platform
import subprocess
import sys
import weakref

import pytest

from pingo import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_runs_on_glibc() -> None:
    assert heap.trim() is True


async def test_a_burst_of_requests_trims_once_after_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trimmed = asyncio.Event()
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    def counting_trim() -> bool:
        calls.append(loop.time())
        loop.call_soon_threadsafe(trimmed.set)
        return True

    monkeypatch.setattr(heap, "trim", counting_trim)
    trimmer = heap.Trimmer(delay_s=0.2)
    first = last = loop.time()
    for _ in range(5):
        last = loop.time()
        trimmer.soon()
        await asyncio.sleep(0.05)
    await asyncio.wait_for(trimmed.wait(), timeout=30)
    await trimmer.close()
    assert len(calls) == 1
    # Never before the delay has passed since the last request (a lower bound only).
    assert calls[0] >= last + 0.2 > first + 0.2


async def test_closing_cancels_a_pending_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1) or True)
    trimmer = heap.Trimmer(delay_s=0.05)
    trimmer.soon()
    await trimmer.close()
    await asyncio.sleep(0.2)
    assert calls == []


async def test_the_caches_are_released_before_the_trim_which_a_failure_does_not_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []
    monkeypatch.setattr(heap, "trim", lambda: order.append("trim") or True)

    async def release() -> None:
        order.append("release")

    async def broken() -> None:
        order.append("broken")
        raise RuntimeError("no")

    for hook in (release, broken):
        trimmer = heap.Trimmer(delay_s=0.01, release=hook)
        trimmer.soon()
        await asyncio.sleep(0.1)
        await trimmer.close()
    assert order == ["release", "trim", "broken", "trim"]


#: Frees an 8 MiB buffer, then allocates 1 MiB: prints whether glibc mapped it apart.
_MAPPED_AFTER_A_BIGGER_ONE = """
import ctypes, sys
from pingo import heap
if sys.argv[1] == "fixed":
    assert heap.keep_big_buffers_mapped()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
        "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
big = bytearray(8 << 20)
del big
mapped = libc.mallinfo2().hblkhd
buffer = bytearray(1 << 20)
print(libc.mallinfo2().hblkhd - mapped >= 1 << 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.parametrize(("mode", "mapped"), [("default", "False"), ("fixed", "True")])
def test_big_buffers_stay_mapped_after_a_bigger_one_was_freed(mode: str, mapped: str) -> None:
    """glibc's default raises its threshold to the 8 MiB freed, so the next 1 MiB comes
    from the heap (where it can pin pages); fixed, it is mapped apart, and unmapped when
    freed. A process of its own: the setting is the process's."""
    found = subprocess.run(
        [sys.executable, "-c", _MAPPED_AFTER_A_BIGGER_ONE, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == mapped


def test_full_collections_are_deferred_until_the_last_holder_leaves() -> None:
    before = gc.get_threshold()
    with heap.full_collections_deferred():
        deferred = gc.get_threshold()
        with heap.full_collections_deferred():
            assert gc.get_threshold() == deferred
        assert gc.get_threshold() == deferred
    assert deferred[:2] == before[:2] and deferred[2] > 10**6
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), heap.full_collections_deferred():
        raise RuntimeError("the threshold comes back anyway")
    assert gc.get_threshold() == before


def test_deferring_only_when_asked() -> None:
    before = gc.get_threshold()
    with heap.full_collections_deferred(when=False):
        assert gc.get_threshold() == before
    with heap.full_collections_deferred(when=True):
        assert gc.get_threshold() != before
    assert gc.get_threshold() == before


class _Record:
    """A stand-in for an action record: weakly referenceable, freed by refcount alone."""


def _records(n: int) -> list[_Record]:
    return [_Record() for _ in range(n)]


def test_dismantle_frees_every_element_and_empties_the_list() -> None:
    items = _records(2 * heap.DISMANTLE_SLICE + 7)
    refs = [weakref.ref(r) for r in items]
    heap.dismantle(items)
    assert items == []
    assert all(ref() is None for ref in refs)


async def test_buried_elements_outlive_their_container_until_the_block_ends() -> None:
    async with heap.burying():
        container = tuple(_records(3 * heap.DISMANTLE_SLICE))
        refs = [weakref.ref(r) for r in container]
        # Buried from a worker thread too, as the planner's threads may: the block's
        # graveyard travels with the context.
        await asyncio.to_thread(heap.bury, container[:10])
        heap.bury(container)
        assert len(container) == 3 * heap.DISMANTLE_SLICE  # nothing was mutated
        del container
        assert all(ref() is not None for ref in refs)
    assert all(ref() is None for ref in refs)


def test_bury_outside_a_block_keeps_nothing() -> None:
    items = _records(5)
    refs = [weakref.ref(r) for r in items]
    heap.bury(items)
    del items
    assert all(ref() is None for ref in refs)


async def test_the_graveyard_is_emptied_even_when_the_block_fails() -> None:
    items = _records(heap.DISMANTLE_SLICE + 1)
    refs = [weakref.ref(r) for r in items]
    with pytest.raises(RuntimeError):
        async with heap.burying():
            heap.bury(items)
            del items
            raise RuntimeError("the request failed")
    assert all(ref() is None for ref in refs)

"""Trimming the heap after a big workflow: it runs on glibc, once per burst, after a delay."""

from __future__ import annotations

import asyncio
import gc
import platform

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

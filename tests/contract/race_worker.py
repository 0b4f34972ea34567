"""The body of a claiming OS process in the multi-process races (started with spawn)."""

from __future__ import annotations

import asyncio
import traceback
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from pingo.store import open_store


async def _claim_all(url: str, node_id: str, batch: int, barrier: Barrier) -> list[Any]:
    claimed: list[tuple[str, int]] = []
    async with open_store(url) as store:
        # Everyone is connected: start claiming at the same moment.
        barrier.wait(timeout=60)
        while True:
            got = await store.claim_actions(node_id, batch, lease_s=600)
            if not got:
                return claimed
            for action in got:
                assert action.owner == node_id
                claimed.append(action.key)


def claim_all(url: str, node_id: str, batch: int, barrier: Barrier, results: Queue[Any]) -> None:
    """Claim READY actions of the store at `url` until none is left; report their keys."""
    try:
        results.put((node_id, asyncio.run(_claim_all(url, node_id, batch, barrier)), None))
    except BaseException:
        results.put((node_id, [], traceback.format_exc()))

"""The built-in retention policies: keep-all, lru, lfu, cost-benefit, gdsf, most-used, adaptive.

Each ranks the candidates from "evict first" to "evict last" and takes them in
that order until enough bytes are freed. Ties are broken by dataset id so that
a decision never depends on the order the store listed the candidates in.
Zero-byte datasets are never evicted: keeping them is free.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime

from pingo import errors
from pingo.retention.policy import Candidate, Eviction, NewDatasetInfo, PolicyFactory


def take_until_freed(ranked: Iterable[tuple[Candidate, str]], bytes_to_free: int) -> list[Eviction]:
    """Evictions for `ranked` (best victim first) until `bytes_to_free` bytes are freed."""
    evictions: list[Eviction] = []
    freed = 0
    for candidate, reason in ranked:
        if freed >= bytes_to_free:
            break
        if not candidate.evictable or candidate.size_bytes <= 0:
            continue
        evictions.append(Eviction(candidate.dataset_id, reason))
        freed += candidate.size_bytes
    return evictions


def _seconds(later: datetime, earlier: datetime) -> float:
    return max((later - earlier).total_seconds(), 0.0)


class KeepAll:
    """Never evicts: storage grows without bound (the reference for unlimited storage)."""

    name = "keep-all"

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        return []

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


class LRU:
    """Least recently used first (creation counts as a use)."""

    name = "lru"

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        if bytes_to_free <= 0:
            return []
        ranked = sorted(candidates, key=lambda c: (c.last_touched_at, c.dataset_id))
        return take_until_freed(
            ((c, f"lru: idle {_seconds(now, c.last_touched_at):.0f}s") for c in ranked),
            bytes_to_free,
        )

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


class LFU:
    """Least frequently used first, least recently used among equals (the original's
    "most commonly used" kept)."""

    name = "lfu"

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        if bytes_to_free <= 0:
            return []
        ranked = sorted(candidates, key=lambda c: (c.use_count, c.last_touched_at, c.dataset_id))
        return take_until_freed(((c, f"lfu: {c.use_count} uses") for c in ranked), bytes_to_free)

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


def cost_benefit_score(candidate: Candidate, now: datetime) -> float:
    """Seconds of recomputation saved per byte kept per second: cost * use rate / size.

    The use rate counts the creation as the first use and divides by the age
    plus the idle time, so a dataset that stops being used loses value twice as
    fast as it ages (the aging), while a fresh one is not evicted before anyone
    had the chance to reuse it.
    """
    age_s = _seconds(now, candidate.created_at) + 1.0
    idle_s = _seconds(now, candidate.last_touched_at)
    rate = (candidate.use_count + 1) / (age_s + idle_s)
    return candidate.recompute_cost_s * rate / max(candidate.size_bytes, 1)


class CostBenefit:
    """Evicts the datasets whose recompute cost * use rate / size is lowest."""

    name = "cost-benefit"

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        if bytes_to_free <= 0:
            return []
        scored = sorted(
            ((cost_benefit_score(c, now), c) for c in candidates),
            key=lambda sc: (sc[0], sc[1].dataset_id),
        )
        return take_until_freed(
            (
                (
                    c,
                    f"cost-benefit: score {score:.3g} (recompute {c.recompute_cost_s:.1f}s, "
                    f"{c.use_count} uses, {c.size_bytes} B)",
                )
                for score, c in scored
            ),
            bytes_to_free,
        )

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


class GDSF:
    """GreedyDual-Size-Frequency with the recompute cost as the cost.

    Each dataset's priority is H = L + frequency * recompute_cost / size, set
    when it is first seen and again whenever it is reused; L (the inflation
    value) rises to the priority of each evicted dataset, so datasets not reused
    for a long time fall behind the newly reused ones. H and L live in this
    instance: each node's loop ages on its own, which only changes the order
    among datasets the policy has not seen reused.
    """

    name = "gdsf"

    def __init__(self) -> None:
        self.inflation = 0.0
        #: dataset id → (use count and last use when H was set, H).
        self._priority: dict[str, tuple[tuple[int, datetime | None], float]] = {}

    def priority(self, candidate: Candidate) -> float:
        """H for `candidate`, recomputed with the current L if it was reused since."""
        seen = (candidate.use_count, candidate.last_used_at)
        known = self._priority.get(candidate.dataset_id)
        if known is not None and known[0] == seen:
            return known[1]
        frequency = candidate.use_count + 1
        h = self.inflation + frequency * candidate.recompute_cost_s / max(candidate.size_bytes, 1)
        self._priority[candidate.dataset_id] = (seen, h)
        return h

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        ranked = sorted(
            ((self.priority(c), c) for c in candidates), key=lambda hc: (hc[0], hc[1].dataset_id)
        )
        # Forget datasets that are no longer candidates (evicted, deleted, claimed):
        # one that comes back is treated as freshly used, which it just was.
        present = {c.dataset_id for c in candidates}
        for dataset_id in [d for d in self._priority if d not in present]:
            del self._priority[dataset_id]
        if bytes_to_free <= 0:
            return []
        evictions = take_until_freed(
            (
                (c, f"gdsf: H {h:.3g} (L {self.inflation:.3g}, {c.use_count} uses)")
                for h, c in ranked
            ),
            bytes_to_free,
        )
        chosen = {e.dataset_id for e in evictions}
        for h, c in ranked:
            if c.dataset_id in chosen:
                self.inflation = max(self.inflation, h)
                del self._priority[c.dataset_id]
        return evictions

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


class UseHistory:
    """Which "submissions" used each dataset, observed from the candidates' use records.

    A policy sees datasets only when asked to evict, so it learns uses from
    what changed since: a new creation or a new `last_used_at`. Planning a
    submission stamps its reuses and creations with one clock reading, so each
    distinct instant observed stands for one submission. Uses between two
    passes that left no trace (a dataset reused twice) are counted once.
    """

    def __init__(self) -> None:
        self.instants: list[datetime] = []
        self._seen_instants: set[datetime] = set()
        self.uses: dict[str, list[datetime]] = {}

    def observe(self, candidates: Sequence[Candidate]) -> None:
        fresh: set[datetime] = set()
        for c in candidates:
            uses = self.uses.setdefault(c.dataset_id, [c.created_at])
            if c.last_used_at is not None and c.last_used_at > uses[-1]:
                uses.append(c.last_used_at)
            fresh.update(u for u in uses if u not in self._seen_instants)
        self._seen_instants |= fresh
        self.instants.extend(sorted(fresh))
        self.instants.sort()
        present = {c.dataset_id for c in candidates}
        for dataset_id in [d for d in self.uses if d not in present]:
            del self.uses[dataset_id]

    def uses_within(self, dataset_id: str, window: int) -> int:
        """Uses of the dataset among the last `window` submissions observed."""
        if not self.instants:
            return 0
        start = self.instants[max(len(self.instants) - window, 0)]
        return sum(1 for u in self.uses.get(dataset_id, ()) if u >= start)

    def reuse_distances(self) -> list[int]:
        """Submissions between consecutive uses of each dataset, over all datasets."""
        rank = {instant: n for n, instant in enumerate(self.instants)}
        return [
            rank[b] - rank[a] for uses in self.uses.values() for a, b in itertools.pairwise(uses)
        ]


def _window_option(window: int | str) -> int:
    try:
        value = int(window)
    except ValueError:
        raise errors.ConfigurationError(f"window must be an integer, not {window!r}") from None
    if value < 1:
        raise errors.ConfigurationError(f"window must be at least 1, not {value}")
    return value


class _WindowedUse:
    """Evict what the last `current_window()` submissions used least (unused first)."""

    name = ""

    def __init__(self) -> None:
        self.history = UseHistory()

    def current_window(self) -> int:
        raise NotImplementedError

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        self.history.observe(candidates)
        if bytes_to_free <= 0:
            return []
        window = self.current_window()
        # Unused in the window first (count 0), then ascending counts, oldest use first.
        counted = sorted(
            ((self.history.uses_within(c.dataset_id, window), c) for c in candidates),
            key=lambda uc: (uc[0], uc[1].last_touched_at, uc[1].dataset_id),
        )
        return take_until_freed(
            (
                (c, f"{self.name}: used by {uses} of the last {window} submissions")
                for uses, c in counted
            ),
            bytes_to_free,
        )

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        return True


class MostUsed(_WindowedUse):
    """The original design's "most commonly used": evict what the last W submissions used least."""

    name = "most-used"
    DEFAULT_WINDOW = 50

    def __init__(self, window: int | str = DEFAULT_WINDOW) -> None:
        super().__init__()
        self.window = _window_option(window)

    def current_window(self) -> int:
        return self.window


class Adaptive(_WindowedUse):
    """The original design's adaptive policy: most-used with W = mean + 3 sigma of reuse distances.

    Until a reuse is observed the window is `initial_window`.
    """

    name = "adaptive"

    def __init__(self, initial_window: int | str = MostUsed.DEFAULT_WINDOW) -> None:
        super().__init__()
        self.initial_window = _window_option(initial_window)

    def window(self) -> int:
        distances = self.history.reuse_distances()
        if not distances:
            return self.initial_window
        mean = statistics.fmean(distances)
        sigma = statistics.pstdev(distances)
        return max(1, math.ceil(mean + 3 * sigma))

    def current_window(self) -> int:
        return self.window()


#: Name → factory, also registered as entry points in pyproject.toml.
BUILTINS: dict[str, PolicyFactory] = {
    KeepAll.name: KeepAll,
    LRU.name: LRU,
    LFU.name: LFU,
    CostBenefit.name: CostBenefit,
    GDSF.name: GDSF,
    MostUsed.name: MostUsed,
    Adaptive.name: Adaptive,
}

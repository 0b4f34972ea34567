"""The built-in retention policies: keep-all, lru, lfu, cost-benefit, gdsf, most-used, adaptive,
lineage.

Each ranks the candidates from "evict first" to "evict last" and takes them in
that order until enough bytes are freed. Ties are broken by dataset id so that
a decision never depends on the order the store listed the candidates in.
Zero-byte datasets are never evicted: keeping them is free.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import statistics
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import networkx as nx

from pingo import errors
from pingo.retention.policy import Candidate, Eviction, NewDatasetInfo, PolicyFactory
from pingo.workflows.definition import WorkflowDefinition


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


def _idle(candidate: Candidate, now: datetime) -> str:
    """How long the dataset has not been used, and what its last use was: for reasons."""
    idle = f"idle {_seconds(now, candidate.last_touched_at):.0f}s"
    if candidate.last_used_at is not None and candidate.last_used_at >= candidate.last_touched_at:
        return f"{idle} since its last reuse"
    return f"{idle} since it was stored, never reused since"


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
            ((c, f"lru: {_idle(c, now)}") for c in ranked),
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
        return take_until_freed(
            ((c, f"lfu: {c.use_count} uses, {_idle(c, now)}") for c in ranked), bytes_to_free
        )

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
        self.forget_absent({c.dataset_id for c in candidates})
        if bytes_to_free <= 0:
            return []
        evictions = take_until_freed(
            (
                (
                    c,
                    f"gdsf: H {h:.3g} (L {self.inflation:.3g}; {c.use_count + 1} uses * "
                    f"recompute {c.recompute_cost_s:.1f}s / {c.size_bytes} B)",
                )
                for h, c in ranked
            ),
            bytes_to_free,
        )
        chosen = {e.dataset_id for e in evictions}
        for h, c in ranked:
            if c.dataset_id in chosen:
                self.inflation = max(self.inflation, h)
                self.drop(c.dataset_id)
        return evictions

    def forget_absent(self, present: Collection[str]) -> None:
        """Forget datasets that are no longer candidates (evicted, deleted, claimed).

        One that comes back is treated as freshly used, which it just was.
        """
        for dataset_id in [d for d in self._priority if d not in present]:
            del self._priority[dataset_id]

    def drop(self, dataset_id: str) -> None:
        self._priority.pop(dataset_id, None)

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


def read_shares(definition: WorkflowDefinition) -> dict[int, float]:
    """For each action, the share of the workflow's steps whose edit makes the next run read it.

    Editing step a recomputes a and all its descendants, and each recomputed
    action reads its parents. So the output of d is read by the next submission
    when the edited step is d's child, or an ancestor of one of its children,
    but neither d nor one of d's ancestors (then d itself is recomputed: a new
    version, and the old one is superseded). With every step equally likely to
    be edited, that is the share of such steps. Sets of ancestors are bit masks,
    one OR of two masks per edge: once per workflow planned, 4 ms for the
    1,738-action Montage trace (load average 6 on 2 cores).
    """
    order = list(nx.topological_sort(definition.graph))
    bit = {aid: 1 << n for n, aid in enumerate(order)}
    ancestry: dict[int, int] = {}
    for aid in order:
        mask = bit[aid]
        for parent in definition.graph.predecessors(aid):
            mask |= ancestry[parent]
        ancestry[aid] = mask
    shares: dict[int, float] = {}
    for aid in order:
        readers = 0
        for child in definition.graph.successors(aid):
            readers |= ancestry[child]
        read = (readers & ~ancestry[aid]).bit_count()
        shares[aid] = read / len(order)
    return shares


@dataclass(frozen=True, slots=True)
class _Exposure:
    """Which workflow a dataset belongs to, and the share of that workflow's edits that read it."""

    family: str
    share: float
    #: The number of workflows observed when it was recorded (to forget it later).
    seen: int
    #: Its workflow's submissions observed when it was first recorded.
    first_family: int
    #: Its action's id in the workflow: with `family`, its step (`Lineage._step_bytes`).
    action_id: int = 0


@dataclass(slots=True)
class _Supersession:
    """An older version of a workflow step, replaced at planning time by a newer one."""

    step: tuple[str, ...]
    at: datetime
    by: str


def _switch(name: str, value: bool | str) -> bool:
    """A policy's on/off option, given as a bool or as the text of `name:key=value`."""
    if isinstance(value, bool):
        return value
    if value.lower() not in {"0", "1", "false", "true"}:
        raise errors.ConfigurationError(f"{name} must be 0 or 1, not {value!r}")
    return value.lower() in {"1", "true"}


def _fraction(name: str, value: float | str) -> float:
    """A policy's option between 0 and 1, given as a number or as the text of `name:key=value`."""
    try:
        number = float(value)
    except ValueError:
        raise errors.ConfigurationError(f"{name} must be a number, not {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise errors.ConfigurationError(f"{name} must be between 0 and 1, not {number}")
    return number


class Lineage:
    """Pingo's own policy: superseded versions first, then expected reads, never a flush.

    It learns from the planner what the other policies cannot see. Every new
    intermediate passes through `keep_new` with the workflow that plans it.

    *Superseded versions.* When a workflow plans a new dataset for a step (same
    owner, scope, workflow name, action id, name and type: `step_key`) that
    already had one, the step was edited, and the old dataset (and, as the
    planner reaches them, its descendants) is superseded: only a resubmission
    of the old version could read it again. Superseded datasets are evicted
    first. How often one is reused anyway is learned online: a step whose old
    version came back is no longer trusted, and when the learned reuse rate
    exceeds `max_reuse_rate` the tier is dropped.

    *Expected reads.* The rest are ranked by the recompute seconds keeping them
    is expected to save per byte and per submission: how often their workflow
    is submitted (learned online), times the share of its steps whose edit
    makes the next run read them (from the DAG, `read_shares`; updated by the
    dataset's own reuses, the share being a prior worth `prior` submissions),
    times the recompute cost with missing ancestors, over the size. As in GDSF,
    an L anchored at the dataset's creation or last reuse is added, and L rises
    to the value of each dataset evicted in order (not of those taken out of
    order to spare a big one), so what was valuable long ago but is not read
    falls behind. With `aging=0` there is no L: a dataset not read for many runs
    of its workflow still loses value through its share, and a pass that must
    evict nearly everything (a large workflow's claims) no longer raises L to
    the value of small, dear datasets, a hundred times that of the big ones,
    which are then ranked by when they were anchored alone. Off, it does better
    with `defer` and at tight budgets, worse at 10-20% (docs/retention.md).

    *Within a pass.* A child's value rises as soon as the pass takes one of its
    parents (`_cascading`); a pass does not overshoot on a big dataset when
    smaller ones cover the rest for less (`_take`); and the set with the
    cascade charge is kept only when its expected loss is below the plain
    order's (`_choose`). While running actions' claims hold storage over the
    mark, it keeps what fitted at rest.

    *Not keeping what the next runs rarely read (`min_share`, `auto` by default).* For
    `PRESSURE_WORKFLOWS` workflows after a pass under pressure (one that had to free
    `PRESSURE_SHARE` of the candidates' bytes or more), a new dataset that fewer than
    `min_share` of its workflow's edits would make the next run read (by its read
    share from the DAG) is not kept past its run: the keep hook declines it, it is
    stored while its readers in the run need it and deleted when they end.
    Kept, it would be claimed by those readers while the run's passes evict what
    the next runs read instead (a large Montage's `mBackground` outputs, read
    by 81 of 1,738 edits, against its `mProject` outputs, read by most). Every
    pass still frees what it is asked to; the bytes waiting for their readers
    are on disk, so storage during runs peaks higher. A fixed share recomputes
    much less at tight budgets and more at roomy ones, where what is rarely read
    still fits. `auto` (the default) is `AUTO_SHARE` only while the store is tight:
    what fits at rest (`room`) is less than the bytes of the datasets the last
    `AUTO_WORKFLOWS` workflows' next runs likely read, those at least `AUTO_SHARE`
    of the edits read (`likely_read_bytes`); otherwise nothing is declined
    (docs/retention.md). 0 keeps every new dataset.

    *Deferring (`defer`, off by default).* What the running workflows planned and
    have not yet handed over as candidates (claimed while their next actions read
    them) is ranked with the candidates, its size and cost estimated from the
    step's previous version: the part of the pass that such datasets make up,
    being worth less than the candidates it would take, is left to the passes
    after they end (`_deferred`). It recomputes much less at tight budgets, but
    a pass then frees less than asked although it could free it all, so the store
    stays over its budget while such workflows run (docs/retention.md): not the
    contract of `select_evictions`, hence an option for budgets that can stretch.

    State lives in the instance: a node learns from the workflows it plans;
    what another node planned it values by its own reuses per submission.
    """

    name = "lineage"

    #: Exposures of datasets no longer candidates are forgotten this many workflows later.
    FORGET_AFTER = 50

    def __init__(
        self,
        max_reuse_rate: float | str = 0.2,
        prior: float | str = 3.0,
        aging: bool | str = True,
        defer: bool | str = False,
        min_share: float | str = "auto",
    ) -> None:
        self.max_reuse_rate = _fraction("max_reuse_rate", max_reuse_rate)
        try:
            self.prior = float(prior)
        except ValueError:
            raise errors.ConfigurationError(f"prior must be a number, not {prior!r}") from None
        if not self.prior >= 0.0:
            raise errors.ConfigurationError(f"prior must be at least 0, not {self.prior}")
        #: Whether L rises with evictions (GDSF's aging; see the class doc).
        self.aging = _switch("aging", aging)
        #: Whether a pass leaves to later passes the part of it that what running
        #: workflows write would make up (`_deferred`): it frees less than asked, so the
        #: store stays over its budget while they run. Off by default, see the class doc.
        self.defer = _switch("defer", defer)
        #: New datasets read by fewer of their workflow's edits are not kept under pressure;
        #: with `auto` (`AUTO_SHARE`), only while the store is tight (`likely_read_bytes`).
        self.auto = isinstance(min_share, str) and min_share.strip().lower() == "auto"
        self.min_share = self.AUTO_SHARE if self.auto else _fraction("min_share", min_share)
        #: With `auto`: per recent workflow (the last `AUTO_WORKFLOWS`), its datasets that
        #: at least `min_share` of its edits read next → their steps; the latest bytes of
        #: each step seen as a candidate; and, while the workflow planned last found the
        #: store tight, what fitted at rest and what its recent workflows likely read.
        self._recent_read: collections.deque[dict[str, tuple[str, int]]] = collections.deque(
            maxlen=self.AUTO_WORKFLOWS
        )
        self._step_bytes: dict[tuple[str, int], int] = {}
        self._tight: tuple[int, int] | None = None
        #: Workflows seen at the last pass under pressure (`_rarely_read`), if any, and
        #: that pass's bytes to free and evictable candidates' bytes (for the reasons).
        self._pressed_at: int | None = None
        self._pressure = (0, 0)
        #: Bytes of candidates kept by the last pass that could reach its target: what
        #: fits at rest (None before any such pass).
        self.room: int | None = None
        #: Step → (size, compute seconds) of its latest version seen as a candidate.
        self._step_size: dict[tuple[str, ...], tuple[int, float]] = {}
        self._step_of: dict[str, tuple[str, ...]] = {}
        #: Datasets planned and not yet seen as candidates → (workflows seen then, size, cost).
        self._pending: dict[str, tuple[int, int, float]] = {}
        self.inflation = 0.0
        #: dataset id → (use count when L was last anchored, that L).
        self._anchors: dict[str, tuple[int, float]] = {}
        self._latest: dict[tuple[str, ...], str] = {}
        self._superseded: dict[str, _Supersession] = {}
        self._untrusted: set[tuple[str, ...]] = set()
        #: Superseded datasets whose fate is known: reused after all, or evicted unused.
        self.superseded_reused = 0
        self.superseded_evicted = 0
        #: Workflows planned (that computed anything), in all and per workflow name.
        self._workflows_seen = 0
        self._family_totals: collections.Counter[str] = collections.Counter()
        self._exposures: dict[str, _Exposure] = {}
        #: The ids of the last workflows observed (their datasets reach `keep_new` one by one).
        self._observed: dict[str, None] = {}

    @staticmethod
    def step_key(dataset: NewDatasetInfo) -> tuple[str, ...]:
        """A step's identity across versions: its owner, scope and workflow, then the action.

        The workflow's name is part of it: WfCommons-style ids and names
        (`mProject_ID0000037`, id 37) recur in different workflows, and the two
        Montage traces share 31 such steps. Without the name, each run of one
        superseded the other's datasets, whose next run then reused them: on
        seed 3 at 20% the learned reuse rate reached 0.78 and the superseded
        tier was off for the rest of the run (docs/retention.md). The action's
        name comes last, for the reasons.
        """
        action = dataset.action
        workflow = "" if dataset.workflow is None else dataset.workflow.name
        return (dataset.owner, dataset.scope, workflow, action.type, str(action.id), action.name)

    def _observe(self, dataset: NewDatasetInfo) -> None:
        """Learn, once per workflow, its name and the read share of each of its datasets."""
        workflow = dataset.workflow
        if workflow is None or dataset.workflow_id in self._observed:
            return
        self._observed[dataset.workflow_id] = None
        if len(self._observed) > 4 * self.FORGET_AFTER:
            del self._observed[next(iter(self._observed))]
        self._workflows_seen += 1
        self._family_totals[workflow.name] += 1
        shares = read_shares(workflow)
        for aid, dataset_id in dataset.dataset_ids.items():
            if aid in shares and not workflow.is_leaf(aid):
                before = self._exposures.get(dataset_id)
                self._exposures[dataset_id] = _Exposure(
                    workflow.name,
                    shares[aid],
                    self._workflows_seen,
                    self._family_totals[workflow.name] if before is None else before.first_family,
                    aid,
                )
        if self.auto:
            self._recent_read.append(
                {
                    dataset_id: (workflow.name, aid)
                    for aid, dataset_id in dataset.dataset_ids.items()
                    if aid in shares and not workflow.is_leaf(aid) and shares[aid] >= self.min_share
                }
            )
            room, likely = self.room, self.likely_read_bytes()
            self._tight = (room, likely) if room is not None and room < likely else None

    def read_rate(self, candidate: Candidate) -> float:
        """Expected reads per submission: how often its workflow comes, times its read share.

        A dataset whose workflow was not seen planned (another node planned it,
        or before this policy started) is valued by its own reuses per submission.
        """
        seen = max(self._workflows_seen, 1)
        known = self._exposures.get(candidate.dataset_id)
        if known is None:
            return (candidate.use_count + 1) / (seen + 1)
        return self._family_totals[known.family] / seen * self._share(known, candidate)

    def _share(self, known: _Exposure, candidate: Candidate) -> float:
        """The structural share as a prior worth `prior` submissions, updated by its reuses."""
        if not self.prior:
            return known.share
        exposed = self._family_totals[known.family] - known.first_family
        return (self.prior * known.share + candidate.use_count) / (self.prior + exposed)

    def value(self, candidate: Candidate) -> float:
        """Recompute seconds that keeping it saves per byte and per submission, expected."""
        return self.read_rate(candidate) * candidate.recompute_cost_s / max(candidate.size_bytes, 1)

    def aged_value(self, candidate: Candidate) -> float:
        """`value` plus the L anchored at its creation or last reuse (GDSF's aging)."""
        anchor = self._anchors.get(candidate.dataset_id)
        if anchor is None or anchor[0] != candidate.use_count:
            anchor = (candidate.use_count, self.inflation)
            self._anchors[candidate.dataset_id] = anchor
        return anchor[1] + self.value(candidate)

    def _forget(self, present: Collection[str]) -> None:
        """Forget the exposures of datasets gone and recorded `FORGET_AFTER` workflows ago."""
        horizon = self._workflows_seen - self.FORGET_AFTER
        for dataset_id in [
            d for d, e in self._exposures.items() if e.seen <= horizon and d not in present
        ]:
            del self._exposures[dataset_id]
        for dataset_id in [d for d in self._step_of if d not in self._exposures]:
            del self._step_of[dataset_id]

    def keep_new(self, dataset: NewDatasetInfo, now: datetime) -> bool:
        self._observe(dataset)
        step = self.step_key(dataset)
        previous = self._latest.get(step)
        if previous is not None and previous != dataset.dataset_id:
            self._superseded[previous] = _Supersession(step, now, dataset.dataset_id)
        self._latest[step] = dataset.dataset_id
        # A dataset planned again (recomputed after an eviction) is current again.
        self._superseded.pop(dataset.dataset_id, None)
        if self._rarely_read(dataset.dataset_id):
            # Deleted once its readers in this run end: nothing for a later pass to free.
            return False
        if self.defer and dataset.dataset_id in self._exposures:
            self._step_of[dataset.dataset_id] = step
            prev = dataset.previous
            if prev is not None and prev.size_bytes and prev.compute_s is not None:
                estimate: tuple[int, float] | None = (prev.size_bytes, prev.compute_s)
            else:
                estimate = self._step_size.get(step)
            if estimate is not None:
                self._pending[dataset.dataset_id] = (self._workflows_seen, *estimate)
        return True

    #: A pass is under pressure when what it must free is at least this part of the
    #: candidates' bytes: the store is tight, not passing over a little excess.
    PRESSURE_SHARE = 1 / 20
    #: `min_share` applies for this many workflows after a pass under pressure.
    PRESSURE_WORKFLOWS = 10
    #: `min_share=auto` (the default): this share, while the store is tight.
    AUTO_SHARE = 0.15
    #: `min_share=auto` weighs what fits at rest against the datasets of this many of the
    #: latest workflows planned.
    AUTO_WORKFLOWS = 20

    def likely_read_bytes(self) -> int:
        """Bytes of the datasets of the last `AUTO_WORKFLOWS` workflows planned (each once)
        that at least `min_share` of their workflow's edits read next.

        Each dataset counts with the latest size of its step seen as a candidate (the
        outputs of a step weigh about the same from one version to the next), and
        nothing while its step was never one (the figure only grows as passes see more).
        """
        steps: dict[str, tuple[str, int]] = {}
        for datasets in self._recent_read:
            steps.update(datasets)
        return sum(self._step_bytes.get(step, 0) for step in steps.values())

    def _rarely_read(self, dataset_id: str) -> bool:
        """Under pressure, and fewer than `min_share` of its workflow's edits read it next.

        With `auto`, also only when the store is tight: what its last pass that
        reached its target kept (`room`, what fits at rest) was less than
        `likely_read_bytes` when the dataset's workflow was planned. Then a dataset
        rarely read only takes the room of those the next runs likely read; when
        they all fit, it may fit too, and is kept.
        """
        known = self._exposures.get(dataset_id)
        return (
            self._pressed_at is not None
            and self._workflows_seen - self._pressed_at <= self.PRESSURE_WORKFLOWS
            and known is not None
            and known.share < self.min_share
            and (not self.auto or self._tight is not None)
        )

    def explain_decline(self, dataset: NewDatasetInfo, now: datetime) -> str:
        """Why `keep_new` declined `dataset`: its read share and the pass that pressed."""
        known = self._exposures.get(dataset.dataset_id)
        share = 0.0 if known is None else known.share
        to_free, total = self._pressure
        since = self._workflows_seen - (self._pressed_at or 0)
        tight = ""
        if self.auto and self._tight is not None:
            room, likely = self._tight
            tight = (
                f"; {room:,} bytes fit at rest, under the {likely:,} bytes the last "
                f"{len(self._recent_read)} workflows' next runs likely read"
            )
        return (
            f"lineage: read next by {share:.1%} of its workflow's edits, under min_share "
            f"{self.min_share:.1%}{' (auto)' if self.auto else ''}; a pass {since} "
            f"workflow(s) ago had to free {to_free:,} of {total:,} evictable bytes{tight}"
        )

    #: The prior on the reuse rate of superseded datasets: one reuse in ten, as if
    #: observed ten times (so ten reuses among the first datasets turn the tier off).
    PRIOR_REUSES, PRIOR_WEIGHT = 1.0, 10.0

    def reuse_rate(self) -> float:
        """Learned share of superseded datasets reused after all (the prior, updated)."""
        observed = self.superseded_reused + self.superseded_evicted
        return (self.superseded_reused + self.PRIOR_REUSES) / (observed + self.PRIOR_WEIGHT)

    def _learn(self, candidates: Sequence[Candidate]) -> None:
        for c in candidates:
            known = self._superseded.get(c.dataset_id)
            if known is not None and c.last_used_at is not None and c.last_used_at > known.at:
                self.superseded_reused += 1
                self._untrusted.add(known.step)
                del self._superseded[c.dataset_id]

    def _dead(self, candidate: Candidate) -> _Supersession | None:
        known = self._superseded.get(candidate.dataset_id)
        if known is None or known.step in self._untrusted:
            return None
        return known

    def select_evictions(
        self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
    ) -> list[Eviction]:
        self._learn(candidates)
        if self.defer:
            self._track_pending(candidates)
        if self.auto:
            for c in candidates:
                known = self._exposures.get(c.dataset_id)
                if known is not None and c.size_bytes > 0:
                    self._step_bytes[(known.family, known.action_id)] = c.size_bytes
        trust = self.reuse_rate() <= self.max_reuse_rate
        ranked = sorted(
            ((0 if trust and self._dead(c) else 1, self.aged_value(c), c) for c in candidates),
            key=lambda thc: (thc[0], thc[1], thc[2].dataset_id),
        )
        present = {c.dataset_id for c in candidates}
        for dataset_id in [d for d in self._anchors if d not in present]:
            del self._anchors[dataset_id]
        self._forget(present)
        if bytes_to_free <= 0:
            return []
        total = sum(max(c.size_bytes, 0) for c in candidates if c.evictable)
        if bytes_to_free >= self.PRESSURE_SHARE * total:
            self._pressed_at = self._workflows_seen
            self._pressure = (bytes_to_free, total)
        evictions, frontier = self._choose(ranked, bytes_to_free, total)
        chosen = {e.dataset_id for e in evictions}
        for tier, h, c in ranked:
            if c.dataset_id not in chosen:
                continue
            if tier == 0:
                self.superseded_evicted += 1
                del self._superseded[c.dataset_id]
            elif self.aging:
                # L rises as far as the order went, not to the value of the
                # smaller datasets taken out of order to spare a big one.
                self.inflation = max(self.inflation, min(h, frontier))
            self._anchors.pop(c.dataset_id, None)
        return evictions

    def _choose(
        self, ranked: Sequence[tuple[int, float, Candidate]], bytes_to_free: int, total: int
    ) -> tuple[list[Eviction], float]:
        """Evictions for the pass: the cheaper of two orders, no flush while claims hold the excess.

        With them, how far the order went (`_take`): L rises no further. `total` is
        the bytes of the evictable candidates.

        The order with the cascade charge (`_cascading`) spares a child whose
        parent the pass takes, which makes the pass reach further down the
        order; it is kept only when its expected loss (`_loss`) is below the
        plain order's. When evicting every candidate would still leave storage
        over the mark, the excess is held by what running actions claim (and by
        leaves): it goes when they finish. Flushing every candidate then throws
        away what the next submissions read and does not bring storage under
        the mark. So the pass keeps as many bytes of candidates as the last pass
        that could reach its target kept (the most valuable first) and evicts
        the rest, superseded first.
        """
        if self.defer and total >= bytes_to_free:
            bytes_to_free -= self._deferred(ranked, bytes_to_free)
        if total >= bytes_to_free or self.room is None:
            evictions, frontier = self._take(list(self._cascading(ranked)), bytes_to_free)
            plain, plain_frontier = self._take(ranked, bytes_to_free)
            if self._loss(plain, ranked) < self._loss(evictions, ranked):
                evictions, frontier = plain, plain_frontier
            if total >= bytes_to_free:
                chosen = {e.dataset_id for e in evictions}
                self.room = sum(
                    max(c.size_bytes, 0) for _, _, c in ranked if c.dataset_id not in chosen
                )
            return evictions, frontier
        superseded = sum(max(c.size_bytes, 0) for tier, _, c in ranked if tier == 0)
        reasons = ((c, self._reason(tier, h, c)) for tier, h, c in self._cascading(ranked))
        return take_until_freed(reasons, max(total - self.room, superseded)), math.inf

    #: A planned dataset not seen as a candidate this many workflows later is forgotten.
    PENDING_WORKFLOWS = 5

    def _track_pending(self, candidates: Sequence[Candidate]) -> None:
        """For `defer` only: planned datasets that became candidates are no longer
        pending, and their steps' sizes and costs are remembered for the next version."""
        for c in candidates:
            self._pending.pop(c.dataset_id, None)
            step_of = self._step_of.get(c.dataset_id)
            if step_of is not None and c.size_bytes > 0:
                self._step_size[step_of] = (c.size_bytes, c.compute_s)
        horizon = self._workflows_seen - self.PENDING_WORKFLOWS
        for dataset_id in [d for d, p in self._pending.items() if p[0] <= horizon]:
            del self._pending[dataset_id]

    def _deferred(self, ranked: Sequence[tuple[int, float, Candidate]], bytes_to_free: int) -> int:
        """Bytes of the pass that planned datasets, not yet candidates, are to make up later.

        While a workflow runs, what it writes is claimed by its next actions: a
        pass cannot evict it, and evicts datasets kept at rest instead (a large
        Montage's 80 new `mBackground` outputs, 663 MB worth 5e-9 s/B per
        submission, made each run evict as many `mProject` outputs worth 1.3e-7).
        Once the run ends they are candidates and the next passes evict them
        first. So the datasets planned and not yet seen as candidates, their size
        and cost estimated from the step's previous version (or the dataset's own
        past record), are ranked with the candidates; the part of what is to free
        that they make up in that order is left to the passes after the run.
        """
        seen = max(self._workflows_seen, 1)
        pending: list[tuple[int, float, int]] = []
        for dataset_id, (_, size, cost) in self._pending.items():
            known = self._exposures.get(dataset_id)
            if known is None or size <= 0:
                continue
            rate = self._family_totals[known.family] / seen * known.share
            pending.append((1, self.inflation + rate * cost / size, size))
        if not pending:
            return 0
        merged = sorted(
            [(t, h, c.size_bytes, False) for t, h, c in ranked if c.evictable and c.size_bytes > 0]
            + [(t, h, size, True) for t, h, size in pending],
            key=lambda x: (x[0], x[1]),
        )
        freed = deferred = 0
        for _, _, size, is_pending in merged:
            if freed >= bytes_to_free:
                break
            freed += size
            if is_pending:
                deferred += size
        return min(deferred, bytes_to_free)

    def _take(
        self, ordered: Sequence[tuple[int, float, Candidate]], bytes_to_free: int
    ) -> tuple[list[Eviction], float]:
        """Evictions in order until enough is freed, without overshooting on a big one.

        When the next candidate is larger than what is still to free, the later
        (more valuable per byte) candidates smaller than it may cover the rest
        for less: their expected recompute costs are compared with its own.
        Also returns how far the order went: the value of the last candidate
        taken in order, or of the big one a cover spared.
        """
        items = [(t, h, c) for t, h, c in ordered if c.evictable and c.size_bytes > 0]
        largest_spared = self.COVER_MAX_SHARE * sum(c.size_bytes for _, _, c in items)
        taken, frontier = self._take_items(items, bytes_to_free, largest_spared)
        return [Eviction(c.dataset_id, self._reason(t, h, c)) for t, h, c in taken], frontier

    #: How many big candidates in a row a cover may itself replace by smaller ones.
    COVER_DEPTH = 16
    #: A cover spares only a candidate at most this share of the candidates' bytes: at a
    #: tight budget a bigger one's surplus is needed by the next passes, and sparing it
    #: pass after pass evicts small, dear datasets one pass at a time.
    COVER_MAX_SHARE = 0.3

    def _take_items(
        self,
        items: Sequence[tuple[int, float, Candidate]],
        bytes_to_free: int,
        largest_spared: float,
        depth: int = 0,
    ) -> tuple[list[tuple[int, float, Candidate]], float]:
        """`_take` on items already filtered: the chosen items, in order, and the frontier.

        A cover spares no candidate larger than `largest_spared` bytes (`COVER_MAX_SHARE`
        of all the pass's candidates).

        The cover of a big candidate is chosen by the same rule (`_cover`): when
        several big candidates come first (the outputs of one costly step, a
        little apart in value), the cover of the first does not simply take the
        next big one, which would overshoot as much.
        """
        taken: list[tuple[int, float, Candidate]] = []
        freed = 0
        frontier = -math.inf
        for n, (tier, h, c) in enumerate(items):
            rest = bytes_to_free - freed
            if rest <= 0:
                break
            frontier = max(frontier, h)
            if (
                tier == 1
                and c.size_bytes > rest
                and depth < self.COVER_DEPTH
                and c.size_bytes <= largest_spared
            ):
                cover = self._cover(items[n + 1 :], rest, c.size_bytes, largest_spared, depth + 1)
                if cover is not None and self._expected(cover) < self._expected([(tier, h, c)]):
                    taken.extend(cover)
                    break
            taken.append((tier, h, c))
            freed += c.size_bytes
        return taken, frontier

    def _cover(
        self,
        later: Sequence[tuple[int, float, Candidate]],
        rest: int,
        smaller_than: int,
        largest_spared: float,
        depth: int,
    ) -> list[tuple[int, float, Candidate]] | None:
        """Later candidates smaller than `smaller_than` covering `rest`, taken as `_take` does.

        Among them a candidate larger than what is still to cover may itself be
        replaced by smaller later ones that lose less.
        """
        smaller = [item for item in later if item[2].size_bytes < smaller_than]
        cover, _ = self._take_items(smaller, rest, largest_spared, depth)
        return cover if sum(x[2].size_bytes for x in cover) >= rest else None

    def _expected(self, items: Sequence[tuple[int, float, Candidate]]) -> float:
        """Expected recompute seconds per submission of evicting `items` (each on its own)."""
        return sum(self.read_rate(c) * c.recompute_cost_s for _, _, c in items)

    def _loss(
        self, evictions: Sequence[Eviction], ranked: Sequence[tuple[int, float, Candidate]]
    ) -> float:
        """Expected recompute seconds per submission a set of evictions puts at stake.

        Each evicted dataset not superseded costs its recompute, plus that of each
        of its parents the same set evicts, times its read rate.
        """
        chosen = {e.dataset_id for e in evictions}
        by_id = {c.dataset_id: (tier, c) for tier, _, c in ranked}
        loss = 0.0
        for dataset_id in chosen:
            tier, c = by_id[dataset_id]
            if tier == 0:
                continue
            cost = c.recompute_cost_s + sum(
                by_id[p][1].recompute_cost_s for p in c.parents if p in chosen
            )
            loss += self.read_rate(c) * cost
        return loss

    def _cascading(
        self, ranked: Sequence[tuple[int, float, Candidate]]
    ) -> Iterator[tuple[int, float, Candidate]]:
        """`ranked` in order, a child's H raised as soon as the pass takes one of its parents.

        The candidates' costs count the ancestors missing before the pass; once
        this pass takes a parent, recomputing the child needs the parent too, so
        the child's cost grows by the parent's and it moves back in line instead
        of going in the same pass. The order is consumed lazily: it is a heap,
        and a child's entry is refreshed only when a parent is taken.
        """
        children: dict[str, list[Candidate]] = {}
        for _, _, c in ranked:
            for parent in c.parents:
                children.setdefault(parent, []).append(c)
        # Already sorted by (tier, H, id): a valid heap as it is.
        heap = [(tier, h, c.dataset_id, n) for n, (tier, h, c) in enumerate(ranked)]
        position = {c.dataset_id: n for n, (_, _, c) in enumerate(ranked)}
        current = {c.dataset_id: (tier, h) for tier, h, c in ranked}
        taken: set[str] = set()
        while heap:
            tier, h, dataset_id, n = heapq.heappop(heap)
            if dataset_id in taken or current[dataset_id] != (tier, h):
                continue
            candidate = ranked[n][2]
            taken.add(dataset_id)
            yield tier, h, candidate
            if not candidate.evictable or candidate.size_bytes <= 0:
                continue  # take_until_freed keeps it: nothing to charge
            for child in children.get(dataset_id, ()):
                if child.dataset_id in taken:
                    continue
                child_tier, child_h = current[child.dataset_id]
                if child_tier == 0:
                    continue
                raised = child_h + self._parent_share(child, candidate)
                current[child.dataset_id] = (child_tier, raised)
                heapq.heappush(
                    heap, (child_tier, raised, child.dataset_id, position[child.dataset_id])
                )

    def _parent_share(self, child: Candidate, parent: Candidate) -> float:
        """What losing `parent` adds to the child's value: its cost, at the child's read rate."""
        return self.read_rate(child) * parent.recompute_cost_s / max(child.size_bytes, 1)

    def _reason(self, tier: int, h: float, c: Candidate) -> str:
        if tier == 0:
            known = self._superseded[c.dataset_id]
            return (
                f"lineage: step {known.step[-1]!r} has a newer version ({known.by}); "
                f"superseded datasets reused so far: {self.superseded_reused} of "
                f"{self.superseded_reused + self.superseded_evicted}"
            )
        return (
            f"lineage: {h:.3g} s/B per submission (L {self.inflation:.3g}; "
            f"{self._rate_reason(c)} * recompute {c.recompute_cost_s:.1f}s with missing "
            f"ancestors / {c.size_bytes} B)"
        )

    def _rate_reason(self, c: Candidate) -> str:
        """The expected reads per submission, with the figures they come from."""
        seen = max(self._workflows_seen, 1)
        known = self._exposures.get(c.dataset_id)
        if known is None:
            return f"{c.use_count + 1} uses over {seen + 1} submissions, its workflow not seen"
        return (
            f"{known.family!r} {self._family_totals[known.family]} of {seen} workflows * "
            f"{self._share(known, c):.1%} of its runs read it ({known.share:.1%} of its "
            f"steps' edits would, {c.use_count} reuses)"
        )


#: Name → factory, also registered as entry points in pyproject.toml.
BUILTINS: dict[str, PolicyFactory] = {
    KeepAll.name: KeepAll,
    LRU.name: LRU,
    LFU.name: LFU,
    CostBenefit.name: CostBenefit,
    GDSF.name: GDSF,
    MostUsed.name: MostUsed,
    Adaptive.name: Adaptive,
    Lineage.name: Lineage,
}

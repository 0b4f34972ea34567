"""The offline reference: a light model of planning and a policy that knows the future.

The model plans exactly as `WorkflowManager` does for a sequence of workflows
run one after the other: from the leaves up, an action is needed when it is a
leaf or a child of it computes; a needed action whose dataset is on disk is
reused (and read by its computing children), any other needed action
computes. Ancestors of a reused action are not needed: a reused descendant
hides them. What the model leaves out (claims, in-flight datasets, failures)
cannot happen when submissions run one at a time.

The oracle keeps at most `budget` bytes on disk between submissions. After a
submission, while over budget, it evicts the stored intermediate whose next
*read* is farthest away (never read again first), ties broken by the lowest
recompute cost per byte. "Next read" is found by planning the family's future
submissions against what is on disk now, as if nothing else were evicted:
a dataset appearing in a future workflow is not read if a descendant of it is
reused there. Evicting a dataset makes its stored ancestors readable when it
would have been read, which the oracle folds in at once. Like Belady's MIN it
is a reference, not a proven optimum: sizes and costs differ, and it is
granted the transient overflow while a workflow runs that the live loop must
handle as it goes.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pingo.simulation.sequence import Submission
from pingo.simulation.traces import output_bytes, runtime_s
from pingo.workflows import language, provenance

NEVER = 1 << 60


@dataclass(frozen=True, slots=True)
class SubmissionModel:
    """One submission, reduced to what planning needs (actions by position)."""

    index: int
    family: str
    #: Dataset id of each action.
    datasets: tuple[str, ...]
    #: Positions of each action's parents.
    parents: tuple[tuple[int, ...], ...]
    #: Positions of the leaf actions.
    leaves: tuple[int, ...]
    runtimes: tuple[float, ...]

    @property
    def compute_s(self) -> float:
        """What the submission costs without any reuse."""
        return sum(self.runtimes)


@dataclass(slots=True)
class Catalog:
    """What is known of every dataset the sequence mentions."""

    size: dict[str, int] = field(default_factory=dict)
    runtime: dict[str, float] = field(default_factory=dict)
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    leaf: set[str] = field(default_factory=set)
    family: dict[str, str] = field(default_factory=dict)
    #: Index of the last submission the dataset appears in.
    last_seen: dict[str, int] = field(default_factory=dict)


def build_models(
    submissions: Sequence[Submission], scope: str = provenance.SERVER_SCOPE
) -> tuple[list[SubmissionModel], Catalog]:
    """Models of every submission, with dataset ids computed by the real id function."""
    catalog = Catalog()
    models: list[SubmissionModel] = []
    for sub in submissions:
        definition = language.parse(sub.document)
        ids = provenance.dataset_ids(definition, scope)
        order = sorted(definition.actions)
        position = {aid: n for n, aid in enumerate(order)}
        datasets = tuple(ids[aid] for aid in order)
        parents = tuple(
            tuple(position[p] for p in definition.actions[aid].parents) for aid in order
        )
        leaves = tuple(position[aid] for aid in definition.leaves())
        runtimes = tuple(runtime_s(definition.actions[aid].raw) for aid in order)
        for n, aid in enumerate(order):
            ds = datasets[n]
            catalog.last_seen[ds] = sub.index
            if ds in catalog.size:
                continue
            catalog.size[ds] = output_bytes(definition.actions[aid].raw)
            catalog.runtime[ds] = runtimes[n]
            catalog.parents[ds] = tuple(datasets[p] for p in parents[n])
            catalog.family[ds] = sub.family
        for n in leaves:
            catalog.leaf.add(datasets[n])
        models.append(SubmissionModel(sub.index, sub.family, datasets, parents, leaves, runtimes))
    return models, catalog


def plan(
    model: SubmissionModel, on_disk: Mapping[str, object] | set[str]
) -> tuple[list[int], list[str]]:
    """Positions the submission computes, and the stored datasets it reads."""
    computed: list[int] = []
    reads: list[str] = []
    leaves = set(model.leaves)
    seen = set(model.leaves)
    stack = list(model.leaves)
    while stack:
        n = stack.pop()
        ds = model.datasets[n]
        if ds in on_disk:
            if n not in leaves:
                reads.append(ds)
            continue
        computed.append(n)
        for p in model.parents[n]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return computed, reads


@dataclass(frozen=True, slots=True)
class WorkingSet:
    """The sequence's datasets; its compute with no reuse and with unlimited storage."""

    bytes: int
    datasets: int
    #: Bytes of the datasets a later submission reads, with unlimited storage.
    reusable_bytes: int
    no_reuse_compute_s: float
    unlimited_compute_s: float

    def capacity_bytes(self, fraction: float) -> int:
        """The storage capacity `pingo simulate` gives a run at `fraction` of this set."""
        return max(1, int(fraction * self.bytes))


def working_set(models: Sequence[SubmissionModel], catalog: Catalog) -> WorkingSet:
    """Sizes and reference costs of the sequence (planned by the model, nothing evicted)."""
    on_disk: set[str] = set()
    read: set[str] = set()
    unlimited = 0.0
    for model in models:
        computed, reads = plan(model, on_disk)
        read.update(reads)
        unlimited += sum(model.runtimes[n] for n in computed)
        on_disk.update(model.datasets[n] for n in computed)
    return WorkingSet(
        bytes=sum(catalog.size.values()),
        datasets=len(catalog.size),
        reusable_bytes=sum(catalog.size[d] for d in read),
        no_reuse_compute_s=sum(m.compute_s for m in models),
        unlimited_compute_s=unlimited,
    )


@dataclass(frozen=True, slots=True)
class OracleResult:
    compute_s: float
    evictions: int
    peak_bytes: int


class _Oracle:
    def __init__(self, models: Sequence[SubmissionModel], catalog: Catalog, budget: int) -> None:
        self.models = models
        self.catalog = catalog
        self.budget = budget
        self.on_disk: dict[str, set[str]] = {}  # family → datasets on disk (leaves included)
        self.stored: set[str] = set()  # evictable: on disk and not a leaf
        self.used = 0
        self.by_family: dict[str, list[int]] = {}
        for m in models:
            self.by_family.setdefault(m.family, []).append(m.index)
        self.next_read: dict[str, int] = {}
        self.fresh: set[str] = set()  # families whose next reads are up to date

    def disk(self, family: str) -> set[str]:
        return self.on_disk.setdefault(family, set())

    def run(self) -> OracleResult:
        compute = 0.0
        evictions = 0
        peak = 0
        for model in self.models:
            disk = self.disk(model.family)
            computed, _ = plan(model, disk)
            for n in computed:
                ds = model.datasets[n]
                compute += model.runtimes[n]
                if ds not in disk:
                    disk.add(ds)
                    self.used += self.catalog.size[ds]
                    if ds not in self.catalog.leaf:
                        self.stored.add(ds)
            self.fresh.discard(model.family)
            peak = max(peak, self.used)
            if self.used > self.budget:
                evictions += self.evict(after=model.index)
        return OracleResult(compute, evictions, peak)

    def refresh(self, family: str, after: int) -> None:
        """Next reads of the family's stored datasets, planning its future from now."""
        disk = self.disk(family)
        targets = {d for d in disk if d in self.stored}
        for d in targets:
            self.next_read[d] = NEVER
        self.fresh.add(family)
        if not targets:
            return
        horizon = max(self.catalog.last_seen[d] for d in targets)
        available = set(disk)
        unassigned = set(targets)
        for index in self.by_family[family]:
            if index <= after:
                continue
            if index > horizon or not unassigned:
                break
            computed, reads = plan(self.models[index], available)
            for d in reads:
                if d in unassigned:
                    unassigned.discard(d)
                    self.next_read[d] = index
            model = self.models[index]
            available.update(model.datasets[n] for n in computed)

    def recompute_cost(self, ds: str) -> float:
        total = self.catalog.runtime[ds]
        seen: set[str] = set()
        todo = list(self.catalog.parents[ds])
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            if p in self.disk(self.catalog.family[p]):
                continue
            total += self.catalog.runtime[p]
            todo.extend(self.catalog.parents[p])
        return total

    def key(self, ds: str) -> tuple[int, float, str]:
        per_byte = self.recompute_cost(ds) / max(self.catalog.size[ds], 1)
        return (-self.next_read[ds], per_byte, ds)

    def evict(self, after: int) -> int:
        families = {self.catalog.family[d] for d in self.stored}
        for family in families - self.fresh:
            self.refresh(family, after)
        heap = [self.key(d) for d in self.stored if self.catalog.size[d] > 0]
        heapq.heapify(heap)
        evicted = 0
        while self.used > self.budget and heap:
            neg_next, _, ds = heapq.heappop(heap)
            if ds not in self.stored or -neg_next != self.next_read[ds]:
                continue  # stale entry
            self.stored.discard(ds)
            self.disk(self.catalog.family[ds]).discard(ds)
            self.used -= self.catalog.size[ds]
            evicted += 1
            when = self.next_read.pop(ds)
            if when != NEVER:
                # It will be recomputed when it would have been read: its inputs
                # (or theirs, if gone too) are read then.
                for ancestor in self._stored_inputs(ds):
                    if self.next_read[ancestor] > when:
                        self.next_read[ancestor] = when
                        heapq.heappush(heap, self.key(ancestor))
        return evicted

    def _stored_inputs(self, ds: str) -> list[str]:
        found: list[str] = []
        seen: set[str] = set()
        todo = list(self.catalog.parents[ds])
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            if p in self.stored:
                found.append(p)
            elif p not in self.disk(self.catalog.family[p]):
                todo.extend(self.catalog.parents[p])
        return found


def run_oracle(
    models: Sequence[SubmissionModel], catalog: Catalog, budget_bytes: int | None
) -> OracleResult:
    """Replay the sequence keeping at most `budget_bytes` on disk between submissions."""
    budget = (1 << 62) if budget_bytes is None else budget_bytes
    return _Oracle(models, catalog, budget).run()

"""Retention: the built-in policies' rankings, plug-in loading, candidates and the loop."""

from __future__ import annotations

import itertools
import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as settings_hypothesis
from hypothesis import strategies as st

from pingo import errors, metrics, states
from pingo.config import Settings
from pingo.retention import builtin
from pingo.retention import policy as policy_api
from pingo.retention.loop import RetentionLoop
from pingo.retention.policy import Candidate, Eviction
from pingo.store import protocol
from pingo.store.memory import MemoryStore
from pingo.workflows import language

D = states.DatasetState
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def cand(dataset_id: str, **overrides: Any) -> Candidate:
    values: dict[str, Any] = {
        "dataset_id": dataset_id,
        "size_bytes": 100,
        "compute_s": 10.0,
        "recompute_cost_s": 10.0,
        "created_at": T0,
        "use_count": 0,
        "last_used_at": None,
        "parents": (),
    }
    values.update(overrides)
    return Candidate(**values)


def chosen(evictions: Sequence[Eviction]) -> list[str]:
    return [e.dataset_id for e in evictions]


# ------------------------------------------------------------------------- rankings


def test_keep_all_never_evicts() -> None:
    policy = builtin.KeepAll()
    assert policy.select_evictions([cand("a"), cand("b")], 10**9, at(100)) == []


def test_lru_evicts_least_recently_touched_until_enough_is_freed() -> None:
    candidates = [
        cand("used-late", last_used_at=at(50), use_count=5),
        cand("created-late", created_at=at(40)),
        cand("used-early", last_used_at=at(10), use_count=9),
        cand("never-used", created_at=at(0)),
    ]
    evictions = builtin.LRU().select_evictions(candidates, 150, at(100))
    assert chosen(evictions) == ["never-used", "used-early"]
    assert all(e.reason.startswith("lru:") for e in evictions)


def test_lru_skips_pinned_claimed_and_empty_datasets() -> None:
    candidates = [
        cand("pinned", pinned=True),
        cand("claimed", claimed=True),
        cand("empty", size_bytes=0),
        cand("ok", created_at=at(1)),
    ]
    assert chosen(builtin.LRU().select_evictions(candidates, 10**6, at(100))) == ["ok"]


def test_lfu_evicts_least_used_with_recency_breaking_ties() -> None:
    candidates = [
        cand("popular", use_count=7, last_used_at=at(1)),
        cand("once-recent", use_count=1, last_used_at=at(90)),
        cand("once-old", use_count=1, last_used_at=at(20)),
        cand("never", created_at=at(95)),
    ]
    evictions = builtin.LFU().select_evictions(candidates, 300, at(100))
    assert chosen(evictions) == ["never", "once-old", "once-recent"]


def test_cost_benefit_prefers_evicting_cheap_large_rarely_used_data() -> None:
    now = at(1000)
    candidates = [
        cand("cheap-big", size_bytes=1000, recompute_cost_s=1.0),
        cand("costly-small", size_bytes=10, recompute_cost_s=100.0),
        cand("costly-big", size_bytes=1000, recompute_cost_s=100.0),
        cand("fairly-cheap-big-popular", size_bytes=1000, recompute_cost_s=5.0, use_count=50,
             last_used_at=at(999)),
    ]  # fmt: skip
    evictions = builtin.CostBenefit().select_evictions(candidates, 2000, now)
    # 51 uses at a fifth of the cost outweigh one use at 100x the cost.
    assert chosen(evictions) == ["cheap-big", "costly-big"]
    evictions = builtin.CostBenefit().select_evictions(candidates, 2001, now)
    assert chosen(evictions) == ["cheap-big", "costly-big", "fairly-cheap-big-popular"]


def test_cost_benefit_ages_datasets_that_stopped_being_used() -> None:
    now = at(10_000)
    stale = cand("stale", use_count=3, last_used_at=at(100))
    fresh = cand("fresh", use_count=3, last_used_at=at(9_900))
    assert builtin.cost_benefit_score(stale, now) < builtin.cost_benefit_score(fresh, now)
    assert chosen(builtin.CostBenefit().select_evictions([fresh, stale], 1, now)) == ["stale"]
    # Lineage counts: the same dataset with unstored ancestors is worth more.
    orphan = cand("orphan", recompute_cost_s=50.0)
    assert builtin.cost_benefit_score(orphan, now) > builtin.cost_benefit_score(cand("x"), now)


def test_gdsf_ranks_by_frequency_times_cost_over_size_and_inflates() -> None:
    policy = builtin.GDSF()
    now = at(100)
    candidates = [
        cand("a", size_bytes=100, recompute_cost_s=10.0),  # H = 0.1
        cand("b", size_bytes=100, recompute_cost_s=10.0, use_count=3, last_used_at=at(50)),
        cand("c", size_bytes=10, recompute_cost_s=10.0),  # H = 1.0
        cand("d", size_bytes=100, recompute_cost_s=20.0),  # H = 0.2
    ]
    first = policy.select_evictions(candidates, 150, now)
    assert chosen(first) == ["a", "d"]
    assert policy.inflation == pytest.approx(0.2)
    # "c" keeps the H it got before the inflation; a dataset reused now gets
    # L + its value, so it outranks "c" although it is worth less on its own.
    remaining = [
        candidates[2],
        cand("b", size_bytes=100, recompute_cost_s=10.0, use_count=4, last_used_at=at(100)),
        cand("e", size_bytes=100, recompute_cost_s=85.0),  # new: H = 0.2 + 0.85
    ]
    assert policy.priority(remaining[1]) == pytest.approx(0.2 + 0.5)
    second = policy.select_evictions(remaining, 1, at(200))
    assert chosen(second) == ["b"]
    assert policy.inflation == pytest.approx(0.7)
    assert policy.select_evictions(remaining[:1], 0, at(300)) == []


def test_every_builtin_frees_enough_and_returns_each_dataset_once() -> None:
    candidates = [cand(f"d{i}", size_bytes=10 * (i + 1), created_at=at(i)) for i in range(10)]
    for name in ("lru", "lfu", "cost-benefit", "gdsf", "most-used", "adaptive", "lineage"):
        evictions = policy_api.load_policy(name).select_evictions(candidates, 200, at(50))
        ids = chosen(evictions)
        assert len(ids) == len(set(ids)), name
        freed = sum(10 * (int(i[1:]) + 1) for i in ids)
        assert freed >= 200, name
        assert freed - 10 * (int(ids[-1][1:]) + 1) < 200, f"{name} evicted more than needed"


def test_most_used_evicts_what_the_window_did_not_use_then_the_least_used() -> None:
    policy = policy_api.load_policy("most-used:window=3")
    # Six submissions at t=0..5; "old" was used at 0 and 1 only, "hot" at 3, 4 and 5,
    # "warm" at 5, "cold" created at 2 and never used since.
    history = [
        [cand("old", created_at=at(0)), cand("hot", created_at=at(3))],
        [
            cand("old", created_at=at(0), use_count=1, last_used_at=at(1)),
            cand("hot", created_at=at(3), use_count=1, last_used_at=at(4)),
            cand("cold", created_at=at(2)),
        ],
    ]
    for candidates in history:
        assert policy.select_evictions(candidates, 0, at(10)) == []
    final = [
        cand("old", created_at=at(0), use_count=1, last_used_at=at(1)),
        cand("hot", created_at=at(3), use_count=2, last_used_at=at(5)),
        cand("cold", created_at=at(2)),
        cand("warm", created_at=at(5)),
    ]
    evictions = policy.select_evictions(final, 400, at(10))
    # Window = instants 3, 4, 5: old and cold unused (oldest first), warm once, hot thrice.
    assert chosen(evictions) == ["old", "cold", "warm", "hot"]
    assert evictions[0].reason == "most-used: used by 0 of the last 3 submissions"
    assert evictions[3].reason == "most-used: used by 3 of the last 3 submissions"


def test_adaptive_sets_its_window_from_the_reuse_distances() -> None:
    policy = policy_api.load_policy("adaptive:initial_window=7")
    assert isinstance(policy, builtin.Adaptive)
    assert policy.window() == 7
    # "a" reused every submission (distance 1), "b" once after 3 submissions.
    policy.select_evictions([cand("a", created_at=at(0)), cand("b", created_at=at(0))], 0, at(9))
    for t in (1, 2, 3):
        policy.select_evictions(
            [
                cand("a", created_at=at(0), use_count=t, last_used_at=at(t)),
                cand(
                    "b",
                    created_at=at(0),
                    use_count=int(t == 3),
                    last_used_at=at(3) if t == 3 else None,
                ),
            ],
            0,
            at(9),
        )
    # Distances 1, 1, 1 (a) and 3 (b): mean 1.5, sigma 0.866, window ceil(4.1) = 5.
    assert sorted(policy.history.reuse_distances()) == [1, 1, 1, 3]
    assert policy.window() == 5


def test_policy_options_are_parsed_and_checked() -> None:
    assert policy_api.parse_policy_spec("most-used: window = 9 ,") == (
        "most-used",
        {"window": "9"},
    )
    assert policy_api.load_policy("most-used:window=9").window == 9  # type: ignore[attr-defined]
    for bad, message in (
        ("most-used:window", "not key=value"),
        ("most-used:window=0", "at least 1"),
        ("most-used:window=many", "must be an integer"),
        ("most-used:size=3", "failed to start"),
    ):
        with pytest.raises(errors.ConfigurationError, match=message):
            policy_api.load_policy(bad)


# ---------------------------------------------------------------------- loading


def test_load_policy_by_name_returns_fresh_instances() -> None:
    names = policy_api.available_policies()
    assert {"keep-all", "lru", "lfu", "cost-benefit", "gdsf"} <= set(names)
    for name in ("keep-all", "lru", "lfu", "cost-benefit", "gdsf"):
        loaded = policy_api.load_policy(name)
        assert loaded.name == name
        assert isinstance(loaded, policy_api.RetentionPolicy)
    assert policy_api.load_policy("gdsf") is not policy_api.load_policy("gdsf")
    with pytest.raises(errors.ConfigurationError, match="unknown retention policy"):
        policy_api.load_policy("no-such-policy")


def test_a_plugin_registers_by_entry_point_and_a_broken_one_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "bigfirst.py").write_text(
        textwrap.dedent(
            """
            class BiggestFirst:
                name = "biggest-first"

                def select_evictions(self, candidates, bytes_to_free, now):
                    from pingo.retention.builtin import take_until_freed
                    ranked = sorted(candidates, key=lambda c: -c.size_bytes)
                    return take_until_freed(((c, "big") for c in ranked), bytes_to_free)

                def keep_new(self, dataset, now):
                    return True
            """
        )
    )
    dist = tmp_path / "bigfirst-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bigfirst\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[pingo.retention_policies]\n"
        "biggest-first = bigfirst:BiggestFirst\n"
        "broken = no_such_module_for_pingo_tests:Policy\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level("ERROR", logger="pingo.retention.policy")
    names = policy_api.available_policies()
    assert "biggest-first" in names
    assert "broken" not in names
    assert any("broken" in r.getMessage() for r in caplog.records)
    plugin = policy_api.load_policy("biggest-first")
    evictions = plugin.select_evictions([cand("s"), cand("b", size_bytes=500)], 1, T0)
    assert chosen(evictions) == ["b"]
    sys.modules.pop("bigfirst", None)


async def test_keep_hook_asks_the_policy_with_the_store_clock() -> None:
    seen: list[datetime] = []

    class DropAll(builtin.KeepAll):
        name = "drop-all"

        def keep_new(self, dataset: policy_api.NewDatasetInfo, now: datetime) -> bool:
            seen.append(now)
            return False

    store = MemoryStore(clock=lambda: at(42))
    hook = policy_api.keep_hook(DropAll(), store)
    info = policy_api.NewDatasetInfo(
        dataset_id="x" * 64,
        workflow_id="wf",
        owner="ann",
        scope="server",
        action=None,  # type: ignore[arg-type]  # the policy does not look at it
        parents=(),
        previous=None,
    )
    assert await hook(info) is False
    assert seen == [at(42)]
    # The decline is recorded as a decision, with a plain reason when the policy gives none.
    [decision] = await policy_api.recent_decisions(store)
    assert decision["kind"] == "decline" and decision["datasetId"] == "x" * 64
    assert decision["reason"] == "drop-all: not worth keeping past its run"


async def test_recent_decisions_keep_the_latest_of_each_kind() -> None:
    store = MemoryStore(clock=lambda: at(42))
    for n in range(3):
        await store.append_event(policy_api.EVICT_EVENT, dataset_id=f"e{n}", payload={})
    for n in range(5):
        await store.append_event(policy_api.DECLINE_EVENT, dataset_id=f"d{n}", payload={})
    await store.append_event(policy_api.EVICT_EVENT, dataset_id="e3", payload={})
    decisions = await policy_api.recent_decisions(store, limit=2)
    assert [(d["kind"], d["datasetId"]) for d in decisions] == [
        ("evict", "e3"), ("decline", "d4"), ("decline", "d3"), ("evict", "e2"),
    ]  # fmt: skip


async def test_a_decline_explanation_that_raises_leaves_the_plain_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Explains(builtin.KeepAll):
        name = "explains"

        def keep_new(self, dataset: policy_api.NewDatasetInfo, now: datetime) -> bool:
            return dataset.dataset_id == "keep"

        def explain_decline(self, dataset: policy_api.NewDatasetInfo, now: datetime) -> str:
            if dataset.dataset_id == "broken":
                raise RuntimeError("no figures today")
            return f"explains: {dataset.dataset_id} at {now:%H:%M:%S}"

    store = MemoryStore(clock=lambda: at(42))
    hook = policy_api.keep_hook(Explains(), store)
    caplog.set_level("ERROR", logger="pingo.retention.policy")
    for dataset_id in ("keep", "told", "broken"):
        info = policy_api.NewDatasetInfo(dataset_id, "wf", "ann", "server", None, (), None)  # type: ignore[arg-type]
        assert await hook(info) is (dataset_id == "keep")
    decisions = await policy_api.recent_decisions(store)
    assert [(d["datasetId"], d["reason"]) for d in decisions] == [
        ("broken", "explains: not worth keeping past its run"),
        ("told", "explains: told at 00:00:42"),
    ]
    assert any("failed to explain" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------- store-backed cases


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


MakeDataset = Callable[..., "Any"]


@pytest.fixture
def make_dataset(store: MemoryStore) -> MakeDataset:
    """Create a dataset through a workflow plan, then move it to `state` as a callback would."""
    counter = iter(range(1, 10**6))

    async def make(
        name: str,
        *,
        state: D = D.STORED,
        size: int = 100,
        compute_s: float = 10.0,
        parents: tuple[str, ...] = (),
        claims: tuple[str, ...] = (),
    ) -> protocol.DatasetRecord:
        n = next(counter)
        now = store.clock()
        target = D.TO_LEAF if state is D.LEAF else D.TO_STORE
        workflow = protocol.WorkflowRecord(
            id=f"wf-{n}",
            name="w",
            owner="ann",
            state=states.WorkflowState.RUNNING,
            document={},
            scope="server",
            on_failure="abort",
            end_dataset_id=None,
            created_at=now,
        )
        plan = protocol.DatasetPlan(
            id=name,
            state=target,
            path=f"/data/{name}",
            scope="server",
            action_type="command-line",
            definition={},
            parents=parents,
            producer_workflow_id=workflow.id,
            producer_action_id=1,
            is_managed=True,
            claims=claims,
        )
        await store.create_workflow(protocol.WorkflowPlan(workflow, (), (plan,)))
        done = D.LEAF if state is D.LEAF else D.STORED
        record = await store.transition_dataset(
            name,
            {target},
            done,
            protocol.DatasetChanges(size_bytes=size, compute_s=compute_s, stored_at=now),
        )
        if state not in (D.STORED, D.LEAF):
            record = await store.transition_dataset(name, {done}, state)
        assert record is not None
        return record

    return make


async def test_candidates_add_the_cost_of_unstored_ancestors_once(
    store: MemoryStore, make_dataset: MakeDataset
) -> None:
    await make_dataset("a", state=D.DELETED, compute_s=10.0)
    await make_dataset("x", state=D.DELETED, compute_s=3.0, parents=("a",))
    await make_dataset("b", compute_s=5.0, parents=("a",))
    await make_dataset("c", compute_s=2.0, parents=("b",))
    await make_dataset("d", compute_s=1.0, parents=("a", "x"))
    await make_dataset("leaf", state=D.LEAF, compute_s=1.0, parents=("b",))
    await make_dataset("claimed", compute_s=1.0, claims=("wf-9/2",))
    await store.set_dataset_pinned("c", True)
    candidates = {c.dataset_id: c for c in await policy_api.build_candidates(store)}
    assert set(candidates) == {"b", "c", "d", "claimed"}
    assert candidates["b"].recompute_cost_s == pytest.approx(15.0)
    assert candidates["c"].recompute_cost_s == pytest.approx(2.0)
    assert candidates["d"].recompute_cost_s == pytest.approx(14.0)
    assert candidates["c"].pinned and not candidates["c"].evictable
    assert candidates["claimed"].claimed and not candidates["claimed"].evictable
    assert candidates["b"].parents == ("a",)


def settings(capacity: int | None, low_water: float = 0.5) -> Settings:
    return Settings(
        home=Path("/nonexistent-pingo-home"),
        storage_capacity_bytes=capacity,
        high_water=0.9,
        low_water=low_water,
    )


async def test_loop_does_nothing_under_the_high_water_mark(
    store: MemoryStore, make_dataset: MakeDataset
) -> None:
    for i in range(9):
        await make_dataset(f"d{i}")
    assert await RetentionLoop(store, settings(1000), builtin.LRU()).enforce() == []
    assert await RetentionLoop(store, settings(None), builtin.LRU()).enforce() == []


async def test_loop_evicts_what_is_over_the_high_mark_sparing_leaf_pinned_and_claimed(
    store: MemoryStore, make_dataset: MakeDataset, clock: Clock
) -> None:
    # 1200 bytes on disk for a capacity of 1000, high mark 900: 300 must go. The
    # low mark (600) is not where a pass goes: data that fits under the budget stays.
    await make_dataset("leaf", state=D.LEAF, size=300)
    await make_dataset("pinned", size=100)
    await store.set_dataset_pinned("pinned", True)
    await make_dataset("claimed", size=100, claims=("wf-x/1",))
    for i in range(7):
        clock.advance(1)
        await make_dataset(f"d{i}", size=100)
    before = metrics.RETENTION_EVICTIONS.labels(policy="lru")._value.get()
    loop = RetentionLoop(store, settings(1000, low_water=0.6), builtin.LRU())
    evicted = await loop.enforce()
    assert [e.dataset_id for e in evicted] == ["d0", "d1", "d2"]
    by_state = await store.bytes_by_state()
    assert by_state[D.STORED] + by_state[D.LEAF] == 900
    for kept in ("leaf", "pinned", "claimed", "d3", "d6"):
        record = await store.get_dataset(kept)
        assert record is not None and record.state is not D.STORED_TO_DELETE
    assert metrics.RETENTION_EVICTIONS.labels(policy="lru")._value.get() == before + 3
    decisions = await policy_api.recent_decisions(store, limit=3)
    assert [d["datasetId"] for d in decisions] == ["d2", "d1", "d0"]
    assert decisions[0]["policy"] == "lru" and decisions[0]["sizeBytes"] == 100
    assert decisions[0]["reason"].startswith("lru:")
    # The evicted bytes are on their way out: the next pass evicts nothing more.
    assert await loop.enforce() == []


async def test_a_pass_keeps_room_for_the_growth_it_measured_down_to_the_low_mark_at_most(
    store: MemoryStore, make_dataset: MakeDataset, clock: Clock
) -> None:
    for i in range(9):
        clock.advance(1)
        await make_dataset(f"d{i}", size=100)
    loop = RetentionLoop(store, settings(1000, low_water=0.6), builtin.LRU())
    assert await loop.enforce() == []  # 900: at the high mark, not over it
    # 200 written over one interval (5 s): the pass frees the 200 over the mark
    # and 200 more, the room the next interval's writes will need.
    clock.advance(5)
    for i in (9, 10):
        await make_dataset(f"d{i}", size=100)
    evicted = await loop.enforce()
    assert [e.dataset_id for e in evicted] == ["d0", "d1", "d2", "d3"]
    # 400 written over ten intervals: 40 B of room (200 over the mark, 240 to free).
    clock.advance(50)
    for i in (11, 12, 13, 14):
        await make_dataset(f"d{i}", size=100)
    evicted = await loop.enforce()
    assert [e.dataset_id for e in evicted] == ["d4", "d5", "d6"]
    # A burst of 600 in one interval: 500 over the mark, and the room is capped
    # at 300 (900 - 600): the pass stops at the low mark.
    clock.advance(5)
    for i in range(15, 21):
        await make_dataset(f"d{i}", size=100)
    evicted = await loop.enforce()
    assert len(evicted) == 8
    by_state = await store.bytes_by_state()
    assert by_state[D.STORED] == 600


async def test_a_look_answered_late_does_not_make_its_writes_a_burst(
    store: MemoryStore,
    make_dataset: MakeDataset,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(9):
        await make_dataset(f"d{i}", size=100)
    loop = RetentionLoop(store, settings(1000, low_water=0.6), builtin.LRU())
    read = store.bytes_by_state

    async def answered_late() -> dict[D, int]:
        # The store reads 900 bytes, then answers 50 s later; 600 are written meanwhile.
        seen = await read()
        clock.advance(50)
        for i in range(9, 15):
            await make_dataset(f"d{i}", size=100)
        return seen

    monkeypatch.setattr(store, "bytes_by_state", answered_late)
    assert await loop.enforce() == []  # 900: at the high mark, not over it
    monkeypatch.setattr(store, "bytes_by_state", read)
    # One interval (5 s) after that answer: the 600 took 55 s to write, not 5. The
    # pass frees the 600 over the mark and 54 of room (600 * 5 / 55), not the 300
    # of room a burst within one interval would get (which ends at the low mark).
    clock.advance(5)
    evicted = await loop.enforce()
    assert [e.dataset_id for e in evicted] == [f"d{i}" for i in range(7)]


async def test_loop_ignores_bad_decisions_and_survives_a_failing_policy(
    store: MemoryStore, make_dataset: MakeDataset
) -> None:
    await make_dataset("leaf", state=D.LEAF, size=600)
    await make_dataset("pinned", size=300)
    await store.set_dataset_pinned("pinned", True)
    await make_dataset("ok", size=300)

    class Rogue(builtin.KeepAll):
        name = "rogue"

        def select_evictions(
            self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
        ) -> list[Eviction]:
            return [Eviction("leaf", "x"), Eviction("pinned", "x"), Eviction("ok", "x")]

    class Failing(builtin.KeepAll):
        name = "failing"

        def select_evictions(
            self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
        ) -> list[Eviction]:
            raise RuntimeError("bug in a plug-in")

    assert await RetentionLoop(store, settings(1000), Failing()).enforce() == []
    evicted = await RetentionLoop(store, settings(1000), Rogue()).enforce()
    assert [e.dataset_id for e in evicted] == ["ok"]
    leaf, pinned = await store.get_dataset("leaf"), await store.get_dataset("pinned")
    assert leaf is not None and leaf.state is D.LEAF
    assert pinned is not None and pinned.state is D.STORED


async def test_a_claim_arriving_after_the_listing_blocks_the_eviction(
    store: MemoryStore, make_dataset: MakeDataset
) -> None:
    await make_dataset("a", size=600)
    await make_dataset("b", size=600)

    class ClaimsThenEvicts(builtin.LRU):
        name = "claims-then-evicts"

        def select_evictions(
            self, candidates: Sequence[Candidate], bytes_to_free: int, now: datetime
        ) -> list[Eviction]:
            # A planner claims "a" between the candidate listing and the CAS.
            record = store._datasets["a"]
            store._datasets["a"] = protocol.DatasetRecord(
                **{
                    **{f: getattr(record, f) for f in record.__dataclass_fields__},
                    "claims": ("wf-late/3",),
                }
            )
            return [Eviction("a", "x"), Eviction("b", "x")]

    evicted = await RetentionLoop(store, settings(1000), ClaimsThenEvicts()).enforce()
    assert [e.dataset_id for e in evicted] == ["b"]
    a = await store.get_dataset("a")
    assert a is not None and a.state is D.STORED


@settings_hypothesis(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 30), max_size=4), st.booleans(), st.integers(0, 9)),
        min_size=1,
        max_size=30,
    )
)
def test_memoized_recompute_costs_equal_a_plain_lineage_walk(
    spec: list[tuple[set[int], bool, int]],
) -> None:
    records: dict[str, protocol.DatasetRecord] = {}
    for n, (parents, on_disk, runtime) in enumerate(spec):
        records[f"d{n}"] = protocol.DatasetRecord(
            id=f"d{n}",
            state=D.STORED if on_disk else D.DELETED,
            path="",
            scope="server",
            action_type="command-line",
            definition={},
            parents=tuple(f"d{p}" for p in sorted(parents) if p < n),  # a DAG
            producer_workflow_id="wf",
            producer_action_id=n,
            is_managed=True,
            created_at=T0,
            updated_at=T0,
            compute_s=float(runtime),
        )

    def walk(record: protocol.DatasetRecord) -> float:
        total, seen, todo = record.compute_s or 0.0, set(), list(record.parents)
        while todo:
            ancestor = records[todo.pop()]
            if ancestor.id in seen:
                continue
            seen.add(ancestor.id)
            if ancestor.state is D.DELETED:
                total += ancestor.compute_s or 0.0
                todo.extend(ancestor.parents)
        return total

    stored = [r for r in records.values() if r.state is D.STORED]
    costs = policy_api._Lineage(records).costs(stored)
    assert costs == {r.id: pytest.approx(walk(r)) for r in stored}


DOCS = Path(__file__).resolve().parents[2] / "docs" / "retention.md"


def test_the_worked_example_in_the_docs_is_a_working_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = DOCS.read_text()
    start = text.index("```python\n# cheapest_first.py") + len("```python\n")
    code = text[start : text.index("```", start)]
    (tmp_path / "cheapest_first.py").write_text(code)
    dist = tmp_path / "cheapest_first-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cheapest-first\nVersion: 0.1\n")
    entry = text[text.index('[project.entry-points."pingo.retention_policies"]') :]
    # The TOML line `name = "module:Factory"` is `name = module:Factory` in entry_points.txt.
    (dist / "entry_points.txt").write_text(
        "[pingo.retention_policies]\n" + entry.splitlines()[1].replace('"', "") + "\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        plugin = policy_api.load_policy("cheapest-first")
        candidates = [
            cand("costly", size_bytes=100, recompute_cost_s=500.0),
            cand("cheap", size_bytes=100, recompute_cost_s=1.0),
            cand("small", size_bytes=10, recompute_cost_s=10.0),
        ]
        # Per byte: cheap 0.01 s, small 1 s, costly 5 s.
        assert chosen(plugin.select_evictions(candidates, 100, T0)) == ["cheap"]
        evictions = plugin.select_evictions(candidates, 150, T0)
        assert chosen(evictions) == ["cheap", "small", "costly"]
        assert evictions[0].reason.startswith("cheapest-first:")
        document = {
            "name": "w",
            "startActionId": 1,
            "endActionId": 1,
            "actions": [
                {"id": 1, "name": "a", "type": "command-line", "command": ["true"],
                 "metadata": {"retention": "scratch"}},
            ],
        }  # fmt: skip
        action = language.parse(document).actions[1]
        info = policy_api.NewDatasetInfo("x" * 64, "wf", "ann", "server", action, (), None)
        assert plugin.keep_new(info, T0) is False
    finally:
        sys.modules.pop("cheapest_first", None)


# ---------------------------------------------------------------------- lineage policy


def planned(
    dataset_id: str,
    step: int,
    *,
    owner: str = "ann",
    name: str = "",
    workflow: str = "wf",
    metadata: dict[str, Any] | None = None,
) -> Any:
    """What the planner tells the keep hook about a new dataset of step `step`."""
    from pingo.workflows.definition import ActionDefinition

    action = ActionDefinition(
        id=step,
        name=name or f"step{step}",
        type="command-line",
        parents=(),
        force_computation=False,
        is_managed=True,
        output_path=None,
        timeout_s=None,
        max_attempts=None,
        metadata=metadata or {},
        spec={"command": ["true"]},
        raw={},
    )
    return policy_api.NewDatasetInfo(
        dataset_id=dataset_id,
        workflow_id=workflow,
        owner=owner,
        scope="server",
        action=action,
        parents=(),
        previous=None,
    )


def test_lineage_evicts_superseded_versions_first_then_ranks_like_gdsf() -> None:
    policy = policy_api.load_policy("lineage")
    assert isinstance(policy, builtin.Lineage)
    for info in (planned("a1", 1), planned("b1", 2), planned("c1", 3)):
        assert policy.keep_new(info, at(0))
    # A new version of step 1 (and of nothing else): a1 is superseded. Another
    # user's step 2 supersedes nothing of ann's.
    assert policy.keep_new(planned("a2", 1), at(10))
    assert policy.keep_new(planned("b9", 2, owner="bob"), at(10))
    candidates = [
        # a1 is the most valuable by GDSF (costly, small), and still goes first.
        cand("a1", recompute_cost_s=1000.0, size_bytes=10),
        cand("a2", recompute_cost_s=1000.0, size_bytes=10),
        cand("b1", recompute_cost_s=5.0, size_bytes=100),
        cand("c1", recompute_cost_s=50.0, size_bytes=100),
    ]
    evictions = policy.select_evictions(candidates, 100, at(20))
    assert chosen(evictions) == ["a1", "b1"]
    assert "newer version" in evictions[0].reason and "a2" in evictions[0].reason
    assert "recompute 5.0s" in evictions[1].reason and "100 B" in evictions[1].reason
    assert policy.superseded_evicted == 1


def test_lineage_learns_that_a_superseded_step_came_back_and_stops_trusting_it() -> None:
    policy = builtin.Lineage()
    policy.keep_new(planned("old", 1), at(0))
    policy.keep_new(planned("new", 1), at(10))
    policy.keep_new(planned("other", 2), at(10))
    # The old version was reused after its supersession: someone went back to it.
    reused = cand("old", use_count=1, last_used_at=at(15), recompute_cost_s=100.0, size_bytes=10)
    cheap = cand("other", recompute_cost_s=1.0, size_bytes=100)
    evictions = policy.select_evictions([reused, cheap], 50, at(20))
    assert chosen(evictions) == ["other"]
    assert policy.superseded_reused == 1
    # Learned online: once superseded datasets keep coming back, the tier is dropped.
    policy.superseded_reused += 2
    assert policy.reuse_rate() > policy.max_reuse_rate
    policy.keep_new(planned("x1", 3), at(30))
    policy.keep_new(planned("x2", 3), at(31))
    costly_old = cand("x1", recompute_cost_s=1000.0, size_bytes=10)
    evictions = policy.select_evictions([costly_old, cheap], 50, at(40))
    assert chosen(evictions) == ["other"]


def test_lineage_does_not_take_another_workflows_step_of_the_same_id_for_a_version() -> None:
    # WfCommons ids and names recur across workflows: both Montage traces have an
    # action 1 named mProject_ID0000001. Neither is a version of the other.
    def step_of(workflow: str, dataset_id: str) -> policy_api.NewDatasetInfo:
        action = {"id": 1, "name": "mProject_ID0000001", "type": "command-line", "command": ["m"]}
        document = {"name": workflow, "startActionId": 1, "endActionId": 1, "actions": [action]}
        definition = language.parse(document)
        return policy_api.NewDatasetInfo(
            dataset_id, dataset_id, "ann", "server", definition.actions[1], (), None, definition
        )

    policy = builtin.Lineage()
    assert policy.keep_new(step_of("montage-01d", "small"), at(0))
    assert policy.keep_new(step_of("montage-05d", "big"), at(10))
    dear = cand("small", recompute_cost_s=1000.0, size_bytes=10)
    cheap = cand("other", recompute_cost_s=1.0, size_bytes=100)
    # The 05d run superseded nothing: the dear 01d dataset is ranked by its value.
    assert chosen(policy.select_evictions([dear, cheap], 50, at(20))) == ["other"]
    # Its next run reuses it: no superseded dataset came back, the tier stays trusted.
    reused = cand("small", recompute_cost_s=1000.0, size_bytes=10, use_count=1, last_used_at=at(30))
    policy.select_evictions([reused, cheap], 0, at(40))
    assert policy.superseded_reused == 0
    assert policy.reuse_rate() <= policy.max_reuse_rate
    # An edit of the 01d step itself does supersede it.
    assert policy.keep_new(step_of("montage-01d", "small2"), at(50))
    evictions = policy.select_evictions([reused, cheap], 5, at(60))
    assert chosen(evictions) == ["small"]
    assert "'mProject_ID0000001' has a newer version (small2)" in evictions[0].reason


def test_lineage_refreshes_h_when_ancestors_go_missing() -> None:
    child = cand("child", recompute_cost_s=10.0)
    other = cand("other", recompute_cost_s=15.0)
    # The child's parent is evicted between two passes: recomputing the child now
    # costs both. GDSF keeps the H it set when it first saw the child.
    orphaned = cand("child", recompute_cost_s=40.0)
    gdsf, lineage = builtin.GDSF(), builtin.Lineage()
    for policy in (gdsf, lineage):
        assert policy.select_evictions([child, other], 0, at(0)) == []
    assert chosen(gdsf.select_evictions([orphaned, other], 100, at(10))) == ["child"]
    assert chosen(lineage.select_evictions([orphaned, other], 100, at(10))) == ["other"]


def test_lineage_charges_a_child_the_parent_it_evicts_in_the_same_pass() -> None:
    # parent (H 0.1) and child (H 0.2) are the cheapest per byte; other (H 0.25) is
    # worth more than the child alone, less than the child once its parent is gone
    # (0.2 + 10 s / 100 B = 0.3). Two victims are needed.
    parent = cand("parent", recompute_cost_s=10.0)
    child = cand("child", recompute_cost_s=20.0, parents=("parent",))
    other = cand("other", recompute_cost_s=25.0)
    gdsf, lineage = builtin.GDSF(), builtin.Lineage()
    assert chosen(gdsf.select_evictions([parent, child, other], 200, at(0))) == [
        "parent",
        "child",
    ]
    evictions = lineage.select_evictions([parent, child, other], 200, at(0))
    assert chosen(evictions) == ["parent", "other"]
    # A child whose raised H still ranks first goes all the same.
    cheap_child = cand("child", recompute_cost_s=5.0, parents=("parent",))
    costly = cand("other", recompute_cost_s=100.0)
    evictions = builtin.Lineage().select_evictions([parent, cheap_child, costly], 200, at(0))
    assert chosen(evictions) == ["child", "parent"]


def test_lineage_spares_what_fits_at_rest_while_claims_hold_the_excess() -> None:
    policy = builtin.Lineage()
    costly, cheap = cand("costly", recompute_cost_s=500.0), cand("cheap", recompute_cost_s=1.0)
    # Before any pass could reach its target, an unreachable one evicts everything.
    assert sorted(chosen(policy.select_evictions([costly, cheap], 1000, at(0)))) == [
        "cheap",
        "costly",
    ]
    # A pass that reaches its target learns what fits at rest: 100 B of candidates.
    assert chosen(policy.select_evictions([costly, cheap], 100, at(10))) == ["cheap"]
    assert policy.room == 100
    # A running workflow's claims hold 1,000 B: evicting all 300 B of candidates would
    # not bring storage under the mark. The pass keeps the 100 B worth the most.
    fresh = cand("fresh", recompute_cost_s=50.0)
    other = cand("other", recompute_cost_s=5.0)
    evictions = policy.select_evictions([costly, fresh, other], 1000, at(20))
    assert chosen(evictions) == ["other", "fresh"]


def test_lineage_options_are_checked() -> None:
    assert policy_api.load_policy("lineage:max_reuse_rate=0.5").max_reuse_rate == 0.5  # type: ignore[attr-defined]
    assert policy_api.load_policy("lineage:prior=0").prior == 0.0  # type: ignore[attr-defined]
    assert policy_api.load_policy("lineage").aging  # type: ignore[attr-defined]
    assert not policy_api.load_policy("lineage:aging=0").aging  # type: ignore[attr-defined]
    assert not policy_api.load_policy("lineage").defer  # type: ignore[attr-defined]
    assert policy_api.load_policy("lineage:defer=true").defer  # type: ignore[attr-defined]
    default = policy_api.load_policy("lineage")
    assert default.min_share == builtin.Lineage.AUTO_SHARE == 0.15  # type: ignore[attr-defined]
    assert default.auto  # type: ignore[attr-defined]
    assert policy_api.load_policy("lineage:min_share=AUTO").auto  # type: ignore[attr-defined]
    off = policy_api.load_policy("lineage:min_share=0")
    assert off.min_share == 0.0 and not off.auto  # type: ignore[attr-defined]
    fixed = policy_api.load_policy("lineage:min_share=0.1")
    assert fixed.min_share == 0.1 and not fixed.auto  # type: ignore[attr-defined]
    for bad in (
        "lineage:max_reuse_rate=x",
        "lineage:max_reuse_rate=2",
        "lineage:prior=-1",
        "lineage:prior=x",
        "lineage:aging=2",
        "lineage:defer=yes",
        "lineage:min_share=x",
        "lineage:min_share=automatic",
        "lineage:min_share=1.5",
        "lineage:min_share=-0.1",
        "lineage:window=3",
    ):
        with pytest.raises(errors.ConfigurationError):
            policy_api.load_policy(bad)


async def test_live_reasons_measure_idle_time_from_the_last_use_or_store(
    store: MemoryStore, make_dataset: MakeDataset, clock: Clock
) -> None:
    # Planned at 0 but written at 500 (a long action): idle since 500, not since 0.
    slow = await make_dataset("slow", size=100)
    assert slow.created_at == T0
    await store.transition_dataset(
        "slow", {D.STORED}, D.STORED, protocol.DatasetChanges(stored_at=at(500))
    )
    clock.advance(200)
    await make_dataset("reused", size=100)
    clock.advance(100)
    await store.record_dataset_uses(["reused"])  # reused at 300
    clock.advance(900)  # now: 1200
    evicted = await RetentionLoop(store, settings(100, low_water=0.01), builtin.LRU()).enforce()
    reasons = {e.dataset_id: e.reason for e in evicted}
    assert reasons["reused"] == "lru: idle 900s since its last reuse"
    assert reasons["slow"] == "lru: idle 700s since it was stored, never reused since"
    decisions = await policy_api.recent_decisions(store)
    assert {d["reason"] for d in decisions} == set(reasons.values())


@st.composite
def dags(draw: st.DrawFn) -> dict[int, list[int]]:
    """Random DAGs of up to 9 actions, parents numbered before children."""
    n = draw(st.integers(1, 9))
    return {
        aid: draw(st.lists(st.integers(1, aid - 1), unique=True, max_size=3)) if aid > 1 else []
        for aid in range(1, n + 1)
    }


@settings_hypothesis(max_examples=60, deadline=None)
@given(shape=dags())
def test_read_shares_count_the_edits_whose_next_run_reads_each_output(
    shape: dict[int, list[int]],
) -> None:
    document = {
        "name": "w",
        "startActionId": 1,
        "endActionId": max(shape),
        "actions": [
            {"id": aid, "name": f"s{aid}", "type": "command-line", "command": ["true"],
             "parentActions": [{"id": p} for p in parents]}
            for aid, parents in shape.items()
        ],
    }  # fmt: skip
    definition = language.parse(document)
    children = {aid: [c for c, ps in shape.items() if aid in ps] for aid in shape}

    def recomputed(edited: int) -> set[int]:
        """The edited step and everything downstream of it: what the next run computes."""
        found, todo = set(), [edited]
        while todo:
            aid = todo.pop()
            if aid not in found:
                found.add(aid)
                todo.extend(children[aid])
        return found

    # By brute force: an output is read when a child is recomputed and it is not.
    expected = {
        aid: sum(
            1
            for edited in shape
            if aid not in recomputed(edited) and set(children[aid]) & recomputed(edited)
        )
        / len(shape)
        for aid in shape
    }
    assert builtin.read_shares(definition) == pytest.approx(expected)


#: a -> b -> c (a leaf), and d -> c: editing b reads a; editing c or d reads b;
#: editing a, b or c reads d (read shares of 1/4, 2/4 and 3/4).
A_B_C_D = {
    "name": "w",
    "startActionId": 1,
    "endActionId": 3,
    "actions": [
        {"id": 1, "name": "a", "type": "command-line", "command": ["a"]},
        {"id": 2, "name": "b", "type": "command-line", "command": ["b"],
         "parentActions": [{"id": 1}]},
        {"id": 4, "name": "d", "type": "command-line", "command": ["d"]},
        {"id": 3, "name": "c", "type": "command-line", "command": ["c"],
         "parentActions": [{"id": 2}, {"id": 4}]},
    ],
}  # fmt: skip


def test_lineage_values_datasets_by_how_often_the_next_runs_read_them() -> None:
    definition = language.parse(A_B_C_D)
    ids = {1: "a", 2: "b", 3: "c", 4: "d"}

    def planned_once() -> builtin.Lineage:
        policy = builtin.Lineage()
        for aid in (1, 2, 4):
            action = definition.actions[aid]
            info = policy_api.NewDatasetInfo(
                ids[aid], "wf1", "ann", "server", action, (), None, definition, ids
            )
            assert policy.keep_new(info, at(0))
        return policy

    # The same cost per byte: the share of edits that read each one decides.
    candidates = [cand("a"), cand("b"), cand("d")]
    evictions = planned_once().select_evictions(candidates, 100, at(10))
    assert chosen(evictions) == ["a"]
    assert "'w' 1 of 1 workflows * 25.0% of its runs read it" in evictions[0].reason
    assert chosen(planned_once().select_evictions(candidates, 200, at(10))) == ["a", "b"]
    # Four times the cost per byte outweighs half the share.
    costly = [cand("a", recompute_cost_s=40.0), cand("b"), cand("d")]
    assert chosen(planned_once().select_evictions(costly, 100, at(10))) == ["b"]
    # A dataset reused more often than its share says is worth more: with a prior
    # worth 3 runs, a reuse in the one run since makes a's share (3/4 + 1) / 4.
    policy = planned_once()
    policy._family_totals["w"] += 1
    policy._workflows_seen += 1
    reused = [cand("a", use_count=1), cand("b"), cand("d")]
    assert chosen(policy.select_evictions(reused, 100, at(10))) == ["b"]


def test_lineage_deferring_leaves_to_later_passes_what_the_running_workflow_writes() -> None:
    # b is cheap to recompute (1 s per 100 B): worth the least.
    definition = language.parse(A_B_C_D)
    policy, strict = builtin.Lineage(defer="1", aging="0"), builtin.Lineage(aging="0")
    first = {1: "a", 2: "b", 3: "c", 4: "d"}
    for aid in (1, 2, 4):
        info = policy_api.NewDatasetInfo(
            first[aid], "wf1", "ann", "server", definition.actions[aid], (), None, definition, first
        )
        assert policy.keep_new(info, at(0)) and strict.keep_new(info, at(0))
    a, d = cand("a"), cand("d")
    b = cand("b", compute_s=1.0, recompute_cost_s=1.0)
    # At rest: nothing to free, but the pass sees how big and dear b's step is.
    assert policy.select_evictions([a, b, d], 0, at(10)) == []
    assert strict.select_evictions([a, b, d], 0, at(10)) == []
    # The second run edits b: a new version b2 supersedes b and is written, claimed
    # by c while c runs, so it is not a candidate. 200 B are to free.
    second = {**first, 2: "b2"}
    info = policy_api.NewDatasetInfo(
        "b2", "wf2", "ann", "server", definition.actions[2], ("a",), None, definition, second
    )
    assert policy.keep_new(info, at(20)) and strict.keep_new(info, at(20))
    # b (superseded) goes; b2, estimated as large and as cheap as b, is worth less
    # than a: the rest is b2's to make up once the run ends, not a's now.
    assert chosen(policy.select_evictions([a, b, d], 200, at(30))) == ["b"]
    # Without `defer`, a pass frees what it is asked to.
    assert chosen(strict.select_evictions([a, b, d], 200, at(30))) == ["b", "a"]
    # The run ended: b2 is a candidate, no longer expected, and goes first.
    b2 = cand("b2", compute_s=1.0, recompute_cost_s=1.0, parents=("a",))
    assert chosen(policy.select_evictions([a, b2, d], 100, at(40))) == ["b2"]
    # Nothing expected any more: the same pass as above now takes a.
    assert chosen(policy.select_evictions([a, b2, d], 200, at(50))) == ["b2", "a"]


def test_lineage_declines_what_the_next_runs_rarely_read_under_pressure() -> None:
    definition = language.parse(A_B_C_D)
    ids = {1: "a", 2: "b", 3: "c", 4: "d"}
    runs = itertools.count()

    def plan(policy: builtin.Lineage, aid: int, workflow: str | None = None) -> bool:
        info = policy_api.NewDatasetInfo(
            ids[aid], workflow or f"wf{next(runs)}", "ann", "server", definition.actions[aid],
            (), None, definition, ids,
        )  # fmt: skip
        return policy.keep_new(info, at(0))

    policy, default = builtin.Lineage(min_share="0.3"), builtin.Lineage(min_share="0")
    # Read shares: a 1/4, b 2/4, d 3/4. Before any pass under pressure, all is kept,
    # and a pass over a little excess (1 B of 300) is not pressure.
    assert all(plan(policy, aid, "wf") for aid in (1, 2, 4))
    easy = policy.select_evictions([cand("a"), cand("b"), cand("d")], 1, at(10))
    assert chosen(easy) == ["a"]
    assert plan(policy, 1)
    # A pass that must free half of what it could: a (read by a quarter of the
    # edits) is not kept past its run; b and d are; without the option, all are.
    assert chosen(policy.select_evictions([cand("b"), cand("d")], 100, at(20))) == ["b"]
    shared = f"wf{next(runs)}"
    assert [plan(policy, aid, shared) for aid in (1, 2, 4)] == [False, True, True]
    info = policy_api.NewDatasetInfo("a", shared, "ann", "server", definition.actions[1], (), None)
    assert policy.explain_decline(info, at(20)) == (
        "lineage: read next by 25.0% of its workflow's edits, under min_share 30.0%; "
        "a pass 1 workflow(s) ago had to free 100 of 200 evictable bytes"
    )
    default.select_evictions([cand("b"), cand("d")], 100, at(20))
    assert all(plan(default, aid) for aid in (1, 2, 4))
    # The pressure lapses after PRESSURE_WORKFLOWS workflows with no pass under it.
    for _ in range(builtin.Lineage.PRESSURE_WORKFLOWS - 1):
        assert not plan(policy, 1)
    assert plan(policy, 1)


# x feeds only the leaf y: 1 of the 8 steps' edits reads it next (12.5%). h, g, k, m
# and n feed the leaf l: 5 of 8 edits read each of them (l's and the other four's).
RARE_AND_COMMON = {
    "name": "w",
    "startActionId": 1,
    "endActionId": 4,
    "actions": [
        {"id": 1, "name": "x", "type": "command-line", "command": ["x"]},
        {"id": 2, "name": "y", "type": "command-line", "command": ["y"],
         "parentActions": [{"id": 1}]},
        {"id": 3, "name": "h", "type": "command-line", "command": ["h"]},
        {"id": 5, "name": "g", "type": "command-line", "command": ["g"]},
        {"id": 6, "name": "k", "type": "command-line", "command": ["k"]},
        {"id": 7, "name": "m", "type": "command-line", "command": ["m"]},
        {"id": 8, "name": "n", "type": "command-line", "command": ["n"]},
        {"id": 4, "name": "l", "type": "command-line", "command": ["l"],
         "parentActions": [{"id": 3}, {"id": 5}, {"id": 6}, {"id": 7}, {"id": 8}]},
    ],
}  # fmt: skip


@pytest.mark.parametrize("to_free", [300, 40])
def test_lineage_declines_by_default_only_while_what_the_next_runs_likely_read_does_not_fit(
    to_free: int,
) -> None:
    """`min_share=auto`: 0.15 while what fits at rest is less than the bytes of the
    datasets the recent workflows' next runs likely read, nothing declined otherwise."""
    definition = language.parse(RARE_AND_COMMON)
    first = {1: "x", 2: "y", 3: "h", 4: "l", 5: "g", 6: "k", 7: "m", 8: "n"}
    assert builtin.read_shares(definition)[1] == 1 / 8
    assert builtin.read_shares(definition)[3] == 5 / 8

    def plan(policy: builtin.Lineage, ids: dict[int, str], workflow: str, aid: int) -> bool:
        info = policy_api.NewDatasetInfo(
            ids[aid], workflow, "ann", "server", definition.actions[aid], (), None, definition, ids
        )
        return policy.keep_new(info, at(0))

    auto, fixed = builtin.Lineage(), builtin.Lineage(min_share="0.15")
    off = builtin.Lineage(min_share="0")
    for policy in (auto, fixed, off):
        assert all(plan(policy, first, "wf0", aid) for aid in (1, 3, 5, 6, 7, 8))
        # A pass under pressure (to free at least a twentieth of the 600 B): x, read by
        # the fewest edits, goes first; with 300 B to free, two more go.
        candidates = [cand(first[aid]) for aid in (1, 3, 5, 6, 7, 8)]
        assert chosen(policy.select_evictions(candidates, to_free, at(10)))[0] == "x"
    # What fits at rest: 300 B after the tight pass, 500 B after the other.
    assert auto.room == fixed.room == 600 - 100 * math.ceil(to_free / 100)
    # The datasets the next runs likely read (h, g, k, m and n, 100 B each; x and the
    # leaves are not counted), and their sizes, learned from the pass.
    assert auto.likely_read_bytes() == 500
    # The next run edits x: its new version x2 is read next by 1 edit in 8.
    second = {**first, 1: "x2", 2: "y2"}
    kept = plan(auto, second, "wf1", 1)
    # The share alone declines it whatever the room; off, it is kept.
    assert not plan(fixed, second, "wf1", 1)
    assert plan(off, second, "wf1", 1)
    if to_free == 300:
        # 300 B fit at rest, under the 500 B the next runs likely read: x2 would only
        # take their room, so it is not kept past its run.
        assert not kept
        info = policy_api.NewDatasetInfo(
            "x2", "wf1", "ann", "server", definition.actions[1], (), None
        )
        assert auto.explain_decline(info, at(20)) == (
            "lineage: read next by 12.5% of its workflow's edits, under min_share 15.0% "
            "(auto); a pass 1 workflow(s) ago had to free 300 of 600 evictable bytes; "
            "300 bytes fit at rest, under the 500 bytes the last 2 workflows' next runs "
            "likely read"
        )
    else:
        # 500 B fit: everything the next runs likely read fits, and x2 is kept.
        assert kept


def test_lineage_ages_unless_told_not_to() -> None:
    # Values: half a read per submission (their workflow not seen) * cost / 100 B.
    cheap = cand("cheap", recompute_cost_s=20.0)  # 0.1
    kept = cand("kept", recompute_cost_s=60.0)  # 0.3
    new = cand("new", recompute_cost_s=50.0, created_at=at(20))  # 0.25
    plain, aging = builtin.Lineage(aging="0"), builtin.Lineage()
    for policy in (plain, aging):
        assert chosen(policy.select_evictions([cheap, kept], 100, at(10))) == ["cheap"]
    # With aging, L rose to 0.1 and the new dataset is anchored there: 0.35 outranks
    # kept's 0.3. Without it, the values alone decide: the new one is worth less.
    assert aging.inflation == pytest.approx(0.1)
    assert chosen(aging.select_evictions([kept, new], 100, at(30))) == ["kept"]
    assert plain.inflation == 0.0
    assert chosen(plain.select_evictions([kept, new], 100, at(30))) == ["new"]


#: Candidates dear per byte, never reached by the passes below: with them a
#: 1,000 B candidate is under a tenth of the candidates' bytes.
KEPT = [cand(f"kept{n}", size_bytes=1000, recompute_cost_s=10_000.0) for n in range(20)]


def test_lineage_covers_the_rest_with_smaller_datasets_when_that_loses_less() -> None:
    # 100 B to free. The cheapest per byte is 1,000 B costing 20 s; the next two,
    # 110 B together, cost 14 s: evicting them frees enough and loses less.
    big = cand("big", size_bytes=1000, recompute_cost_s=20.0)
    small = [
        cand("s1", size_bytes=50, recompute_cost_s=5.0),
        cand("s2", size_bytes=60, recompute_cost_s=9.0),
    ]
    assert chosen(builtin.GDSF().select_evictions([big, *small, *KEPT], 100, at(0))) == ["big"]
    lineage = builtin.Lineage().select_evictions([big, *small, *KEPT], 100, at(0))
    assert chosen(lineage) == ["s1", "s2"]
    # At 12 s the big one loses less than the two (14 s): it goes, as in GDSF.
    cheap_big = cand("big", size_bytes=1000, recompute_cost_s=12.0)
    lineage = builtin.Lineage().select_evictions([cheap_big, *small, *KEPT], 100, at(0))
    assert chosen(lineage) == ["big"]
    # Without the others it is most of the candidates' bytes (a tight budget):
    # sparing it pass after pass would throw out the small ones one pass at a
    # time, and its surplus is needed soon. It goes.
    assert chosen(builtin.Lineage().select_evictions([big, *small], 100, at(0))) == ["big"]


def test_lineage_spares_two_big_datasets_in_a_row_when_small_ones_cover_the_rest() -> None:
    # 100 B to free. The two cheapest per byte are big (1,000 and 900 B, the
    # outputs of one costly step: 5 and 4.95 s expected); smaller ones come next
    # (60 B, 0.6 s each). The cover of the first big one is not the second big
    # one, which overshoots as much: it is chosen by the same rule, so two small
    # ones go (1.2 s) and both big ones stay.
    big = [
        cand("big1", size_bytes=1000, recompute_cost_s=10.0),
        cand("big2", size_bytes=900, recompute_cost_s=9.9),
    ]
    small = [cand(f"s{n}", size_bytes=60, recompute_cost_s=1.2) for n in (1, 2, 3)]
    assert chosen(builtin.GDSF().select_evictions([*big, *small, *KEPT], 100, at(0))) == ["big1"]
    policy = builtin.Lineage(aging="1")
    assert chosen(policy.select_evictions([*big, *small, *KEPT], 100, at(0))) == ["s1", "s2"]
    # L rises as far as the order went (big1's value: half a read per
    # submission, its workflow not seen, * 10 s / 1,000 B), not to the value of
    # the small ones taken out of order (0.01), so big1 does not fall behind
    # what is anchored at L from now on.
    assert policy.inflation == pytest.approx(0.5 * 10.0 / 1000)

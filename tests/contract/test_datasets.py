"""Datasets: the plan's upsert rules, lists, compare-and-set, claims, deletor and retention."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from pingo.states import ActionState, DatasetState
from pingo.store.protocol import DatasetChanges, NewEvent, Store, claim_key
from tests.contract.conftest import Backend, Factory, FakeClock, seed_dataset

D = DatasetState


async def test_plan_adds_claims_on_reused_datasets(store: Store, make: Factory) -> None:
    stored = await seed_dataset(store, make, D.STORED)
    before = await store.get_dataset(stored)
    assert before is not None

    plan = make.plan({0: ()}, datasets=False)
    claim = claim_key(plan.workflow.id, 0)
    # A reused dataset appears in the plan with its current state and the new claim.
    reuse = replace(
        make.dataset(plan.actions[0], id=stored, state=D.STORED, path="/elsewhere"),
        claims=(claim,),
    )
    await store.create_workflow(replace(plan, datasets=(reuse,)))

    after = await store.get_dataset(stored)
    assert after is not None
    assert after.state is D.STORED
    assert after.claims == (claim,)
    # Its identity and producer are untouched.
    assert (after.path, after.producer_workflow_id) == (before.path, before.producer_workflow_id)


@pytest.mark.parametrize(
    ("existing", "planned", "result"),
    [
        (D.TO_DELETE, D.TO_STORE, D.TO_STORE),
        (D.TO_DELETE, D.TO_LEAF, D.TO_LEAF),
        (D.TO_STORE, D.TO_LEAF, D.TO_LEAF),
        (D.TO_STORE, D.TO_DELETE, D.TO_STORE),
        (D.TO_LEAF, D.TO_STORE, D.TO_LEAF),
        (D.TO_STORE, D.TO_STORE, D.TO_STORE),
        (D.STORED, D.TO_STORE, D.STORED),
        (D.LEAF, D.TO_DELETE, D.LEAF),
        (D.STORED_TO_DELETE, D.TO_STORE, D.STORED_TO_DELETE),
        (D.DELETING, D.TO_STORE, D.DELETING),
        (D.DELETED, D.TO_DELETE, D.TO_DELETE),
        (D.DELETED, D.TO_LEAF, D.TO_LEAF),
    ],
)
async def test_plan_upsert_rules(
    store: Store,
    make: Factory,
    clock: FakeClock,
    existing: DatasetState,
    planned: DatasetState,
    result: DatasetState,
) -> None:
    dataset_id = await seed_dataset(store, make, existing)
    sized = await store.transition_dataset(
        dataset_id,
        {existing},
        existing,
        DatasetChanges(size_bytes=10, digest="sha256:" + "ab" * 32, stored_at=clock.now),
    )
    before = await store.get_dataset(dataset_id)
    assert before is not None and before == sized
    now = clock.advance(1)

    plan = make.plan({0: ()}, datasets=False)
    claim = claim_key(plan.workflow.id, 5)
    planned_dataset = replace(
        make.dataset(plan.actions[0], id=dataset_id, state=planned, path="/new/path"),
        claims=(claim,),
    )
    await store.create_workflow(replace(plan, datasets=(planned_dataset,)))

    after = await store.get_dataset(dataset_id)
    assert after is not None
    assert after.state is result
    assert after.claims == (claim,)
    assert after.updated_at == now
    assert after.created_at == before.created_at
    if existing is D.DELETED:
        # Recomputed: this plan's action produces it now.
        assert (after.producer_workflow_id, after.producer_action_id) == (plan.workflow.id, 0)
        assert after.path == "/new/path"
        # Its files are gone: no size nor digest until the new computation stores it.
        assert (after.size_bytes, after.digest, after.stored_at) == (None, None, None)
    else:
        assert after.producer_workflow_id == before.producer_workflow_id
        assert after.path == before.path
        assert (after.size_bytes, after.stored_at) == (10, before.stored_at)
        assert after.digest == "sha256:" + "ab" * 32


async def test_plan_claims_are_a_set(store: Store, make: Factory) -> None:
    dataset_id = await seed_dataset(store, make, D.STORED, claims=("w/1", "w/2"))
    plan = make.plan({0: ()}, datasets=False)
    again = replace(
        make.dataset(plan.actions[0], id=dataset_id, state=D.STORED), claims=("w/2", "w/3")
    )
    await store.create_workflow(replace(plan, datasets=(again,)))
    record = await store.get_dataset(dataset_id)
    assert record is not None and sorted(record.claims) == ["w/1", "w/2", "w/3"]


async def test_get_datasets_returns_those_that_exist(store: Store, make: Factory) -> None:
    plan = make.plan()
    await store.create_workflow(plan)
    ids = [d.id for d in plan.datasets]
    found = await store.get_datasets([*ids, "missing", ids[0]])
    assert sorted(found) == sorted(ids)
    assert all(found[i].id == i for i in ids)
    assert await store.get_datasets([]) == {}
    assert await store.get_dataset("missing") is None


async def test_list_datasets_newest_first_with_cursor(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    made = []
    for i in range(5):
        clock.advance(1)
        made.append(await seed_dataset(store, make, D.STORED if i % 2 else D.LEAF))

    everything = await store.list_datasets()
    assert [d.id for d in everything.items] == list(reversed(made))
    stored = await store.list_datasets(state=D.STORED)
    assert [d.id for d in stored.items] == [made[3], made[1]]

    seen: list[str] = []
    page = await store.list_datasets(limit=2)
    seen.extend(d.id for d in page.items)
    while page.next_cursor is not None:
        clock.advance(1)
        await seed_dataset(store, make, D.STORED)  # newer: not in the pages being read
        page = await store.list_datasets(limit=2, cursor=page.next_cursor)
        seen.extend(d.id for d in page.items)
    assert seen == list(reversed(made))


async def test_list_datasets_in_scopes_pages_only_through_them(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    """Filtered in the store: every cursor is the position of a row in the scopes, never
    one of the datasets around them (whose ids and times it would give away)."""
    mine, bobs = [], []
    for i in range(6):
        clock.advance(1)
        scope = ("user:alice", "server", "user:bob")[i % 3]
        made = await seed_dataset(store, make, D.STORED, scope=scope, id=f"{i:02d}" + "ab" * 31)
        (bobs if scope == "user:bob" else mine).append(made)
    scopes = {"server", "user:alice"}
    seen: list[str] = []
    page = await store.list_datasets(scopes=scopes, limit=1)
    seen.extend(d.id for d in page.items)
    while page.next_cursor is not None:
        assert not any(bob in page.next_cursor for bob in bobs)
        page = await store.list_datasets(scopes=scopes, limit=1, cursor=page.next_cursor)
        seen.extend(d.id for d in page.items)
    assert seen == list(reversed(mine))
    assert not (await store.list_datasets(scopes=set())).items
    only_bobs = await store.list_datasets(state=D.STORED, scopes={"user:bob"})
    assert [d.id for d in only_bobs.items] == list(reversed(bobs))


async def test_transition_dataset_compare_and_set(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    dataset_id = await seed_dataset(store, make, D.TO_STORE)
    before = await store.get_dataset(dataset_id)
    assert before is not None
    now = clock.advance(2)

    stored = await store.transition_dataset(
        dataset_id,
        {D.TO_STORE, D.DELETED},
        D.STORED,
        DatasetChanges(size_bytes=1234, digest="sha256:" + "0f" * 32, compute_s=5.5, stored_at=now),
    )
    assert stored == replace(
        before,
        state=D.STORED,
        size_bytes=1234,
        digest="sha256:" + "0f" * 32,
        compute_s=5.5,
        stored_at=now,
        updated_at=now,
        version=before.version + 1,
    )
    assert await store.get_dataset(dataset_id) == stored
    assert (
        await store.transition_dataset(
            dataset_id, {D.TO_STORE}, D.STORED, DatasetChanges(size_bytes=1)
        )
        is None
    )
    assert await store.get_dataset(dataset_id) == stored
    assert await store.transition_dataset("missing", {D.STORED}, D.LEAF) is None

    moved = await store.transition_dataset(
        dataset_id,
        {D.STORED},
        D.STORED,
        DatasetChanges(path="/moved", producer_workflow_id="wf-x", producer_action_id=9),
    )
    assert moved is not None
    assert (moved.path, moved.producer_workflow_id, moved.producer_action_id) == (
        "/moved",
        "wf-x",
        9,
    )


async def test_transition_dataset_appends_its_event_only_when_it_moves(
    store: Store, make: Factory, backend: Backend
) -> None:
    dataset_id = await seed_dataset(store, make, D.TO_STORE)
    event = NewEvent("dataset.stored", "alice", "wf-1", dataset_id, {"sizeBytes": 7})

    lost = await store.transition_dataset(dataset_id, {D.DELETED}, D.STORED, event=event)
    assert lost is None
    assert await store.list_events(dataset_id=dataset_id) == []

    moved = await store.transition_dataset(dataset_id, {D.TO_STORE}, D.STORED, event=event)
    assert moved is not None and moved.state is D.STORED
    [recorded] = await store.list_events(dataset_id=dataset_id)
    assert (recorded.kind, recorded.owner, recorded.workflow_id, recorded.payload) == (
        "dataset.stored",
        "alice",
        "wf-1",
        {"sizeBytes": 7},
    )
    assert await store.list_events(owner="alice") == [recorded]

    if backend.name == "sqlite":
        # One transaction: an event that cannot be written takes the move back with it.
        unwritable = replace(event, payload={"sizeBytes": object()})
        with pytest.raises(TypeError):
            await store.transition_dataset(dataset_id, {D.STORED}, D.LEAF, event=unwritable)
        again = await store.get_dataset(dataset_id)
        assert again is not None and again.state is D.STORED


async def test_transition_dataset_if_unclaimed(store: Store, make: Factory) -> None:
    dataset_id = await seed_dataset(store, make, D.STORED_TO_DELETE, claims=("w/1",))

    assert (
        await store.transition_dataset(
            dataset_id, {D.STORED_TO_DELETE}, D.PROCESSING, if_unclaimed=True
        )
        is None
    )
    removed = await store.remove_dataset_claim(dataset_id, "w/1")
    assert removed is not None and removed.claims == ()
    claimed = await store.transition_dataset(
        dataset_id, {D.STORED_TO_DELETE}, D.PROCESSING, if_unclaimed=True
    )
    assert claimed is not None and claimed.state is D.PROCESSING


async def test_dataset_claims_are_conditional_on_state(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    dataset_id = await seed_dataset(store, make, D.STORED)
    reusable = {D.STORED, D.LEAF}
    now = clock.advance(1)

    first = await store.add_dataset_claim(dataset_id, "w/1", reusable)
    assert first is not None and first.claims == ("w/1",) and first.updated_at == now
    again = await store.add_dataset_claim(dataset_id, "w/1", reusable)
    assert again is not None and again.claims == ("w/1",)
    second = await store.add_dataset_claim(dataset_id, "w/2", reusable)
    assert second is not None and second.claims == ("w/1", "w/2")

    await store.transition_dataset(dataset_id, {D.STORED}, D.STORED_TO_DELETE)
    assert await store.add_dataset_claim(dataset_id, "w/3", reusable) is None
    current = await store.get_dataset(dataset_id)
    assert current is not None and current.claims == ("w/1", "w/2")
    assert await store.add_dataset_claim("missing", "w/3", reusable) is None

    removed = await store.remove_dataset_claim(dataset_id, "w/1")
    assert removed is not None and removed.claims == ("w/2",)
    # Removing is idempotent, in any state.
    same = await store.remove_dataset_claim(dataset_id, "w/1")
    assert same is not None and same.claims == ("w/2",) and same.version == removed.version
    assert await store.remove_dataset_claim("missing", "w/1") is None


async def test_list_claimed_datasets_pages_by_id_in_every_state(
    store: Store, make: Factory
) -> None:
    claimed = [
        await seed_dataset(store, make, state, claims=(f"w/{i}",))
        for i, state in enumerate((D.STORED, D.LEAF, D.STORED_TO_DELETE, D.TO_STORE, D.STORED))
    ]
    unclaimed = await seed_dataset(store, make, D.STORED)
    released = claimed.pop()
    await store.remove_dataset_claim(released, "w/4")
    assert await store.list_claimed_datasets(limit=0) == []

    seen: list[str] = []
    after: str | None = None
    for _ in range(len(claimed)):
        page = await store.list_claimed_datasets(after=after, limit=3)
        if not page:
            break
        assert len(page) <= 3 and (after is None or page[0].id > after)
        seen.extend(d.id for d in page)
        after = page[-1].id
    assert seen == sorted(claimed)
    assert unclaimed not in seen and released not in seen
    everything = await store.list_claimed_datasets()
    assert [(d.id, d.claims) for d in everything] == [
        (d, (await store.get_dataset(d)).claims)  # type: ignore[union-attr]
        for d in sorted(claimed)
    ]


async def test_record_use_and_pinning(store: Store, make: Factory, clock: FakeClock) -> None:
    dataset_id = await seed_dataset(store, make, D.STORED)
    other = await seed_dataset(store, make, D.STORED)
    first_use = clock.advance(1)
    # Named twice, counted once; a missing one is not counted.
    assert await store.record_dataset_uses([dataset_id, "missing", dataset_id, other]) == 2
    used = await store.get_dataset(dataset_id)
    assert used is not None and (used.use_count, used.last_used_at) == (1, first_use)
    assert used.updated_at == first_use
    second_use = clock.advance(1)
    assert await store.record_dataset_uses([dataset_id]) == 1
    used = await store.get_dataset(dataset_id)
    assert used is not None and (used.use_count, used.last_used_at) == (2, second_use)
    untouched = await store.get_dataset(other)
    assert untouched is not None and (untouched.use_count, untouched.last_used_at) == (1, first_use)
    assert await store.record_dataset_uses(["missing"]) == 0
    assert await store.record_dataset_uses([]) == 0

    pinned = await store.set_dataset_pinned(dataset_id, True)
    assert pinned is not None and pinned.pinned
    again = await store.set_dataset_pinned(dataset_id, True)
    assert again is not None and again.pinned
    unpinned = await store.set_dataset_pinned(dataset_id, False)
    assert unpinned is not None and not unpinned.pinned
    assert await store.set_dataset_pinned("missing", True) is None


async def test_deletable_datasets(store: Store, make: Factory, clock: FakeClock) -> None:
    free = await seed_dataset(store, make, D.STORED_TO_DELETE)
    claimed = await seed_dataset(store, make, D.STORED_TO_DELETE, claims=("w/1",))
    busy = await seed_dataset(store, make, D.PROCESSING)
    deleting = await seed_dataset(store, make, D.DELETING)
    for state in (D.STORED, D.LEAF, D.DELETED, D.TO_DELETE):
        await seed_dataset(store, make, state)

    found = await store.list_deletable_datasets(stale_s=60)
    assert [d.id for d in found] == [free]

    clock.advance(60)  # the deletors of `busy` and `deleting` look dead now
    found = await store.list_deletable_datasets(stale_s=60)
    assert sorted(d.id for d in found) == sorted([free, busy, deleting])
    assert claimed not in {d.id for d in found}
    assert len(await store.list_deletable_datasets(stale_s=60, limit=2)) == 2


async def test_retention_candidates_and_bytes_by_state(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    assert await store.bytes_by_state() == {}
    sizes = {D.STORED: [100, 250], D.LEAF: [7], D.STORED_TO_DELETE: [1000]}
    stored_ids = []
    for state, values in sizes.items():
        for size in values:
            dataset_id = await seed_dataset(store, make, state)
            done = await store.transition_dataset(
                dataset_id, {state}, state, DatasetChanges(size_bytes=size, compute_s=2.0)
            )
            assert done is not None
            if state is D.STORED:
                stored_ids.append(dataset_id)
    pinned_claimed = await seed_dataset(store, make, D.STORED, claims=("w/1",))
    await store.set_dataset_pinned(pinned_claimed, True)
    await seed_dataset(store, make, D.TO_STORE)  # no size yet

    candidates = await store.list_retention_candidates()
    assert sorted(d.id for d in candidates) == sorted([*stored_ids, pinned_claimed])
    by_id = {d.id: d for d in candidates}
    assert by_id[stored_ids[1]].size_bytes == 250
    assert by_id[stored_ids[1]].compute_s == 2.0
    assert by_id[pinned_claimed].pinned and by_id[pinned_claimed].claims == ("w/1",)

    assert await store.bytes_by_state() == {
        D.STORED: 350,
        D.LEAF: 7,
        D.STORED_TO_DELETE: 1000,
        D.TO_STORE: 0,
    }

    # Totals follow datasets across states; a state left empty drops out.
    await store.transition_dataset(stored_ids[1], {D.STORED}, D.STORED_TO_DELETE)
    leaf = (await store.list_datasets(state=D.LEAF)).items[0]
    await store.transition_dataset(leaf.id, {D.LEAF}, D.STORED_TO_DELETE)
    await store.transition_dataset(
        stored_ids[0], {D.STORED}, D.STORED, DatasetChanges(size_bytes=None)
    )
    assert await store.bytes_by_state() == {
        D.STORED: 0,
        D.STORED_TO_DELETE: 1257,
        D.TO_STORE: 0,
    }


async def test_dataset_of_a_finished_action_is_reachable(store: Store, make: Factory) -> None:
    plan = make.plan({0: ()}, actions={0: {"state": ActionState.FINISHED}})
    await store.create_workflow(plan)
    action = await store.get_action(plan.workflow.id, 0)
    assert action is not None
    dataset = await store.get_dataset(action.dataset_id)
    assert dataset is not None and dataset.producer_action_id == 0


async def test_a_dataset_planned_twice_in_one_plan_is_merged(store: Store, make: Factory) -> None:
    plan = make.plan({0: (), 1: ()}, datasets=False)
    first = replace(make.dataset(plan.actions[0], state=D.TO_STORE), claims=("w/a",))
    second = replace(make.dataset(plan.actions[1], id=first.id, state=D.TO_LEAF), claims=("w/b",))
    await store.create_workflow(replace(plan, datasets=(first, second)))

    record = await store.get_dataset(first.id)
    assert record is not None
    assert record.state is D.TO_LEAF
    assert sorted(record.claims) == ["w/a", "w/b"]
    assert record.producer_action_id == 0  # the first plan created it
    assert await store.bytes_by_state() == {D.TO_LEAF: 0}


async def test_a_naive_time_is_refused_by_every_backend(store: Store, make: Factory) -> None:
    # One codec for times (`pingo.store._cursor`): a time without a zone is a
    # caller's bug, refused alike, never read as UTC by one backend only.
    dataset_id = await seed_dataset(store, make, D.TO_STORE)
    naive = datetime(2026, 1, 1, 12, 0)
    with pytest.raises(ValueError, match="naive"):
        await store.transition_dataset(
            dataset_id, {D.TO_STORE}, D.STORED, DatasetChanges(stored_at=naive)
        )
    record = await store.get_dataset(dataset_id)
    assert record is not None and record.state is D.TO_STORE

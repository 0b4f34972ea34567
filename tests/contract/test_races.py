"""Races: concurrent claimers and writers; each action is claimed exactly once."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
from collections import Counter
from typing import Any

import pytest

from pingo.states import ActionState, DatasetState
from pingo.store.protocol import ActionChanges, Store
from tests.contract import race_worker
from tests.contract.conftest import SHARED_BACKENDS, Backend, Factory, FakeClock, seed_dataset

A = ActionState
COUNT = 1000
#: mongomock deep-copies and sorts every matching document on each query, so one
#: claim costs O(n) and a 1,000-action race takes half a minute; the race itself
#: is the same with fewer actions.
COUNT_ON = {"mongomock": 200}


async def test_two_claimers_one_winner(store: Store, make: Factory) -> None:
    plan = make.ready_plan(1)
    await store.create_workflow(plan)
    a, b = await asyncio.gather(
        store.claim_actions("node-a", 1, lease_s=30), store.claim_actions("node-b", 1, lease_s=30)
    )
    assert len(a) + len(b) == 1
    winner = "node-a" if a else "node-b"
    record = await store.get_action(plan.workflow.id, 0)
    assert record is not None and record.owner == winner


async def test_nodes_claiming_by_quotas_split_the_work_each_within_its_quota(
    store: Store, make: Factory
) -> None:
    plan = make.plan(
        {i: () for i in range(60)},
        datasets=False,
        actions={i: {"type": ("spark", "command-line")[i % 2]} for i in range(60)},
    )
    await store.create_workflow(plan)

    async def node(node_id: str, quotas: dict[str, int]) -> list[Any]:
        got = await store.claim_actions(node_id, 64, lease_s=600, quotas=quotas)
        await asyncio.sleep(0)
        return got

    quotas = [{"spark": 5, "command-line": 3}, {"spark": 2}, {"command-line": 9}] * 3
    results = await asyncio.gather(*(node(f"node-{i}", q) for i, q in enumerate(quotas)))

    counts = Counter(a.key for got in results for a in got)
    assert set(counts.values()) <= {1}  # never twice
    for got, quota in zip(results, quotas, strict=True):
        by_type = Counter(a.type for a in got)
        assert all(by_type[t] <= quota.get(t, 0) for t in by_type), (by_type, quota)
    # All 21 spark asked for (of 30), and all 30 command-line (36 asked for).
    assert Counter(key[1] % 2 for key in counts) == {0: 21, 1: 30}


async def test_eight_tasks_claim_each_action_exactly_once(
    store: Store, make: Factory, backend: Backend
) -> None:
    count = COUNT_ON.get(backend.name, COUNT)
    plan = make.ready_plan(count)
    await store.create_workflow(plan)

    async def claimer(node_id: str) -> list[tuple[str, int]]:
        keys: list[tuple[str, int]] = []
        while True:
            got = await store.claim_actions(node_id, 7, lease_s=600)
            if not got:
                return keys
            assert all(a.owner == node_id and a.state is A.PROCESSING for a in got)
            keys.extend(a.key for a in got)
            await asyncio.sleep(0)  # let the others in, even on a store that never awaits

    results = await asyncio.gather(*(claimer(f"node-{i}") for i in range(8)))

    counts = Counter(key for keys in results for key in keys)
    assert len(counts) == count
    assert set(counts.values()) == {1}
    assert sum(1 for keys in results if keys) > 1  # it really was a race
    assert await store.count_actions(plan.workflow.id) == {A.PROCESSING: count}


async def test_racing_batch_claims_return_exactly_what_the_store_holds(
    store: Store, make: Factory
) -> None:
    # A batch claim may build its records without reading them back: each must be the
    # stored action as claimed (owner, lease, version), whether it won all or part.
    plan = make.ready_plan(40)
    await store.create_workflow(plan)

    async def claimer(node_id: str) -> list[Any]:
        got: list[Any] = []
        while batch := await store.claim_actions(node_id, 6, lease_s=600):
            got.extend(batch)
            await asyncio.sleep(0)
        return got

    results = await asyncio.gather(*(claimer(f"node-{i}") for i in range(4)))
    claimed = [record for records in results for record in records]
    assert sorted(r.action_id for r in claimed) == list(range(40))
    for record in claimed:
        stored = await store.get_action(plan.workflow.id, record.action_id)
        assert stored == record


async def test_concurrent_transitions_of_one_action_have_one_winner(
    store: Store, make: Factory
) -> None:
    plan = make.plan({0: ()}, actions={0: {"state": A.RUNNING, "attempts": 1}})
    await store.create_workflow(plan)
    wid = plan.workflow.id

    results = await asyncio.gather(
        *(
            store.transition_action(
                wid,
                0,
                {A.SUBMITTED, A.RUNNING},
                A.FINISHED if i % 2 else A.FAILED,
                ActionChanges(error=f"writer {i}"),
                if_attempt=1,
            )
            for i in range(8)
        )
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await store.get_action(wid, 0) == winners[0]


async def test_concurrent_releases_flip_a_child_once(store: Store, make: Factory) -> None:
    parents = {i: () for i in range(6)}
    plan = make.plan({**parents, 6: tuple(parents)}, datasets=False)
    await store.create_workflow(plan)
    wid = plan.workflow.id

    # Every parent finishes at once, and each release is delivered twice.
    results = await asyncio.gather(
        *(store.release_parent(wid, p, (6,)) for p in [*parents, *parents])
    )

    flipped = [a for ready in results for a in ready]
    assert [a.action_id for a in flipped] == [6]
    child = await store.get_action(wid, 6)
    assert child is not None and (child.state, child.waiting_on) == (A.READY, ())


async def test_concurrent_finishes_have_one_winner_and_flip_a_child_once(
    store: Store, make: Factory
) -> None:
    parents = {i: () for i in range(6)}
    plan = make.plan(
        {**parents, 6: tuple(parents)},
        actions={i: {"state": A.RUNNING, "attempts": 1} for i in parents},
        datasets=False,
    )
    await store.create_workflow(plan)
    wid = plan.workflow.id

    # Every parent finishes at once, and each success is delivered twice.
    results = await asyncio.gather(
        *(
            store.finish_action(wid, p, {A.SUBMITTED, A.RUNNING}, if_attempt=1)
            for p in [*parents, *parents]
        )
    )

    won = [r for r in results if r is not None]
    assert sorted(finished.action.action_id for finished in won) == list(parents)
    flipped = [a for finished in won for a in finished.released]
    assert [a.action_id for a in flipped] == [6]
    child = await store.get_action(wid, 6)
    assert child is not None and (child.state, child.waiting_on) == (A.READY, ())


async def test_concurrent_claims_on_a_dataset_being_deleted(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    dataset_id = await seed_dataset(store, make, DatasetState.STORED_TO_DELETE)
    reusable = {DatasetState.STORED, DatasetState.LEAF, DatasetState.STORED_TO_DELETE}

    # A planner claims while the deletor takes it only if unclaimed: never both.
    claim, deletor = await asyncio.gather(
        store.add_dataset_claim(dataset_id, "w/1", reusable),
        store.transition_dataset(
            dataset_id,
            {DatasetState.STORED_TO_DELETE},
            DatasetState.PROCESSING,
            if_unclaimed=True,
        ),
    )
    final = await store.get_dataset(dataset_id)
    assert final is not None
    if deletor is not None and claim is not None:
        pytest.fail("a dataset was claimed while a deletor took it as unclaimed")
    if deletor is not None:
        assert final.state is DatasetState.PROCESSING and final.claims == ()
    else:
        assert final.claims == ("w/1",)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    backend: Backend = request.getfixturevalue("backend_" + request.param)
    return backend


@pytest.fixture
def backend_sqlite(tmp_path: Any) -> Backend:
    return Backend("sqlite", f"sqlite:///{tmp_path / 'race.db'}")


@pytest.fixture
def backend_wire(wire_url: str) -> Backend:
    import uuid

    from tests.contract.conftest import with_database

    return Backend("wire", with_database(wire_url, f"pingo_race_{uuid.uuid4().hex[:12]}"))


async def test_three_processes_claim_each_action_exactly_once(
    shared_backend: Backend, make: Factory
) -> None:
    from pingo.store import open_store

    url = shared_backend.url
    assert url is not None
    plan = make.ready_plan(COUNT)
    async with open_store(url) as store:
        await store.create_workflow(plan)

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    results: Any = ctx.Queue()
    processes = [
        ctx.Process(
            target=race_worker.claim_all,
            args=(url, f"proc-{i}", 5, barrier, results),
            name=f"claimer-{i}",
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    try:
        reports = []
        for _ in processes:
            reports.append(await asyncio.to_thread(results.get, True, 90))
    except queue.Empty:
        pytest.fail("a claiming process did not report within 90 s")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()

    errors = [error for _, _, error in reports if error]
    assert not errors, errors[0]
    claimed = {node: keys for node, keys, _ in reports}
    counts = Counter(tuple(key) for keys in claimed.values() for key in keys)
    assert set(counts) == {(plan.workflow.id, i) for i in range(COUNT)}
    assert set(counts.values()) == {1}, "an action was claimed twice"
    assert all(process.exitcode == 0 for process in processes)

    async with open_store(url) as store:
        records = await store.list_actions(plan.workflow.id)
    for record in records:
        assert record.state is A.PROCESSING
        assert record.key in {tuple(k) for k in claimed[record.owner or ""]}

"""Ids by unique prefix (git-style): the store's range queries and `pingo.store.lookup`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pingo import errors
from pingo.store import lookup
from pingo.store.protocol import Store
from tests.contract.conftest import Factory

A1 = "wf-00000abcd-1111111111"
A2 = "wf-00000abcd-2222222222"
B1 = "wf-00000abce-3333333333"


async def _workflows(store: Store, make: Factory, owners: dict[str, str]) -> None:
    for workflow_id, owner in owners.items():
        await store.create_workflow(make.plan({0: ()}, datasets=False, id=workflow_id, owner=owner))


async def _datasets(store: Store, make: Factory, scopes: dict[str, str]) -> None:
    for dataset_id, scope in scopes.items():
        plan = make.plan({0: ()}, actions={0: {"dataset_id": dataset_id}})
        await store.create_workflow(
            replace(plan, datasets=(replace(plan.datasets[0], scope=scope),))
        )


async def test_find_workflow_ids_by_prefix_in_id_order(store: Store, make: Factory) -> None:
    await _workflows(store, make, {A2: "alice", A1: "alice", B1: "bob"})

    assert await store.find_workflow_ids("wf-00000abc", limit=5) == [A1, A2, B1]
    assert await store.find_workflow_ids("wf-00000abc", limit=2) == [A1, A2]
    assert await store.find_workflow_ids("wf-00000abcd") == [A1, A2]
    assert await store.find_workflow_ids(A1) == [A1]
    assert await store.find_workflow_ids("wf-00000abcz") == []


async def test_find_workflow_ids_sees_only_the_owner(store: Store, make: Factory) -> None:
    await _workflows(store, make, {A1: "alice", A2: "alice", B1: "bob"})

    assert await store.find_workflow_ids("wf-00000abc", owner="bob", limit=5) == [B1]
    assert await store.find_workflow_ids("wf-00000abcd", owner="bob") == []
    assert await store.find_workflow_ids("wf-00000abcd", owner="carol") == []


async def test_find_dataset_ids_by_prefix_and_scope(store: Store, make: Factory) -> None:
    shared, mine, theirs = "ab" * 32, "abc" + "0" * 61, "abd" + "1" * 61
    await _datasets(store, make, {shared: "server", mine: "user:bob", theirs: "user:alice"})

    assert await store.find_dataset_ids("ab", limit=5) == [shared, mine, theirs]
    bob = {"server", "user:bob"}
    assert await store.find_dataset_ids("ab", scopes=bob, limit=5) == [shared, mine]
    assert await store.find_dataset_ids("abd", scopes=bob) == []
    assert await store.find_dataset_ids("abd", scopes=set()) == []


async def test_prefix_characters_are_literal(store: Store, make: Factory) -> None:
    """No wildcard of SQL LIKE, a regex or GLOB leaks through."""
    await _workflows(store, make, {A1: "alice"})

    for pattern in ("wf-%", "wf-_0000", "wf-.*", "wf-*", "wf-[0]", "wf-0000\\"):
        assert await store.find_workflow_ids(pattern) == []


async def test_lookup_resolves_a_unique_prefix(store: Store, make: Factory) -> None:
    await _workflows(store, make, {A1: "alice", B1: "alice"})

    assert (await lookup.workflow(store, "wf-00000abcd", owner="alice")).id == A1
    assert (await lookup.workflow(store, A1, owner=None)).id == A1
    with pytest.raises(errors.AmbiguousId, match=f"{A1}, {B1}"):
        await lookup.workflow(store, "wf-00000abc", owner=None)


async def test_lookup_needs_eight_characters(store: Store, make: Factory) -> None:
    await _workflows(store, make, {A1: "alice"})

    with pytest.raises(errors.NotFound):
        await lookup.workflow(store, "wf-0000", owner=None)
    assert (await lookup.workflow(store, "wf-00000", owner=None)).id == A1


async def test_lookup_never_counts_what_the_requester_cannot_see(
    store: Store, make: Factory
) -> None:
    await _workflows(store, make, {A1: "alice", A2: "alice", B1: "bob"})

    # Only alice's match: not found for bob (neither ambiguous nor forbidden).
    with pytest.raises(errors.NotFound):
        await lookup.workflow(store, "wf-00000abcd", owner="bob")
    with pytest.raises(errors.NotFound):
        await lookup.workflow(store, A1, owner="bob")
    # Alice's and bob's match: bob's alone is unique to bob.
    assert (await lookup.workflow(store, "wf-00000abc", owner="bob")).id == B1


async def test_lookup_datasets_within_scopes(store: Store, make: Factory) -> None:
    mine, shared = "abcdef00" + "0" * 56, "abcdef00" + "1" * 56
    theirs = "abcdef11" + "1" * 56
    await _datasets(store, make, {mine: "user:bob", shared: "server", theirs: "user:alice"})
    bob = {"server", "user:bob"}

    assert (await lookup.dataset(store, "abcdef000", scopes=bob)).id == mine
    assert (await lookup.dataset(store, "abcdef001", scopes=bob)).id == shared
    with pytest.raises(errors.AmbiguousId):
        await lookup.dataset(store, "abcdef00", scopes=bob)
    # Alice's dataset is out of bob's scopes: a prefix of it alone, or its full id, is unknown.
    with pytest.raises(errors.NotFound):
        await lookup.dataset(store, "abcdef11", scopes=bob)
    with pytest.raises(errors.NotFound):
        await lookup.dataset(store, theirs, scopes=bob)

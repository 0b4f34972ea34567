"""MongoStore specifics the contract suite does not see: errors, indexes, document layout."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from mongomock_motor import AsyncMongoMockClient
from pymongo import AsyncMongoClient, monitoring

from pingo import errors, testing
from pingo.states import ActionState, WorkflowState
from pingo.store import open_store
from pingo.store.mongo import MongoStore, parse_write_concern
from pingo.store.protocol import (
    ActionRecord,
    StateEntry,
    UserRecord,
    WorkflowPlan,
    WorkflowRecord,
)

#: A time with microseconds, which BSON dates would truncate.
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture(scope="module")
def wire_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with testing.wire_server(tmp_path_factory.mktemp("wire")) as server:
        yield server.url


@pytest.fixture
async def wire_store(wire_url: str, request: pytest.FixtureRequest) -> AsyncIterator[MongoStore]:
    database = f"unit_{request.node.name}".replace("[", "_").replace("]", "")[:60]
    async with MongoStore.from_url(f"{wire_url}/{database}", clock=lambda: T0) as store:
        yield store


def _plan(workflow_id: str = "wf", document: dict[str, Any] | None = None) -> WorkflowPlan:
    workflow = WorkflowRecord(
        id=workflow_id,
        name="n",
        owner="alice",
        state=WorkflowState.RUNNING,
        document=document or {},
        scope="server",
        on_failure="abort",
        end_dataset_id=None,
        created_at=T0,
    )
    action = ActionRecord(
        workflow_id=workflow_id,
        action_id=7,
        name="a",
        type="command-line",
        state=ActionState.READY,
        dataset_id="d" * 64,
        reused=False,
        reason="absent",
        definition={"command": ["echo", "{output}"]},
        inputs={3: "e" * 64, 12: "f" * 64},
        waiting_on=(),
        children=(9,),
        callback_id=f"cb-{workflow_id}",
        created_at=T0,
        updated_at=T0,
        not_before=T0 + timedelta(microseconds=1),
    )
    return WorkflowPlan(workflow=workflow, actions=(action,), datasets=())


# ------------------------------------------------------------------------ errors


async def test_an_unreachable_server_is_store_unavailable(tmp_path: Path) -> None:
    # A Unix socket nobody listens on fails at once. (A refused TCP port works too,
    # but pymongo 4.20 leaks the socket of a connect cancelled by close(), and pytest
    # turns the ResourceWarning into an error at the end of the session.)
    url = f"mongodb://{quote(str(tmp_path / 'absent.sock'), safe='')}/x"
    url += "?serverSelectionTimeoutMS=200"
    store = MongoStore.from_url(url)
    with pytest.raises(errors.StoreUnavailable) as failure:
        await store.__aenter__()
    # The driver's exception is the cause, never what leaves the store.
    assert type(failure.value.__cause__).__module__.startswith("pymongo")

    store = MongoStore.from_url(url)
    with pytest.raises(errors.StoreUnavailable):
        await store.ping()
    await store.__aexit__(None, None, None)


async def test_a_duplicate_key_is_a_conflict(wire_store: MongoStore) -> None:
    user = UserRecord(name="bob", token_hash="h1", is_admin=False, created_at=T0)
    await wire_store.create_user(user)
    with pytest.raises(errors.Conflict, match="already exists"):
        await wire_store.create_user(user)
    with pytest.raises(errors.Conflict, match="same token"):
        await wire_store.create_user(
            UserRecord(name="carol", token_hash="h1", is_admin=False, created_at=T0)
        )


def test_write_concern_is_majority_or_a_node_count() -> None:
    assert parse_write_concern("majority").document == {"w": "majority"}
    assert parse_write_concern("1").document == {"w": 1}
    assert parse_write_concern(" 2 ").document == {"w": 2}
    for bad in ("0", ""):
        with pytest.raises(errors.ConfigurationError):
            parse_write_concern(bad)


def test_a_bad_url_is_a_configuration_error() -> None:
    with pytest.raises(errors.ConfigurationError):
        MongoStore.from_url("mongodb://")


@pytest.mark.parametrize(
    ("url", "database"),
    [
        ("mongodb://h", "pingo"),
        ("mongodb://h/", "pingo"),
        ("mongodb://h/?replicaSet=rs", "pingo"),
        ("mongodb://u:p%40ss@h1:1,h2:2/prod?replicaSet=rs", "prod"),
        ("mongodb+srv://cluster.example.invalid/team%2Dx", "team-x"),
    ],
)
async def test_the_database_comes_from_the_url_path(url: str, database: str) -> None:
    # Nothing connects (nor resolves the SRV name) before the store is entered.
    store = MongoStore.from_url(url)
    assert store._db.name == database
    await store.__aexit__(None, None, None)


async def test_open_store_picks_the_database_from_the_url(wire_url: str) -> None:
    async with open_store(f"{wire_url}/from_url_db", mongo_write_concern="1") as store:
        assert isinstance(store, MongoStore)
        await store.ping()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(wire_url)
    try:
        assert "from_url_db" in await client.list_database_names()
    finally:
        await client.close()


# ----------------------------------------------------------------------- indexes


async def test_indexes_are_created_at_start_and_again_idempotently() -> None:
    client = AsyncMongoMockClient()
    async with MongoStore(client, "idx"):
        pass
    async with MongoStore(client, "idx"):  # a second node starting on the same database
        pass
    db = client["idx"]
    actions = await db["actions"].index_information()
    assert actions["callback_id"].get("unique") is True
    assert actions["claimable"]["key"] == [
        ("state", 1),
        ("updated_at_us", 1),
        ("workflow_id", 1),
        ("action_id", 1),
    ]
    assert actions["lease_expiry"]["key"] == [("state", 1), ("lease_expires_at_us", 1)]
    workflows = await db["workflows"].index_information()
    assert workflows["idempotency"].get("unique") is True
    assert workflows["idempotency"].get("sparse") is True
    assert workflows["owner_newest"]["key"] == [("owner", 1), ("created_at_us", -1), ("id", -1)]
    assert (await db["users"].index_information())["token_hash"].get("unique") is True
    assert "state_age" in await db["datasets"].index_information()


async def test_indexes_on_the_wire_server_are_idempotent(wire_url: str) -> None:
    for _ in range(2):
        async with MongoStore.from_url(f"{wire_url}/idx_twice") as store:
            await store.ping()


class _Commands(monitoring.CommandListener):
    """Every command a client sends (its name and body)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name != "endSessions":
            self.sent.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def sorted_reads(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(filter, sort) of every read of the actions: finds, and aggregation parts."""
        reads = []

        def parts(pipeline: list[dict[str, Any]], collection: str) -> None:
            query: dict[str, Any] = {}
            for stage in pipeline:
                if "$match" in stage:
                    query = stage["$match"]
                elif "$sort" in stage and collection == "actions":
                    reads.append((dict(query), dict(stage["$sort"])))
                elif "$unionWith" in stage:
                    union = stage["$unionWith"]
                    parts(union.get("pipeline", []), union["coll"])

        for name, command in self.sent:
            if name == "find" and command["find"] == "actions":
                reads.append((dict(command["filter"]), dict(command.get("sort", {}))))
            elif name == "aggregate" and command["aggregate"] == "actions":
                parts(command["pipeline"], "actions")
        return reads


async def _claim_with(
    wire_url: str, database: str, options: dict[str, Any]
) -> tuple[list[ActionRecord], _Commands]:
    """Claim the one READY action of `_plan()`, recording the claim's commands."""
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        wire_url, tz_aware=True, event_listeners=[commands]
    )
    async with MongoStore(client, database, clock=lambda: T0, owns_client=True) as store:
        await store.create_workflow(_plan())
        store.clock = lambda: T0 + timedelta(seconds=1)
        commands.sent.clear()
        claimed = await store.claim_actions("n1", 10, 30, **options)
    return claimed, commands


_CLAIM_OPTIONS = pytest.mark.parametrize(
    "options",
    [{}, {"quotas": {"command-line": 5}}, {"max_in_flight": 5}],
    ids=["plain", "quotas", "capped"],
)


@_CLAIM_OPTIONS
async def test_claim_reads_never_sort_by_a_field_their_filter_pins(
    wire_url: str, options: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    # nx-27017's SQLite cannot serve `ORDER BY state, updated_at, ...` from the
    # `claimable` index when the WHERE pins `state`: it reads and sorts every READY action
    # (8 ms at 3,000 instead of 0.05 ms). The index order after the pinned fields is the same.
    claimed, commands = await _claim_with(
        wire_url, f"unit_sort_{request.node.callspec.id}", options
    )
    assert [a.action_id for a in claimed] == [7]
    reads = commands.sorted_reads()
    assert reads, commands.sent
    for query, sort in reads:
        pinned = {k for k, v in query.items() if not isinstance(v, dict)}
        assert sort, query
        assert not pinned & sort.keys(), (query, sort)


@pytest.mark.parametrize("options", [{}, {"quotas": {"command-line": 5}}], ids=["plain", "quotas"])
async def test_an_uncapped_claim_reads_in_one_round_trip(
    wire_url: str, options: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    # The users' caps, the expired leases and the READY actions: one aggregation. It
    # found fewer than asked for and won them all: nothing is read again after the claim.
    claimed, commands = await _claim_with(
        wire_url, f"unit_trips_{request.node.callspec.id}", options
    )
    assert [a.action_id for a in claimed] == [7]
    assert [name for name, _ in commands.sent] == ["aggregate", "update"]


async def test_a_capped_claim_reads_the_room_in_one_round_trip(wire_url: str) -> None:
    # The caps, the in-flight counts and the expired leases: one aggregation; then the
    # READY actions within the room, their workflows' owners, the claim, and no more.
    claimed, commands = await _claim_with(wire_url, "unit_trips_capped", {"max_in_flight": 5})
    assert [a.action_id for a in claimed] == [7]
    names = [(name, command[name]) for name, command in commands.sent]
    assert names == [
        ("aggregate", "actions"),
        ("find", "actions"),
        ("find", "workflows"),
        ("update", "actions"),
    ]
    stages = [next(iter(stage)) for stage in commands.sent[0][1]["pipeline"]]
    assert stages == ["$match", "$group", "$unionWith", "$unionWith"]


async def test_a_capped_claim_looks_up_each_workflows_owner_once(wire_url: str) -> None:
    # The in-flight counts name the workflow of the READY candidates too: one lookup.
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        wire_url, tz_aware=True, event_listeners=[commands]
    )
    plan = _plan()
    second = replace(plan.actions[0], action_id=8, callback_id="cb-wf-8")
    async with MongoStore(client, "unit_owners_once", clock=lambda: T0, owns_client=True) as store:
        await store.create_workflow(replace(plan, actions=(*plan.actions, second)))
        store.clock = lambda: T0 + timedelta(seconds=1)
        assert [a.action_id for a in await store.claim_actions("n1", 1, 30, max_in_flight=5)] == [7]
        commands.sent.clear()
        assert [a.action_id for a in await store.claim_actions("n1", 1, 30, max_in_flight=5)] == [8]
    lookups = [c for name, c in commands.sent if name == "find" and c["find"] == "workflows"]
    assert len(lookups) == 1, lookups


async def test_a_server_without_union_with_gets_the_claim_reads_apart() -> None:
    # mongomock has no $unionWith: the claim reads apart, and keeps doing so.
    async with MongoStore(AsyncMongoMockClient(), "nounion", clock=lambda: T0) as store:
        await store.create_workflow(_plan())
        store.clock = lambda: T0 + timedelta(seconds=1)
        assert [a.action_id for a in await store.claim_actions("n1", 10, 30)] == [7]
        assert store._union_claim_reads is False
        store.clock = lambda: T0 + timedelta(seconds=60)  # the lease expired
        assert [a.owner for a in await store.claim_actions("n2", 10, 30)] == ["n2"]


# ------------------------------------------------------------------ document layout


async def test_times_are_exact_microsecond_integers(wire_store: MongoStore) -> None:
    plan = _plan(document={"$weird": {"a.b": [1, None]}})
    await wire_store.create_workflow(plan)
    raw = await wire_store._actions.find_one({"_id": "wf/7"})
    assert raw is not None
    assert raw["updated_at_us"] == 1772366400123456
    assert raw["not_before_us"] == 1772366400123457
    action = await wire_store.get_action("wf", 7)
    # Microseconds, int parent ids and all; the store opens the history at creation.
    planned = plan.actions[0]
    assert action == replace(planned, history=(StateEntry(planned.state, planned.created_at),))
    assert raw["history"] == [{"state": planned.state.value, "at_us": raw["created_at_us"]}]
    workflow = await wire_store.get_workflow("wf")
    assert workflow == plan.workflow  # keys MongoDB would refuse are stored as JSON text


async def test_not_before_is_compared_to_the_microsecond(wire_store: MongoStore) -> None:
    await wire_store.create_workflow(_plan())
    assert await wire_store.claim_actions("n1", 10, 30) == []  # 1 µs too early
    wire_store.clock = lambda: T0 + timedelta(microseconds=1)
    claimed = await wire_store.claim_actions("n1", 10, 30)
    assert [a.action_id for a in claimed] == [7]
    assert claimed[0].lease_expires_at == T0 + timedelta(seconds=30, microseconds=1)


async def test_a_capped_claim_reads_no_more_of_a_type_than_its_quota(wire_url: str) -> None:
    # A node with one `command-line` slot free and room for 5 `spark` actions: the
    # READY read of each type asks for that type's quota, where one read across the
    # types fetched the claim's whole limit of `command-line` actions to keep one.
    commands = _Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        wire_url, tz_aware=True, event_listeners=[commands]
    )
    plan = _plan()
    more = [replace(plan.actions[0], action_id=i, callback_id=f"cb-wf-{i}") for i in (8, 9)]
    async with MongoStore(client, "unit_quota_reads", clock=lambda: T0, owns_client=True) as store:
        await store.create_workflow(replace(plan, actions=(*plan.actions, *more)))
        store.clock = lambda: T0 + timedelta(seconds=1)
        commands.sent.clear()
        quotas = {"command-line": 1, "spark": 5}
        claimed = await store.claim_actions("n1", 10, 30, max_in_flight=5, quotas=quotas)
    assert [a.action_id for a in claimed] == [7]
    ready_reads = [
        (c["filter"]["type"], c["limit"])
        for name, c in commands.sent
        if name == "find" and c["find"] == "actions" and c["filter"].get("state") == "READY"
    ]
    assert ready_reads == [("command-line", 1), ("spark", 5)]

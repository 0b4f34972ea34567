"""`/api/v1/datasets` and `/api/v1/storage`: what is stored, where it came from, what it costs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from pingo import errors, heap, limits, states
from pingo.api import auth, bodies, documents, models, problems, runtime
from pingo.retention.policy import recent_decisions
from pingo.store import lookup
from pingo.store.protocol import DatasetRecord, Store

PREFIX = "/api/v1"
routes = web.RouteTableDef()

#: Retry-After for a user at their verification cap: a hint, about what hashing 1 GiB takes.
VERIFY_RETRY_S = 3
#: The verifications running on this app, by user (`PINGO_USER_MAX_VERIFICATIONS`).
VERIFYING = web.AppKey("pingo.datasets.verifying", limits.Slots)


def setup(app: web.Application) -> None:
    """Cap the verifications each user may have running at once."""
    per_user = app[runtime.STATE_KEY].settings.user_max_verifications
    app[VERIFYING] = limits.Slots(
        "verifications", per_user=per_user, total=None, retry_after_s=VERIFY_RETRY_S
    )


async def visible_dataset(request: web.Request) -> DatasetRecord:
    """The dataset with this id, or the one id prefix (8+ characters) the requester may see.

    Only datasets in a sharing scope the requester belongs to count: 404 when none
    matches, AMBIGUOUS_ID when several do.
    """
    scopes = auth.visible_scopes(auth.current_user(request))
    ref = request.match_info["dataset_id"]
    return await lookup.dataset(runtime.node(request).store, ref, scopes=scopes)


#: A workflow with at least this many producers to name is read whole (one query)
#: rather than action by action, unless it is much bigger than that (see `_action_names`).
_WHOLE_WORKFLOW_FROM = 20


async def producers(
    request: web.Request, records: Iterable[DatasetRecord | None]
) -> dict[tuple[str, int], documents.Producer]:
    """The owner and action name behind each record's producer: one workflow read per
    producing workflow, and its actions' names in as few reads as `_action_names` can."""
    store = runtime.node(request).store
    by_workflow: dict[str, list[int]] = {}
    for key in sorted(
        {(r.producer_workflow_id, r.producer_action_id) for r in records if r is not None}
    ):
        by_workflow.setdefault(key[0], []).append(key[1])
    workflows = await asyncio.gather(*(store.get_workflow(w) for w in by_workflow))
    names = await asyncio.gather(*(_action_names(store, w, ids) for w, ids in by_workflow.items()))
    found: dict[tuple[str, int], documents.Producer] = {}
    for (workflow_id, action_ids), workflow, named in zip(
        by_workflow.items(), workflows, names, strict=True
    ):
        owner = None if workflow is None else workflow.owner
        for action_id in action_ids:
            found[(workflow_id, action_id)] = documents.Producer(owner, named.get(action_id))
    return found


async def _action_names(store: Store, workflow_id: str, action_ids: list[int]) -> dict[int, str]:
    """The names of these actions of one workflow.

    A large lineage names hundreds of one workflow's actions: one read of the whole
    workflow then costs far less than a store round trip per action (seconds under load).
    """
    if len(action_ids) >= _WHOLE_WORKFLOW_FROM:
        total = sum((await store.count_actions(workflow_id)).values())
        if total <= 10 * len(action_ids):
            wanted = set(action_ids)
            actions = await store.list_actions(workflow_id)
            names = {a.action_id: a.name for a in actions if a.action_id in wanted}
            # A big workflow's records, freed a slice at a time off the loop (issue 13).
            await heap.dismantled(actions)
            return names
    found = await asyncio.gather(*(store.get_action(workflow_id, a) for a in action_ids))
    return {a.action_id: a.name for a in found if a is not None}


def view_of(request: web.Request, producer: documents.Producer | None) -> documents.DatasetView:
    """How much of a dataset the requester may see: admins all, the producer's owner
    nearly all, anyone else never the producing workflow, its document or env."""
    user = auth.current_user(request)
    if user.is_admin:
        return documents.DatasetView.ADMIN
    if producer is not None and producer.owner == user.name:
        return documents.DatasetView.OWNER
    return documents.DatasetView.OTHER


async def dataset_documents(
    request: web.Request, records: Sequence[DatasetRecord]
) -> list[models.Dataset]:
    """The documents of `records` as the requester may see them."""
    found = await producers(request, records)
    documents_: list[models.Dataset] = []
    for record in records:
        producer = found[(record.producer_workflow_id, record.producer_action_id)]
        documents_.append(documents.dataset_document(record, view_of(request, producer), producer))
    return documents_


async def lineage_nodes(
    request: web.Request, records: Mapping[str, DatasetRecord | None]
) -> list[models.LineageNode]:
    """Lineage nodes as the requester may see each of them."""
    found = await producers(request, records.values())
    nodes = []
    for node_id, record in records.items():
        producer = (
            None
            if record is None
            else found[(record.producer_workflow_id, record.producer_action_id)]
        )
        nodes.append(documents.lineage_node(node_id, record, view_of(request, producer), producer))
    return nodes


async def lineage_document(request: web.Request, dataset_id: str) -> models.Lineage:
    """The dataset's ancestor graph as the requester may see each of its nodes."""
    lineage = await runtime.node(request).datasets.lineage(dataset_id)
    return models.Lineage(
        dataset_id=lineage.dataset_id,
        nodes=await lineage_nodes(request, lineage.records),
        edges=[models.LineageEdge(parent=p, child=c) for p, c in lineage.edges],
    )


@routes.get(PREFIX + "/datasets", name="list_datasets")
async def list_datasets(request: web.Request) -> web.Response:
    """Datasets the requester may see, newest first (`state` filter, cursor pagination)."""
    user = auth.current_user(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000)
    wanted_state = bodies.query_enum(request, "state", states.DatasetState)
    try:
        found = await runtime.node(request).store.list_datasets(
            state=wanted_state,
            # In the store, not after its page: `next` names the page's last row.
            scopes=auth.visible_scopes(user),
            limit=limit or 100,
            cursor=request.query.get("cursor") or None,
        )
    except errors.ValidationFailed as exc:
        raise problems.InvalidParameter(exc.message, exc.issues) from exc
    items = await dataset_documents(request, found.items)
    return bodies.json_response(models.DatasetPage(items=items, next=found.next_cursor))


@routes.get(PREFIX + "/datasets/{dataset_id}", name="get_dataset")
async def get_dataset(request: web.Request) -> web.Response:
    """One dataset: state, size, digest, producer and parents.

    `?verify=true` hashes its files again and adds `verification` (match,
    mismatch, missing or unverifiable); a mismatch is never reused. Each user may
    have `PINGO_USER_MAX_VERIFICATIONS` running at once (429 beyond); the hashing
    runs on the storage's own few threads (`storage.VERIFY_THREADS`).
    """
    verify = bodies.query_bool(request, "verify")
    record = await visible_dataset(request)
    (document,) = await dataset_documents(request, [record])
    if verify:
        # Held for the whole hash, even once the client left (aiohttp does not cancel its
        # handler): the thread is busy until then, so a retry must not start another.
        with request.app[VERIFYING].held(auth.current_user(request).name):
            verdict = await runtime.node(request).datasets.verify(record)
        document.verification = documents.verification_document(verdict, record)
    return bodies.json_response(document)


@routes.get(PREFIX + "/datasets/{dataset_id}/lineage", name="get_dataset_lineage")
async def get_dataset_lineage(request: web.Request) -> web.Response:
    """The dataset's ancestors: `{"nodes": [...], "edges": [...]}`."""
    record = await visible_dataset(request)
    return bodies.json_response(await lineage_document(request, record.id))


@routes.delete(PREFIX + "/datasets/{dataset_id}", name="delete_dataset")
async def delete_dataset(request: web.Request) -> web.Response:
    """Mark the dataset for deletion (202): the deletor removes it once no claim holds it.

    A LEAF dataset (the output of a leaf action) needs `?force=true`.
    """
    record = await visible_dataset(request)
    datasets = runtime.node(request).datasets
    await datasets.check_may_manage(auth.current_user(request), record)
    force = bodies.query_bool(request, "force")
    marked = await datasets.mark_for_deletion(record.id, force=force)
    return bodies.json_response((await dataset_documents(request, [marked]))[0], status=202)


async def _set_pinned(request: web.Request, pinned: bool) -> web.Response:
    record = await visible_dataset(request)
    datasets = runtime.node(request).datasets
    await datasets.check_may_manage(auth.current_user(request), record)
    updated = await datasets.set_pinned(record.id, pinned)
    return bodies.json_response((await dataset_documents(request, [updated]))[0])


@routes.post(PREFIX + "/datasets/{dataset_id}/pin", name="pin_dataset")
async def pin_dataset(request: web.Request) -> web.Response:
    """Pin the dataset: retention never evicts it (a user may still delete it)."""
    return await _set_pinned(request, True)


@routes.post(PREFIX + "/datasets/{dataset_id}/unpin", name="unpin_dataset")
async def unpin_dataset(request: web.Request) -> web.Response:
    """Unpin the dataset: retention may evict it again."""
    return await _set_pinned(request, False)


async def retention_decisions(request: web.Request) -> list[dict[str, Any]]:
    """The retention loop's recent decisions (its `retention.evict` events), newest first.

    Only those about datasets the requester may see: in per-user sharing scopes
    another user's dataset ids are not shown.
    """
    store = runtime.node(request).store
    decisions = await recent_decisions(store, limit=20)
    user = auth.current_user(request)
    if user.is_admin:
        return decisions
    ids = {d["datasetId"] for d in decisions if isinstance(d.get("datasetId"), str)}
    found = await store.get_datasets(ids) if ids else {}
    return [
        d
        for d in decisions
        if d.get("datasetId") in found and auth.may_see_scope(user, found[d["datasetId"]].scope)
    ]


async def storage_document(request: web.Request) -> models.Storage:
    """Capacity, usage by dataset state, the retention policy and its recent decisions."""
    settings = runtime.settings(request)
    node = runtime.node(request)
    user = auth.current_user(request)
    summary = await node.datasets.storage_summary()
    return models.Storage(
        capacity_bytes=settings.storage_capacity_bytes,
        used_bytes=summary["usedBytes"],
        bytes_by_state=summary["bytesByState"],
        own_bytes=await node.store.bytes_produced_by(user.name),
        quota_bytes=limits.effective(user.limits, settings).max_storage_bytes,
        policy=settings.retention_policy,
        decisions=msgspec.convert(
            await retention_decisions(request), list[models.RetentionDecision]
        ),
    )


@routes.get(PREFIX + "/storage", name="get_storage")
async def get_storage(request: web.Request) -> web.Response:
    """Capacity, usage by dataset state, the retention policy and its recent decisions."""
    auth.current_user(request)
    return bodies.json_response(await storage_document(request))

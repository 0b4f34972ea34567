"""`/api/v1/datasets` and `/api/v1/storage`: what is stored, where it came from, what it costs."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pingo import errors, states
from pingo.api import auth, bodies, documents, problems, state
from pingo.retention.policy import recent_decisions
from pingo.store import lookup
from pingo.store.protocol import DatasetRecord

PREFIX = "/api/v1"
routes = web.RouteTableDef()


async def visible_dataset(request: web.Request) -> DatasetRecord:
    """The dataset with this id, or the one id prefix (8+ characters) the requester may see.

    Only datasets in a sharing scope the requester belongs to count: 404 when none
    matches, AMBIGUOUS_ID when several do.
    """
    scopes = auth.visible_scopes(auth.current_user(request))
    ref = request.match_info["dataset_id"]
    return await lookup.dataset(state.node(request).store, ref, scopes=scopes)


async def _may_manage(request: web.Request, dataset: DatasetRecord) -> None:
    """Deleting or pinning is for admins and the owner of the workflow that produced it."""
    user = auth.current_user(request)
    if user.is_admin:
        return
    producer = await state.node(request).store.get_workflow(dataset.producer_workflow_id)
    if producer is None or producer.owner != user.name:
        raise errors.Forbidden(
            "only an admin or the owner of the workflow that produced a dataset may change it"
        )


@routes.get(PREFIX + "/datasets", name="list_datasets")
async def list_datasets(request: web.Request) -> web.Response:
    """Datasets the requester may see, newest first (`state` filter, cursor pagination)."""
    user = auth.current_user(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000)
    wanted_state = bodies.query_enum(request, "state", states.DatasetState)
    try:
        found = await state.node(request).store.list_datasets(
            state=wanted_state, limit=limit or 100, cursor=request.query.get("cursor") or None
        )
    except errors.ValidationFailed as exc:
        raise problems.InvalidParameter(exc.message, exc.issues) from exc
    # Filtering after the store's page may shorten a page in per-user scopes;
    # the cursor stays valid, so clients simply follow `next`.
    items = [
        documents.dataset_document(d) for d in found.items if auth.may_see_scope(user, d.scope)
    ]
    return bodies.json_response(documents.page(items, found.next_cursor))


@routes.get(PREFIX + "/datasets/{dataset_id}", name="get_dataset")
async def get_dataset(request: web.Request) -> web.Response:
    """One dataset: state, size, path, claims, producer and parents."""
    return bodies.json_response(documents.dataset_document(await visible_dataset(request)))


@routes.get(PREFIX + "/datasets/{dataset_id}/lineage", name="get_dataset_lineage")
async def get_dataset_lineage(request: web.Request) -> web.Response:
    """The dataset's ancestors: `{"nodes": [...], "edges": [...]}`."""
    record = await visible_dataset(request)
    return bodies.json_response(await state.node(request).datasets.lineage(record.id))


@routes.delete(PREFIX + "/datasets/{dataset_id}", name="delete_dataset")
async def delete_dataset(request: web.Request) -> web.Response:
    """Mark the dataset for deletion (202): the deletor removes it once no claim holds it.

    A LEAF dataset (the output of a leaf action) needs `?force=true`.
    """
    record = await visible_dataset(request)
    await _may_manage(request, record)
    force = bodies.query_bool(request, "force")
    marked = await state.node(request).datasets.mark_for_deletion(record.id, force=force)
    return bodies.json_response(documents.dataset_document(marked), status=202)


async def _set_pinned(request: web.Request, pinned: bool) -> web.Response:
    record = await visible_dataset(request)
    await _may_manage(request, record)
    updated = await state.node(request).store.set_dataset_pinned(record.id, pinned)
    if updated is None:
        raise errors.NotFound(f"no dataset {record.id!r}")
    return bodies.json_response(documents.dataset_document(updated))


@routes.post(PREFIX + "/datasets/{dataset_id}/pin", name="pin_dataset")
async def pin_dataset(request: web.Request) -> web.Response:
    """Pin the dataset: retention never evicts it (a user may still delete it)."""
    return await _set_pinned(request, True)


@routes.post(PREFIX + "/datasets/{dataset_id}/unpin", name="unpin_dataset")
async def unpin_dataset(request: web.Request) -> web.Response:
    """Unpin the dataset: retention may evict it again."""
    return await _set_pinned(request, False)


async def retention_decisions(request: web.Request) -> list[dict[str, Any]]:
    """The retention loop's recent decisions (its `retention.evict` events), newest first."""
    return await recent_decisions(state.node(request).store, limit=20)


async def storage_document(request: web.Request) -> dict[str, Any]:
    """Capacity, usage by dataset state, the retention policy and its recent decisions."""
    settings = state.settings(request)
    summary = await state.node(request).datasets.storage_summary()
    return {
        "capacityBytes": settings.storage_capacity_bytes,
        "usedBytes": summary["usedBytes"],
        "bytesByState": summary["bytesByState"],
        "policy": settings.retention_policy,
        "decisions": await retention_decisions(request),
    }


@routes.get(PREFIX + "/storage", name="get_storage")
async def get_storage(request: web.Request) -> web.Response:
    """Capacity, usage by dataset state, the retention policy and its recent decisions."""
    auth.current_user(request)
    return bodies.json_response(await storage_document(request))

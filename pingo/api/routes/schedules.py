"""`/api/v1/schedules`: recurring workflows (create, list, inspect, pause, resume, delete),
their runs, and the webhook delivery logs of schedules and workflows."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from pingo import errors
from pingo.api import auth, bodies, models, runtime
from pingo.api.routes import workflows as workflow_routes
from pingo.schedules.service import next_fire_times
from pingo.store.protocol import ScheduleRecord, ScheduleRunRecord, WebhookDeliveryRecord
from pingo.webhooks import hooks

logger = logging.getLogger(__name__)

PREFIX = "/api/v1"
routes = web.RouteTableDef()

#: How many upcoming ticks a schedule's view lists.
NEXT_FIRE_TIMES = 5


def schedule_location(schedule_id: str) -> str:
    return f"{PREFIX}/schedules/{schedule_id}"


def schedule_document(record: ScheduleRecord) -> models.Schedule:
    """A schedule as the API shows it: its definition, state and next ticks; no secret."""
    spec = record.spec
    triggered = "trigger" in spec
    # Stored resolved: a schedule's workflow is always a document by now.
    workflow = hooks.without_secrets(spec.get("workflow") or {})
    return models.Schedule(
        id=record.id,
        name=record.name,
        owner=record.owner,
        cron=spec.get("cron"),
        trigger=spec.get("trigger"),
        timezone=spec.get("timezone", "UTC"),
        catch_up=spec.get("catchUp", "latest"),
        catch_up_limit=spec.get("catchUpLimit", 100),
        max_concurrent=spec.get("maxConcurrent"),
        overlap=spec.get("overlap", "skip"),
        parameters=spec.get("parameters", {}),
        start=spec.get("start"),
        end=spec.get("end"),
        paused=record.paused,
        # A data trigger has no next fire time: its next_fire_at is a watermark.
        next_fire_at=None if triggered else record.next_fire_at,
        fires_on_data_after=record.next_fire_at if triggered else None,
        next_fire_times=next_fire_times(record, NEXT_FIRE_TIMES),
        pending_tick_at=record.pending_tick_at,
        created_at=record.created_at,
        updated_at=record.updated_at,
        webhooks=[
            models.WebhookView(url=h["url"], events=h["events"])
            for h in hooks.redact(spec.get("webhooks", []))
        ],
        workflow=workflow,
    )


def run_document(run: ScheduleRunRecord) -> models.ScheduleRun:
    return models.ScheduleRun(
        tick_at=run.tick_at,
        workflow_id=run.workflow_id,
        outcome=run.outcome,
        reason=run.reason,
        recorded_at=run.recorded_at,
    )


def delivery_document(delivery: WebhookDeliveryRecord) -> models.Delivery:
    """One entry of a delivery log (the URL and outcome; the secret is never stored here)."""
    return models.Delivery(
        id=delivery.id,
        event=delivery.event,
        url=delivery.url,
        workflow_id=delivery.workflow_id,
        schedule_id=delivery.schedule_id,
        state=delivery.state,
        attempts=delivery.attempts,
        last_status=delivery.last_status,
        last_error=delivery.last_error,
        next_attempt_at=delivery.next_attempt_at,
        created_at=delivery.created_at,
        updated_at=delivery.updated_at,
    )


async def visible_schedule(request: web.Request) -> ScheduleRecord:
    """The schedule, if the requester may see it; 404 otherwise (never reveal that it exists)."""
    schedule_id = request.match_info["schedule_id"]
    record = await runtime.node(request).store.get_schedule(schedule_id)
    if record is None or not auth.may_see(auth.current_user(request), record.owner):
        raise errors.NotFound(f"no schedule {schedule_id!r}")
    return record


async def _resolve_workflow(request: web.Request, body: Any) -> Any:
    """The body with `workflow` given as a stored workflow's id replaced by its document."""
    if not isinstance(body, Mapping) or not isinstance(body.get("workflow"), str):
        return body
    stored = await workflow_routes.visible_workflow(request, body["workflow"])
    return {**body, "workflow": dict(stored.document)}


@routes.post(PREFIX + "/schedules", name="create_schedule")
async def create_schedule(request: web.Request) -> web.Response:
    """Create a schedule (201 + Location) owned by the requester."""
    user = auth.current_user(request)
    body = await _resolve_workflow(request, await bodies.read_json(request))
    if isinstance(body, Mapping) and isinstance(body.get("workflow"), Mapping):
        workflow_routes.check_executors(request, body["workflow"])
    node = runtime.node(request)
    record = await node.schedules.create(body, owner=user.name)
    node.scheduler.wake()
    return bodies.json_response(
        schedule_document(record),
        status=201,
        headers={"Location": schedule_location(record.id)},
    )


@routes.get(PREFIX + "/schedules", name="list_schedules")
async def list_schedules(request: web.Request) -> web.Response:
    """The requester's schedules (an admin's: everyone's, or `?owner=`), newest first."""
    user = auth.current_user(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    owner = request.query.get("owner") or None
    if not user.is_admin:
        if owner is not None and owner != user.name:
            return bodies.json_response(models.ScheduleList(items=[]))
        owner = user.name
    found = await runtime.node(request).store.list_schedules(owner=owner, limit=limit)
    return bodies.json_response(models.ScheduleList(items=[schedule_document(s) for s in found]))


@routes.get(PREFIX + "/schedules/{schedule_id}", name="get_schedule")
async def get_schedule(request: web.Request) -> web.Response:
    """One schedule, with its next fire times."""
    return bodies.json_response(schedule_document(await visible_schedule(request)))


@routes.get(PREFIX + "/schedules/{schedule_id}/runs", name="list_schedule_runs")
async def list_schedule_runs(request: web.Request) -> web.Response:
    """What became of the schedule's ticks, latest first: submitted, skipped or failed."""
    record = await visible_schedule(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    runs = await runtime.node(request).store.list_schedule_runs(record.id, limit=limit)
    return bodies.json_response(models.ScheduleRunList(items=[run_document(r) for r in runs]))


@routes.post(PREFIX + "/schedules/{schedule_id}/pause", name="pause_schedule")
async def pause_schedule(request: web.Request) -> web.Response:
    """Pause: no tick is claimed until resumed (a tick already claimed still settles)."""
    record = await visible_schedule(request)
    paused = await runtime.node(request).schedules.set_paused(record.id, True)
    return bodies.json_response(schedule_document(paused))


@routes.post(PREFIX + "/schedules/{schedule_id}/resume", name="resume_schedule")
async def resume_schedule(request: web.Request) -> web.Response:
    """Resume from the next tick after now; ticks due while paused are not caught up."""
    record = await visible_schedule(request)
    node = runtime.node(request)
    resumed = await node.schedules.set_paused(record.id, False)
    node.scheduler.wake()
    return bodies.json_response(schedule_document(resumed))


@routes.delete(PREFIX + "/schedules/{schedule_id}", name="delete_schedule")
async def delete_schedule(request: web.Request) -> web.Response:
    """Delete the schedule and its run log (its workflows stay)."""
    record = await visible_schedule(request)
    await runtime.node(request).schedules.delete(record.id)
    return web.Response(status=204)


@routes.get(PREFIX + "/schedules/{schedule_id}/deliveries", name="list_schedule_deliveries")
async def list_schedule_deliveries(request: web.Request) -> web.Response:
    """The webhook delivery log of the schedule's workflows, newest first."""
    record = await visible_schedule(request)
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    found = await runtime.node(request).store.list_deliveries(schedule_id=record.id, limit=limit)
    return bodies.json_response(models.DeliveryList(items=[delivery_document(d) for d in found]))


@routes.get(PREFIX + "/workflows/{workflow_id}/deliveries", name="list_workflow_deliveries")
async def list_workflow_deliveries(request: web.Request) -> web.Response:
    """The webhook delivery log of one workflow, newest first."""
    record = await workflow_routes.visible_workflow(request, request.match_info["workflow_id"])
    limit = bodies.query_int(request, "limit", default=100, minimum=1, maximum=1000) or 100
    found = await runtime.node(request).store.list_deliveries(workflow_id=record.id, limit=limit)
    return bodies.json_response(models.DeliveryList(items=[delivery_document(d) for d in found]))

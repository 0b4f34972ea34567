"""Operations: health, readiness, Prometheus metrics, the OpenAPI document and /docs."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pingo import metrics
from pingo.api import bodies, models, openapi, runtime

routes = web.RouteTableDef()


@routes.get("/healthz", name="healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process answers (liveness)."""
    return bodies.json_response(models.Status(status="ok"))


@routes.get("/readyz", name="readyz")
async def readyz(request: web.Request) -> web.Response:
    """The store answers (readiness); 503 STORE_UNAVAILABLE otherwise; and the sandbox's state."""
    node = runtime.node(request)
    await node.store.ping()
    return bodies.json_response(models.Readiness(status="ready", sandbox=node.sandbox))


@routes.get("/metrics", name="metrics")
async def metrics_route(request: web.Request) -> web.Response:
    """Prometheus text exposition of `pingo.metrics.REGISTRY`."""
    response = web.Response(body=generate_latest(metrics.REGISTRY))
    # The exposition content type carries a version parameter aiohttp won't take as content_type.
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


@routes.get("/openapi.json", name="openapi")
async def openapi_json(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 document."""
    return web.Response(body=openapi.document_bytes(), content_type="application/json")


@routes.get("/docs", name="docs")
async def docs(request: web.Request) -> web.Response:
    """The API reference, rendered from the OpenAPI document (no scripts, no CDN)."""
    return web.Response(body=openapi.docs_html(), content_type="text/html", charset="utf-8")

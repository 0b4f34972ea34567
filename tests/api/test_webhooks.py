"""Webhooks over real HTTP: a receiver on 127.0.0.1 (the server allows private targets
for it), signed deliveries, retries with backoff, the owner's delivery log, and the
targets refused by default."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pingo import untrusted
from pingo.api.app import create_app
from pingo.config import Settings
from pingo.webhooks import hooks
from pingo.webhooks.sender import TargetRefused, _CheckingResolver

from .conftest import ADMIN_TOKEN, AiohttpClient, Api, chain, command_workflow, make_settings

pytestmark = pytest.mark.timeout(60)
SECRET = "whsec-test-secret"


@dataclass
class Receiver:
    url: str
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    #: Statuses to answer with, in order; 204 once they run out.
    statuses: list[int] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    app = web.Application()
    box: list[Receiver] = []

    async def hook(request: web.Request) -> web.Response:
        rec = box[0]
        rec.received.append((dict(request.headers), await request.read()))
        rec.arrived.set()
        status = rec.statuses.pop(0) if rec.statuses else 204
        if status == 302:
            raise web.HTTPFound("/elsewhere")
        return web.Response(status=status)

    app.router.add_post("/hook", hook)
    app.router.add_post("/elsewhere", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    box.append(Receiver(url=f"http://127.0.0.1:{port}/hook"))
    yield box[0]
    await runner.cleanup()


@pytest.fixture
async def open_api(aiohttp_client: AiohttpClient, tmp_path: Path) -> Api:
    settings = make_settings(
        tmp_path, webhook_private_targets="allow", webhook_backoff_s=0.05, webhook_interval_s=0.05
    )
    client = await aiohttp_client(create_app(settings))
    api = Api(client=client, app=client.app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    return api


async def deliveries(api: Api, workflow_id: str, user: str = "alice") -> list[dict[str, Any]]:
    response = await api.client.get(
        f"/api/v1/workflows/{workflow_id}/deliveries", headers=api.auth(user)
    )
    assert response.status == 200, await response.text()
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def settled(api: Api, workflow_id: str, count: int = 1) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        found = await deliveries(api, workflow_id)
        if len(found) >= count and all(d["state"] != "pending" for d in found):
            return found
        assert loop.time() < deadline, found
        await asyncio.sleep(0.05)


async def test_a_finished_workflow_posts_a_signed_summary(
    open_api: Api, receiver: Receiver
) -> None:
    api = open_api
    delivered = 'pingo_webhook_deliveries_total{outcome="delivered"}'
    before = await api.metric(delivered)
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.finished"]}
    workflow = await api.submit({**chain("hooked"), "webhooks": [hook]}, user="alice")
    await api.wait(workflow["id"])
    [delivery] = await settled(api, workflow["id"])
    assert delivery["state"] == "delivered"
    assert await api.metric(delivered) == before + 1
    assert delivery["attempts"] == 1
    assert delivery["lastStatus"] == 204
    [(headers, body)] = receiver.received
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Pingo-Signature"] == expected
    assert headers["X-Pingo-Delivery"] == delivery["id"]
    document = json.loads(body)
    assert document["event"] == "workflow.finished"
    assert document["workflowId"] == workflow["id"]
    assert document["state"] == "SUCCEEDED"
    assert SECRET.encode() not in body
    assert SECRET not in json.dumps(delivery)
    # The log is the owner's: another user gets a 404 like for the workflow itself.
    response = await api.client.get(
        f"/api/v1/workflows/{workflow['id']}/deliveries", headers=api.auth("bob")
    )
    assert response.status == 404


async def test_a_big_killed_workflow_still_calls_its_webhook(
    open_api: Api, receiver: Receiver
) -> None:
    # Its stored document is longer than untrusted.PIECEWISE_CHARS, so the store hands
    # it back undecoded and the webhooks are found off the event loop.
    api = open_api
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.killed"]}
    commands = {i: ["sleep", "30"] for i in range(1, 2501)}
    document = {**command_workflow(commands, {i: [1] for i in range(2, 2501)}), "webhooks": [hook]}
    assert len(json.dumps(document)) > untrusted.PIECEWISE_CHARS
    workflow = await api.submit(document, user="alice")
    response = await api.client.post(
        f"/api/v1/workflows/{workflow['id']}/kill", headers=api.auth("alice")
    )
    assert response.status < 300, await response.text()
    [delivery] = await settled(api, workflow["id"])
    assert delivery["state"] == "delivered"
    [(_, body)] = receiver.received
    assert json.loads(body)["state"] == "KILLED"


async def test_a_workflow_reused_whole_at_submission_is_announced_too(
    open_api: Api, receiver: Receiver
) -> None:
    api = open_api
    first = await api.submit(chain("whole"), user="alice")
    await api.wait(first["id"])
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.succeeded"]}
    again = await api.submit({**chain("whole"), "webhooks": [hook]}, user="alice")
    assert again["state"] == "SUCCEEDED"  # nothing to run: it ended at submission
    [delivery] = await settled(api, again["id"])
    assert delivery["state"] == "delivered"
    assert json.loads(receiver.received[0][1])["workflowId"] == again["id"]


async def test_failures_are_retried_with_backoff_and_redirects_not_followed(
    open_api: Api, receiver: Receiver
) -> None:
    api = open_api
    retries = 'pingo_webhook_deliveries_total{outcome="retry"}'
    before = await api.metric(retries)
    receiver.statuses = [500, 302]
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.failed"]}
    failing = command_workflow({1: ["sh", "-c", "exit 3"]}, extra={1: {"maxAttempts": 1}})
    workflow = await api.submit({**failing, "webhooks": [hook]}, user="alice")
    assert (await api.wait(workflow["id"]))["state"] == "FAILED"
    [delivery] = await settled(api, workflow["id"])
    assert delivery["state"] == "delivered"
    assert delivery["attempts"] == 3
    # The 302 was an answer, not an instruction: /elsewhere was never called by it.
    assert len(receiver.received) == 3
    assert json.loads(receiver.received[0][1])["state"] == "FAILED"
    bodies = {body for _, body in receiver.received}
    assert len(bodies) == 1  # every attempt sends the same signed bytes
    assert await api.metric(retries) == before + 2


async def test_each_action_failure_posts_when_asked_for(open_api: Api, receiver: Receiver) -> None:
    """`action.failed`: one delivery per action failing for good, signed like the others,
    beside the workflow's own end; a webhook that did not ask for it gets none."""
    api = open_api
    hook = {"url": receiver.url, "secret": SECRET, "events": ["action.failed", "workflow.failed"]}
    quiet = {"url": receiver.url, "secret": "other-secret", "events": ["workflow.succeeded"]}
    failing = command_workflow(
        {1: ["sh", "-c", "exit 3"], 2: ["sh", "-c", "exit 4"], 3: ["true"]},
        {3: [1, 2]},
        extra={1: {"maxAttempts": 2}, 2: {"maxAttempts": 1}},
    )
    failing["onFailure"] = "continue"
    workflow = await api.submit({**failing, "webhooks": [hook, quiet]}, user="alice")
    assert (await api.wait(workflow["id"]))["state"] == "FAILED"
    found = await settled(api, workflow["id"], count=3)
    assert sorted(d["event"] for d in found) == [
        "action.failed",
        "action.failed",
        "workflow.failed",
    ]
    assert all(d["state"] == "delivered" for d in found)
    failures = [json.loads(b) for _, b in receiver.received if b"action.failed" in b]
    assert sorted(f["actionId"] for f in failures) == [1, 2]
    by_action = {f["actionId"]: f for f in failures}
    assert by_action[1]["attempts"] == 2
    assert by_action[2]["attempts"] == 1
    assert by_action[1]["workflowId"] == workflow["id"]
    for headers, body in receiver.received:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Pingo-Signature"] == expected
        assert SECRET.encode() not in body


async def test_events_not_asked_for_are_not_sent(open_api: Api, receiver: Receiver) -> None:
    api = open_api
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.failed"]}
    workflow = await api.submit({**chain("fine"), "webhooks": [hook]}, user="alice")
    await api.wait(workflow["id"])
    await asyncio.sleep(0.5)
    assert await deliveries(api, workflow["id"]) == []
    assert receiver.received == []


async def test_private_targets_are_refused_by_default(api: Api) -> None:
    for url in (
        "http://127.0.0.1:8080/hook",
        "http://10.1.2.3/hook",
        "http://[::1]/hook",
        "http://169.254.169.254/",
        "http://localhost./hook",
        "http://0.0.0.0/",
        "http://192.0.0.8/",
        "http://[2002:7f00:1::]/",
    ):
        hook = {"url": url, "secret": "s"}
        response = await api.client.post(
            "/api/v1/workflows", json={**chain("x"), "webhooks": [hook]}, headers=api.auth("admin")
        )
        assert response.status == 422, url
        problem = await response.json()
        assert problem["errors"][0]["pointer"] == "/webhooks/0/url"


async def test_names_that_resolve_to_private_addresses_are_refused(tmp_path: Path) -> None:
    resolver = _CheckingResolver(Settings(home=tmp_path))
    # A name the static check cannot judge (no literal address), resolving to loopback.
    with pytest.raises(TargetRefused):
        await resolver.resolve("localhost", 80)
    await resolver.close()
    allowed = _CheckingResolver(Settings(home=tmp_path, webhook_private_targets="allow"))
    assert await allowed.resolve("localhost", 80)
    await allowed.close()


def test_address_rules(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert hooks.url_problem("https://example.org/hook", settings) is None
    assert hooks.url_problem("https://93.184.216.34/", settings) is None
    for bad in (
        "http://[::ffff:127.0.0.1]/",
        "http://100.64.0.1/",  # carrier-grade NAT
        "http://[fe80::1]/",
        "http://224.0.0.1/",
        "gopher://example.org/",
        "http://example.org:0/",
        "http://exa mple.org/",
        "",
    ):
        assert hooks.url_problem(bad, settings) is not None, bad


@pytest.mark.parametrize(
    "address",
    [
        "192.0.0.8",  # IANA's IETF protocol assignments, global to Python 3.11
        "192.0.0.9",  # its PCP anycast: a service near the sender
        "::ffff:192.0.0.8",  # IPv4-mapped
        "2002:7f00:1::",  # 6to4 carrying 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 carrying 169.254.169.254, the metadata address
        "2002:c000:8::",  # 6to4 carrying 192.0.0.8
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, its client 127.0.0.1
        "::127.0.0.1",  # IPv4-compatible
        "64:ff9b:1::a00:1",  # local-use NAT64
        "3fff::1",  # documentation
        "5f00::1",  # SRv6 segment ids
        "fec0::1",  # site-local
    ],
)
def test_addresses_not_globally_reachable_are_refused(tmp_path: Path, address: str) -> None:
    literal = ipaddress.ip_address(address)
    host = f"[{address}]" if literal.version == 6 else address
    assert hooks.url_problem(f"http://{host}/hook", Settings(home=tmp_path)) is not None
    assert hooks.address_problem(literal, Settings(home=tmp_path)) is not None
    allowed = Settings(home=tmp_path, webhook_private_targets="allow")
    assert hooks.address_problem(literal, allowed) is None


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "::ffff:93.184.216.34",
        "2002:5db8:d822::1",  # 6to4 carrying 93.184.216.34
        "2606:4700:4700::1111",
    ],
)
def test_public_addresses_are_allowed(tmp_path: Path, address: str) -> None:
    assert hooks.address_problem(ipaddress.ip_address(address), Settings(home=tmp_path)) is None


def test_a_refusal_names_the_carried_address(tmp_path: Path) -> None:
    problem = hooks.address_problem(ipaddress.ip_address("2002:7f00:1::"), Settings(home=tmp_path))
    assert problem is not None and "127.0.0.1" in problem


async def test_a_schedules_webhooks_are_called_for_each_of_its_runs(
    open_api: Api, receiver: Receiver
) -> None:
    api = open_api
    hook = {"url": receiver.url, "secret": SECRET, "events": ["workflow.finished"]}
    body = {
        "name": "hooked",
        "cron": "* * * * * *",
        "timezone": "UTC",
        "workflow": command_workflow(
            {1: ["sh", "-c", 'echo "$1" > "$PINGO_OUTPUT"', "x", "{schedule.time}"]}
        ),
        "catchUp": "none",
        "maxConcurrent": 1,
        "webhooks": [hook],
    }
    response = await api.client.post("/api/v1/schedules", json=body, headers=api.auth("alice"))
    assert response.status == 201, await response.text()
    sid = (await response.json())["id"]
    await asyncio.wait_for(receiver.arrived.wait(), 20)
    headers, raw = receiver.received[0]
    document = json.loads(raw)
    assert document["scheduleId"] == sid
    assert document["state"] == "SUCCEEDED"
    expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert headers["X-Pingo-Signature"] == expected
    await api.client.post(f"/api/v1/schedules/{sid}/pause", headers=api.auth("alice"))
    log = await api.client.get(f"/api/v1/schedules/{sid}/deliveries", headers=api.auth("alice"))
    items = (await log.json())["items"]
    assert items and all(d["scheduleId"] == sid for d in items)
    assert SECRET not in json.dumps(items)

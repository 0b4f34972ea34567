"""Webhook definitions, deliveries and their signature; which targets are allowed.

A webhook is `{"url", "secret", "events"}` in a workflow document or a schedule.
Each event a workflow's end matches becomes one delivery: a POST of a JSON body
with the header `X-Pingo-Signature: sha256=<hex HMAC-SHA256 of the body>`, keyed
with the webhook's secret (as GitHub signs its webhooks). A delivery's id is
derived from the workflow, the webhook's position and the event, so that two
nodes ending the same workflow queue it once.

The URL is hostile: only http and https, and unless the server allows private
targets (`PINGO_WEBHOOK_PRIVATE_TARGETS=allow`), no loopback, private,
link-local, multicast, reserved or unspecified address, nor one IANA lists as not
globally reachable (`NOT_GLOBAL`), nor an IPv6 address that carries such an IPv4
address (6to4, Teredo, IPv4-mapped or -compatible), checked on the address the
sender resolved and then connects to (so DNS cannot swap it in between).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from pingo import errors, untrusted
from pingo.config import Settings
from pingo.errors import ValidationIssue
from pingo.store.protocol import ActionRecord, WebhookDeliveryRecord, WorkflowRecord

SIGNATURE_HEADER = "X-Pingo-Signature"
EVENT_HEADER = "X-Pingo-Event"
DELIVERY_HEADER = "X-Pingo-Delivery"

WORKFLOW_FINISHED = "workflow.finished"
#: Each action that fails for good (optional: a webhook asks for it by name).
ACTION_FAILED = "action.failed"
#: Every event a webhook may ask for; `workflow.finished` is any end.
EVENTS = (
    WORKFLOW_FINISHED,
    "workflow.succeeded",
    "workflow.failed",
    "workflow.killed",
    ACTION_FAILED,
)
INVALID_WEBHOOK = "INVALID_WEBHOOK"
MAX_WEBHOOKS = 10


@dataclass(frozen=True, slots=True)
class Webhook:
    url: str
    secret: str
    events: tuple[str, ...]


def parse_webhooks(value: Any, pointer: str, settings: Settings) -> tuple[Webhook, ...]:
    """Check a list of webhook definitions; raise `ValidationFailed` with every issue."""
    if value is None:
        return ()
    issues: list[ValidationIssue] = []
    hooks: list[Webhook] = []
    if not isinstance(value, list | tuple) or len(value) > MAX_WEBHOOKS:
        raise errors.ValidationFailed(
            [ValidationIssue(INVALID_WEBHOOK, f"a list of at most {MAX_WEBHOOKS}", pointer)]
        )
    for index, item in enumerate(value):
        where = f"{pointer}/{index}"
        if not isinstance(item, Mapping) or set(item) - {"url", "secret", "events"}:
            issues.append(ValidationIssue(INVALID_WEBHOOK, "{url, secret, events}", where))
            continue
        url, secret = item.get("url"), item.get("secret")
        events = item.get("events", [WORKFLOW_FINISHED])
        problem = url_problem(url, settings)
        if problem is not None:
            issues.append(ValidationIssue(INVALID_WEBHOOK, problem, f"{where}/url"))
        if not isinstance(secret, str) or not 1 <= len(secret) <= 500:
            issues.append(
                ValidationIssue(INVALID_WEBHOOK, "1 to 500 characters", f"{where}/secret")
            )
        if not isinstance(events, list) or not events or any(e not in EVENTS for e in events):
            issues.append(
                ValidationIssue(
                    INVALID_WEBHOOK, f"a list of {', '.join(EVENTS)}", f"{where}/events"
                )
            )
        if not issues:
            hooks.append(Webhook(str(url), str(secret), tuple(dict.fromkeys(events))))
    if issues:
        raise errors.ValidationFailed(issues)
    return tuple(hooks)


def url_problem(url: Any, settings: Settings) -> str | None:
    """Why `url` may not be a webhook target (judged without resolving it), or None."""
    if not isinstance(url, str) or not 1 <= len(url) <= 2000:
        return "a URL of 1 to 2000 characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http or https URL with a host"
    if parts.username or parts.password:
        return "credentials in the URL are not allowed (sign with the secret instead)"
    if port == 0 or any(c in url for c in "\r\n\t\x00 "):
        return "not a valid URL"
    try:
        literal = ipaddress.ip_address(parts.hostname)
    except ValueError:
        # Names are judged when the sender resolves them; these need no resolver.
        host = parts.hostname.lower().rstrip(".")
        if host != "localhost" and not host.endswith(".localhost"):
            return None
        literal = ipaddress.ip_address("127.0.0.1")
    return address_problem(literal, settings)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Blocks IANA's special-purpose registries mark not globally reachable that Python
#: 3.11's `is_global` still calls global (newer Pythons know some of them).
NOT_GLOBAL: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
    # IETF protocol assignments (RFC 6890): 3.11 knows only 192.0.0.170/31 of it. The
    # PCP and TURN anycasts (.9, .10) reach a service near the sender, not a receiver.
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215)
    ipaddress.IPv6Network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.IPv6Network("5f00::/16"),  # SRv6 segment ids (RFC 9602)
    ipaddress.IPv6Network("fec0::/10"),  # site-local: deprecated, yet routed inside a site
)


def address_problem(address: Address, settings: Settings) -> str | None:
    """Why a resolved address may not be connected to, or None."""
    if settings.webhook_private_targets == "allow":
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # The connection goes over IPv4, to the mapped address: it alone is judged.
        address = address.ipv4_mapped
    if not _is_public(address):
        return f"{address} is not a public address (see PINGO_WEBHOOK_PRIVATE_TARGETS)"
    if isinstance(address, ipaddress.IPv6Address):
        for carried in _carried_ipv4(address):
            if not _is_public(carried):
                return (
                    f"{address} carries {carried}, not a public address"
                    " (see PINGO_WEBHOOK_PRIVATE_TARGETS)"
                )
    return None


def _is_public(address: Address) -> bool:
    """Whether `address` itself (not what it may carry) is one webhooks may reach."""
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
        or any(address in network for network in NOT_GLOBAL)
    )


def _carried_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a transition mechanism would send `address`'s packets to.

    The stdlib judges a 6to4 (`2002:7f00:1::`, carrying 127.0.0.1) or Teredo address
    by its IPv6 prefix alone; a relay or the host's own tunnel would deliver it to the
    IPv4 address inside. IPv4-compatible addresses (`::a.b.c.d`) are judged the same.
    """
    carried: list[ipaddress.IPv4Address] = []
    if address.sixtofour is not None:
        carried.append(address.sixtofour)
    if address.teredo is not None:
        carried.extend(address.teredo)  # the Teredo server and the client's address
    if int(address) >> 32 == 0:
        carried.append(ipaddress.IPv4Address(int(address)))
    return carried


def redact(webhooks: Any) -> list[dict[str, Any]]:
    """Webhooks as views show them: never the secret."""
    if not isinstance(webhooks, list):
        return []
    return [
        {"url": w.get("url"), "events": w.get("events", [WORKFLOW_FINISHED])}
        for w in webhooks
        if isinstance(w, Mapping)
    ]


def without_secrets(document: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow document as a view may show it: its webhooks as `{url, events}`.

    The stored document keeps the secrets (they sign each delivery), so every view
    of it, the schedule's copy and the web UI's download included, goes through here.
    """
    shown = dict(document)
    if "webhooks" in shown:
        shown["webhooks"] = redact(shown["webhooks"])
    return shown


def sign(secret: str, body: bytes) -> str:
    """The `X-Pingo-Signature` value of `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def events_for(state: str) -> tuple[str, ...]:
    """The events a workflow's end in `state` raises."""
    return (WORKFLOW_FINISHED, f"workflow.{state.lower()}")


def delivery_id(workflow_id: str, index: int, event: str) -> str:
    digest = hashlib.sha256(f"{workflow_id}\n{index}\n{event}".encode()).hexdigest()
    return f"dl-{digest[:32]}"


def deliveries_for(
    workflow: WorkflowRecord, schedule_id: str | None, now: datetime
) -> list[WebhookDeliveryRecord]:
    """The deliveries a workflow's end queues (its document's webhooks, schedule's included)."""
    raw = _webhooks(workflow)
    if not isinstance(raw, list) or not raw:
        return []
    raised = events_for(workflow.state.value)
    deliveries = []
    for index, hook in enumerate(raw):
        if not isinstance(hook, Mapping) or not isinstance(hook.get("url"), str):
            continue
        for event in hook.get("events", [WORKFLOW_FINISHED]):
            if event not in raised:
                continue
            the_id = delivery_id(workflow.id, index, event)
            body = _body(workflow, schedule_id, event, the_id)
            deliveries.append(
                WebhookDeliveryRecord(
                    id=the_id,
                    owner=workflow.owner,
                    workflow_id=workflow.id,
                    schedule_id=schedule_id,
                    url=hook["url"],
                    event=event,
                    body=body,
                    state="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                    updated_at=now,
                )
            )
    return deliveries


def _webhooks(workflow: WorkflowRecord) -> Any:
    """The document's `webhooks`, or None; a big workflow's document without any is
    never decoded for this (`untrusted.may_have_key`)."""
    document = workflow.document
    if not isinstance(document, Mapping) or not untrusted.may_have_key(document, "webhooks"):
        return None
    return document.get("webhooks")


def action_failed_deliveries(
    workflow: WorkflowRecord, action: ActionRecord, schedule_id: str | None, now: datetime
) -> list[WebhookDeliveryRecord]:
    """The deliveries an action's failure queues, for the webhooks that ask for `action.failed`."""
    raw = _webhooks(workflow)
    if not isinstance(raw, list) or not raw:
        return []
    deliveries = []
    for index, hook in enumerate(raw):
        if not isinstance(hook, Mapping) or not isinstance(hook.get("url"), str):
            continue
        if ACTION_FAILED not in hook.get("events", [WORKFLOW_FINISHED]):
            continue
        the_id = delivery_id(workflow.id, index, _action_event_key(action.action_id))
        document = _summary(workflow, schedule_id, ACTION_FAILED, the_id)
        document.update(
            actionId=action.action_id,
            actionName=action.name,
            actionError=action.error,
            attempts=action.attempts,
        )
        deliveries.append(
            WebhookDeliveryRecord(
                id=the_id,
                owner=workflow.owner,
                workflow_id=workflow.id,
                schedule_id=schedule_id,
                url=hook["url"],
                event=ACTION_FAILED,
                body=_encode(document),
                state="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
                updated_at=now,
            )
        )
    return deliveries


def _action_event_key(action_id: int) -> str:
    """What a failure's delivery id is derived from: one delivery per action and webhook."""
    return f"{ACTION_FAILED}/{action_id}"


def _delivery_keys(hook: Mapping[str, Any], delivery: WebhookDeliveryRecord) -> list[str]:
    """The event keys whose delivery ids `hook` could have produced for `delivery`."""
    events = hook.get("events", [WORKFLOW_FINISHED])
    keys = [e for e in events if e != ACTION_FAILED]
    if ACTION_FAILED in events and delivery.event == ACTION_FAILED:
        try:
            action_id = json.loads(delivery.body).get("actionId")
        except (ValueError, AttributeError):
            action_id = None
        if isinstance(action_id, int):
            keys.append(_action_event_key(action_id))
    return keys


def secret_for(workflow: WorkflowRecord, delivery: WebhookDeliveryRecord) -> str | None:
    """The secret that signs `delivery`: read from the workflow, never stored beside it."""
    raw = _webhooks(workflow)
    if not isinstance(raw, Sequence):
        return None
    for index, hook in enumerate(raw):
        if isinstance(hook, Mapping) and any(
            delivery_id(workflow.id, index, e) == delivery.id
            for e in _delivery_keys(hook, delivery)
        ):
            secret = hook.get("secret")
            return secret if isinstance(secret, str) else None
    return None


def _body(workflow: WorkflowRecord, schedule_id: str | None, event: str, the_id: str) -> bytes:
    return _encode(_summary(workflow, schedule_id, event, the_id))


def _encode(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def _summary(
    workflow: WorkflowRecord, schedule_id: str | None, event: str, the_id: str
) -> dict[str, Any]:
    """The workflow summary every delivery's body holds."""

    def stamp(at: datetime | None) -> str | None:
        return None if at is None else at.isoformat().replace("+00:00", "Z")

    return {
        "event": event,
        "deliveryId": the_id,
        "workflowId": workflow.id,
        "name": workflow.name,
        "owner": workflow.owner,
        "state": workflow.state.value,
        "scheduleId": schedule_id,
        "createdAt": stamp(workflow.created_at),
        "finishedAt": stamp(workflow.finished_at),
        "error": workflow.error,
    }

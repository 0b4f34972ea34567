"""The loop that sends webhook deliveries: claim, POST signed, record, retry with backoff.

Like an executor, this is an edge that speaks HTTP to the outside. Every node
runs it; a delivery is claimed by compare-and-set with a short lease, so two
nodes never send it at once, and one whose sender died is sent by another once
the lease expired (at least once: a crash after the POST and before the record
sends it again; receivers dedupe on `X-Pingo-Delivery`).

The target is hostile (see `hooks`): a resolver checks every address a name
resolves to and hands the connector only checked ones, so the connection goes
to the address that was judged; redirects are not followed; timeouts are short;
the response body is never read beyond a little.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from datetime import timedelta

import aiohttp
from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver

from pingo import errors, loops, metrics
from pingo.config import Settings
from pingo.store.protocol import DeliveryChanges, Store, WebhookDeliveryRecord
from pingo.webhooks import hooks

logger = logging.getLogger(__name__)

_BATCH = 32
#: Backoff never waits longer than this between two attempts.
_MAX_BACKOFF_S = 3600.0
#: How much of an answer is kept in the delivery log.
_ERROR_CHARS = 300


class TargetRefused(OSError):
    """The webhook's host resolves to an address webhooks may not reach."""


class _CheckingResolver(ThreadedResolver):
    """Resolves as usual, then refuses the whole name if any address is not allowed."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._settings = settings

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await super().resolve(host, port, family)
        for result in results:
            address = ipaddress.ip_address(result["host"].split("%", 1)[0])
            problem = hooks.address_problem(address, self._settings)
            if problem is not None:
                raise TargetRefused(f"{host} resolves to {problem}")
        return results


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TargetRefused) or isinstance(
            getattr(seen, "os_error", None), TargetRefused
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class WebhookSender(loops.Loop):
    """Sends due deliveries, each by its own claim."""

    name = "webhooks"

    def __init__(self, store: Store, settings: Settings) -> None:
        super().__init__(settings.webhook_interval_s)
        self.store = store
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=_CheckingResolver(self.settings), limit=_BATCH, force_close=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,  # no proxy from the environment: the check is on the target
                timeout=aiohttp.ClientTimeout(total=self.settings.webhook_timeout_s),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self.close()

    async def run_once(self) -> bool:
        now = self.store.clock()
        lease_s = self.settings.webhook_timeout_s * 2 + 5
        claimed = await self.store.claim_deliveries(self.settings.node_id, now, _BATCH, lease_s)
        if claimed:
            await asyncio.gather(*(self._deliver(d) for d in claimed))
        return len(claimed) == _BATCH

    async def _deliver(self, delivery: WebhookDeliveryRecord) -> None:
        workflow = await self.store.get_workflow(delivery.workflow_id)
        secret = None if workflow is None else hooks.secret_for(workflow, delivery)
        status: int | None = None
        error: str | None = None
        permanent = False
        if secret is None:
            error, permanent = "the webhook's workflow is gone", True
        else:
            problem = hooks.url_problem(delivery.url, self.settings)
            if problem is not None:
                error, permanent = problem, True
            else:
                status, error, permanent = await self._post(delivery, secret)
        attempts = delivery.attempts + 1
        if status is not None and 200 <= status < 300:
            changes = DeliveryChanges(
                state="delivered", attempts=attempts, last_status=status, last_error=None
            )
            outcome = "delivered"
        elif permanent or attempts >= self.settings.webhook_max_attempts:
            changes = DeliveryChanges(
                state="failed", attempts=attempts, last_status=status, last_error=error
            )
            outcome = "failed"
        else:
            backoff_s = min(self.settings.webhook_backoff_s * 2 ** (attempts - 1), _MAX_BACKOFF_S)
            changes = DeliveryChanges(
                attempts=attempts,
                last_status=status,
                last_error=error,
                next_attempt_at=self.store.clock() + timedelta(seconds=backoff_s),
                claimed_by=None,
                claim_expires_at=None,
            )
            outcome = "retry"
        metrics.WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()
        updated = await self.store.update_delivery(delivery.id, delivery.version, changes)
        log = logger.info if outcome == "delivered" else logger.warning
        log(
            "webhook delivery %s of workflow %s (%s, attempt %d): %s",
            delivery.id,
            delivery.workflow_id,
            delivery.event,
            attempts,
            outcome if error is None else f"{outcome}: {error}",
            extra={
                "event": "webhook_" + outcome,
                "delivery_id": delivery.id,
                "workflow_id": delivery.workflow_id,
                "lost_claim": updated is None,
            },
        )

    async def _post(
        self, delivery: WebhookDeliveryRecord, secret: str
    ) -> tuple[int | None, str | None, bool]:
        """POST the delivery: (status, error, whether retrying is pointless)."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "pingo-webhooks",
            hooks.SIGNATURE_HEADER: hooks.sign(secret, delivery.body),
            hooks.EVENT_HEADER: delivery.event,
            hooks.DELIVERY_HEADER: delivery.id,
        }
        try:
            async with self._client().post(
                delivery.url, data=delivery.body, headers=headers, allow_redirects=False
            ) as response:
                await response.content.read(1024)
                if 200 <= response.status < 300:
                    return response.status, None, False
                return response.status, f"HTTP {response.status}", False
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            text = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
            return None, text, _refused(exc)
        except errors.PingoError as exc:  # pragma: no cover - defensive
            return None, exc.message, False

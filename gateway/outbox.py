"""Delivery to adapters: one place that sends, logs failures and remembers our echoes.

Every native id an outbound message becomes is remembered, so when a platform shows the
gateway its own post again it is dropped before parsing (the first loop-prevention layer).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from adapters.base import Adapter, DeliveryError, Outbound, Receipt
from gateway.guards import RecentSet

log = logging.getLogger("bpgw.gateway.outbox")

ECHO_TTL_SECONDS = 3600.0


class Outbox:
    """Sends ``Outbound`` messages through the adapter named by their address."""

    def __init__(self, adapters: Mapping[str, Adapter]) -> None:
        self._adapters = adapters
        self._echoes = RecentSet(ECHO_TTL_SECONDS)
        self.failures = 0

    def is_echo(self, transport: str, native_id: str | None) -> bool:
        """True when ``native_id`` on ``transport`` is a message the gateway sent."""
        return native_id is not None and f"{transport}\0{native_id}" in self._echoes

    def adapter(self, transport: str) -> Adapter | None:
        """The adapter of that transport name, if it is enabled."""
        return self._adapters.get(transport)

    async def send(self, out: Outbound) -> Receipt | None:
        """Deliver ``out``; on failure log it with its ids and return None (never raises)."""
        adapter = self._adapters.get(out.address.transport)
        extra = {
            "request_id": out.request_id,
            "trace_id": out.trace_id,
            "transport": out.address.transport,
            "channel": out.address.channel,
            "recipient": out.recipient,
        }
        if adapter is None:
            self.failures += 1
            log.error("no enabled transport for address", extra=extra)
            return None
        try:
            receipt = await adapter.send(out)
        except DeliveryError as exc:
            self.failures += 1
            log.error("delivery failed: %s", exc, extra=extra)
            return None
        except Exception:  # an adapter bug must not take the pipeline down
            self.failures += 1
            log.exception("adapter raised while sending", extra=extra)
            return None
        for native_id in receipt.native_ids:
            self._echoes.add(f"{out.address.transport}\0{native_id}")
        log.debug("delivered", extra={**extra, "native_id": ",".join(receipt.native_ids)})
        return receipt

"""A test-only transport kind ``hook`` that delivers each message by POSTing it to a
platform of the test's own (an aiohttp server in the test process).

Imported by a gateway through ``[gateway] adapter_modules = ["hook_kit"]`` (with this
folder on PYTHONPATH), so gateway subprocesses can run it. The platform answers 2xx with
the native id it gave the message, or 429/503 with ``Retry-After`` while it is down: the
outbox sees what a real platform's rate limits and outages look like.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from adapters.base import (
    Adapter,
    DeliveryError,
    GatewaySink,
    HealthState,
    Outbound,
    Receipt,
    register_adapter,
)


@register_adapter("hook")
class HookAdapter(Adapter):
    """Posts ``{"id", "channel", "kind", "request_id", "text"}`` to ``<url>/deliver``."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.url = str((options or {})["url"])
        self._http: aiohttp.ClientSession | None = None

    async def start(self, sink: GatewaySink) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self.set_health(HealthState.UP, f"posting to {self.url}")

    async def send(self, message: Outbound) -> Receipt:
        assert self._http is not None
        body = {"id": message.id, "channel": message.address.channel, "kind": str(message.kind),
                "request_id": message.request_id, "text": message.text}
        try:
            async with self._http.post(f"{self.url}/deliver", json=body) as resp:
                if resp.status == 200:
                    return Receipt((str((await resp.json())["native_id"]),))
                retry = resp.headers.get("Retry-After")
                raise DeliveryError(f"platform answered {resp.status}",
                                    retry_after=float(retry) if retry else None,
                                    code="rate_limited" if resp.status == 429 else "unavailable")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"platform unreachable: {exc}") from None

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.set_health(HealthState.DOWN, "stopped")

"""A test-only transport kind ``solo`` that allows one connection per credential.

Imported by a gateway through ``[gateway] adapter_modules = ["lease_kit"]`` (with this
folder on PYTHONPATH), so gateway subprocesses can run it. It does nothing but report
its state, which is what the lease tests watch: ``up`` where it runs, ``standby``
elsewhere, and how many times it was started on this replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.base import (
    Adapter,
    Capabilities,
    DeliveryError,
    GatewaySink,
    HealthState,
    Outbound,
    Receipt,
    register_adapter,
)


@register_adapter("solo")
class SoloAdapter(Adapter):
    """A single-connection transport with no platform behind it."""

    capabilities = Capabilities(single_connection=True)

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.starts = 0
        self.connected = False

    async def start(self, sink: GatewaySink) -> None:
        self.starts += 1
        self.connected = True
        self.set_health(HealthState.UP, f"connected with lease epoch {self.lease_epoch}")

    async def send(self, message: Outbound) -> Receipt:
        if not self.connected:
            raise DeliveryError(f"{self.name} is not connected on this replica")
        return Receipt()

    async def stop(self) -> None:
        self.connected = False
        self.set_health(HealthState.DOWN, "stopped")

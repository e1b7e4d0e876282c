"""Single-connection transports: run each on the one replica that holds its lease.

For every adapter with ``capabilities.single_connection`` the gateway runs a
``LeaseKeeper``: it tries to take the transport's lease every fifth of the lease time;
the replica that gets it starts the adapter and renews the lease every quarter of the
lease time. A holder stops the adapter as soon as a renewal says the lease is gone, and
also when it could not renew for most of the lease time (Redis unreachable): by then
another replica may take it over, and two connections on one credential must never run
at once. A clean stop releases the lease so another replica takes over at once; a holder
that dies stops renewing and another replica takes over within about 1.2 x the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from adapters.base import Adapter, GatewaySink, HealthState
from state.leases import Lease

log = logging.getLogger("bpgw.gateway.leases")

# The holder stops the adapter this fraction of the lease after its last good renewal
# began (the lease cannot have expired in Redis before then).
STOP_AT_FRACTION = 0.8


class LeaseKeeper:
    """Runs one single-connection adapter while this replica holds its lease."""

    def __init__(self, adapter: Adapter, lease: Lease, sink: GatewaySink) -> None:
        self.adapter = adapter
        self.lease = lease
        self._sink = sink
        self._ttl = lease.ttl_seconds
        self.epoch = 0  # the fencing epoch while held, else 0
        self.takeovers = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin competing for the lease in the background."""
        self.adapter.set_health(HealthState.STANDBY, "waiting for the transport's lease")
        self._task = asyncio.create_task(self._run(), name=f"lease-{self.adapter.name}")

    async def stop(self) -> None:
        """Stop the adapter if it runs here and release the lease.

        The adapter's ``stop()`` runs on standby too (it is safe when never started): a
        standby adapter may hold resources, e.g. the REST client a Discord transport
        posts through while another replica holds the gateway session.
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.adapter.stop()
        except Exception:
            log.exception("transport did not stop cleanly", extra={"transport": self.adapter.name})

    async def _run(self) -> None:
        while True:
            asked = time.monotonic()  # the lease, if granted, lasts at least ttl from here
            epoch = await self._try_acquire()
            if epoch:
                await self._hold(epoch, asked)
            await asyncio.sleep(self._ttl / 5)

    async def _try_acquire(self) -> int:
        try:
            epoch = await asyncio.wait_for(self.lease.acquire(), self._ttl / 5)
        except Exception as exc:  # Redis down: stay on standby, try again
            self.adapter.set_health(HealthState.STANDBY, f"cannot reach the lease: {exc}")
            return 0
        if not epoch:
            holder = await self._holder()
            self.adapter.set_health(HealthState.STANDBY, f"runs on another replica ({holder})")
        return epoch

    async def _holder(self) -> str:
        try:
            return await self.lease.holder_now() or "none"
        except Exception:
            return "unknown"

    async def _hold(self, epoch: int, asked: float) -> None:
        """Run the adapter while the lease with ``epoch`` (asked for at ``asked``) stays ours."""
        name = self.adapter.name
        self.epoch = epoch
        self.adapter.lease_epoch = epoch
        try:
            try:
                await self.adapter.start(self._sink)
            except Exception:
                log.exception("transport did not start", extra={"transport": name})
                return
            self.takeovers += 1
            log.info("transport started (lease epoch %d)", epoch, extra={"transport": name})
            stop_at = asked + self._ttl * STOP_AT_FRACTION
            while True:
                await asyncio.sleep(min(self._ttl / 4, max(0.0, stop_at - time.monotonic())))
                attempt = time.monotonic()
                try:
                    kept = await asyncio.wait_for(self.lease.renew(epoch), self._ttl / 4)
                except Exception as exc:
                    log.warning("could not renew lease: %s", exc, extra={"transport": name})
                    kept = None
                if kept:
                    stop_at = attempt + self._ttl * STOP_AT_FRACTION
                elif kept is False:
                    log.warning("lease lost to another replica", extra={"transport": name})
                    break
                if time.monotonic() >= stop_at:
                    log.warning("lease not renewed in time", extra={"transport": name})
                    break
        finally:
            await self._give_up(epoch)

    async def _give_up(self, epoch: int) -> None:
        """Stop the adapter, then free the lease (best effort: else it expires)."""
        self.epoch = 0
        self.adapter.lease_epoch = 0
        with contextlib.suppress(Exception):
            await self.adapter.stop()
        self.adapter.set_health(HealthState.STANDBY, "lease released")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.lease.release(epoch), self._ttl / 5)
        log.info("transport stopped (lease released)", extra={"transport": self.adapter.name})

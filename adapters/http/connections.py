"""A cap on the HTTP server's connections that keeps room for real requests.

aiohttp has header and idle timeouts (its keep-alive timeout also closes a connection
that never completes its first request) but no connection limit, so a flood of silent or
trickling sockets could take every file descriptor and leave ``/healthz`` and agents
with connection resets. The ``ConnectionGuard`` counts connections through a thin
protocol wrapper around aiohttp's own request handler (aiohttp's low-level ``web.Server``
is the protocol factory) and, at the cap, makes room as busy servers do: a new connection evicts the
connection idle the longest (one that has not completed a request yet, or an idle
keep-alive one). Connections with a request in progress (a long-poll, a body being read
under its own timeout) are never evicted; when every connection is busy the new one is
closed at once. So a client that sends its request promptly is served however many idle
sockets an attacker holds, and the server never holds more than ``limit`` of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("bpgw.adapters.http")

RequestHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
"""A request handler of aiohttp's low-level server."""


class _Slot:
    """One accepted connection: its transport and how many requests are in progress."""

    __slots__ = ("busy", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.busy = 0


class GuardedProtocol(asyncio.Protocol):
    """Forwards every event to aiohttp's request handler, telling the guard about the
    connection's start and end."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection (evicting an idle one at the cap), then hand it on."""
        # A cast, not a check: uvloop's transports do not subclass asyncio's.
        stream = cast(asyncio.Transport, transport)
        if not self._guard.admit(self, stream):
            stream.abort()
            return
        self._inner.connection_made(stream)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection, then hand the event on."""
        if self._guard.release(self):
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Hand the bytes to aiohttp's parser."""
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """Hand the end of input on."""
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        """Hand flow control on."""
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Hand flow control on."""
        self._inner.resume_writing()


class ConnectionGuard:
    """At most ``limit`` connections; at the cap the longest-idle one makes room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Least recently active first: the front holds the eviction candidates.
        self._slots: OrderedDict[asyncio.Transport, _Slot] = OrderedDict()
        self._admitted: dict[GuardedProtocol, asyncio.Transport] = {}
        self.accepted = 0
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._slots)

    def protocol_factory(self, make: Callable[[], Any]) -> Callable[[], GuardedProtocol]:
        """A protocol factory for ``loop.create_server`` wrapping aiohttp's ``make``."""

        return lambda: GuardedProtocol(make(), self)

    def admit(self, protocol: GuardedProtocol, transport: asyncio.Transport) -> bool:
        """Take a new connection, making room if needed; False when none can be made."""
        if len(self._slots) >= self.limit and not self._evict_one():
            self.refused += 1
            log.warning("http: %d connections, all busy; a new one was refused", self.limit)
            return False
        self._slots[transport] = _Slot(transport)
        self._admitted[protocol] = transport
        self.accepted += 1
        return True

    def release(self, protocol: GuardedProtocol) -> bool:
        """Forget a closed connection; False if it was never admitted."""
        transport = self._admitted.pop(protocol, None)
        if transport is None:
            return False
        self._slots.pop(transport, None)
        return True

    def _evict_one(self) -> bool:
        for transport, slot in self._slots.items():
            if slot.busy == 0:
                del self._slots[transport]
                transport.abort()  # RST: the descriptor is free at once, no lingering
                self.evicted += 1
                if self.evicted in (1, 10, 100) or self.evicted % 1000 == 0:
                    log.warning(
                        "http: at the cap of %d connections, %d idle or incomplete ones "
                        "closed so far to make room", self.limit, self.evicted,
                    )
                return True
        return False

    def serving(
        self,
        handler: RequestHandler,
        on_error: Callable[[web.BaseRequest, Exception], web.StreamResponse | None],
    ) -> RequestHandler:
        """``handler`` (the server's request handler) marking its connection busy while
        it runs (never evicted meanwhile), with an exception it raises answered by
        ``on_error`` (re-raised when that gives None)."""
        slots = self._slots

        async def serve(request: web.BaseRequest) -> web.StreamResponse:
            transport = request.transport
            slot = slots.get(transport) if transport is not None else None
            if slot is not None:
                slot.busy += 1
                slots.move_to_end(slot.transport)
            try:
                return await handler(request)
            except Exception as exc:
                answer = on_error(request, exc)
                if answer is None:
                    raise
                return answer
            finally:
                if slot is not None:
                    slot.busy -= 1
                    if slot.transport in slots:
                        slots.move_to_end(slot.transport)

        return serve


DESCRIPTORS_SPARE = 128
"""Descriptors kept free for everything but client connections (Redis pools, files)."""


def fit_descriptor_limit(wanted: int) -> int:
    """The connection cap this process can honour: raises its soft descriptor limit
    towards ``wanted`` plus a spare when the hard limit allows, else lowers the cap."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + DESCRIPTORS_SPARE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(16, soft - DESCRIPTORS_SPARE)
        log.warning(
            "http: max_connections %d lowered to %d: the process may open %d files "
            "(ulimit -n)", wanted, fitted, soft,
        )
        return fitted
    return wanted

"""A cap on the HTTP server's connections that keeps room for real requests.

The server (adapters/http/http11.py) closes connections that do not send a complete
request head in time, but a flood of silent or trickling sockets could still take every
file descriptor and leave ``/healthz`` and agents with connection resets. The
``ConnectionGuard`` counts the server's connections and, at the cap, makes room as busy
servers do: a new connection evicts the connection idle the longest (one that has not
completed a request yet, or an idle keep-alive one). Connections with a request in
progress (a long-poll, a body being read under its own timeout) are never evicted; when
every connection is busy the new one is closed at once. So a client that sends its
request promptly is served however many idle sockets an attacker holds, and the server
never holds more than ``limit`` of them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol

log = logging.getLogger("bpgw.adapters.http")


class Guarded(Protocol):
    """A connection as the guard sees it."""

    @property
    def busy(self) -> bool:
        """Whether a request is being answered on it (it is not evicted then)."""

    def abort(self) -> None:
        """Close it at once."""


class ConnectionGuard:
    """At most ``limit`` connections; at the cap the longest-idle one makes room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Least recently active first: the front holds the eviction candidates.
        self._held: OrderedDict[Guarded, None] = OrderedDict()
        self.accepted = 0
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, conn: Guarded) -> bool:
        """Take a new connection, making room if needed; False when none can be made."""
        if len(self._held) >= self.limit and not self._evict_one():
            self.refused += 1
            log.warning("http: %d connections, all busy; a new one was refused", self.limit)
            return False
        self._held[conn] = None
        self.accepted += 1
        return True

    def release(self, conn: Guarded) -> None:
        """Forget a closed connection."""
        self._held.pop(conn, None)

    def touch(self, conn: Guarded) -> None:
        """``conn`` was active just now: the last to be evicted."""
        if conn in self._held:
            self._held.move_to_end(conn)

    def _evict_one(self) -> bool:
        for conn in self._held:
            if not conn.busy:
                del self._held[conn]
                conn.abort()  # RST: the descriptor is free at once, no lingering
                self.evicted += 1
                if self.evicted in (1, 10, 100) or self.evicted % 1000 == 0:
                    log.warning(
                        "http: at the cap of %d connections, %d idle or incomplete ones "
                        "closed so far to make room", self.limit, self.evicted,
                    )
                return True
        return False


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

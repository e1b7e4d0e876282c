"""Readiness: a fresh, time-bounded look at the state store and the outbox.

``/healthz`` must turn 503 soon after Redis stops answering (a freeze, not only a crash),
so it cannot trust the sweeper's last run (every few seconds) or wait on a stuck pool. One
pipelined round trip (PING plus the oldest undelivered journal entry) runs under a short
timeout; its result is reused for at most ``max_age`` seconds, and concurrent callers
share one check in flight, so a flood of health checks costs Redis one round trip per
``max_age``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

CHECK_TIMEOUT_SECONDS = 1.0
"""How long the store may take to answer a health check before it counts as down."""
MAX_AGE_SECONDS = 1.0
"""How long one check's result is reused."""


@dataclass(frozen=True)
class Part:
    """One thing the gateway needs, as ``/healthz`` lists it."""

    name: str
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class StoreCheck:
    """What one check found: the store's part, the outbox's part, and when (monotonic)."""

    store: Part
    outbox: Part
    at: float


def _journal_age(oldest: Any, now: float) -> float | None:
    """Seconds since the oldest journal entry was written (its id is its time), or None."""
    if not oldest:
        return None
    entry_id = oldest[0][0]
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return max(0.0, now - int(text.partition("-")[0]) / 1000)


class HealthProbe:
    """Checks the store and the outbox journal, cached and single-flight."""

    def __init__(
        self,
        redis: aioredis.Redis,
        journal_key: str,
        *,
        stall_seconds: float,
        timeout: float = CHECK_TIMEOUT_SECONDS,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._journal = journal_key
        self.stall_seconds = stall_seconds
        self._timeout = timeout
        self._max_age = max_age
        self._clock = clock
        self.last: StoreCheck | None = None
        self._running: asyncio.Future[StoreCheck] | None = None

    async def check(self) -> StoreCheck:
        """A result at most ``max_age`` old (waits at most ``timeout`` for a new one)."""
        last = self.last
        if last is not None and self._clock() - last.at <= self._max_age:
            return last
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._check())
        # Shielded: a caller that goes away does not cancel the others' check.
        return await asyncio.shield(self._running)

    async def _check(self) -> StoreCheck:
        try:
            async with asyncio.timeout(self._timeout):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.ping()
                    pipe.xrange(self._journal, count=1)
                    _, oldest = await pipe.execute()
        except TimeoutError:
            why = f"unreachable: no answer within {self._timeout:g}s"
            result = self._down(why)
        except Exception as exc:  # any failure to reach the store is its part failing
            result = self._down(f"unreachable: {type(exc).__name__}: {exc}")
        else:
            age = _journal_age(oldest, time.time())
            stalled = age is not None and age > self.stall_seconds
            outbox = Part(
                "outbox",
                not stalled,
                f"oldest undelivered message is {age:.0f}s old (stall threshold "
                f"{self.stall_seconds:g}s)" if stalled else "delivering",
            )
            result = StoreCheck(Part("state_store", True, "ok"), outbox, self._clock())
        self.last = result
        return result

    def _down(self, why: str) -> StoreCheck:
        return StoreCheck(
            Part("state_store", False, why),
            Part("outbox", True, "unknown while the state store is unreachable"),
            self._clock(),
        )

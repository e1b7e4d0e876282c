"""Counters the status command and /healthz show.

Outcome counts are per process (what this replica handled). Violations are kept in
Redis as a sorted set of timestamps, so ``violations in the last hour`` covers every
replica; the set is trimmed to the hour on each write, so it stays small.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("bpgw.gateway.metrics")

HOUR = 3600.0


class Metrics:
    """Per-process outcome counters and the shared violation log."""

    def __init__(self, redis: aioredis.Redis, key_prefix: str) -> None:
        self._redis = redis
        self._key = f"{key_prefix}:gw:violations"
        self.outcomes: Counter[str] = Counter()
        self.violations_by_kind: Counter[str] = Counter()
        self.started_at = time.time()

    def count(self, outcome: str) -> None:
        """Count one envelope's outcome."""
        self.outcomes[outcome] += 1

    async def record_violation(self, kind: str) -> None:
        """Log one protocol violation (impersonation, signature, depth, loop, ...)."""
        self.violations_by_kind[kind] += 1
        now = time.time()
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zadd(self._key, {f"{now:.6f}:{kind}:{uuid.uuid4().hex[:8]}": now})
                pipe.zremrangebyscore(self._key, "-inf", now - HOUR)
                await pipe.execute()
        except RedisError as exc:  # a metrics write must never fail a message
            log.warning("could not record violation: %s", exc, extra={"reason": kind})

    async def violations_last_hour(self) -> dict[str, int]:
        """Violations of the last hour across all replicas, by kind."""
        now = time.time()
        members = await self._redis.zrangebyscore(self._key, now - HOUR, "+inf")
        counts: Counter[str] = Counter()
        for member in members:
            text = member.decode() if isinstance(member, bytes) else str(member)
            parts = text.split(":")
            counts[parts[1] if len(parts) > 2 else "other"] += 1
        return dict(counts)

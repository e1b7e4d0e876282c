"""Counters the status command and /healthz show.

Outcome counts are per process (what this replica handled). Violations are counted in
Redis in one small hash per minute (kind -> count, expiring after the hour), so
``violations in the last hour`` covers every replica and costs the same 60 reads however
many violations a flood produced.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("bpgw.gateway.metrics")

MINUTE = 60
HOUR_MINUTES = 60


class Metrics:
    """Per-process outcome counters and the shared violation counts."""

    def __init__(self, redis: aioredis.Redis, key_prefix: str) -> None:
        self._redis = redis
        self._prefix = f"{key_prefix}:gw:violations:"
        self.outcomes: Counter[str] = Counter()
        self.violations_by_kind: Counter[str] = Counter()
        self.started_at = time.time()

    def count(self, outcome: str) -> None:
        """Count one envelope's outcome."""
        self.outcomes[outcome] += 1

    async def record_violation(self, kind: str) -> None:
        """Count one protocol violation (impersonation, signature, depth, loop, ...)."""
        self.violations_by_kind[kind] += 1
        key = f"{self._prefix}{int(time.time()) // MINUTE}"
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(key, kind, 1)
                pipe.expire(key, (HOUR_MINUTES + 1) * MINUTE)
                await pipe.execute()
        except RedisError as exc:  # a metrics write must never fail a message
            log.warning("could not record violation: %s", exc, extra={"reason": kind})

    async def violations_last_hour(self) -> dict[str, int]:
        """Violations of the last hour across all replicas, by kind."""
        now_minute = int(time.time()) // MINUTE
        async with self._redis.pipeline(transaction=False) as pipe:
            for minute in range(now_minute - HOUR_MINUTES + 1, now_minute + 1):
                pipe.hgetall(f"{self._prefix}{minute}")
            buckets = await pipe.execute()
        counts: Counter[str] = Counter()
        for bucket in buckets:
            for kind, n in bucket.items():
                name = kind.decode() if isinstance(kind, bytes) else str(kind)
                counts[name] += int(n)
        return dict(counts)

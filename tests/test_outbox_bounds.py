"""The outbox's per-destination bookkeeping is bounded and reclaimed (issue 9, issue 7):
thousands of hostile destination names leave an exact dead-letter total, at most
``stats_destinations`` per-destination counters, and nothing once they are idle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from test_gateway_outbox import FlakyAdapter

from adapters.base import OutboundKind
from gateway.outbox import OutboxKeys, journal_entry

from gwkit import make_config, running

pytestmark = [pytest.mark.asyncio, pytest.mark.redis]

DESTINATIONS = 2000
DETAIL = 50


def _hostile(i: int) -> str:
    """Channel names as an attacker would pick them: braces, separators, long, unicode."""
    shapes = ["{room}-%d", "a:b:%d\n", "%d" + "x" * 300, "ｍａｎｔｉｓ\u202e%d", "%d}{", " %d "]
    return shapes[i % len(shapes)] % i


def _config(redis_url: str, namespace: str, tmp_path: Path) -> Any:
    return make_config(
        redis_url, namespace, tmp_path,
        transports={"chat": {"kind": "memory"}, "far": {"kind": "flaky"}},
        outbox={"max_attempts": 1, "stats_destinations": DETAIL,
                "idle_destination_seconds": 0.5},
    )


async def _until(check: Any, limit: float = 30.0) -> None:
    async with asyncio.timeout(limit):
        while not await check():  # noqa: ASYNC110 - another task (the reclaim) writes it
            await asyncio.sleep(0.1)


async def _dead_streams(redis: aioredis.Redis, namespace: str) -> int:
    return len([k async for k in redis.scan_iter(match=f"{namespace}:ob:dl:*", count=1000)])


async def test_thousands_of_hostile_destinations_are_counted_exactly_and_forgotten(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    keys = OutboxKeys(namespace)
    async with running(_config(redis_url, namespace, tmp_path)) as gw:
        far = gw.adapters["far"]
        assert isinstance(far, FlakyAdapter)
        far.down = True  # every send fails, and max_attempts is 1: all dead-lettered
        entries = [
            journal_entry("hello", OutboundKind.NOTICE, [("far", _hostile(i), "", "", "")])
            for i in range(DESTINATIONS)
        ]
        for i in range(0, DESTINATIONS, 500):
            await gw.outbox.enqueue(entries[i:i + 500])
        assert await gw.drain(timeout=60)
        stats = await gw.outbox.stats()
        # Every dead letter counted in the total; a counter of its own for the first few.
        assert stats["dead_lettered_total"] == DESTINATIONS
        assert len(stats["dead_lettered"]) == DETAIL
        assert set(stats["dead_lettered"].values()) == {1}
        assert await redis_client.hlen(keys.stats) == DETAIL + 1
        assert stats["destinations"] == DESTINATIONS
        # Kept dead letters keep their destination, however long it is idle.
        await asyncio.sleep(1.5)
        assert await redis_client.scard(keys.dests) == DESTINATIONS

        # Once nothing is queued or dead for them, idle destinations are forgotten.
        assert await gw.outbox.drop([]) == DESTINATIONS

        async def forgotten() -> bool:
            return await redis_client.scard(keys.dests) == 0

        await _until(forgotten)
        stats = await gw.outbox.stats()
        assert stats["dead_lettered_total"] == DESTINATIONS  # the total stays exact
        assert stats["dead_lettered"] == {} and stats["destinations"] == 0
        assert await redis_client.hgetall(keys.stats) == {b"dead": str(DESTINATIONS).encode()}
        assert await redis_client.zcard(keys.seen) == 0
        assert await redis_client.hlen(keys.blocked) == 0
        assert await _dead_streams(redis_client, namespace) == 0
        dispatcher = gw._dispatcher
        assert dispatcher is not None and not dispatcher._locks and not dispatcher._workers


async def test_a_namespace_from_before_the_total_keeps_its_counts(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    keys = OutboxKeys(namespace)
    # What an earlier version left: a counter per destination, never forgotten.
    await redis_client.hset(keys.stats, mapping={"dead:far:a": 2, "dead:far:b": 3})
    await redis_client.sadd(keys.dests, "far:a", "far:b")
    async with running(_config(redis_url, namespace, tmp_path)) as gw:

        async def forgotten() -> bool:
            return await redis_client.scard(keys.dests) == 0

        await _until(forgotten)
        stats = await gw.outbox.stats()
        assert stats["dead_lettered_total"] == 5 and stats["dead_lettered"] == {}

"""The test-server fixtures really serve: a Redis round trip and a NATS JetStream round trip."""

from __future__ import annotations

import nats
import redis.asyncio as aioredis


async def test_redis_fixture_round_trip(redis_client: aioredis.Redis, namespace: str) -> None:
    await redis_client.set(f"{namespace}:k", b"v")
    assert await redis_client.get(f"{namespace}:k") == b"v"
    info = await redis_client.info("server")
    assert info.get("redis_version") or info.get("valkey_version")


async def test_nats_fixture_jetstream_round_trip(nats_url: str, namespace: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        stream = f"T{namespace.replace('-', '')}"
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        try:
            ack = await js.publish(f"{stream}.x", b"hello")
            assert ack.seq == 1
            sub = await js.pull_subscribe(f"{stream}.x", durable="d")
            msgs = await sub.fetch(1, timeout=5)
            assert msgs[0].data == b"hello"
        finally:
            await js.delete_stream(stream)
    finally:
        await nc.close()

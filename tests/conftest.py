"""Shared fixtures: real Redis/Valkey and NATS servers, never mocks.

``redis_url`` / ``nats_url`` use ``REDIS_URL`` / ``NATS_URL`` when set; otherwise a
private server is started on a free loopback port for the whole session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from hypothesis import settings

from servers import PrivateNats, PrivateValkey

# Property tests check results, not speed (benchmarks do that): on a loaded 2-core CI
# machine a per-example deadline only makes them flaky.
settings.register_profile("bpgw", deadline=None)
settings.load_profile("bpgw")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a Redis server, so CI can rerun them on another one."""
    for item in items:
        if "redis_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis-protocol server for this test session."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = PrivateValkey().start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def valkey() -> Iterator[PrivateValkey]:
    """A private Valkey of this test's own: for tests that stop it or change its config."""
    server = PrivateValkey().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def durable_valkey() -> Iterator[PrivateValkey]:
    """A private Valkey keeping its data across a stop (append-only file)."""
    server = PrivateValkey(appendonly=True).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """URL of a real NATS server (JetStream on) for this test session."""
    url = os.environ.get("NATS_URL")
    if url:
        yield url
        return
    server = PrivateNats().start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def namespace() -> str:
    """A key namespace of this test's own, so tests never see each other's keys."""
    return f"bpgwtest-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_url: str, namespace: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio Redis client; deletes this test's namespace afterwards (never FLUSHALL)."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        async for key in client.scan_iter(match=f"*{namespace}*", count=1000):
            await client.delete(key)
        await client.aclose()


@pytest.fixture
async def redis(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """A client like the gateway's (text replies); the namespace is cleaned by redis_client."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()

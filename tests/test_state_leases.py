"""Leases on real Redis: one holder, fencing epochs, expiry and release."""

from __future__ import annotations

import asyncio
from typing import Any

from state.leases import Lease


async def test_one_holder_at_a_time_with_growing_epochs(redis_client: Any, namespace: str) -> None:
    a = Lease(redis_client, namespace, "transport:tg", "replica-a", 0.3)
    b = Lease(redis_client, namespace, "transport:tg", "replica-b", 0.3)
    first = await a.acquire()
    assert first >= 1
    assert await b.acquire() == 0
    assert await a.acquire() == first  # asking again keeps (and renews) our own lease
    assert await a.renew(first)
    assert await a.holder_now() == f"{first}:replica-a"
    await asyncio.sleep(0.45)  # a stopped renewing (paused, or dead)
    second = await b.acquire()
    assert second > first  # the new holder's epoch fences the old one
    assert not await a.renew(first)  # a learns it lost the lease
    assert not await a.release(first)  # and cannot free b's lease
    assert await b.holder_now() == f"{second}:replica-b"
    assert await b.release(second)
    assert await a.acquire() > second  # free again at once after a release


async def test_lease_keys_are_tagged_per_name(redis_client: Any, namespace: str) -> None:
    lease = Lease(redis_client, namespace, "transport:discord", "r", 5)
    epoch = await lease.acquire()
    keys = sorted([k.decode() async for k in redis_client.scan_iter(match=f"{namespace}:lease:*")])
    tag = "{transport:discord}"
    assert keys == [f"{namespace}:lease:{tag}", f"{namespace}:lease:{tag}:epoch"]
    assert await lease.release(epoch)

"""Several processes on one server: overlapping appliers and competing sweepers."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import pytest
import redis.asyncio as aioredis
from test_state_helpers import (
    ORIGIN,
    T0,
    clarify,
    drop_namespace,
    handoff,
    request,
    response,
    store,
)

from protocol.models import Message, Status
from state.records import ConvStatus, Outcome
from state.settings import StateSettings
from state.store import ConversationStore

__all__ = ["store"]
pytestmark = pytest.mark.slow

CONVERSATIONS = 2000  # x 5 messages = 10,000 distinct messages
PROCESSES = 4
FINALS = [Status.DONE, Status.PARTIAL, Status.FAILED, Status.CANCELLED]


def chain(i: int) -> list[Message]:
    """The five messages of conversation i, in order (depth 1..5)."""
    rid = f"c{i}"
    return [request(rid), clarify(rid), response(rid, sender="Lotbot", to="Mantis", depth=3,
                                                 status=None, result="site A"),
            handoff(rid, depth=4, to=f"Agent{i % 7}"),
            response(rid, sender=f"Agent{i % 7}", depth=5, status=FINALS[i % 4])]


async def _apply_chains(url: str, namespace: str, worker: int) -> Counter[str]:
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=True)
    st = ConversationStore(client, StateSettings(namespace=namespace))
    # Each conversation is driven by two of the four processes, each in order.
    mine = [i for i in range(CONVERSATIONS) if worker in (i % PROCESSES, (i + 1) % PROCESSES)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in mine:
        queue.put_nowait(i)
    outcomes: Counter[str] = Counter()

    async def drive() -> None:
        while not queue.empty():
            for msg in chain(queue.get_nowait()):
                outcomes[str((await st.apply(msg, ORIGIN, now=T0)).outcome)] += 1

    await asyncio.gather(*(drive() for _ in range(16)))
    await client.aclose()
    return outcomes


def apply_worker(url: str, namespace: str, worker: int) -> Counter[str]:
    return asyncio.run(_apply_chains(url, namespace, worker))


async def _claim_all(url: str, namespace: str, sweepers: int) -> list[str]:
    client: aioredis.Redis = aioredis.from_url(url, decode_responses=True)
    st = ConversationStore(client, StateSettings(namespace=namespace))
    # Start together: a spawned process can take seconds to start on a loaded machine,
    # and a sweeper alone would claim everything before the other one is up.
    ready = "{" + namespace + "}:test:sweepers-ready"
    await client.incr(ready)
    deadline = time.monotonic() + 60
    while int(await client.get(ready) or 0) < sweepers:
        assert time.monotonic() < deadline, "the other sweeper never started"
        await asyncio.sleep(0.005)
    claimed: list[str] = []
    while batch := await st.claim_due(now=T0 + 4000, limit=100):
        claimed += [c.request_id for c in batch]
    await client.aclose()
    return claimed


def claim_worker(url: str, namespace: str, sweepers: int) -> list[str]:
    return asyncio.run(_claim_all(url, namespace, sweepers))


def _pool(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


async def test_four_processes_overlapping_conversations(
        store: ConversationStore, redis_url: str, namespace: str) -> None:
    loop = asyncio.get_running_loop()
    with _pool(PROCESSES) as pool:
        results = await asyncio.gather(*(
            loop.run_in_executor(pool, apply_worker, redis_url, namespace, w)
            for w in range(PROCESSES)))
    total: Counter[str] = sum(results, Counter())
    assert total == {"applied": CONVERSATIONS * 5, "duplicate": CONVERSATIONS * 5}
    counts = await store.counts()
    for k, final in enumerate(FINALS):
        expected = len(range(k, CONVERSATIONS, 4))
        assert counts[str(final)] == expected
    assert counts["open"] == counts["clarifying"] == counts["handed_off"] == 0
    assert await store.load_by_agent() == {}
    for i in range(0, CONVERSATIONS, 97):
        conv = await store.get(f"c{i}")
        assert conv is not None and conv.status == ConvStatus(str(FINALS[i % 4]))
        assert [(e.type, e.depth_current) for e in conv.history] == [
            ("REQUEST", 1), ("CLARIFY", 2), ("RESPONSE", 3), ("HANDOFF", 4), ("RESPONSE", 5)]


async def test_two_sweepers_claim_each_due_conversation_once(
        store: ConversationStore, redis_url: str, namespace: str) -> None:
    n = 10_000
    for start in range(0, n, 2000):
        results = await store.apply_many(
            [request(f"d{i}", to=f"Agent{i % 5}") for i in range(start, start + 2000)],
            ORIGIN, now=T0)
        assert {r.outcome for r in results} == {Outcome.APPLIED}
    loop = asyncio.get_running_loop()
    with _pool(2) as pool:
        a, b = await asyncio.gather(*(
            loop.run_in_executor(pool, claim_worker, redis_url, namespace, 2) for _ in range(2)))
    assert len(a) + len(b) == n
    assert set(a).isdisjoint(b) and set(a) | set(b) == {f"d{i}" for i in range(n)}
    assert len(a) > 0 and len(b) > 0
    counts = await store.counts()
    assert counts["timeout"] == n and counts["open"] == 0
    assert await store.load_by_agent() == {}
    assert await store.claim_due(now=T0 + 5000) == []


async def test_apply_many_counts_like_apply(redis_url: str, namespace: str) -> None:
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        st = ConversationStore(client, StateSettings(namespace=namespace))
        results = await st.apply_many(chain(3) + chain(3)[:2], ORIGIN, now=T0)
        assert [r.outcome for r in results] == [Outcome.APPLIED] * 5 + [Outcome.DUPLICATE] * 2
        assert (await st.counts())[str(FINALS[3])] == 1
    finally:
        await drop_namespace(client, namespace)
        await client.aclose()

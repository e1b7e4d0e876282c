"""Indices instead of counters: batched claims, the agent set, old layouts, commands per step."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from test_state_helpers import (
    ORIGIN,
    T0,
    broadcast,
    clarify,
    handoff,
    request,
    response,
    store,
)

from protocol.models import Message
from state.records import ConvStatus
from state.settings import StateSettings
from state.store import ConversationStore

from servers import PrivateValkey

__all__ = ["store"]


async def test_one_claim_batch_of_every_kind(store: ConversationStore) -> None:
    await store.apply(request("open", to="Mantis"), ORIGIN, now=T0)
    await store.apply(request("asks", to="Heron"), ORIGIN, now=T0 + 1)
    await store.apply(clarify("asks", sender="Heron"), ORIGIN, now=T0 + 2)  # owed by Lotbot
    await store.apply(request("moved"), ORIGIN, now=T0 + 3)
    await store.apply(handoff("moved", to="Heron"), ORIGIN, now=T0 + 4)
    await store.apply(request("ended"), ORIGIN, now=T0 + 5)
    await store.apply(response("ended"), ORIGIN, now=T0 + 6)
    await store.apply(broadcast("news"), ORIGIN, now=T0)
    await store.apply(request("later"), ORIGIN, now=T0 + 5000)

    claimed = await store.claim_due(now=T0 + 4000)
    assert [c.request_id for c in claimed] == ["asks", "open", "moved"]  # by deadline
    assert all(c.status is ConvStatus.TIMEOUT and c.deadline is None for c in claimed)
    assert [c.history[-1].to for c in claimed] == ["Lotbot", "Mantis", "Heron"]
    assert [c.history[-1].excerpt for c in claimed] == [
        "no reply from Lotbot (was clarifying)", "no reply from Mantis (was open)",
        "no reply from Heron (was handed_off)"]
    assert await store.get("news") is None  # the expired broadcast is gone, silently
    assert [await store.get(c.request_id) for c in claimed] == claimed  # stored as returned
    counts = await store.counts()
    assert (counts["timeout"], counts["done"], counts["open"], counts["broadcast"]) == (3, 1, 1, 0)
    assert await store.load_by_agent() == {"Mantis": 1}
    # Same terminal time: newest first falls back to RequestId order, descending.
    assert [c.request_id for c in await store.list(status="timeout")] == ["open", "moved", "asks"]
    assert await store.claim_due(now=T0 + 4000) == []


async def test_purge_prunes_agents_and_a_later_step_adds_them_again(
        store: ConversationStore) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("r1"), ORIGIN, now=T0)  # Mantis owes
    await store.apply(request("r2", to="Heron"), ORIGIN, now=T0)
    await store.apply(response("r2", sender="Heron"), ORIGIN, now=T0)
    assert await redis.smembers(keys.agents) == {"Mantis", "Heron"}
    assert await store.purge_expired(now=T0) == 0
    assert await redis.smembers(keys.agents) == {"Mantis"}  # Heron owes nothing any more
    # Lotbot was never in the set: the CLARIFY that makes it owe a reply adds it.
    await store.apply(clarify("r1"), ORIGIN, now=T0 + 1)
    assert await store.load_by_agent() == {"Lotbot": 1}
    assert await store.purge_expired(now=T0) == 0
    assert await redis.smembers(keys.agents) == {"Lotbot"}
    await store.apply(response("r1", sender="Lotbot", to="Mantis", depth=3, status=None),
                      ORIGIN, now=T0 + 2)
    assert await store.load_by_agent() == {"Mantis": 1}


async def test_load_busiest_first_then_by_name(store: ConversationStore) -> None:
    for i, to in enumerate(["Ant", "Bee", "Bee", "Cat", "Cat", "Cat", "Dog"]):
        await store.apply(request(f"r{i}", to=to), ORIGIN, now=T0)
    assert list((await store.load_by_agent()).items()) == [
        ("Cat", 3), ("Bee", 2), ("Dog", 1), ("Ant", 1)]
    assert await store.load_by_agent(limit=2) == {"Cat": 3, "Bee": 2}


async def test_namespace_of_the_old_layout_keeps_its_load(store: ConversationStore) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("r1"), ORIGIN, now=T0)
    # What the earlier version left: no agent set, a `load` zset and an `n` hash.
    await redis.delete(keys.agents)
    await redis.zadd(keys.prefix + "load", {"Mantis": 1})
    await redis.hset(keys.prefix + "n", mapping={"open": 1})
    assert await store.load_by_agent() == {"Mantis": 1}
    assert await redis.exists(keys.prefix + "load", keys.prefix + "n") == 0
    assert await redis.smembers(keys.agents) == {"Mantis"}


@pytest.fixture
async def private_store(namespace: str) -> AsyncIterator[ConversationStore]:
    """A store on a Valkey of this test alone, so INFO commandstats counts only it."""
    server = PrivateValkey().start()
    client: aioredis.Redis = aioredis.from_url(server.url, decode_responses=True)
    try:
        yield ConversationStore(client, StateSettings(namespace=namespace))
    finally:
        await client.aclose()
        server.close()


async def _commands(st: ConversationStore, msg: Message) -> int:
    """Commands INFO commandstats counts for one apply (incl. the ones the script runs)."""

    async def calls() -> int:
        stats = await st.redis.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    before = await calls()
    await st.apply(msg, ORIGIN, now=T0)
    return await calls() - before - 1  # minus the first INFO


async def test_commands_per_step(private_store: ConversationStore) -> None:
    st = private_store
    await st.apply(request("warm"), ORIGIN, now=T0)  # the script is loaded once
    assert await _commands(st, request("r1")) == 6  # EVALSHA + SET NX GET + 3 ZADD + SADD
    assert await _commands(st, request("r1")) == 2  # a duplicate: EVALSHA + SET NX GET
    assert await _commands(st, clarify("r1")) == 9
    assert await _commands(st, response("r1", sender="Lotbot", to="Mantis", depth=3,
                                        status=None)) == 9
    assert await _commands(st, handoff("r1", depth=4)) == 9
    assert await _commands(st, response("r1", sender="Heron", depth=5)) == 7

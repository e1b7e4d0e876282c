"""Indices and load counters: batched claims, old layouts, commands per step;
listing by status filters and by any party (issue 8 item 7)."""

from __future__ import annotations

import asyncio
import json
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

import state.store as store_module
from protocol.models import Message
from state.records import Budget, ConvStatus, Outcome
from state.settings import StateSettings
from state.store import MERGED_WINDOW, ConversationStore, list_statuses

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
    assert await store.load_by_agent() == {"mantis": 1}
    # Same terminal time: newest first falls back to RequestId order, descending.
    assert [c.request_id for c in await store.list(status="timeout")] == ["open", "moved", "asks"]
    assert await store.claim_due(now=T0 + 4000) == []


async def test_purge_drops_idle_load_counters_and_a_later_step_adds_them_again(
        store: ConversationStore) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("r1"), ORIGIN, now=T0)  # Mantis owes
    await store.apply(request("r2", to="Heron"), ORIGIN, now=T0)
    await store.apply(response("r2", sender="Heron"), ORIGIN, now=T0)
    assert await redis.hgetall(keys.load) == {"mantis": "1", "heron": "0"}
    assert await store.purge_expired(now=T0) == 0
    assert await redis.hgetall(keys.load) == {"mantis": "1"}  # Heron owes nothing any more
    # Lotbot had no counter: the CLARIFY that makes it owe a reply adds it.
    await store.apply(clarify("r1"), ORIGIN, now=T0 + 1)
    assert await store.load_by_agent() == {"lotbot": 1}
    assert await store.purge_expired(now=T0) == 0
    assert await redis.hgetall(keys.load) == {"lotbot": "1"}
    await store.apply(response("r1", sender="Lotbot", to="Mantis", depth=3, status=None),
                      ORIGIN, now=T0 + 2)
    assert await store.load_by_agent() == {"mantis": 1}


async def test_load_busiest_first_then_by_name(store: ConversationStore) -> None:
    for i, to in enumerate(["Ant", "Bee", "Bee", "Cat", "Cat", "Cat", "Dog"]):
        await store.apply(request(f"r{i}", to=to), ORIGIN, now=T0)
    assert list((await store.load_by_agent()).items()) == [
        ("cat", 3), ("bee", 2), ("dog", 1), ("ant", 1)]
    assert await store.load_by_agent(limit=2) == {"cat": 3, "bee": 2}


async def _old_index_layout(store: ConversationStore, owed: dict[str, list[str]],
                            *, agent_set: bool = True) -> None:
    """What earlier versions kept instead of the load counters: a zset of owed
    conversations per agent (``a:<name>``), its names in the set ``ag`` (or, before that,
    in a ``load`` zset, with an ``n`` hash of counts)."""
    redis, p = store.redis, store.keys.prefix
    await redis.delete(store.keys.load)
    for name, ids in owed.items():
        await redis.zadd(f"{p}a:{name}", {i: T0 for i in ids})
    if agent_set:
        await redis.sadd(f"{p}ag", *owed)
    else:
        await redis.zadd(f"{p}load", {name: len(ids) for name, ids in owed.items()})
        await redis.hset(f"{p}n", mapping={"open": 1})


async def test_namespace_of_the_old_layout_keeps_its_load(store: ConversationStore) -> None:
    redis, p = store.redis, store.keys.prefix
    await store.apply(request("r1"), ORIGIN, now=T0)
    await _old_index_layout(store, {"Mantis": ["r1"]}, agent_set=False)
    assert await store.load_by_agent() == {"Mantis": 1}  # read as it is
    assert await redis.exists(f"{p}load", f"{p}n", f"{p}ag", f"{p}a:Mantis") == 0
    assert await store.canonical_agent_indices() == 1  # then moved at the next start
    assert await store.load_by_agent() == {"mantis": 1}
    assert await redis.hgetall(store.keys.load) == {"mantis": "1"}


async def test_old_layout_names_move_at_start_before_any_load_query(
        store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(request("r2", to="Heron"), ORIGIN, now=T0)
    await _old_index_layout(store, {"Mantis": ["r1"], "heron": ["r2"]})
    # A step taken before the take-over counts against the counter, not the old index.
    await store.apply(response("r2", sender="Heron"), ORIGIN, now=T0 + 1)
    assert await store.canonical_agent_indices() == 1
    assert await store.redis.exists(f"{store.keys.prefix}ag") == 0
    assert await store.load_by_agent() == {"mantis": 1}
    await store.apply(response("r1"), ORIGIN, now=T0 + 1)
    assert await store.load_by_agent() == {}


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


async def _commands(st: ConversationStore, msg: Message, budget: Budget | None = None) -> int:
    """Commands INFO commandstats counts for one apply (incl. the ones the script runs)."""

    async def calls() -> int:
        stats = await st.redis.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    before = await calls()
    result = await st.apply(msg, ORIGIN, now=T0, budget=budget)
    assert result.outcome in (Outcome.APPLIED, Outcome.DUPLICATE), result
    return await calls() - before - 1  # minus the first INFO


async def _has_msetex(st: ConversationStore) -> bool:
    """Whether apply.lua writes budgets kept in their window with MSETEX (Valkey 9.1+)."""
    info = await st.redis.info("server")
    version = str(info.get("valkey_version", "0.0")).split(".")
    return (int(version[0]), int(version[1])) >= (9, 1)


async def test_commands_per_step(private_store: ConversationStore) -> None:
    st = private_store
    await st.apply(request("warm"), ORIGIN, now=T0)  # the script is loaded once
    # EVALSHA + SET NX GET + 2 ZADD (status, due) + HINCRBY + a ZADD per party (requester,
    # addressee)
    assert await _commands(st, request("r1")) == 7
    assert await _commands(st, request("r1")) == 2  # a duplicate: EVALSHA + SET NX GET
    # GET, ZREM + ZADD status, 2 HINCRBY (the load moves), ZADD due, SET
    assert await _commands(st, clarify("r1")) == 8
    assert await _commands(st, response("r1", sender="Lotbot", to="Mantis", depth=3,
                                        status=None)) == 8
    assert await _commands(st, handoff("r1", depth=4)) == 9  # + a ZADD: Heron is a party now
    assert await _commands(st, response("r1", sender="Heron", depth=5)) == 7
    # With the loop guard's two budgets: their MGET (which reads a later step's record
    # too, instead of its GET) and a SET each, new ones; ones still in the window they
    # were read in keep their expiry, written together on Valkey 9.1+ (one MSETEX).
    kept = 1 if await _has_msetex(st) else 2
    guard = Budget(("p:lotbot mantis", "i:http:lotbot mantis"), 100, 60.0, 60.0)
    assert await _commands(st, request("r2"), guard) == 7 + 3
    assert await _commands(st, request("r2"), guard) == 2 + 1  # a duplicate: no charge
    assert await _commands(st, clarify("r2"), guard) == 8 + kept
    assert await _commands(st, clarify("r2"), guard) == 2  # EVALSHA + MGET



async def test_budgets_kept_in_their_window_are_the_same_without_msetex(
        private_store: ConversationStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Valkey 9.1 (and on Redis) there is no MSETEX: the budgets a step keeps in
    the window they were read in are written with a SET ... KEEPTTL each, to the same
    values and expiries."""
    source = store_module.load_script("apply")
    assert "redis.VALKEY_VERSION_NUM" in source
    monkeypatch.setitem(store_module._SCRIPTS, "apply",
                        source.replace("redis.VALKEY_VERSION_NUM", "nil"))
    settings = StateSettings(namespace=private_store.settings.namespace + "-old")
    old = ConversationStore(private_store.redis, settings)
    guard = Budget(("p:lotbot mantis", "i:http:lotbot mantis"), 100, 60.0, 60.0)
    for st in (private_store, old):
        assert (await st.apply(request("g1"), ORIGIN, now=T0, budget=guard)).outcome is (
            Outcome.APPLIED)
    kept = 1 if await _has_msetex(private_store) else 2  # one MSETEX, or a SET each
    assert await _commands(private_store, clarify("g1"), guard) == 8 + kept
    assert await _commands(old, clarify("g1"), guard) == 8 + 2  # a SET each
    r = private_store.redis
    for name in guard.names:
        new_key, old_key = private_store.keys.budget(name), old.keys.budget(name)
        assert await r.get(new_key) == await r.get(old_key) == "[0,1700000000,0,2]"
        ttl_new, ttl_old = await r.pttl(new_key), await r.pttl(old_key)
        assert ttl_new > 0 and abs(ttl_new - ttl_old) < 5000

async def test_many_budgets_kept_in_their_window_are_all_written(
        private_store: ConversationStore) -> None:
    """More budgets kept in their window than one MSETEX takes (500): every one is
    written, to the value a step that keeps it writes, with its expiry kept."""
    st = private_store
    guard = Budget(tuple(f"p:lotbot mantis{i}" for i in range(620)), 100, 60.0, 60.0)
    assert (await st.apply(request("m1"), ORIGIN, now=T0, budget=guard)).outcome is (
        Outcome.APPLIED)
    kept = 2 if await _has_msetex(st) else 620  # 500 + 120 in two MSETEX, or a SET each
    assert await _commands(st, clarify("m1"), guard) == 8 + kept
    values = await st.redis.mget([st.keys.budget(name) for name in guard.names])
    assert values == ["[0,1700000000,0,2]"] * 620
    assert min([await st.redis.pttl(st.keys.budget(name)) for name in guard.names]) > 0


async def test_a_batch_writes_each_shared_index_once(private_store: ConversationStore) -> None:
    st = private_store
    await st.apply(request("warm"), ORIGIN, now=T0)

    async def calls() -> int:
        stats = await st.redis.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    before = await calls()
    batch = [request(f"b{i}", sender=f"Agent{i}") for i in range(10)]
    results = await st.apply_many(batch, ORIGIN, now=T0 + 1)
    assert [r.outcome for r in results] == [Outcome.APPLIED] * 10
    # One EVALSHA for the batch; a SET NX GET per record; ZADD s:open, ZADD due, HINCRBY
    # ld and ZADD p:mantis once for all ten; a ZADD p:<sender> per sender: 25, not 70.
    assert await calls() - before - 1 == 1 + 10 + 4 + 10
    assert await st.load_by_agent() == {"mantis": 11}
    assert (await st.counts())["open"] == 11
    assert {c.request_id for c in await st.list(agent="Mantis", limit=20)} == (
        {"warm"} | {f"b{i}" for i in range(10)})
    assert [c.request_id for c in await st.list(agent="Agent3")] == ["b3"]
    due = await st.deadlines([f"b{i}" for i in range(10)])
    assert all(d is not None and d > T0 for d in due)


async def test_later_messages_of_a_batch_see_earlier_ones(private_store: ConversationStore
                                                          ) -> None:
    st = private_store
    # A whole conversation, a retry and a step on a closed one, in one batch: each message
    # is checked against the record as the ones before it in the batch left it.
    msgs = [request("w1"), clarify("w1"), response("w1", sender="Lotbot", to="Mantis",
                                                   depth=3, status=None),
            response("w1", depth=4), request("w1"), clarify("w1", depth=5)]
    results = await st.apply_many(msgs, ORIGIN, now=T0)
    assert [r.outcome for r in results] == [
        Outcome.APPLIED, Outcome.APPLIED, Outcome.APPLIED, Outcome.APPLIED,
        Outcome.DUPLICATE, Outcome.ILLEGAL]
    conv = await st.get("w1")
    assert conv is not None and conv.status is ConvStatus.DONE
    counts = await st.counts()
    assert counts["done"] == 1 and counts["open"] == counts["clarifying"] == 0
    assert await st.load_by_agent() == {}
    assert await st.deadlines(["w1"]) == [None]


async def test_a_budget_shared_within_a_batch_counts_each_message(
        private_store: ConversationStore) -> None:
    st = private_store
    guard = Budget(("p:lotbot mantis",), 3, 60.0, 30.0)
    # Concurrent applies: the first goes alone, the other five as one batch.
    results = await asyncio.gather(*(
        st.apply(request(f"g{i}"), ORIGIN, now=T0, budget=guard) for i in range(6)))
    outcomes = [r.outcome for r in results]
    assert outcomes.count(Outcome.APPLIED) == 3 and outcomes.count(Outcome.LOOP) == 3
    assert sum(r.tripped for r in results) == 1  # one notice per cooldown
    key = st.keys.budget("p:lotbot mantis")
    assert 0 < await st.redis.pttl(key) <= 30_000  # cooling down


# -- listing: status filters, any party, bounded pages -----------------------------------


async def _ids(store: ConversationStore, **kw: object) -> list[str]:
    return [c.request_id for c in await store.list(**kw)]  # type: ignore[arg-type]


async def test_no_status_lists_every_status(store: ConversationStore) -> None:
    await store.apply(request("o1"), ORIGIN, now=T0)
    await store.apply(request("c2", to="Heron"), ORIGIN, now=T0 + 1)
    await store.apply(clarify("c2", sender="Heron"), ORIGIN, now=T0 + 2)
    await store.apply(request("d3", sender="Heron"), ORIGIN, now=T0 + 3)
    await store.apply(response("d3", to="Heron"), ORIGIN, now=T0 + 4)
    await store.apply(request("x4"), ORIGIN, now=T0 + 5)
    await store.cancel("x4", by="alice", reason="not needed", now=T0 + 6)
    await store.apply(broadcast("news"), ORIGIN, now=T0 + 7)
    # Active ones oldest first, then finished ones most recently finished first.
    every = ["o1", "c2", "x4", "d3"]
    assert await _ids(store) == every
    assert await _ids(store, status="all") == every == await _ids(store, status="ALL")
    assert await _ids(store, status="active") == ["o1", "c2"]
    assert await _ids(store, status="finished") == ["x4", "d3"]
    assert await _ids(store, status="open") == ["o1"]
    assert await _ids(store, status="cancelled") == ["x4"]
    # Pages run across the active / finished boundary without gaps or repeats.
    pages = [await _ids(store, offset=i, limit=1) for i in range(5)]
    assert pages == [["o1"], ["c2"], ["x4"], ["d3"], []]
    assert await _ids(store, offset=1, limit=2) == ["c2", "x4"]
    assert await _ids(store, status="finished", offset=1, limit=5) == ["d3"]


async def test_the_agent_filter_matches_any_party(store: ConversationStore) -> None:
    await store.apply(request("o1"), ORIGIN, now=T0)  # Lotbot -> Mantis
    await store.apply(request("h2"), ORIGIN, now=T0 + 1)
    await store.apply(handoff("h2"), ORIGIN, now=T0 + 2)  # Mantis -> Heron
    await store.apply(response("h2", sender="Heron", depth=3), ORIGIN, now=T0 + 3)
    await store.apply(request("q3", to="all"), ORIGIN, now=T0 + 4)
    await store.apply(clarify("q3", sender="Kite"), ORIGIN, now=T0 + 5)  # Kite takes it
    await store.apply(request("z4", sender="Heron", to="Kite"), ORIGIN, now=T0 + 6)
    # Newest first; the requester, the addressee, a finished assignee all find it.
    assert await _ids(store, agent="Lotbot") == ["q3", "h2", "o1"]
    assert await _ids(store, agent="Mantis") == ["h2", "o1"]  # handed h2 on, still a party
    assert await _ids(store, agent="Heron") == ["z4", "h2"]
    assert await _ids(store, agent="Kite") == ["z4", "q3"]
    assert await _ids(store, agent="all") == []  # @all is nobody
    # Names compare canonically.
    assert await _ids(store, agent="mantis") == await _ids(store, agent="MANTIS") == ["h2", "o1"]
    assert await _ids(store, agent="Mantis", status="finished") == ["h2"]
    assert await _ids(store, agent="Mantis", status="open") == ["o1"]
    assert await _ids(store, agent="Lotbot", status="active", limit=1) == ["q3"]
    assert await _ids(store, agent="Lotbot", status="active", offset=1) == ["o1"]
    assert await _ids(store, agent="Nobody") == []


async def test_the_party_index_goes_with_the_conversation(store: ConversationStore) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(handoff("r1"), ORIGIN, now=T0 + 1)
    await store.apply(response("r1", sender="Heron", depth=3), ORIGIN, now=T0 + 2)
    await store.apply(request("r2"), ORIGIN, now=T0 + 3)
    assert await redis.zrange(keys.party("Heron"), 0, -1) == ["r1"]
    assert await redis.zrange(keys.party("Lotbot"), 0, -1) == ["r1", "r2"]
    # Purged after the retention: r1 leaves every party index, Heron's is gone.
    assert await store.purge_expired(now=T0 + 2 + store.settings.retention_seconds) == 1
    assert await redis.exists(keys.party("Heron")) == 0
    assert await redis.zrange(keys.party("Lotbot"), 0, -1) == ["r2"]
    assert await redis.zrange(keys.party("Mantis"), 0, -1) == ["r2"]


async def test_a_record_from_before_the_party_index_joins_it_when_it_moves(
    store: ConversationStore,
) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("old"), ORIGIN, now=T0)
    # What the earlier version wrote: a header of 18 fields and no party index.
    blob = await redis.get(keys.conv("old"))
    header, _, body = blob.partition("\n")
    await redis.set(keys.conv("old"), json.dumps(json.loads(header)[:18]) + "\n" + body)
    await redis.delete(keys.party("Lotbot"), keys.party("Mantis"))
    await store.apply(handoff("old"), ORIGIN, now=T0 + 1)
    for who in ("Lotbot", "Mantis", "Heron"):
        assert await _ids(store, agent=who) == ["old"], who


async def test_records_are_stored_compactly_and_older_ones_still_read(
        store: ConversationStore) -> None:
    redis, keys = store.redis, store.keys
    await store.apply(request("new", to="Ｍａｎｔｉｓ"), ORIGIN, now=T0)
    await store.apply(clarify("new", sender="mantis"), ORIGIN, now=T0 + 1.5)
    header, *events = (await redis.get(keys.conv("new"))).splitlines()
    # Keys only when not the name's ASCII lower case, parties besides those two, times
    # since created, the conversation's transport and first native id left out.
    assert json.loads(header)[16:] == ["", "mantis", {}, 1]  # Lua's empty table: {}
    assert [json.loads(e)[6:9] for e in events] == [["", "", 0], ["", "n-1", 1.5]]
    conv = await store.get("new")
    assert conv is not None
    assert [(e.transport, e.native_id, e.at) for e in conv.history] == [
        ("discord", "n-1", T0), ("discord", "n-1", T0 + 1.5)]
    # A record as the previous version wrote it: full keys and parties, epoch times.
    old = [["", "REQUEST", "Lotbot", "Mantis", "open", 1, 5, "normal", "count", T0, T0,
            T0 + 1800, "discord", "c-1", "t-1", "n-1", "lotbot", "mantis",
            ["lotbot", "mantis"]],
           ["REQUEST", "Lotbot", "Mantis", 1, 5, "open", "discord", "n-1", T0, "count",
            "0123456789abcdef"]]
    await redis.set(keys.conv("old"), "".join(json.dumps(x) + "\n" for x in old))
    await redis.zadd(keys.status("open"), {"old": T0})
    await redis.zadd(keys.due, {"old": T0 + 1800})
    await redis.hincrby(keys.load, "mantis", 1)
    await store.apply(handoff("old"), ORIGIN, now=T0 + 2)
    conv = await store.get("old")
    assert conv is not None and conv.assignee == "Heron"
    assert [(e.transport, e.native_id, e.at) for e in conv.history] == [
        ("discord", "n-1", T0), ("discord", "n-1", T0 + 2)]
    assert json.loads((await redis.get(keys.conv("old"))).splitlines()[0])[16:] == [
        "", "", ["mantis"]]  # Mantis, no longer the assignee, stays a party
    assert await store.load_by_agent() == {"lotbot": 1, "heron": 1}


async def test_bad_filters_and_pages_are_refused(store: ConversationStore) -> None:
    with pytest.raises(ValueError, match="unknown status 'opne'; use one of: all, active"):
        await store.list(status="opne")
    with pytest.raises(ValueError, match=f"reach {MERGED_WINDOW} at most"):
        await store.list(offset=MERGED_WINDOW, limit=1)
    with pytest.raises(ValueError, match="filter by one status"):
        await store.list(status="finished", offset=MERGED_WINDOW - 10, limit=11)
    assert await store.list(status="done", offset=10**9, limit=5) == []  # one index: any offset
    assert list_statuses(None) == list_statuses("") == tuple(ConvStatus)
async def test_agent_indices_use_the_canonical_name_key(store: ConversationStore) -> None:
    # One agent, three spellings: one index, one load, found by any spelling.
    await store.apply(request("r1", to="Mantis"), ORIGIN, now=T0)
    await store.apply(request("r2", to="ｍａｎｔｉｓ"), ORIGIN, now=T0 + 1)
    await store.apply(request("r3", to="MANTIS"), ORIGIN, now=T0 + 2)
    assert await store.load_by_agent() == {"mantis": 3}
    for spelling in ("Mantis", "mantis", "ＭＡＮＴＩＳ"):
        assert [c.request_id for c in await store.list(agent=spelling)] == ["r3", "r2", "r1"]
    # Answered, asked back, handed off under other spellings: the indices follow the keys.
    await store.apply(response("r1", sender="mantis"), ORIGIN, now=T0 + 3)
    await store.apply(clarify("r2", sender="MANTIS", to="LOTBOT"), ORIGIN, now=T0 + 4)
    await store.apply(handoff("r3", sender="Mantis", to="heron"), ORIGIN, now=T0 + 5)
    assert await store.load_by_agent() == {"lotbot": 1, "heron": 1}
    assert [c.request_id for c in await store.list(agent="LOTBOT", status="clarifying")
            ] == ["r2"]
    assert [c.request_id for c in await store.list(agent="HERON")] == ["r3"]
    claimed = await store.claim_due(now=T0 + 10_000)
    assert {c.request_id for c in claimed} == {"r2", "r3"}
    assert await store.load_by_agent() == {}


async def test_load_kept_under_a_spelling_moves_to_the_name_key(
        store: ConversationStore) -> None:
    await store.apply(request("old", to="Mantis"), ORIGIN, now=T0)
    await store.apply(request("new", to="mantis"), ORIGIN, now=T0 + 1)
    # As an earlier version counted it: under the name as first written.
    await store.redis.hset(store.keys.load, mapping={"mantis": 1, "Mantis": 1})
    assert await store.canonical_agent_indices() == 1
    assert await store.canonical_agent_indices() == 0  # idempotent
    assert await store.redis.hgetall(store.keys.load) == {"mantis": "2"}
    assert await store.load_by_agent() == {"mantis": 2}
    await store.apply(response("old", sender="Mantis"), ORIGIN, now=T0 + 2)
    assert await store.load_by_agent() == {"mantis": 1}


@pytest.mark.parametrize("now", [T0 + 0.1, T0 + 12.345, -7.5, 1e15 + 0.5])
async def test_a_new_conversation_is_indexed_at_its_creation_time(
    store: ConversationStore, now: float
) -> None:
    # A record the client writes comes with the time's text, which the index scores take
    # as it is (apply.lua); at 1e15 the script writes the record (the time has no plain
    # 14-digit form) and the scores come from the number. Either way the same doubles.
    await store.apply(request("r1"), ORIGIN, now=now)
    await store.apply(broadcast("b1"), ORIGIN, now=now)
    created = float(f"{now:.3f}")
    r, k, t = store.redis, store.keys, store.settings.timeout_for
    for key in (k.status("open"), k.party("Lotbot"), k.party("Mantis")):
        assert await r.zscore(key, "r1") == created
    assert await r.zscore(k.due, "r1") == created + t("REQUEST")
    assert await r.zscore(k.due, "b1") == created + t("BROADCAST")

"""The sweeper: scheduled claims and purges, callbacks, and a Redis outage mid-sweep."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from test_state_helpers import ORIGIN, T0, request, response, store

from state.records import Conversation, ConvStatus
from state.settings import StateSettings
from state.store import ConversationStore
from state.sweeper import Sweeper

from servers import PrivateValkey

__all__ = ["store"]


async def test_run_once_claims_notifies_and_purges(store: ConversationStore) -> None:
    seen: list[Conversation] = []

    async def notify(conv: Conversation) -> None:
        seen.append(conv)

    await store.apply(request("late"), ORIGIN, now=T0)
    await store.apply(request("fine"), ORIGIN, now=T0 + 3000)
    await store.apply(request("gone"), ORIGIN, now=T0 - 10 * 86400)
    await store.apply(response("gone"), ORIGIN, now=T0 - 9 * 86400)
    sweeper = Sweeper(store, notify, store.settings)
    report = await sweeper.run_once(now=T0 + 2000)
    assert (report.claimed, report.purged, report.error) == (1, 1, None)
    assert sweeper.last_report == report
    assert [c.request_id for c in seen] == ["late"]
    assert seen[0].status is ConvStatus.TIMEOUT and seen[0].history[-1].to == "Mantis"
    assert seen[0].origin == ORIGIN  # the notice goes back into the same thread
    assert await store.get("gone") is None
    assert (await sweeper.run_once(now=T0 + 2000)).claimed == 0


async def test_failing_callback_does_not_stop_the_sweep(store: ConversationStore) -> None:
    seen: list[str] = []

    async def notify(conv: Conversation) -> None:
        seen.append(conv.request_id)
        if conv.request_id == "a":
            raise RuntimeError("chat platform down")

    for rid in ("a", "b"):
        await store.apply(request(rid), ORIGIN, now=T0)
    report = await Sweeper(store, notify, store.settings).run_once(now=T0 + 4000)
    assert report.claimed == 2 and report.error is None and sorted(seen) == ["a", "b"]


async def test_redis_stopped_mid_sweep_then_started_again(namespace: str) -> None:
    server = PrivateValkey(appendonly=True).start()
    client: aioredis.Redis = aioredis.from_url(server.url, decode_responses=True)
    try:
        settings = StateSettings(namespace=namespace, sweep_batch=10,
                                 sweep_interval_seconds=0.1)
        st = ConversationStore(client, settings)
        await st.apply_many([request(f"r{i}") for i in range(30)], ORIGIN, now=T0)
        seen: list[str] = []
        all_seen = asyncio.Event()
        stopped = False

        async def notify(conv: Conversation) -> None:
            nonlocal stopped
            if not stopped:  # the server goes away while the first batch is handled
                stopped = True
                await asyncio.to_thread(server.stop)
            # What the gateway's callback does last, atomically with journaling the
            # notices: clear the claim's "notices owed" mark.
            await st.redis.zrem(st.keys.notify, conv.request_id)
            seen.append(conv.request_id)
            if len(seen) == 30:
                all_seen.set()

        sweeper = Sweeper(st, notify, settings)
        report = await sweeper.sweep(now=T0 + 4000)
        # Claimed, but their notices could not be journaled: the marks stay, and a later
        # sweep posts them.
        assert report.claimed == 10 and report.error is not None and not seen

        sweeper.start()  # the scheduled job keeps failing, logging and retrying
        await asyncio.sleep(0.5)
        assert sweeper.last_report is not None and sweeper.last_report.error is not None
        await asyncio.to_thread(server.start)
        try:
            await asyncio.wait_for(all_seen.wait(), timeout=15)
        finally:
            await sweeper.stop()
        assert sorted(seen) == sorted(f"r{i}" for i in range(30))  # none twice, none missed
        counts = await st.counts()
        assert counts["timeout"] == 30 and counts["open"] == 0
    finally:
        await client.aclose()
        server.close()


async def test_first_sweep_runs_at_start_not_after_an_interval(store: ConversationStore) -> None:
    # Fell due while no gateway was running: handled as soon as one starts.
    claimed: asyncio.Queue[Conversation] = asyncio.Queue()

    async def notify(conv: Conversation) -> None:
        await claimed.put(conv)

    await store.apply(request("overdue"), ORIGIN, now=T0)  # T0 is long past
    settings = StateSettings(namespace=store.settings.namespace, sweep_interval_seconds=3600)
    sweeper = Sweeper(store, notify, settings)
    sweeper.start()
    try:
        conv = await asyncio.wait_for(claimed.get(), timeout=10)
    finally:
        await sweeper.stop()
    assert conv.request_id == "overdue" and conv.status is ConvStatus.TIMEOUT

"""State survives: closing and reopening the store, and restarting the embedded server."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis
from test_state_helpers import ORIGIN, T0, clarify, drop_namespace, request

from state.connection import open_redis
from state.records import ConvStatus, Outcome
from state.settings import StateSettings
from state.store import ConversationStore


async def test_close_and_reopen_store(redis_url: str, namespace: str) -> None:
    settings = StateSettings(namespace=namespace)
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    st = ConversationStore(client, settings)
    await st.apply(request("r1"), ORIGIN, now=T0)
    await st.apply(clarify("r1"), ORIGIN, now=T0)
    before = await st.get("r1")
    await client.aclose()
    client = aioredis.from_url(redis_url, decode_responses=False)  # bytes replies work too
    try:
        st = ConversationStore(client, settings)
        assert await st.get("r1") == before
        assert (await st.apply(clarify("r1"), ORIGIN)).outcome is Outcome.DUPLICATE
        assert (await st.counts())["clarifying"] == 1
        assert await st.load_by_agent() == {"lotbot": 1}
    finally:
        await drop_namespace(client, namespace)
        await client.aclose()


async def test_embedded_server_restart_keeps_state(tmp_path: Path) -> None:
    settings = StateSettings(redis_url="embedded", namespace="bpgw", data_dir=tmp_path)
    handle = await open_redis(settings)
    try:
        st = ConversationStore(handle.client, settings)
        await st.apply(request("r1"), ORIGIN, now=T0)
        await st.apply(clarify("r1"), ORIGIN, now=T0 + 1)
        before = await st.get("r1")
        port = (tmp_path / "valkey" / "port").read_text()
    finally:
        await handle.close()
    assert (tmp_path / "valkey").is_dir()
    handle = await open_redis(settings)  # a fresh server process on the same data folder
    try:
        assert handle.url.endswith(f":{port}")
        st = ConversationStore(handle.client, settings)
        conv = await st.get("r1")
        assert conv == before and conv is not None and conv.status is ConvStatus.CLARIFYING
        assert (await st.counts())["clarifying"] == 1
        assert [c.request_id for c in await st.claim_due(now=T0 + 700)] == ["r1"]
    finally:
        await handle.close()


async def test_embedded_second_opener_shares_the_running_server(tmp_path: Path) -> None:
    settings = StateSettings(redis_url="embedded", data_dir=tmp_path)
    first = await open_redis(settings)
    try:
        second = await open_redis(settings)
        assert second.url == first.url and second.server is None
        await second.close()
        assert await first.client.ping()
    finally:
        await first.close()

"""Fault test: ``kill -9`` the gateway (a real ``bpgw run`` process) while 5,000 messages
stream in over HTTP and out to a second transport; after a restart every message that got
a 2xx is in state once and in its recipient's inbox once (counted by message id on the
reading side)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from protocol import build_request
from state.settings import StateSettings
from state.store import ConversationStore

from gwproc import GatewayProcess, InboxReader, Poster, scaled, two_transports, write_config
from servers import free_port

TOKENS = {"Lotbot": "tok-lotbot-fault", "Mantis": "tok-mantis-fault"}
MESSAGES = scaled(5000)
CONCURRENCY = 16
KILL_AFTER = MESSAGES // 3


def _config(folder: Path, redis_url: str, namespace: str, ports: tuple[int, int]) -> Path:
    return write_config(folder / "gw.toml", {
        "gateway": {"data_dir": str(folder / "data"), "log_level": "WARNING"},
        "state": {"redis_url": redis_url, "namespace": namespace,
                  "sweep_interval_seconds": 3600},
        "policy": {"pair_budget_messages": 1_000_000},
        # A short dispatch lease, so the restarted process takes over the dead one's
        # outbox within seconds.
        "outbox": {"lease_seconds": 2},
        **two_transports(ports, TOKENS, inbox_visibility_seconds=5),
    })


async def test_kill_9_while_streaming_loses_and_doubles_nothing(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    ports = (free_port(), free_port())
    config = _config(tmp_path, redis_url, namespace, ports)
    web, side = (f"http://127.0.0.1:{p}" for p in ports)
    reqs = [build_request(sender="Lotbot", to="Mantis", task=f"job {i}") for i in range(MESSAGES)]
    async with aiohttp.ClientSession() as http:
        gw = await GatewayProcess(config, web).start()
        poster = Poster(http)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for req in reqs:
            queue.put_nowait(req)
        killed = asyncio.Event()

        async def client() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                if not await poster.post(web, TOKENS["Lotbot"], req):
                    assert killed.is_set(), f"{req.request_id} refused before the kill"
                    queue.put_nowait(req)  # retried after the restart
                    return
                if len(poster.ok) >= KILL_AFTER and not killed.is_set():
                    gw.kill()
                    killed.set()

        try:
            await asyncio.wait_for(asyncio.gather(*(client() for _ in range(CONCURRENCY))), 120)
            assert killed.is_set()
            await gw.stop()
            gw = await GatewayProcess(config, web).start()
            # The rest, including every post that failed around the kill (a retry of a
            # committed one is answered "already accepted").
            rest = [queue.get_nowait() for _ in range(queue.qsize())]
            for chunk in range(0, len(rest), CONCURRENCY):
                got = await asyncio.gather(*(poster.post(web, TOKENS["Lotbot"], r)
                                             for r in rest[chunk:chunk + CONCURRENCY]))
                assert all(got), poster.answers
            assert len(poster.ok) == MESSAGES

            reader = InboxReader(http, "Mantis", TOKENS["Mantis"])
            await reader.read_until([side], MESSAGES, within=60)
            counts = reader.protocol_ids()
            assert set(counts) == poster.ok, (len(counts), len(poster.ok))
            assert max(counts.values()) == 1, [r for r, n in counts.items() if n > 1][:5]
            assert max(reader.ids.values()) == 1
        finally:
            await gw.stop()
    client_redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        store = ConversationStore(client_redis, StateSettings(redis_url=redis_url,
                                                              namespace=namespace))
        assert (await store.counts())["open"] == MESSAGES
    finally:
        await client_redis.aclose()

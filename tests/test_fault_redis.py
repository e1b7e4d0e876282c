"""Fault test: the gateway's Redis/Valkey (a private one) is stopped (or frozen) for 10 s
in the middle of a stream of messages, then started again (or resumed). Nothing
acknowledged is lost, a client answered 503 with Retry-After retries and its message ends
delivered exactly once, /healthz says the state store is down meanwhile, and the gateway
recovers by itself."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from protocol import build_request
from state.settings import StateSettings
from state.store import ConversationStore

from gwproc import GatewayProcess, InboxReader, Poster, bearer, scaled, two_transports, write_config
from servers import PrivateValkey, free_port

TOKENS = {"Lotbot": "tok-lotbot-outage", "Mantis": "tok-mantis-outage"}
MESSAGES = scaled(3000)
CONCURRENCY = 16
OUTAGE_SECONDS = 10.0
RECOVERY_LIMIT_SECONDS = 15.0
COMMAND_TIMEOUT_SECONDS = 1.0
PROMPT_503_SECONDS = 6.0
"""A POST during a freeze is answered 503 within this (a few command timeouts), not after
the freeze: the state store's commands time out."""

# Bounded by the waits inside; a loaded machine may need more than the default 120 s.
# A private server of its own: nothing to gain from CI's second pass on the machine's Redis.
pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def durable_valkey(tmp_path: Path) -> Iterator[PrivateValkey]:
    # Append-only with fsync always: what Redis acknowledged survives its restart.
    server = PrivateValkey(tmp_path / "valkey", appendonly=True).start()
    try:
        yield server
    finally:
        server.close()


def _config(folder: Path, redis_url: str, ports: tuple[int, int]) -> Path:
    return write_config(folder / "gw.toml", {
        "gateway": {"data_dir": str(folder / "data"), "log_level": "ERROR"},
        # The sweeper's run every second is what /healthz reads the store's state from.
        "state": {"redis_url": redis_url, "namespace": "outage", "sweep_interval_seconds": 1,
                  "command_timeout_seconds": COMMAND_TIMEOUT_SECONDS},
        "policy": {"pair_budget_messages": 1_000_000},
        # A lost poll answer comes back within seconds (frozen variant).
        **two_transports(ports, TOKENS, inbox_visibility_seconds=5),
    })


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
async def test_redis_down_for_10s_mid_stream(
    durable_valkey: PrivateValkey, tmp_path: Path, fault: str
) -> None:
    """``stopped``: the server exits and is started again. ``frozen``: SIGSTOP, then
    SIGCONT: commands sent meanwhile wait unanswered, then run (a client may be told 503
    for a message that commits later, and a reader's poll answer may be lost)."""
    valkey = durable_valkey
    ports = (free_port(), free_port())
    web, side = (f"http://127.0.0.1:{p}" for p in ports)
    reqs = [build_request(sender="Lotbot", to="Mantis", task=f"job {i}") for i in range(MESSAGES)]
    refused: set[str] = set()  # answered 503 (or not at all) at least once
    async with aiohttp.ClientSession() as http:
        gw = await GatewayProcess(_config(tmp_path, valkey.url, ports), web).start()
        admin = aioredis.from_url(valkey.url)
        poster = Poster(http)
        reader = InboxReader(http, "Mantis", TOKENS["Mantis"])
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for req in reqs:
            queue.put_nowait(req)
        outage_at = MESSAGES // 3
        down = asyncio.Event()
        seen_down: Counter[str] = Counter()  # what /healthz and an inbox poll answered
        frozen = asyncio.Event()  # set for the whole freeze
        refused_in: list[float] = []  # seconds each POST sent and refused during it took

        async def client() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                while True:
                    during = frozen.is_set()
                    sent = time.monotonic()
                    if await poster.post(web, TOKENS["Lotbot"], req):
                        break
                    if during and frozen.is_set():
                        refused_in.append(time.monotonic() - sent)
                    refused.add(req.request_id)
                    await asyncio.sleep(1.0)  # the Retry-After every 503 carried
                if len(poster.ok) >= outage_at:
                    down.set()

        async def outage() -> None:
            pid = int((await admin.info("server"))["process_id"])
            await down.wait()
            if fault == "stopped":
                await asyncio.to_thread(valkey.stop)
            else:
                os.kill(pid, signal.SIGSTOP)
                frozen.set()
            stopped = time.monotonic()
            while time.monotonic() - stopped < OUTAGE_SECONDS:
                status, headers, body = await gw.health(http)
                if status == 503:
                    assert headers.get("Retry-After"), headers
                    assert body["state_store"].startswith("unreachable"), body
                seen_down[f"healthz {status}"] += 1
                try:
                    async with http.get(f"{side}/v1/agents/Mantis/inbox", params={"wait": "0"},
                                        headers=bearer(TOKENS["Mantis"]),
                                        timeout=aiohttp.ClientTimeout(total=3)) as resp:
                        if resp.status == 503:
                            assert resp.headers.get("Retry-After"), dict(resp.headers)
                        seen_down[f"inbox {resp.status}"] += 1
                except TimeoutError:
                    seen_down["inbox no answer within 3 s"] += 1
                await asyncio.sleep(0.5)
            if fault == "stopped":
                await asyncio.to_thread(valkey.start)
            else:
                frozen.clear()
                os.kill(pid, signal.SIGCONT)

        try:
            await asyncio.wait_for(
                asyncio.gather(outage(), *(client() for _ in range(CONCURRENCY))), 120
            )
            assert seen_down["healthz 503"] > 0, seen_down
            # Frozen: every command times out after the command timeout, so a POST and an
            # inbox poll are answered 503 promptly, not after the freeze. A command that
            # timed out may still run after SIGCONT (a message committed, a poll's batch
            # handed out to nobody): the client's retry is "already accepted", and the
            # batch comes back to the reader after its visibility timeout.
            answers = {"healthz 503", "healthz 200", "inbox 503", "inbox 200"}
            assert set(seen_down) <= answers, seen_down
            assert seen_down["inbox 503"] > 0, seen_down
            if fault == "frozen":
                assert refused_in, "no POST was sent and refused during the freeze"
                assert max(refused_in) < PROMPT_503_SECONDS, sorted(refused_in)[-5:]
            assert refused, "no client was refused while Redis was down"
            assert poster.answers["503:error"] > 0, poster.answers
            assert len(poster.ok) == MESSAGES
            # Recovered by itself: healthy again, no restart.
            async with asyncio.timeout(RECOVERY_LIMIT_SECONDS):
                while await gw.health_status(http) != 200:  # noqa: ASYNC110 - another process
                    await asyncio.sleep(0.2)

            await reader.read_until([side], MESSAGES, within=60)
            stored = reader.stored()
            assert set(stored) == poster.ok, (len(stored), len(poster.ok))
            assert all(len(ids) == 1 for ids in stored.values())  # stored once each
            if fault == "stopped":  # no answer lost: each handed out once too
                assert max(reader.ids.values()) == 1
            assert gw.running
        finally:
            await gw.stop()
            await admin.aclose()
    client_redis = aioredis.from_url(valkey.url, decode_responses=True)
    try:
        store = ConversationStore(client_redis, StateSettings(redis_url=valkey.url,
                                                              namespace="outage"))
        assert (await store.counts())["open"] == MESSAGES
    finally:
        await client_redis.aclose()

"""Fault test: ``kill -9`` the gateway (a real ``bpgw run`` process) while messages stream
in over HTTP; after a restart every message that got a 2xx is in state once and in its
recipient's inbox once (counted by message id on the reading side)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from protocol import build_request, parse, render
from state.settings import StateSettings
from state.store import ConversationStore

from gwkit import healthy
from servers import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKENS = {"Lotbot": "tok-lotbot-fault", "Mantis": "tok-mantis-fault"}
MESSAGES = 600
CONCURRENCY = 16
KILL_AFTER = 200


def _config(path: Path, redis_url: str, namespace: str, port: int) -> Path:
    path.write_text(
        f"""
[gateway]
data_dir = "{path.parent / 'data'}"
log_level = "WARNING"
[state]
redis_url = "{redis_url}"
namespace = "{namespace}"
sweep_interval_seconds = 3600
[policy]
pair_budget_messages = 100000
[agents.Lotbot]
addresses = ["web:Lotbot"]
identities = ["web:Lotbot"]
[agents.Mantis]
addresses = ["web:Mantis"]
identities = ["web:Mantis"]
[transports.web]
kind = "http"
port = {port}
inbox_visibility_seconds = 5
[transports.web.tokens]
Lotbot = "{TOKENS['Lotbot']}"
Mantis = "{TOKENS['Mantis']}"
"""
    )
    return path


async def _start(config: Path, base: str, http: aiohttp.ClientSession) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, whatever is installed
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env=env, cwd=config.parent,
    )
    assert await healthy(base, proc), "bpgw run never became healthy"
    return proc


async def test_kill_9_while_streaming_loses_and_doubles_nothing(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = _config(tmp_path / "gw.toml", redis_url, namespace, port)
    reqs = [build_request(sender="Lotbot", to="Mantis", task=f"job {i}") for i in range(MESSAGES)]
    ok: set[str] = set()
    auth = {"Authorization": f"Bearer {TOKENS['Lotbot']}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        proc = await _start(config, base, http)
        killed = asyncio.Event()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for req in reqs:
            queue.put_nowait(req)

        async def post(req: Any) -> bool:
            try:
                async with http.post(
                    f"{base}/v1/messages", json={"text": render(req)}, headers=auth
                ) as resp:
                    body = await resp.json()
                    if resp.status == 200 and body["outcome"] in ("accepted", "duplicate"):
                        ok.add(req.request_id)
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            return False

        async def client() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                if not await post(req):
                    assert killed.is_set(), f"{req.request_id} refused before the kill"
                    queue.put_nowait(req)  # retried after the restart
                    return
                if len(ok) >= KILL_AFTER and not killed.is_set():
                    proc.send_signal(signal.SIGKILL)
                    killed.set()

        try:
            await asyncio.wait_for(
                asyncio.gather(*(client() for _ in range(CONCURRENCY))), 60
            )
            assert killed.is_set()
            await proc.wait()
            proc = await _start(config, base, http)
            # The rest, including every post that failed around the kill (a retry of a
            # committed one is answered "already accepted").
            while not queue.empty():
                req = queue.get_nowait()
                assert await post(req), req.request_id
            assert len(ok) == MESSAGES

            counts: Counter[str] = Counter()
            ids: Counter[str] = Counter()
            read_auth = {"Authorization": f"Bearer {TOKENS['Mantis']}"}
            ack = ""
            async with asyncio.timeout(40):
                while len(counts) < MESSAGES:
                    params = {"wait": "2", "max": "200", **({"ack": ack} if ack else {})}
                    async with http.get(
                        f"{base}/v1/agents/Mantis/inbox", params=params, headers=read_auth
                    ) as resp:
                        got = (await resp.json())["messages"]
                    for m in got:
                        ids[m["id"]] += 1
                        if m["kind"] == "protocol":
                            counts[parse(m["text"]).messages[0].request_id] += 1
                    if got:
                        ack = got[-1]["id"]
            assert set(counts) == ok
            assert max(counts.values()) == 1, [r for r, n in counts.items() if n > 1][:5]
            assert max(ids.values()) == 1
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    client_redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        store = ConversationStore(client_redis, StateSettings(redis_url=redis_url,
                                                              namespace=namespace))
        assert (await store.counts())["open"] == MESSAGES
    finally:
        await client_redis.aclose()

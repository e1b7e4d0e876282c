"""Fault test: a destination platform that fails for 30 s, then recovers, and one that never
recovers, behind a real ``bpgw run`` process (transport kind ``hook`` from hook_kit.py,
posting to a platform server of this test's own).

While messages stream in over HTTP: everything queued for the failing destination is
delivered once it recovers, in the order it was sent, each message once; its sender is
told meanwhile that the destination is failing. The one that never recovers is
dead-lettered after the last attempt, visible in /protocol status and /metrics, its sender
is told, and an operator's ``outbox retry`` delivers it once it works again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from protocol import build_request, render

from gwproc import GatewayProcess, InboxReader, Poster, bearer, write_config
from servers import free_port

TOKENS = {"Lotbot": "tok-lotbot-dest", "op": "tok-operator-dest"}
OUTAGE_SECONDS = 30.0
STREAM_SECONDS = OUTAGE_SECONDS + 5.0
RATE = 10.0  # messages per second to the failing destination, sent one after another
NEVER = 3  # messages to the destination that never recovers
RETRY_AFTER = "8"  # what the failing platform asks for: attempts ~8 s apart

# Bounded by the waits inside; a loaded machine may need more than the default 120 s.
pytestmark = pytest.mark.timeout(240)


class Platform:
    """The chat platform behind both destinations: records deliveries per channel."""

    def __init__(self) -> None:
        self.delivered: dict[str, list[dict[str, Any]]] = {"room-a": [], "room-b": []}
        self.refused: Counter[str] = Counter()
        self.down_until = 0.0  # room-a fails (503 + Retry-After) until then
        self.broken = True  # room-b fails (503, no hint) while set

    async def deliver(self, request: web.Request) -> web.Response:
        body = await request.json()
        channel = body["channel"]
        if channel == "room-b" and self.broken:
            self.refused[channel] += 1
            return web.Response(status=503)
        if channel == "room-a" and time.monotonic() < self.down_until:
            self.refused[channel] += 1
            return web.Response(status=503, headers={"Retry-After": RETRY_AFTER})
        self.delivered[channel].append(body)
        return web.json_response({"native_id": f"{channel}-{len(self.delivered[channel])}"})


def _config(folder: Path, redis_url: str, namespace: str, port: int, hook_url: str) -> Path:
    return write_config(folder / "gw.toml", {
        "gateway": {"data_dir": str(folder / "data"), "log_level": "WARNING",
                    "adapter_modules": ["hook_kit"]},
        "state": {"redis_url": redis_url, "namespace": namespace},
        "policy": {"pair_budget_messages": 1_000_000},
        "permissions": {"operators": ["role:web:operator"]},
        # Six attempts: the failing destination's Retry-After spreads them over 40 s (it
        # recovers before the fifth); the broken one, without a hint, spends them in 2 s.
        "outbox": {"max_attempts": 6, "backoff_base_seconds": 0.1,
                   "backoff_max_seconds": 0.5},
        "agents": {
            "Lotbot": {"addresses": ["web:Lotbot"], "identities": ["web:Lotbot"]},
            "Mantis": {"addresses": ["hook:room-a"]},
            "Nemo": {"addresses": ["hook:room-b"]},
        },
        "transports": {
            "web": {"kind": "http", "port": port, "tokens": {"Lotbot": TOKENS["Lotbot"]},
                    "operator_tokens": {"op": TOKENS["op"]}},
            "hook": {"kind": "hook", "url": hook_url},
        },
    })


async def _command(http: aiohttp.ClientSession, base: str, *args: str) -> dict[str, Any]:
    async with http.post(f"{base}/v1/commands", json={"command": args[0], "args": args[1:]},
                         headers=bearer(TOKENS["op"])) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


def _field(result: dict[str, Any], name: str) -> str:
    return str({f["name"]: f["value"] for f in result["fields"]}[name])


async def test_destination_down_30s_then_back_and_one_never_back(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    platform = Platform()
    app = web.Application()
    app.router.add_post("/deliver", platform.deliver)
    runner = web.AppRunner(app)
    await runner.setup()
    hook_port, port = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()
    base = f"http://127.0.0.1:{port}"
    config = _config(tmp_path, redis_url, namespace, port, f"http://127.0.0.1:{hook_port}")
    try:
        async with aiohttp.ClientSession() as http:
            gw = await GatewayProcess(config, base).start()
            try:
                await _scenario(http, base, platform)
            finally:
                await gw.stop()
    finally:
        await runner.cleanup()


async def _scenario(http: aiohttp.ClientSession, base: str, platform: Platform) -> None:
    poster = Poster(http)
    platform.down_until = time.monotonic() + OUTAGE_SECONDS
    never = [build_request(sender="Lotbot", to="Nemo", task=f"n{i}") for i in range(NEVER)]
    for req in never:
        assert await poster.post(base, TOKENS["Lotbot"], req)
    sent: list[str] = []
    warned = 0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < STREAM_SECONDS:
        req = build_request(sender="Lotbot", to="Mantis", task=f"m{len(sent)}")
        async with http.post(f"{base}/v1/messages", json={"text": render(req)},
                             headers=bearer(TOKENS["Lotbot"])) as resp:
            body = await resp.json()
            assert resp.status == 200 and body["outcome"] == "accepted", body
        sent.append(req.request_id)
        if any(w["code"] == "unavailable" for w in body["warnings"]):
            warned += 1  # the sender is told the destination is failing
        await asyncio.sleep(max(0.0, len(sent) / RATE - elapsed))
    assert warned > 0
    assert platform.refused["room-a"] >= 3, platform.refused

    # The destination that never recovered: dead-lettered, counted, the sender told.
    status = await _command(http, base, "status")
    assert _field(status, "dead letters") == f"hook:room-b: {NEVER}", status
    async with http.get(f"{base}/metrics", headers=bearer(TOKENS["op"])) as resp:
        metrics = await resp.text()
    assert any(line.startswith("bpgw_outbox_dead_letters{") and "room-b" in line
               and line.endswith(f" {NEVER:.1f}") for line in metrics.splitlines()), metrics
    assert platform.refused["room-b"] == 6 * NEVER  # max_attempts each, then no more

    # The one that recovered: everything, in the order sent, once each.
    async with asyncio.timeout(60):
        while len(platform.delivered["room-a"]) < len(sent):  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # a double would show up now
    got = platform.delivered["room-a"]
    assert [d["request_id"] for d in got] == sent
    assert len({d["id"] for d in got}) == len(got)  # one outbox id, one delivery

    # Re-sent by an operator once the platform works again: delivered once each.
    platform.broken = False
    retried = await _command(http, base, "outbox", "retry", "all")
    assert retried["ok"] and retried["title"].startswith(f"{NEVER} "), retried
    async with asyncio.timeout(30):
        while len(platform.delivered["room-b"]) < NEVER:  # noqa: ASYNC110 - another process
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    assert sorted(d["request_id"] for d in platform.delivered["room-b"]) == sorted(
        r.request_id for r in never)
    assert _field(await _command(http, base, "status"), "dead letters") == "none"
    lotbot = InboxReader(http, "Lotbot", TOKENS["Lotbot"])
    await lotbot.read_until([base], NEVER, within=10)
    told = Counter(m["request_id"] for m in lotbot.messages if "dead-lettered" in m["text"])
    assert told == Counter(r.request_id for r in never)

"""Helpers for the AINET bridge's end-to-end tests: a real gateway on real Redis with the
``ainet`` transport on a temporary folder and the HTTP transport as the chat side (Lotbot
holds an HTTP token), plus the plain AINET agent of ``ainet_peer`` on the same folder."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from adapters.ainet import AinetAdapter
from adapters.ainet.watch import Watcher
from gateway.app import Gateway
from gateway.config import GatewayConfig
from protocol import Message, parse, render

from gwkit import HttpAgent, http_url, make_config, running

ME = "Device-bridgeAB12/网关"
PEER = "Device-ABC123/智能体A"
TOKEN = "tok-lotbot-ainet-1"
T = TypeVar("T")


def bridge_config(redis_url: str, namespace: str, tmp_path: Path,
                  **ainet: Any) -> GatewayConfig:
    """Lotbot on HTTP transport ``web``; the AINET folder ``tmp_path/shared`` on ``ainet``."""
    options: dict[str, Any] = {
        "kind": "ainet", "workspace": str(tmp_path / "shared"), "create_workspace": True,
        "state_dir": str(tmp_path / "bridge-state"), "agent_id": ME, "discovery": "poll",
        "poll_interval_seconds": 0.05, "settle_seconds": 0.0, "agents": {PEER: ""},
    }
    options.update(ainet)
    return make_config(
        redis_url, namespace, tmp_path,
        agents={"Lotbot": {"addresses": ["web:Lotbot"], "identities": ["web:Lotbot"]}},
        transports={"web": {"kind": "http", "port": 0, "tokens": {"Lotbot": TOKEN}},
                    "ainet": options},
    )


def bridge(gateway: Gateway) -> AinetAdapter:
    """The gateway's ``ainet`` transport."""
    adapter = gateway.adapters["ainet"]
    assert isinstance(adapter, AinetAdapter)
    return adapter


async def eventually(probe: Callable[[], T | None], within: float = 10.0) -> T:
    """Wait until ``probe()`` returns something truthy (files appear asynchronously)."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing after {within}s from {probe}")
        await asyncio.sleep(0.02)


async def ingested(gateway: Gateway, rel: str, within: float = 10.0) -> None:
    """Wait until the bridge recorded workspace file ``rel`` as handled."""
    inbox = bridge(gateway)._inbox
    assert inbox is not None
    deadline = time.monotonic() + within
    while (await inbox.ledger.lookup([rel]))[0] is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{rel} was not ingested within {within}s")
        await asyncio.sleep(0.02)


async def watch_is_live(watcher: Watcher, root: Path, within: float = 30.0) -> None:
    """Wait until ``watcher`` reports events: the OS watch is set up in the background
    after ``start`` returns (slowly on a loaded machine), and a file written before that
    brings no event. Rewrites ``root/watch-probe``, a file no inbox looks at."""
    seen = asyncio.Event()
    report = watcher.on_paths

    def on_paths(paths: Iterable[str]) -> None:
        seen.set()
        report(paths)

    watcher.on_paths = on_paths
    probe = root / "watch-probe"
    try:
        async with asyncio.timeout(within):
            while not seen.is_set():
                probe.write_text(str(time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await seen.wait()
    finally:
        watcher.on_paths = report


class Chat(HttpAgent):
    """Lotbot on the HTTP API: posts blocks, reads its inbox."""

    def __init__(self, gateway: Gateway, http: aiohttp.ClientSession) -> None:
        super().__init__(http_url(gateway, "web"), "Lotbot", TOKEN, http)

    async def post(self, msg: Message) -> dict[str, Any]:
        body = await self.post_text(render(msg))
        assert body["outcome"] == "accepted", body
        return body

    async def receive(self, wait: float = 10.0) -> list[Message]:
        """The next protocol messages in Lotbot's inbox (acknowledging the previous ones)."""
        return [m for text in await self.take(wait) for m in parse(text).messages]

    async def one(self) -> Message:
        got = await self.receive()
        assert len(got) == 1, got
        return got[0]


@asynccontextmanager
async def chat_and_bridge(config: GatewayConfig) -> AsyncIterator[tuple[Gateway, Chat]]:
    """A running gateway with the bridge, and Lotbot's HTTP client on it."""
    async with running(config) as gateway, aiohttp.ClientSession() as http:
        yield gateway, Chat(gateway, http)

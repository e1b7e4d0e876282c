"""Contract harness of the ``http`` transport: agent ``Peer`` holds a token; its channel is
its inbox, read (and acknowledged) through the real HTTP API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from adapters.base import Address, Outbound, OutboundKind
from adapters.http import HttpAdapter
from gateway.app import Gateway

from contract_harness import TRANSPORT, Harness, Posted, register_harness

PEER_TOKEN = "peer-token-contract"
INBOX_MAX = 50


class HttpHarness:
    """Drives the HTTP API as agent ``Peer``."""

    kind = "http"
    channel = "Peer"
    peer = "Peer"
    max_length = None
    echoes_own_posts = False

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._url = ""
        self._adapter: HttpAdapter | None = None
        self._posted: list[Posted] = []

    def options(self) -> dict[str, Any]:
        return {"port": 0, "tokens": {"Peer": PEER_TOKEN}, "inbox_max": INBOX_MAX}

    def peer_agent(self) -> dict[str, Any]:
        return {}  # the token makes Peer an agent with identity and inbox t:Peer

    async def connected(self, gateway: Gateway) -> None:
        adapter = gateway.adapters[TRANSPORT]
        assert isinstance(adapter, HttpAdapter)
        self._adapter = adapter
        self._url = adapter.url

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {PEER_TOKEN}"}

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        assert not files, "the HTTP API carries text only"
        async with self._session.post(
            f"{self._url}/v1/messages", json={"text": text}, headers=self._auth()
        ) as resp:
            assert resp.status in (200, 422), await resp.text()

    async def posted(self) -> list[Posted]:
        async with self._session.get(
            f"{self._url}/v1/agents/Peer/inbox?max=1000", headers=self._auth()
        ) as resp:
            messages = (await resp.json())["messages"]
        if messages:
            async with self._session.post(
                f"{self._url}/v1/agents/Peer/inbox/ack",
                json={"id": messages[-1]["id"]},
                headers=self._auth(),
            ) as resp:
                assert resp.status == 200
        self._posted.extend(Posted(m["text"]) for m in messages)
        return list(self._posted)

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        assert self._adapter is not None
        # A full inbox refuses delivery: fill it to inbox_max.
        for n in range(INBOX_MAX):
            await self._adapter.send(
                Outbound(Address(TRANSPORT, "Peer"), f"filler {n}", kind=OutboundKind.NOTICE)
            )
        return "inbox_full", 1.0


@register_harness("http")
@asynccontextmanager
async def http_harness() -> AsyncIterator[Harness]:
    """The HTTP transport needs no emulator: the harness is a real HTTP client."""
    async with aiohttp.ClientSession() as session:
        yield HttpHarness(session)

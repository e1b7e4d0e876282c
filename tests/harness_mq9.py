"""Contract harness of the ``mq9`` transport: agent ``Peer`` is a plain mq9 client
(tests/mq9wire.py) with a mailbox of its own, on a private nats-server answered by an mq9
service instance with a small mailbox bound (so a full mailbox is easy to reach)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mq9wire import Mq9Wire

from adapters.mq9 import ServiceSettings, start_service, stop_service
from gateway.app import Gateway

from contract_harness import Harness, Posted, register_harness
from servers import PrivateNats

MAILBOX_LIMIT = 20
REPLY_TO = "mq9-reply-to"


class Mq9Harness:
    """Drives the mq9 wire protocol as agent ``Peer``."""

    kind = "mq9"
    max_length = None
    echoes_own_posts = False  # the gateway SENDs to Peer's mailbox, never to its own

    def __init__(self, url: str, wire: Mq9Wire) -> None:
        self._url = url
        self._wire = wire
        suffix = uuid.uuid4().hex[:8]
        self.channel = self.peer = f"peer.{suffix}"
        self._gateway_box = f"gw.{suffix}"
        self._posted: list[Posted] = []

    def options(self) -> dict[str, Any]:
        return {"nats_url": self._url, "mailbox": self._gateway_box, "fetch_wait_ms": 100,
                "request_timeout_seconds": 2, "retry_seconds": 0.1}

    def peer_agent(self) -> dict[str, Any]:
        return {"addresses": [f"t:{self.channel}"], "identities": [f"t:{self.peer}"]}

    async def connected(self, gateway: Gateway) -> None:
        assert (await self._wire.create(self.channel, ttl=0))["error"] == ""

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        assert not files, "an mq9 message carries one payload"
        sent = await self._wire.send(self._gateway_box, text, **{REPLY_TO: self.peer})
        assert sent["error"] == "", sent

    async def posted(self) -> list[Posted]:
        reply = await self._wire.fetch(self.channel, group_name="peer",
                                       config={"num_msgs": 1000})
        messages = reply["messages"]
        if messages:
            assert (await self._wire.ack(self.channel, "peer",
                                         max(m["msg_id"] for m in messages)))["error"] == ""
        self._posted.extend(Posted(m["payload"]) for m in messages)
        return list(self._posted)

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        # Fill Peer's mailbox to the service's bound: SEND answers "mailbox X is full".
        while not (await self._wire.send(self.channel, "filler"))["error"]:
            pass
        return "inbox_full", 1.0


@register_harness("mq9")
@asynccontextmanager
async def mq9_harness() -> AsyncIterator[Harness]:
    """A private nats-server and service instance (the "platform"), and Peer's client."""
    server = PrivateNats().start()
    try:
        service = await start_service(
            server.url, ServiceSettings(max_messages_per_mailbox=MAILBOX_LIMIT))
        wire = await Mq9Wire.connect(server.url)
        try:
            yield Mq9Harness(server.url, wire)
        finally:
            await wire.close()
            await stop_service(service)
    finally:
        server.close()

"""A minimal mq9 agent, as any mq9 client would be: ``bpgw demo``'s mq9 participant.

It has a mailbox of its own, registers itself, SENDs protocol blocks to the gateway's
mailbox with ``mq9-reply-to`` naming its own (that mailbox is its identity at the
gateway), and FETCHes and ACKs its mailbox in a consumer group of its name. Nothing here
knows the gateway's code: only the mq9 wire protocol and the bot-protocol text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats

from adapters.mq9.acking import ack_plan
from adapters.mq9.client import REPLY_TO_HEADER, Mq9Client, Mq9Error, Mq9Unavailable
from protocol import Message, MessageType, parse, render

FETCH_BATCH = 10
CLOSE_SECONDS = 5.0


class Mq9Agent:
    """One agent on one NATS connection (``connect``, then ``post``/``receive``)."""

    via = "mq9"

    def __init__(self, name: str, client: Mq9Client, mailbox: str, gateway_mailbox: str) -> None:
        self.name = name
        self.client = client
        self.mailbox = mailbox
        self.gateway_mailbox = gateway_mailbox

    @classmethod
    async def connect(cls, url: str, name: str, mailbox: str, gateway_mailbox: str,
                      description: str = "") -> Mq9Agent:
        """Connect, create the mailbox (an existing one is reused) and REGISTER."""
        # Few, quick reconnect attempts: a demo fails fast rather than waiting minutes.
        client = Mq9Client(await nats.connect(url, connect_timeout=2, reconnect_time_wait=0.5,
                                              max_reconnect_attempts=5))
        try:
            await client.create_mailbox(mailbox, ttl=3600)
            await client.register({"name": name, "mailbox": mailbox,
                                   "payload": description or f"demo agent {name}"})
        except BaseException:
            await client.nc.close()
            raise
        return cls(name, client, mailbox, gateway_mailbox)

    async def close(self) -> None:
        """UNREGISTER and disconnect."""
        try:
            await self.client.unregister(self.name)
        except (Mq9Error, Mq9Unavailable):
            pass  # going anyway
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.client.nc.close(), CLOSE_SECONDS)

    async def post(self, msg: Message) -> None:
        """SEND one block to the gateway's mailbox, answers to come to ours."""
        await self.client.send(self.gateway_mailbox, render(msg).encode(),
                               {REPLY_TO_HEADER: self.mailbox})

    async def receive(self, want: MessageType, wait_seconds: float = 10.0) -> Message | None:
        """The next protocol message of type ``want`` (None after ``wait_seconds``);
        every message fetched on the way is acknowledged."""
        deadline = time.monotonic() + wait_seconds
        while (left := deadline - time.monotonic()) > 0:
            batch = await self.client.fetch(self.mailbox, self.name, FETCH_BATCH,
                                            max_wait_ms=int(min(left, 5.0) * 1000))
            found: Message | None = None
            for item in batch:
                for msg in parse(item.payload).messages:
                    if found is None and msg.type is want:
                        found = msg
            everything = {item.msg_id for item in batch}
            for msg_id in ack_plan(batch, everything, full=len(batch) >= FETCH_BATCH):
                await self.client.ack(self.mailbox, self.name, msg_id)
            if found is not None:
                return found
        return None

"""A bare mq9 wire client for the conformance tests: JSON over NATS request/reply.

It knows only the protocol (subjects, headers, JSON bodies), nothing of the service's code,
so the same tests could run against any mq9 broker.
"""

from __future__ import annotations

import json
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client

API = "$mq9.AI."


class Mq9Wire:
    """Requests on ``$mq9.AI.*``; every method returns the decoded JSON reply."""

    def __init__(self, nc: Client, timeout: float = 5.0) -> None:
        self.nc = nc
        self.timeout = timeout

    @classmethod
    async def connect(cls, url: str) -> Mq9Wire:
        return cls(await nats.connect(url))

    async def close(self) -> None:
        await self.nc.close()

    async def raw(self, subject: str, body: bytes | dict[str, Any] | list[Any] = b"",
                  headers: dict[str, str] | None = None,
                  wait: float | None = None) -> dict[str, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        msg = await self.nc.request(API + subject, data, headers=headers,
                                    timeout=wait or self.timeout)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def create(self, name: str | None = None, **fields: Any) -> dict[str, Any]:
        body = dict(fields)
        if name is not None:
            body["name"] = name
        return await self.raw("MAILBOX.CREATE", body)

    async def send(self, address: str, payload: bytes | str, **headers: str) -> dict[str, Any]:
        data = payload.encode() if isinstance(payload, str) else payload
        wire_headers = {k.replace("_", "-"): v for k, v in headers.items()}
        return await self.raw(f"MSG.SEND.{address}", data, headers=wire_headers or None)

    async def fetch(self, address: str, **body: Any) -> dict[str, Any]:
        body.setdefault("config", {})
        body["config"].setdefault("max_wait_ms", 0)
        return await self.raw(f"MSG.FETCH.{address}", body)

    async def ack(self, address: str, group: str, msg_id: int) -> dict[str, Any]:
        return await self.raw(f"MSG.ACK.{address}",
                              {"group_name": group, "mail_address": address, "msg_id": msg_id})

    async def query(self, address: str, **body: Any) -> dict[str, Any]:
        return await self.raw(f"MSG.QUERY.{address}", body)

    async def delete(self, address: str, msg_id: int | str) -> dict[str, Any]:
        return await self.raw(f"MSG.DELETE.{address}.{msg_id}")

    async def no_reply(self, subject: str, body: bytes = b"{}", wait: float = 0.4) -> bool:
        """True when nothing answers ``subject`` within ``wait`` seconds."""
        try:
            await self.nc.request(API + subject, body, timeout=wait)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return True
        return False


def ids(reply: dict[str, Any]) -> list[int]:
    """The msg_ids of a FETCH or QUERY reply, in reply order."""
    assert reply["error"] == "", reply
    return [m["msg_id"] for m in reply["messages"]]


def payloads(reply: dict[str, Any]) -> list[str]:
    """The payloads of a FETCH or QUERY reply, in reply order."""
    assert reply["error"] == "", reply
    return [m["payload"] for m in reply["messages"]]

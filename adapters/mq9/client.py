"""A small mq9 client: the ``$mq9.AI.*`` requests as methods, over any NATS connection.

It speaks only the wire protocol (subjects, headers, JSON bodies), so it works against
any mq9 broker: the RobustMQ broker or the bpgw service. The bridge and the demo's mq9
agent use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client

from adapters.mq9.connection import ReplyInbox

API = "$mq9.AI."
# NATS header names the bridge and its agents use beyond the protocol's own.
REPLY_TO_HEADER = "mq9-reply-to"  # the sender's own mailbox: where answers go
MESSAGE_ID_HEADER = "bpgw-id"  # the gateway's stable id of a relayed message
NO_RESPONDERS = "503"  # the status of the server's answer when no one listens


class Mq9Error(Exception):
    """The broker answered with an error (``text`` is its ``error`` field)."""

    def __init__(self, subject: str, text: str) -> None:
        super().__init__(f"{subject}: {text}")
        self.text = text


class Mq9Unavailable(Exception):
    """No answer: no broker/service listens, the request timed out, or NATS is down."""


@dataclass(frozen=True)
class Fetched:
    """One message of a FETCH reply."""

    msg_id: int
    payload: str
    priority: str
    header: dict[str, str]
    create_time: int

    @classmethod
    def from_json(cls, item: Any) -> Fetched:
        """Parse one reply item; ValueError when it is not a message."""
        if not isinstance(item, dict):
            raise ValueError("a FETCH message must be a JSON object")
        msg_id, payload = item.get("msg_id"), item.get("payload")
        if not isinstance(msg_id, int) or isinstance(msg_id, bool) or msg_id < 0:
            raise ValueError(f"bad msg_id {msg_id!r}")
        if not isinstance(payload, str):
            raise ValueError(f"message {msg_id}: payload is not text")
        raw_header = item.get("header") or {}
        header = ({str(k): str(v) for k, v in raw_header.items()}
                  if isinstance(raw_header, dict) else {})
        create_time = item.get("create_time")
        return cls(msg_id, payload, str(item.get("priority") or "normal"), header,
                   create_time if isinstance(create_time, int) else 0)


class Mq9Client:
    """mq9 requests on one NATS connection; every method raises ``Mq9Error`` on an error
    reply and ``Mq9Unavailable`` when nothing answers within ``timeout`` seconds.

    Answers come to one reply inbox of the client's own (``ReplyInbox``).
    """

    def __init__(self, nc: Client, timeout: float = 5.0) -> None:
        self.nc = nc
        self.timeout = timeout
        self._replies = ReplyInbox(nc)

    async def request(self, subject: str, body: bytes | dict[str, Any] = b"", *,
                      headers: dict[str, str] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """One request on ``$mq9.AI.<subject>``; the decoded reply (error checked)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            msg = await self._replies.request(API + subject, data, headers,
                                              timeout or self.timeout)
        except TimeoutError:
            raise Mq9Unavailable(f"{subject}: no answer (TimeoutError)") from None
        except nats.errors.Error as exc:
            raise Mq9Unavailable(f"{subject}: {exc}") from None
        if (msg.headers or {}).get("Status") == NO_RESPONDERS:
            raise Mq9Unavailable(f"{subject}: no answer (NoRespondersError)")
        try:
            reply = json.loads(msg.data)
        except (ValueError, UnicodeDecodeError):
            raise Mq9Error(subject, "reply is not JSON") from None
        if not isinstance(reply, dict):
            raise Mq9Error(subject, "reply is not a JSON object")
        error = reply.get("error")
        if error:
            raise Mq9Error(subject, str(error))
        return reply

    async def create_mailbox(self, name: str, ttl: int, desc: str = "") -> bool:
        """Create mailbox ``name``; False when it already exists (it is reused)."""
        body: dict[str, Any] = {"name": name, "ttl": ttl}
        if desc:
            body["desc"] = desc
        try:
            await self.request("MAILBOX.CREATE", body)
        except Mq9Error as exc:
            if exc.text == f"mailbox {name} already exists":
                return False
            raise
        return True

    async def send(self, address: str, payload: bytes,
                   headers: dict[str, str] | None = None) -> int:
        """SEND ``payload`` to ``address``; its msg_id (-1 when delayed)."""
        reply = await self.request(f"MSG.SEND.{address}", payload, headers=headers or None)
        msg_id = reply.get("msg_id")
        return msg_id if isinstance(msg_id, int) else -1

    async def fetch(self, address: str, group: str, num_msgs: int,
                    max_wait_ms: int, *, from_id: int | None = None) -> list[Fetched]:
        """A stateful FETCH in consumer group ``group`` (waits up to ``max_wait_ms``);
        with ``from_id``, from that msg_id on whatever the group acknowledged
        (``force_deliver``: the group's offsets are neither read nor moved)."""
        body: dict[str, Any] = {"group_name": group, "deliver": "earliest",
                                "config": {"num_msgs": num_msgs, "max_wait_ms": max_wait_ms}}
        if from_id is not None:
            body.update(deliver="from_id", from_id=from_id, force_deliver=True)
        reply = await self.request(f"MSG.FETCH.{address}", body,
                                   timeout=self.timeout + max_wait_ms / 1000)
        items = reply.get("messages")
        if not isinstance(items, list):
            raise Mq9Error(f"MSG.FETCH.{address}", "reply has no messages list")
        return [Fetched.from_json(item) for item in items]

    async def ack(self, address: str, group: str, msg_id: int) -> None:
        """ACK ``msg_id`` for ``group``."""
        await self.request(f"MSG.ACK.{address}",
                           {"group_name": group, "mail_address": address, "msg_id": msg_id})

    async def register(self, card: dict[str, Any]) -> None:
        """REGISTER an agent card (needs ``name``)."""
        await self.request("AGENT.REGISTER", card)

    async def report(self, name: str, info: Any) -> None:
        """REPORT a heartbeat for agent ``name``."""
        await self.request("AGENT.REPORT", {"name": name, "report_info": info})

    async def unregister(self, name: str) -> None:
        """UNREGISTER agent ``name``."""
        await self.request("AGENT.UNREGISTER", {"name": name})

    async def discover(self, text: str, *, limit: int = 100, page: int = 1
                       ) -> list[dict[str, Any]]:
        """One page of a DISCOVER text search."""
        reply = await self.request("AGENT.DISCOVER",
                                   {"text": text, "limit": limit, "page": page})
        agents = reply.get("agents")
        return [a for a in agents if isinstance(a, dict)] if isinstance(agents, list) else []

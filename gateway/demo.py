"""``bpgw demo``: a gateway and three scripted agents talking through it.

Lotbot asks Mantis for a disk check (REQUEST), Mantis asks which host (CLARIFY), Lotbot
answers (RESPONSE), Mantis hands the job to SecurityBot (HANDOFF), SecurityBot answers
Lotbot (RESPONSE done). Agents post blocks and read their inboxes exactly as real agents
would: over the HTTP API, or (SecurityBot, ``gateway/demo_mq9.py``) as an mq9 client, who
first consults an AINET agent (``gateway/demo_ainet.py``); the conversation is then printed
as the gateway tracked it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from gateway.demo_ainet import FileAgent, consult
from protocol import (
    Message,
    MessageType,
    answer_clarify,
    build_request,
    parse,
    render,
    reply_clarify,
    reply_handoff,
    reply_response,
)


class DemoError(RuntimeError):
    """The scripted conversation did not go as planned."""


@dataclass
class HttpAgent:
    """A minimal agent: posts protocol blocks and long-polls its inbox."""

    name: str
    token: str
    base_url: str
    session: aiohttp.ClientSession
    # The id of the last inbox message read, acknowledged with the next poll.
    last_read: str | None = None
    via: str = "http"

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def post(self, msg: Message) -> dict[str, Any]:
        """Post one block; raise DemoError unless the gateway accepted it."""
        async with self.session.post(
            f"{self.base_url}/v1/messages", json={"text": render(msg)}, headers=self._headers
        ) as resp:
            body: dict[str, Any] = await resp.json()
        if body.get("outcome") != "accepted":
            raise DemoError(f"{self.name}'s {msg.type} was not accepted: {body}")
        return body

    async def receive(self, want: MessageType, wait_seconds: float = 10.0) -> Message:
        """Wait for the next protocol message of type ``want`` in this agent's inbox."""
        params = {"wait": str(wait_seconds), "max": "1"}
        if self.last_read:
            params["ack"] = self.last_read
        async with self.session.get(
            f"{self.base_url}/v1/agents/{self.name}/inbox", params=params, headers=self._headers
        ) as resp:
            body = await resp.json()
        for item in body.get("messages", []):
            self.last_read = item["id"]
            for msg in parse(item["text"]).messages:
                if msg.type is want:
                    return msg
        raise DemoError(f"{self.name} waited {wait_seconds}s for a {want} and got {body}")


class DemoAgent(Protocol):
    """A scripted participant on any transport (``via`` names it)."""

    name: str
    via: str

    async def post(self, msg: Message) -> object:
        """Send one block to the gateway."""

    async def receive(self, want: MessageType, wait_seconds: float = 10.0) -> Message | None:
        """The next message of type ``want``; None (or DemoError) when none came."""


async def run_demo(
    base_url: str,
    tokens: dict[str, str],
    operator_token: str,
    say: Callable[[str], None],
    others: Mapping[str, DemoAgent] | None = None,
    auditor: FileAgent | None = None,
) -> dict[str, Any]:
    """Play the scripted conversation; return the conversation as the gateway tracked it.

    ``others`` replaces HTTP participants by name with agents on other transports. With
    ``auditor`` (a plain AINET agent on the gateway's AINET workspace), SecurityBot
    consults it before answering (``gateway/demo_ainet.py``).
    """
    async with aiohttp.ClientSession() as session:
        lot, man, sec = (
            (others or {}).get(n) or HttpAgent(n, tokens[n], base_url, session)
            for n in ("Lotbot", "Mantis", "SecurityBot")
        )

        async def hop(sender: DemoAgent, msg: Message, receiver: DemoAgent) -> Message:
            """``sender`` posts ``msg``; ``receiver`` reads it from its inbox."""
            await sender.post(msg)
            say(
                f"{sender.name:>11} -> {receiver.name:<11} {msg.type:<8} depth {msg.depth}"
                f"  ({sender.via} -> {receiver.via})"
            )
            got = await receiver.receive(msg.type)
            if got is None:
                raise DemoError(f"{receiver.name} waited for a {msg.type} in vain")
            return got

        request = build_request(
            sender="Lotbot",
            to="Mantis",
            task="Check disk usage and report anything over 80%",
            context="nightly audit",
        )
        say(f"RequestId {request.request_id}")
        got = await hop(lot, request, man)
        got = await hop(
            man,
            reply_clarify(got, sender="Mantis", question="Which host: build-01 or build-02?"),
            lot,
        )
        got = await hop(lot, answer_clarify(got, sender="Lotbot", result="build-01, please."), man)
        handoff = reply_handoff(
            got,
            sender="Mantis",
            to="SecurityBot",
            task="Check disk usage on build-01 and report anything over 80%",
            reason="SecurityBot has shell access to build-01",
        )
        got = await hop(man, handoff, sec)
        if auditor is not None:  # SecurityBot checks with the AINET agent first
            await consult(sec, got, auditor, say)
        # The new holder answers the original requester directly.
        done = reply_response(
            got, sender="SecurityBot", status="done", result="/var is at 91%; everything else < 60%"
        ).model_copy(update={"to": "Lotbot"})
        final = await hop(sec, done, lot)
        say(f"Lotbot received: {getattr(final, 'result', None)}")
        async with session.get(
            f"{base_url}/v1/conversations/{request.request_id}",
            headers={"Authorization": f"Bearer {operator_token}"},
        ) as resp:
            conv: dict[str, Any] = await resp.json()
    if conv.get("status") != "done":
        raise DemoError(f"conversation ended as {conv.get('status')}: {json.dumps(conv)}")
    return conv

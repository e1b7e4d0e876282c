"""Shared fixtures and message builders of the state tests (no tests of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from protocol.models import Broadcast, Clarify, Depth, Handoff, Request, Response, Status
from state.records import Origin
from state.settings import StateSettings
from state.store import ConversationStore

ORIGIN = Origin(transport="discord", channel="c-1", thread="t-1", native_id="n-1")
T0 = 1_700_000_000.0


def d(current: int, maximum: int = 5) -> Depth:
    return Depth(current=current, max=maximum)


def request(rid: str, sender: str = "Lotbot", to: str = "Mantis", task: str = "count the lots",
            depth: int = 1, **kw: Any) -> Request:
    return Request(request_id=rid, sender=sender, to=to, task=task, depth=d(depth), **kw)


def clarify(rid: str, sender: str = "Mantis", to: str = "Lotbot", depth: int = 2,
            question: str = "which site?") -> Clarify:
    return Clarify(request_id=rid, sender=sender, to=to, question=question, depth=d(depth))


def response(rid: str, sender: str = "Mantis", to: str = "Lotbot", depth: int = 2,
             status: Status | None = Status.DONE, result: str | None = "42 lots") -> Response:
    return Response(request_id=rid, sender=sender, to=to, status=status, result=result,
                    depth=d(depth))


def handoff(rid: str, sender: str = "Mantis", to: str = "Heron", depth: int = 2,
            task: str = "count the lots in B") -> Handoff:
    return Handoff(request_id=rid, sender=sender, to=to, task=task, depth=d(depth))


def broadcast(rid: str, sender: str = "Ops", message: str = "deploy at noon") -> Broadcast:
    return Broadcast(request_id=rid, sender=sender, to="all", message=message)


async def drop_namespace(client: aioredis.Redis, namespace: str) -> None:
    """Delete every key of a test namespace (they all start with ``{namespace}``)."""
    async for key in client.scan_iter(match="{" + namespace + "}*", count=1000):
        await client.delete(key)


@pytest.fixture
async def store(redis_url: str, namespace: str) -> AsyncIterator[ConversationStore]:
    """A store on the session's real server, in this test's own namespace."""
    client: aioredis.Redis = aioredis.from_url(redis_url, decode_responses=True)
    try:
        yield ConversationStore(client, StateSettings(namespace=namespace))
    finally:
        await drop_namespace(client, namespace)
        await client.aclose()

"""Catch-up cursors: the last committed native id per (transport, channel), in Redis.

A chat transport that reconnects asks its platform for what came after its cursor; the
cursor only moves once the gateway committed a message (``Envelope.on_commit`` /
``CommitWindow`` in adapters/base.py), so a crash never skips a message. Every replica
shares the cursors, so whichever runs the transport next continues from the same place.

One hash per transport (``<namespace>:cur:{<transport>}``, channel -> cursor), hash
tagged per transport so a cluster spreads transports over shards. ``advance`` is one
EVALSHA: a monotonic compare-and-set (an older id never moves a cursor back), bounded to
``max_channels`` channels per transport.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import redis.asyncio as aioredis

from state.keys import tagged_key

MAX_CHANNELS = 10_000
"""Default bound on channels with a cursor, per transport."""
MAX_ID_BYTES = 512
"""Longest channel name or native id a cursor keeps (platform ids are far shorter)."""
_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?")
_SCRIPT = (Path(__file__).parent / "lua" / "cursor.lua").read_text()


class CursorLimitError(OverflowError):
    """A transport already keeps cursors for as many channels as it may."""


def order_key(native_id: str) -> str:
    """A string whose byte order is the order of native ids.

    Decimal ids (``1234``, snowflakes beyond 2**53, Slack's ``1700000000.000100``)
    compare as numbers: the integer part's length comes first. Others compare byte-wise.
    """
    match = _DECIMAL.fullmatch(native_id)
    if match is None:
        return "s" + native_id
    whole = match[1].lstrip("0") or "0"
    fraction = f".{match[2]}" if match[2] else ""
    return f"n{len(whole):04d}{whole}{fraction}"


def _check(what: str, value: str) -> None:
    if not value or len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ValueError(f"cursor {what} must be 1 to {MAX_ID_BYTES} bytes")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class TransportCursors:
    """The cursors of one transport (implements ``adapters.base.Cursors``)."""

    def __init__(self, store: CursorStore, transport: str) -> None:
        self._store = store
        self.transport = transport
        self._key = tagged_key(store.namespace, "cur", transport)

    async def get(self, channel: str) -> str | None:
        """The channel's cursor, or None."""
        stored = await self._store.redis.hget(self._key, channel)
        return None if stored is None else str(json.loads(stored)[1])

    async def advance(self, channel: str, native_id: str) -> bool:
        """Move the cursor to ``native_id`` if it is newer; True when it moved."""
        _check("channel", channel)
        _check("native id", native_id)
        moved = int(
            await self._store.script(
                keys=[self._key],
                args=[channel, order_key(native_id), native_id, self._store.max_channels],
            )
        )
        if moved < 0:
            raise CursorLimitError(
                f"transport {self.transport} already keeps cursors for "
                f"{self._store.max_channels} channels; forget() channels it left"
            )
        return moved == 1

    async def all(self) -> dict[str, str]:
        """Every channel's cursor (bounded by ``max_channels``)."""
        stored = await self._store.redis.hgetall(self._key)
        return {_text(ch): str(json.loads(v)[1]) for ch, v in stored.items()}

    async def forget(self, channel: str) -> None:
        """Drop a channel's cursor."""
        await self._store.redis.hdel(self._key, channel)


class CursorStore:
    """Cursors of every transport in one namespace."""

    def __init__(
        self, redis: aioredis.Redis, namespace: str, *, max_channels: int = MAX_CHANNELS
    ) -> None:
        self.redis = redis
        self.namespace = namespace
        self.max_channels = max_channels
        self.script = redis.register_script(_SCRIPT)

    def for_transport(self, transport: str) -> TransportCursors:
        """The cursors of ``transport``."""
        return TransportCursors(self, transport)

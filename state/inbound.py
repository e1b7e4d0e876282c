"""Inbound claims: each native message is processed by one replica, once.

Several replicas may see the same native message (each connected to a channel, or a
platform redelivering after a crash). Before the pipeline, the gateway claims
(transport, channel, native id) with ``SET key p NX GET PX <processing>``: one command
that both takes a free claim and reads a taken one. After the pipeline the claim becomes
``d`` (done) for ``done_seconds``; if the pipeline failed it is released, so a redelivery
is processed. A replica that dies mid-message leaves a ``p`` claim that expires after
``processing_seconds``, after which a redelivery is processed (the state store's
fingerprints keep that replay from applying twice).

Keys: ``<namespace>:in:{<transport>}:<channel length>:<channel>:<native id>`` (a digest
when long), hash tagged per transport.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum

import redis.asyncio as aioredis

from state.keys import tagged_key

MAX_KEY_TAIL = 200
"""Longest channel+id part kept verbatim in a claim key; longer ones become a digest."""


class Claim(StrEnum):
    """What claiming a native message found."""

    NEW = "new"  # ours to process
    BUSY = "busy"  # another replica is processing it right now
    DONE = "done"  # already processed


_PROCESSING = "p"
_DONE = "d"


class InboundClaims:
    """Claims on inbound native messages, shared by every replica."""

    def __init__(
        self,
        redis: aioredis.Redis,
        namespace: str,
        *,
        processing_seconds: float,
        done_seconds: float,
    ) -> None:
        self._redis = redis
        self._namespace = namespace
        self._processing_ms = max(1, int(processing_seconds * 1000))
        self._done_ms = max(1, int(done_seconds * 1000))

    def key(self, transport: str, channel: str, native_id: str) -> str:
        """The claim key of one native message."""
        prefix = tagged_key(self._namespace, "in", transport)
        tail = f"{len(channel)}:{channel}:{native_id}"
        if len(tail) > MAX_KEY_TAIL:
            tail = "h" + hashlib.sha256(tail.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{prefix}:{tail}"

    async def claim_many(self, keys: Sequence[str]) -> list[Claim]:
        """Try to take every claim of ``keys``, in one round trip."""
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, _PROCESSING, nx=True, get=True, px=self._processing_ms)
            return [_claim(found) for found in await pipe.execute()]

    async def settle(self, done: Sequence[str], failed: Sequence[str]) -> None:
        """The messages of ``done`` were processed: remember them for ``done_seconds``;
        processing ``failed`` failed: let a redelivery have them. One round trip."""
        if not done and not failed:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in done:
                pipe.set(key, _DONE, px=self._done_ms)
            for key in failed:
                pipe.delete(key)
            await pipe.execute()


def _claim(found: object) -> Claim:
    """What a ``SET NX GET`` of a claim answered."""
    if found is None:
        return Claim.NEW
    if isinstance(found, bytes):
        found = found.decode()
    return Claim.BUSY if found == _PROCESSING else Claim.DONE

"""Leases in Redis: one holder at a time per name, with a fencing epoch.

A transport that allows one connection per credential runs on the replica holding its
lease (gateway/leases.py). The lease is a string ``<epoch>:<holder>`` that expires unless
renewed; each new holder gets a larger epoch (an INCR on a counter next to it), so a
holder that was paused and lost the lease can tell, and anything it writes with its
epoch can be refused. Keys ``<namespace>:lease:{<name>}`` and ``...:epoch``, hash tagged
per name so both sit on one cluster slot and one script touches only that slot.
"""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from state.keys import tagged_key

_SCRIPT = (Path(__file__).parent / "lua" / "lease.lua").read_text()


class Lease:
    """The lease ``name`` as seen by ``holder``."""

    def __init__(
        self, redis: aioredis.Redis, namespace: str, name: str, holder: str, ttl_seconds: float
    ) -> None:
        self.name = name
        self.holder = holder
        self.ttl_seconds = ttl_seconds
        self._ttl_ms = max(1, int(ttl_seconds * 1000))
        key = tagged_key(namespace, "lease", name)
        self._keys = [key, f"{key}:epoch"]
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)

    async def acquire(self) -> int:
        """Take (or keep) the lease: its epoch, or 0 when another holder has it."""
        return int(await self._script(keys=self._keys, args=["acquire", self.holder, self._ttl_ms]))

    async def renew(self, epoch: int) -> bool:
        """Extend the lease held with ``epoch``; False when it was lost."""
        args: list[str | int] = ["renew", self.holder, self._ttl_ms, epoch]
        return int(await self._script(keys=self._keys, args=args)) == 1

    async def release(self, epoch: int) -> bool:
        """Give the lease up (another replica may take it at once); False if not ours."""
        args: list[str | int] = ["release", self.holder, self._ttl_ms, epoch]
        return int(await self._script(keys=self._keys, args=args)) == 1

    async def holder_now(self) -> str | None:
        """Who holds the lease right now (``<epoch>:<holder>``), or None."""
        value = await self._redis.get(self._keys[0])
        if isinstance(value, bytes):
            value = value.decode()
        return None if value is None else str(value)

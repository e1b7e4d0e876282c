"""What was ingested: a record of (path, content hash, size, mtime) per workspace file.

``IngestLedger`` is the interface the inbox uses; ``RedisIngestLedger`` keeps it on
Redis (the gateway's cursor store holds per-channel monotonic ids, which fit numbered
turns but not session files rewritten in place), so progress survives restarts: a file
is recorded only after the gateway committed it, a restart neither misses nor repeats
one, and a file whose size and mtime still match its record is skipped without being
read.

Keys live under the namespace, hash-tagged per transport (``{<ns>:ainet:<transport>}``),
so one transport's keys share a cluster slot. ``BoundedHash`` (a hash plus an age
index, oldest evicted first past ``max_entries``) backs the record and the adapter's
other small records (conversation folders, delivered messages, known peers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis

_RECORD = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local max = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], now, ARGV[i])
end
local over = redis.call('ZCARD', KEYS[2]) - max
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for j = 1, #old, 2 do redis.call('HDEL', KEYS[1], old[j]) end
  return over
end
return 0
"""
BATCH = 500


@dataclass(frozen=True)
class IngestRecord:
    """One ingested (or self-written) file: workspace-relative path, hash and stat."""

    path: str
    digest: str
    size: int
    mtime_ns: int

    def matches_stat(self, size: int, mtime_ns: int) -> bool:
        """True when the file still has the size and mtime it had when recorded."""
        return (self.size, self.mtime_ns) == (size, mtime_ns)


class IngestLedger(Protocol):
    """Where the inbox keeps what it has handled (to be served by the cursor store)."""

    async def lookup(self, paths: Sequence[str]) -> list[IngestRecord | None]:
        """The record of each path, None where there is none."""

    async def record(self, records: Sequence[IngestRecord]) -> None:
        """Remember ``records`` (after the gateway committed them)."""


def text_of(value: Any) -> str:
    """A Redis reply as text (the client may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def transport_tag(namespace: str, transport: str) -> str:
    """``{<namespace>:ainet:<transport>}``: the hash tag of one transport's keys."""
    for what, value in (("namespace", namespace), ("transport", transport)):
        if not value or "{" in value or "}" in value:
            raise ValueError(f"the {what} {value!r} can't be part of a hash tag")
    return "{" + f"{namespace}:ainet:{transport}" + "}"


class BoundedHash:
    """A Redis hash of at most ``max_entries`` fields, the least recently written dropped."""

    def __init__(self, client: aioredis.Redis, key: str, *, max_entries: int) -> None:
        self.key = key
        self.order_key = f"{key}:order"
        self.max_entries = max_entries
        self._client = client
        self._script = client.register_script(_RECORD)

    async def get_many(self, fields: Sequence[str]) -> list[str | None]:
        """The value of each field, None where there is none."""
        found: list[str | None] = []
        for start in range(0, len(fields), BATCH):
            chunk = list(fields[start:start + BATCH])
            raw = await self._client.hmget(self.key, chunk)
            found += [None if value is None else text_of(value) for value in raw]
        return found

    async def put(self, items: Sequence[tuple[str, str]]) -> None:
        """Set these fields; the oldest past ``max_entries`` are dropped."""
        for start in range(0, len(items), BATCH):
            args: list[str | int] = [self.max_entries]
            for field, value in items[start:start + BATCH]:
                args += [field, value]
            await self._script(keys=[self.key, self.order_key], args=args)

    async def count(self) -> int:
        """How many fields are kept."""
        return int(await self._client.hlen(self.key))


class RedisIngestLedger:
    """``IngestLedger`` on one Redis/Valkey database."""

    def __init__(self, client: aioredis.Redis, namespace: str, transport: str, *,
                 max_entries: int = 200_000) -> None:
        self._hash = BoundedHash(client, f"{transport_tag(namespace, transport)}:ingested",
                                 max_entries=max_entries)
        self.records_key = self._hash.key
        self.order_key = self._hash.order_key
        self.max_entries = max_entries

    async def lookup(self, paths: Sequence[str]) -> list[IngestRecord | None]:
        """The record of each path, None where there is none."""
        raw = await self._hash.get_many(paths)
        return [None if value is None else _parse(path, value)
                for path, value in zip(paths, raw, strict=True)]

    async def record(self, records: Sequence[IngestRecord]) -> None:
        """Remember ``records``; the oldest entries past ``max_entries`` are dropped."""
        await self._hash.put([(rec.path, f"{rec.digest} {rec.size} {rec.mtime_ns}")
                              for rec in records])

    async def count(self) -> int:
        """How many paths are recorded."""
        return await self._hash.count()


def _parse(path: str, value: str) -> IngestRecord | None:
    parts = value.split(" ")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return IngestRecord(path, parts[0], int(parts[1]), int(parts[2]))

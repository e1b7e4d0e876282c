"""What was ingested: a record of (path, content hash, size, mtime) per workspace file.

``IngestLedger`` is the interface the inbox uses; the gateway's cursor store will back
it once that lands. ``RedisIngestLedger`` implements it on Redis directly meanwhile, so
progress survives restarts: a file is recorded only after the gateway committed it,
a restart neither misses nor repeats one, and a file whose size and mtime still match
its record is skipped without being read.

Keys live under the namespace, hash-tagged per transport (``{<ns>:ainet:<transport>}``),
so one transport's keys share a cluster slot; the record is bounded to ``max_entries``
paths, oldest evicted first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis

_RECORD = """
local now, max = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisIngestLedger:
    """``IngestLedger`` on one Redis/Valkey database."""

    def __init__(self, client: aioredis.Redis, namespace: str, transport: str, *,
                 max_entries: int = 200_000) -> None:
        for what, value in (("namespace", namespace), ("transport", transport)):
            if not value or "{" in value or "}" in value:
                raise ValueError(f"the {what} {value!r} can't be part of a hash tag")
        tag = "{" + f"{namespace}:ainet:{transport}" + "}"
        self.records_key = f"{tag}:ingested"
        self.order_key = f"{tag}:order"
        self.max_entries = max_entries
        self._client = client
        self._script = client.register_script(_RECORD)

    async def lookup(self, paths: Sequence[str]) -> list[IngestRecord | None]:
        """The record of each path, None where there is none."""
        found: list[IngestRecord | None] = []
        for start in range(0, len(paths), BATCH):
            chunk = list(paths[start:start + BATCH])
            raw = await self._client.hmget(self.records_key, chunk)
            found += [None if value is None else _parse(path, _text(value))
                      for path, value in zip(chunk, raw, strict=True)]
        return found

    async def record(self, records: Sequence[IngestRecord]) -> None:
        """Remember ``records``; the oldest entries past ``max_entries`` are dropped."""
        now = await self._client.time()
        stamp = now[0] * 1000 + now[1] // 1000
        for start in range(0, len(records), BATCH):
            args: list[str | int] = [stamp, self.max_entries]
            for rec in records[start:start + BATCH]:
                args += [rec.path, f"{rec.digest} {rec.size} {rec.mtime_ns}"]
            await self._script(keys=[self.records_key, self.order_key], args=args)

    async def count(self) -> int:
        """How many paths are recorded."""
        return int(await self._client.hlen(self.records_key))


def _parse(path: str, value: str) -> IngestRecord | None:
    parts = value.split(" ")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return IngestRecord(path, parts[0], int(parts[1]), int(parts[2]))

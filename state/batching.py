"""Send concurrent calls of one Lua script to Redis in one pipelined round trip.

Under load, many coroutines apply messages at the same moment. Each call on its own pays
the client's whole per-command path (pool, write, read, parse); gathered into one pipeline
they share one write and one read. A call made while nothing else is in flight is sent
at once, as before, so latency at low load does not change.

Each script call stays atomic on the server. Calls in flight at the same time may run in
any order, as they could on separate pool connections before; a call made after another
returned runs after it. Batching changes how calls travel, not what they do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

_Call = tuple[list[str], list[Any], "asyncio.Future[Any]"]


class ScriptBatcher:
    """Calls ``script`` like ``await script(keys=..., args=...)``, batching concurrent calls."""

    def __init__(self, redis: aioredis.Redis, script: AsyncScript, max_batch: int = 256) -> None:
        self._redis = redis
        self._script = script
        self._max_batch = max_batch
        self._pending: list[_Call] = []
        self._scheduled = False
        self._in_flight = 0  # sends (single or batched) awaiting their replies
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, *, keys: list[str], args: list[Any]) -> Any:
        """Run the script once with ``keys`` and ``args``; return its reply."""
        if not self._in_flight and not self._pending:
            # Idle: send at once, with no extra task or loop iteration. Calls made while
            # this one is out are the ones that batch.
            self._in_flight += 1
            try:
                return await self._script(keys=keys, args=args)
            finally:
                self._in_flight -= 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            # Runs after every callback already due in this loop iteration, so the calls
            # those make join this batch.
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self._max_batch):
            task = asyncio.get_running_loop().create_task(
                self._send(pending[start : start + self._max_batch])
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Call]) -> None:
        self._in_flight += 1
        try:
            if len(batch) == 1:
                keys, args, _ = batch[0]
                replies: list[Any] = [await self._script(keys=keys, args=args)]
            else:
                replies = await self._pipelined(batch)
        except BaseException as exc:  # the connection failed: every caller gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._in_flight -= 1
        for (_, _, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller was cancelled; the script ran all the same
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipelined(self, batch: list[_Call]) -> list[Any]:
        # EVALSHA directly: handing the script object to the pipeline would make it send
        # SCRIPT EXISTS with every batch.
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, args, _ in batch:
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):  # a restarted server: load it, run again
                keys, args, _ = batch[i]
                try:
                    replies[i] = await self._script(keys=keys, args=args)
                except Exception as exc:
                    replies[i] = exc
        return replies

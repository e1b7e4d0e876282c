"""Send concurrent calls of one Lua script to Redis in one pipelined round trip.

Under load, many coroutines apply messages at the same moment. Each call on its own pays
the client's whole per-command path (pool, write, read, parse); gathered into one pipeline
they share one write and one read. A call made while nothing else is in flight is sent
at once, as before, so latency at low load does not change.

Each script call stays atomic on the server. Calls in flight at the same time may run in
any order, as they could on separate pool connections before; a call made after another
returned runs after it. Batching changes how calls travel, not what they do.

A script written to take a batch itself (``merged_head``) goes further: the gathered
calls become one call of it, KEYS and per-call ARGV concatenated after the shared head,
and its reply is a list with one reply per call (an error reply fails that call alone).
The server then runs the whole batch as one atomic step and the script can write what
the calls share once (state/lua/apply.lua).

Sends go through a ``Lane`` of the client's pool (state/connection.py): a batcher sends
one batch after another, so it keeps a connection instead of taking one from the pool
for each, and sends EVALSHA itself rather than through the script object's call (which
builds the arguments again and looks up a class each time), loading the script again
when the server lost it (NOSCRIPT) as that call does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.client import NEVER_DECODE
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from state.connection import Lane

_Call = tuple[list[str], list[Any], "asyncio.Future[Any]"]
_Args = tuple[list[str], list[Any]]


class ScriptBatcher:
    """Calls ``script`` like ``await script(keys=..., args=...)``, batching concurrent calls.

    With ``merged_head`` the script takes a batch (see the module docstring): ``args`` of
    a call are its own part only, the head is prepended once per batch. With
    ``max_in_flight`` at most that many sends are out at a time; calls made meanwhile
    wait and go together when one returns (fewer, larger batches under load). With
    ``decode=False`` the replies are the server's bytes, whatever the client decodes (for
    a caller that hands them on as bytes).
    """

    def __init__(self, redis: aioredis.Redis, script: AsyncScript, max_batch: int = 256,
                 *, merged_head: list[Any] | None = None,
                 max_in_flight: int | None = None, decode: bool = True) -> None:
        self._lane = Lane(redis.connection_pool)
        self._script = script
        self._options: dict[str, Any] = {} if decode else {NEVER_DECODE: True}
        self._max_batch = max_batch
        self._head = merged_head
        self._max_in_flight = max_in_flight or 1 << 30
        self._pending: list[_Call] = []
        self._scheduled = False
        self._in_flight = 0  # sends (single or batched) started and awaiting their replies
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, *, keys: list[str], args: list[Any]) -> Any:
        """Run the script once with ``keys`` and ``args``; return its reply."""
        if not self._in_flight and not self._pending:
            # Idle: send at once, with no extra task or loop iteration. Calls made while
            # this one is out are the ones that batch.
            self._in_flight += 1
            try:
                [reply] = await self._run([(keys, args)])
            finally:
                self._sent()
            if isinstance(reply, Exception):
                raise reply
            return reply
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            # Runs after every callback already due in this loop iteration, so the calls
            # those make join this batch.
            loop.call_soon(self._flush)
        return await future

    async def many(self, calls: list[_Args]) -> list[Any]:
        """Run ``calls`` in order, ``max_batch`` per round trip; their replies (an error
        reply as its exception, not raised)."""
        replies: list[Any] = []
        for start in range(0, len(calls), self._max_batch):
            replies += await self._run(calls[start : start + self._max_batch])
        return replies

    def _flush(self) -> None:
        self._scheduled = False
        # With max_in_flight batches on their way the calls wait for one of them to
        # return (which flushes again): the server runs scripts one after the other
        # anyway, so waiting costs no throughput, and the calls gathered meanwhile go as
        # one batch instead of one small batch per loop iteration.
        while self._pending and self._in_flight < self._max_in_flight:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _sent(self) -> None:
        """One send returned: flush what waited for it."""
        self._in_flight -= 1
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            replies = await self._run([(keys, args) for keys, args, _ in batch])
        except BaseException as exc:  # the connection failed: every caller gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._sent()
        for (_, _, future), reply in zip(batch, replies, strict=True):
            if future.done():  # the caller was cancelled; the script ran all the same
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _run(self, calls: list[_Args]) -> list[Any]:
        """One round trip for ``calls``: one call of the batch script, one call on its
        own, or a pipeline; their replies (a script's error reply as its exception)."""
        if self._head is not None:
            return await self._merged(calls)
        if len(calls) == 1:
            keys, args = calls[0]
            try:
                return [await self._evalsha(keys, args)]
            except ResponseError as exc:
                return [exc]
        return await self._pipelined(calls)

    async def _evalsha(self, keys: list[str], args: list[Any]) -> Any:
        script, lane = self._script, self._lane
        options = self._options
        try:
            return await lane.execute_command("EVALSHA", script.sha, len(keys), *keys, *args,
                                              **options)
        except NoScriptError:  # the server lost it (a restart): load it and run it again,
            script.sha = await lane.script_load(script.script)  # as the script object does
        return await lane.execute_command("EVALSHA", script.sha, len(keys), *keys, *args,
                                          **options)

    async def _merged(self, calls: list[_Args]) -> list[Any]:
        """One call of the batch script for ``calls``; its replies, one per call."""
        assert self._head is not None
        keys: list[str] = []
        args = [*self._head]
        for call_keys, call_args in calls:  # (lists extended in C, not item by item)
            keys += call_keys
            args += call_args
        replies = await self._evalsha(keys, args)
        if not isinstance(replies, list) or len(replies) != len(calls):
            raise RuntimeError(f"batch script answered {len(calls)} calls with {replies!r:.200}")
        return replies

    async def _pipelined(self, batch: list[_Args]) -> list[Any]:
        sha = self._script.sha
        replies = await self._lane.pipelined(
            [("EVALSHA", sha, len(keys), *keys, *args) for keys, args in batch],
            raise_on_error=False, **self._options)
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                keys, args = batch[i]
                try:
                    replies[i] = await self._evalsha(keys, args)
                except Exception as exc:
                    replies[i] = exc
        return replies

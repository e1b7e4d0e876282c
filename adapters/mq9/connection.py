"""NATS connections of the mq9 service and bridge: nats-py's client, cheaper header parsing,
and requests answered on one reply inbox.

Every message the service handles carries NATS headers (a SEND's, a stored message's as
JetStream hands it back), and nats-py 2.16 parses each header line with several decodes
and checks each name for whitespace one character at a time in Python: about a tenth of
the service's CPU. ``connect`` gives a client whose parser returns the same dict at about
half the cost (an ASCII block is decoded once, each name searched with one regular
expression). The override applies only while nats-py's parser is the one-argument static
method it replaces (``parser_replaced``); otherwise the library's own parser runs.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import re
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

# For a str pattern, \s is exactly what str.isspace() accepts (the same Unicode table).
_SPACE = re.compile(r"\s")
_CRLF = b"\r\n"
_ASCII_SPACE = " \t\n\r\x0b\x0c"  # what bytes.strip() strips


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """The headers of a NATS header block (``Name: Value`` lines), as nats-py reads them:
    a line without ``:`` or whose name is not ASCII or holds whitespace is skipped, the
    value is stripped and decoded as UTF-8 (bad bytes replaced), the last of a name wins."""
    out: dict[str, str] = {}
    if raw.isascii():  # the usual block: decoded once, the same result
        for line in raw.decode("ascii").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip(_ASCII_SPACE)
                if not _SPACE.search(key):
                    out[key] = value.strip(_ASCII_SPACE)
        return out
    for raw_line in raw.split(_CRLF):
        raw_name, raw_sep, raw_value = raw_line.partition(b":")
        if not raw_sep:
            continue
        try:
            key = raw_name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if not _SPACE.search(key):
            out[key] = raw_value.strip().decode("utf-8", "replace")
    return out


def _replaceable() -> bool:
    """Whether nats-py parses header lines with the static method this module replaces."""
    found = inspect.getattr_static(Client, "_parse_header_lines", None)
    if not isinstance(found, staticmethod):
        return False
    return list(inspect.signature(found.__func__).parameters) == ["raw"]


parser_replaced = _replaceable()


class Mq9Connection(Client):
    """nats-py's client, parsing headers with ``parse_header_lines`` when it can."""

    if parser_replaced:
        _parse_header_lines = staticmethod(parse_header_lines)


async def connect(servers: str | list[str], **options: Any) -> Client:
    """Connect like ``nats.connect`` (same options), with the cheaper header parsing."""
    nc = Mq9Connection()
    await nc.connect(servers, **options)
    return nc


class ReplyInbox:
    """Requests answered on one reply subscription of their own, each named by a counter:
    lighter than nats-py's request (a random token, a timer and a done callback each).

    Subscribed on first use. A request answered by one message goes through ``request``;
    one answered by several registers a queue under its token in ``_queues``."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = nc.new_inbox()
        self._sub: Any = None
        self._subscribing = asyncio.Lock()
        self._answers: dict[str, asyncio.Future[Msg]] = {}
        self._queues: dict[str, asyncio.Queue[Msg]] = {}
        self._ids = itertools.count()

    async def subscribe(self) -> None:
        """Subscribe the reply inbox (once)."""
        if self._sub is None:
            async with self._subscribing:
                if self._sub is None:
                    self._sub = await self._nc.subscribe(self._prefix + ".*",
                                                         cb=self._on_reply)

    async def stop(self) -> None:
        """Drop the reply subscription."""
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _reply_to(self) -> tuple[str, str]:
        """A new request's token and the subject its answers come to."""
        await self.subscribe()
        token = str(next(self._ids))
        return token, f"{self._prefix}.{token}"

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject.rpartition(".")[2]
        queue = self._queues.get(token)
        if queue is not None:
            queue.put_nowait(msg)
            return
        answer = self._answers.get(token)
        if answer is not None and not answer.done():
            answer.set_result(msg)

    async def request(self, subject: str, payload: bytes, headers: dict[str, str] | None,
                      timeout: float) -> Msg:  # noqa: ASYNC109
        """The one message that answers a request (TimeoutError after ``timeout`` s)."""
        token, reply_to = await self._reply_to()
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._answers[token] = answer
        try:
            await self._nc.publish(subject, payload, reply=reply_to, headers=headers)
            async with asyncio.timeout(timeout):
                return await answer
        finally:
            del self._answers[token]

"""The ``http`` transport's HTTP/1.1 server: llhttp (``httptools``) under an asyncio protocol.

It does what the API needs and no more, at a fraction of a general framework's cost per
request: requests are parsed by ``httptools.HttpRequestParser`` as bytes arrive, queued
per connection and answered in order (keep-alive, pipelining, HTTP/1.0) by one task per
busy connection, which calls the transport's handler with a ``Request`` and writes the
``Response`` it returns. Bounds and timeouts (docs/http-api.md, "Slow clients"):

- a request head is at most ``MAX_HEAD_BYTES``, ``MAX_HEADERS`` fields, each field and
  the target at most ``MAX_LINE_BYTES``; HTTP/1.1 needs ``Host``; a malformed or
  oversize head is answered 400 (JSON error shape) and the connection closes;
- a connection that has not sent a complete head ``header_timeout`` seconds after
  connecting or after its last answer is closed;
- a body is kept up to ``max_body_bytes`` (after undoing a gzip or deflate
  ``Content-Encoding``); past that it is dropped while counted, and reading it fails
  (``BodyError`` 413). The handler reads it within its own timeout; the part of a body
  the handler did not read is dropped for at most ``header_timeout`` seconds after the
  answer, then the connection closes (so a client is not reset before it reads the answer);
- while a later pipelined request's body arrives, or ``QUEUE_MAX`` requests wait,
  reading pauses until the earlier ones are answered (input is parsed ``PARSE_SLICE``
  bytes at a time, so a pause also stops the parsing of what was read already);
- trailer fields count with the head's bounds and are dropped; a second field of
  ``_ONCE_ONLY``, or a Transfer-Encoding other than HTTP/1.1's chunked, is a 400;
- an answer is written whole; the next one waits while the socket's buffer is over its
  high-water mark (``pause_writing``); a connection whose buffer does not drain for
  ``header_timeout`` seconds (a client that reads no answers) is aborted, also when
  closing after its last answer.
- ``Expect: 100-continue`` is answered when the handler first reads the body
  (``Request.body``); a request answered without reading it ends the reading of the
  connection, which closes after the answer (the client may send the body or not);
- after the client's EOF (a half-close) the requests that arrived whole are answered,
  one cut short is a 400, then the connection closes.

The ``ConnectionGuard`` (adapters/http/connections.py) caps the connections held.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from email.message import EmailMessage
from email.parser import HeaderParser
from email.policy import HTTP
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qsl

import httptools

from adapters.http.connections import ConnectionGuard

log = logging.getLogger("bpgw.adapters.http")

MAX_LINE_BYTES = 8190
"""The longest request target, header name or header value."""
MAX_HEADERS = 128
"""The most header fields in a request head."""
MAX_HEAD_BYTES = 65536
"""The longest request head (request line and header fields)."""
QUEUE_MAX = 16
"""Pipelined requests parsed ahead of answering: at this many, reading pauses."""
PARSE_SLICE = 4096
"""Input is parsed this much at a time: once reading pauses, what a read brought beyond
the slice waits unparsed, so however many small requests one read holds (a read can be
256 KiB), at most ``QUEUE_MAX`` plus a slice's worth of them are queued."""

JSON_UTF8 = "application/json; charset=utf-8"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Reason phrases fixed here, so answers do not change with Python's HTTPStatus wording
# (3.13 renamed 413 and 422).
_REASONS: dict[int, str] = {
    **{s.value: s.phrase for s in HTTPStatus},
    413: "Request Entity Too Large",
    422: "Unprocessable Entity",
}
_HEADER_VALUE_BAD = re.compile(r"[\r\n\x00]")
# Fields that say how the request is read or whose it is: a second one is refused (400),
# as another server or proxy on the way might have taken that one instead of the first.
_ONCE_ONLY = frozenset({"host", "authorization", "content-type", "content-encoding"})
# The usual header names as clients write them, with their keys (lower case): a look-up
# instead of decoding and lowering each name of every request. Fixed: never grows.
_HEADER_KEYS: dict[bytes, str] = {
    spelling: key
    for key in ("host", "authorization", "content-type", "content-length",
                "content-encoding", "transfer-encoding", "expect", "connection",
                "accept", "accept-encoding", "user-agent")
    for spelling in (key.encode(), key.title().encode())
}
_PCT_RUN = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
_PCT_KEPT = re.compile(r"%2[Ff5]")  # an encoded "/" or "%" stays encoded in the path


class BodyError(Exception):
    """A request body that cannot be had: too large (413), undecodable (400), or not
    arrived in time (408). ``close``: the connection cannot go on after the answer."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


class _HeadError(Exception):
    """A request head this server refuses (raised in a parser callback)."""


def reason(status: int) -> str:
    """The reason phrase of ``status`` (``Unknown`` for a code without one)."""
    return _REASONS.get(status, "Unknown")


def encode_headers(headers: Mapping[str, str], content_type: str | None = JSON_UTF8) -> bytes:
    """Header lines for a ``Response``: ``headers`` in order, then ``Content-Type:
    content_type`` unless ``headers`` has one. A name or value that could break the
    head (CR, LF, NUL) is refused with ``ValueError``."""
    lines = []
    typed = False
    for name, value in headers.items():
        if _HEADER_VALUE_BAD.search(name) or _HEADER_VALUE_BAD.search(value) or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent")
        typed = typed or name.lower() == "content-type"
        lines.append(f"{name}: {value}\r\n")
    if not typed and content_type is not None:
        lines.append(f"Content-Type: {content_type}\r\n")
    return "".join(lines).encode("utf-8")


JSON_HEAD = encode_headers({})
"""The header lines of a JSON answer."""


class Response:
    """An answer: status, header lines (``encode_headers``; the server adds
    ``Content-Length``, ``Date`` and ``Connection``) and body. ``close``: close the
    connection after it."""

    __slots__ = ("body", "close", "head", "status")

    def __init__(
        self, status: int, body: bytes = b"", head: bytes = JSON_HEAD, *, close: bool = False
    ) -> None:
        self.status = status
        self.body = body
        self.head = head
        self.close = close


def decode_path(raw: str) -> str:
    """A target's path percent-decoded (UTF-8) but for ``%2F`` and ``%25``, which stay
    encoded (upper case) so a parameter can hold them; bytes that are not UTF-8 stay
    encoded as they came."""
    if "%" not in raw:
        return raw
    return _PCT_RUN.sub(_decode_run, raw)


def _decode_run(found: re.Match[str]) -> str:
    run = found[0]
    out: list[str] = []
    start = 0
    for kept in _PCT_KEPT.finditer(run):
        if kept.start() % 3 == 0:  # aligned on a %XX, not inside one
            out.append(_decode_utf8(run[start:kept.start()]))
            out.append(kept[0].upper())
            start = kept.end()
    out.append(_decode_utf8(run[start:]))
    return "".join(out)


def _decode_utf8(run: str) -> str:
    """``%XX%XX...`` decoded; a byte that does not decode keeps its ``%XX``."""
    data = bytes(int(run[i + 1:i + 3], 16) for i in range(0, len(run), 3))
    out: list[str] = []
    while data:
        try:
            out.append(data.decode("utf-8"))
            break
        except UnicodeDecodeError as exc:
            out.append(data[:exc.start].decode("utf-8"))
            consumed = len(run) - 3 * len(data)
            out.append(run[consumed + 3 * exc.start:consumed + 3 * exc.end])
            data = data[exc.end:]
    return "".join(out)


class _OctetStream(EmailMessage):
    """A Content-Type parsed as RFC 9110 says: ``application/octet-stream`` when absent
    or not ``type/subtype``."""

    def __init__(self) -> None:
        super().__init__()
        self.set_default_type("application/octet-stream")

    def get_content_type(self) -> str:
        """The lower-cased ``type/subtype``, or the default."""
        ctype = self.get("content-type", "").lower().partition(";")[0].strip()
        return ctype if ctype.count("/") == 1 else self.get_default_type()


def parse_content_type(raw: str | None) -> tuple[str, str | None]:
    """``(type/subtype, charset)`` of a Content-Type header (None when absent)."""
    if raw is None:
        return "application/octet-stream", None
    message = HeaderParser(_OctetStream, policy=HTTP).parsestr(f"Content-Type: {raw}")
    params = dict(message.get_params(())[1:])
    return message.get_content_type(), params.get("charset")


class _Inflater:
    """Undoes a gzip or deflate Content-Encoding a chunk at a time, never producing
    more than asked (a small body cannot expand into a large one unbounded)."""

    __slots__ = ("_deflate", "_engine", "_started")

    def __init__(self, encoding: str) -> None:
        self._deflate = encoding == "deflate"
        self._engine = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip"
                                          else zlib.MAX_WBITS)
        self._started = False

    def feed(self, chunk: bytes, most: int) -> bytes:
        """Up to ``most`` bytes decoded from ``chunk``; raises ``zlib.error``."""
        if not self._started and chunk:
            self._started = True
            # A "deflate" body without its zlib header (as some clients send it).
            if self._deflate and chunk[0] & 0xF != 8:
                self._engine = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._engine.decompress(chunk, most)

    def finished(self) -> bool:
        """Whether a deflate stream ended properly (gzip is taken as it came)."""
        return not self._deflate or not self._started or self._engine.eof


class Request:
    """One request: its head as parsed, its body as it arrives."""

    __slots__ = (
        "_conn", "_data", "_error", "_inflater", "_limit", "_query", "_query_string",
        "_size", "_waiter", "complete", "content_length", "discarding", "expecting",
        "headers", "keep_alive", "method", "path", "version",
    )

    def __init__(
        self,
        conn: HttpConnection,
        method: str,
        target: bytes,
        version: str,
        headers: dict[str, str],
        keep_alive: bool,
        limit: int,
    ) -> None:
        self._conn = conn
        self.method = method
        self.version = version
        # Header names in lower case, the first value of a repeated one.
        self.headers = headers
        self.keep_alive = keep_alive
        self.path, self._query_string = _split_target(target)
        self._query: dict[str, str] | None = None
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None else None
        self._limit = limit
        self._data: bytes | bytearray = b""
        self._size = 0
        self._error: BodyError | None = None
        self._inflater: _Inflater | None = None
        if (encoding := headers.get("content-encoding")) is not None:
            encoding = encoding.lower() if encoding.isascii() else encoding
            if encoding in ("gzip", "deflate"):
                self._inflater = _Inflater(encoding)
            elif encoding in ("br", "zstd"):
                self._error = BodyError(400, f"cannot decode content-encoding {encoding}: "
                                             "send the body unencoded, gzip or deflate")
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.discarding = False
        # The client waits for "100 Continue" before it sends the body (RFC 9110, 10.1.1):
        # sent when the body is first read, so a request refused before (by its route,
        # token or Content-Length) is answered without the client sending the body.
        expect = headers.get("expect")
        self.expecting = (
            expect is not None and version == "1.1" and expect.lower() == "100-continue"
            and (bool(self.content_length) or "transfer-encoding" in headers)
        )

    @property
    def query(self) -> Mapping[str, str]:
        """The target's query parameters (the first of a repeated name)."""
        if self._query is None:
            pairs = parse_qsl(self._query_string, keep_blank_values=True)
            self._query = {}
            for name, value in pairs:
                self._query.setdefault(name, value)
        return self._query

    @property
    def remote(self) -> str | None:
        """The client's address."""
        return self._conn.remote

    def client_gone(self) -> bool:
        """Whether the client closed the connection (or it was closed), or its sending
        side: it may read on, but a full close looks the same (a long-poll takes no
        messages for a reader that may be gone)."""
        conn = self._conn
        return conn.ended or conn.gone()

    def _feed(self, chunk: bytes) -> None:
        if self.discarding or self._error is not None:
            return
        if self._inflater is not None:
            try:
                chunk = self._inflater.feed(chunk, self._limit + 1 - self._size)
            except zlib.error:
                self._fail(BodyError(400, f"cannot decode content-encoding "
                                          f"{self.headers['content-encoding']}"))
                return
        self._size += len(chunk)
        if self._size <= self._limit:
            data = self._data
            if not data:
                self._data = chunk  # the usual body, one chunk: kept as it came
            else:
                # One growing buffer, not a list: a body sent in 1-byte chunks must not
                # cost an object (some 40 bytes) per byte.
                if isinstance(data, bytes):
                    data = self._data = bytearray(data)
                data += chunk
            return
        self._data = b""
        if self._inflater is None:
            self._wake()  # counted on: a complete body says its size
            return
        self._fail(BodyError(413, f"Maximum request body size {self._limit} exceeded."))

    def _finish(self) -> None:
        self.complete = True
        if self._inflater is not None and not self._inflater.finished():
            self._fail(BodyError(400, f"cannot decode content-encoding "
                                      f"{self.headers['content-encoding']}"))
        self._wake()

    def _fail(self, error: BodyError) -> None:
        if self._error is None:
            self._error = error
            self._data = b""
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _over(self) -> BodyError | None:
        """The error of a body past the limit, in the words of how it was seen."""
        if self._size <= self._limit:
            return None
        if self.complete and self._inflater is None:
            return BodyError(413, f"body of {self._size} bytes exceeds the limit of {self._limit}")
        return BodyError(413, f"Maximum request body size {self._limit} exceeded.")

    async def body(self, within: float) -> bytes:
        """The whole body, once arrived; raises ``BodyError`` (408 after ``within``
        seconds, 413 over the limit, 400 undecodable) or ``ConnectionResetError``. Sends
        ``100 Continue`` first to a client that waits for it."""
        if self.expecting and self._error is None and self._size <= self._limit:
            self.expecting = False
            self._conn.write(CONTINUE)
        if not self.complete and self._error is None and self._size <= self._limit:
            try:
                async with asyncio.timeout(within):
                    while not (self.complete or self._error is not None
                               or self._size > self._limit):
                        if self._conn.gone():
                            raise ConnectionResetError("the client went away")
                        self._waiter = asyncio.get_running_loop().create_future()
                        await self._waiter
            except TimeoutError:
                raise BodyError(
                    408, f"the request body did not arrive within {within:g}s", close=True
                ) from None
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        if (too_large := self._over()) is not None:
            raise too_large
        data = self._data
        return data if isinstance(data, bytes) else bytes(data)

    async def _drop_rest(self, within: float) -> bool:
        """Drop the body's unread rest; whether it ended within ``within`` seconds."""
        self.discarding = True
        self._data = b""
        try:
            async with asyncio.timeout(within):
                # (Until the parser gives up on it: malformed, the rest cannot be dropped.)
                conn = self._conn
                while not self.complete and conn._parsing is self and not conn.gone():
                    self._waiter = asyncio.get_running_loop().create_future()
                    await self._waiter
        except TimeoutError:
            return False
        finally:
            self._waiter = None
        return self.complete


def _split_target(target: bytes) -> tuple[str, str]:
    """(decoded path, raw query) of a request target in any of its forms."""
    if target.startswith(b"/"):
        raw, _, rest = target.partition(b"?")
        query = rest.partition(b"#")[0] if rest else rest
        # (find, not ``in``: bytes' ``in`` first tries the operand as an int, and the
        # TypeError it raises and clears for bytes costs more than the search)
        if raw.find(b"#") >= 0:
            raw = raw.partition(b"#")[0]
    else:  # absolute form (or "*", or an authority)
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            return target.decode("utf-8", "surrogateescape"), ""
        raw, query = url.path or b"", url.query or b""
        if not raw and url.schema:
            raw = b"/"
    return (decode_path(raw.decode("utf-8", "surrogateescape")),
            query.decode("utf-8", "surrogateescape"))


Handler = Callable[[Request], Awaitable[Response]]
"""The transport's request handler: answers every request, raising only
``ConnectionError`` (the client went away: nothing to answer)."""


class _DateLine:
    """The ``Date`` header line, formatted once a second."""

    def __init__(self) -> None:
        self._second = 0
        self._line = b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
        return self._line


_date = _DateLine()
_status_lines: dict[tuple[str, int], bytes] = {}


def _status_line(version: str, status: int) -> bytes:
    line = _status_lines.get((version, status))
    if line is None:
        line = f"HTTP/{version} {status} {reason(status)}\r\n".encode()
        if len(_status_lines) < 512:  # the versions are the client's: bounded
            _status_lines[(version, status)] = line
    return line


def _connection_line(version: str, keep_alive: bool) -> bytes:
    """What HTTP/1.0 and 1.1 clients need said: that 1.0 keeps alive, that 1.1 closes."""
    if keep_alive:
        return b"Connection: keep-alive\r\n" if version == "1.0" else b""
    return b"Connection: close\r\n" if version == "1.1" else b""


class HttpConnection(asyncio.Protocol):
    """One client connection: parses its requests and answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._guard = server.guard
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self.remote: str | None = None
        self._queue: deque[Request] = deque()
        # The request whose head or body is being parsed; its head's parts so far.
        self._parsing: Request | None = None
        self._in_head = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._count = 0
        self._head_bytes = 0  # the head's target and fields so far
        self._head_chunks = 0  # the chunks that arrived since the head's first
        self._began = False  # a head began in the chunk being parsed
        self._head_error = ""
        self._unparsed = b""  # what a read brought past a pause, parsed when it ends
        self._reading = True  # input still parsed (not after an error, an upgrade, EOF)
        self._abandoned = False  # input left unparsed (an error, an upgrade...): linger
        self.ended = False  # the client closed its side (EOF): no more input comes
        self._read_paused = False
        self._write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None  # answering (None: idle)
        # The task that answers this connection's requests, kept between them; and what
        # it waits on while idle (True: a request is queued; False: the connection ends).
        self._worker: asyncio.Task[None] | None = None
        self._parked: asyncio.Future[bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # When a complete request head must have arrived by (None: one is being answered).
        self._deadline: float | None = None
        self._closing = False  # answer what is in progress, then close
        self._serving: Request | None = None  # the request whose handler runs
        self._answered = False  # an answer was sent on this connection
        self.busy = False  # a request is being answered: never evicted (see the guard)

    # -- transport events ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection (evicting an idle one at the cap) and start its clock."""
        # A cast, not a check: uvloop's transports do not subclass asyncio's.
        stream = cast(asyncio.Transport, transport)
        if not self._guard.admit(self):
            self._lost = True
            self._reading = False
            stream.abort()
            return
        self._transport = stream
        self._server.connections.add(self)
        peer = stream.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        sock = stream.get_extra_info("socket")
        if sock is not None:  # dead peers are found by TCP, not only by the timeouts
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                pass
        self._arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; a handler still running finds it gone."""
        if self._lost:
            return
        self._lost = True
        self._guard.release(self)
        self._server.connections.discard(self)
        self._cancel_timer()
        self._unpark(False)
        for request in self._queue:
            request._wake()
        if self._parsing is not None:
            self._parsing._wake()
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        """The socket's buffer is full: the next answer waits."""
        self._write_paused = True

    def resume_writing(self) -> None:
        """The socket's buffer drained."""
        self._write_paused = False
        writable = self._writable
        if writable is not None and not writable.done():
            writable.set_result(None)

    def _parse(self, data: bytes | memoryview) -> None:
        """Parse ``data`` a slice at a time, keeping what follows a pause for later."""
        view = memoryview(data)
        for start in range(0, len(data), PARSE_SLICE):
            if not self._reading:
                return
            if self._read_paused:
                self._unparsed = bytes(data[start:])
                return
            self.data_received(view[start:start + PARSE_SLICE])

    def data_received(self, data: bytes | memoryview) -> None:
        """Parse what arrived (over a slice: see ``_parse``); queue each request whose
        head is complete."""
        if not self._reading:
            return
        if len(data) > PARSE_SLICE:
            self._parse(data)
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # llhttp completed the request before stopping; what follows it is not HTTP
            # (this server upgrades to nothing): it is answered, then the connection closes.
            self._abandon()
        except httptools.HttpParserCallbackError:
            self._refuse(self._head_error)
        except httptools.HttpParserError as exc:
            # A TLS handshake's first bytes: a client set up for HTTPS, say so.
            tls = data[:2] == b"\x16\x03" and self._parsing is None
            # Scanners and HTTPS clients send such first requests all day on the
            # internet: not worth a warning each.
            noise = (tls or isinstance(exc, httptools.HttpParserInvalidMethodError)) \
                and not self._answered
            self._refuse("TLS (HTTPS) on an HTTP port" if tls else str(exc), noise=noise)
        else:
            # httptools keeps an incomplete header (or trailer) field itself: bound what
            # it holds (to a slice more than the limit when the head began in this one).
            if self._in_head and not self._began:
                self._head_chunks += len(data)
                if self._head_chunks > MAX_HEAD_BYTES:
                    self._refuse(f"request head over {MAX_HEAD_BYTES} bytes"
                                 if self._parsing is None else
                                 f"trailer fields over {MAX_HEAD_BYTES} bytes")
        self._began = False

    def eof_received(self) -> bool | None:
        """The client closed its side (a half-close: it may still read). The requests
        that arrived whole are answered in order, one cut short by the EOF (its head or
        body incomplete) is answered 400, then the connection closes; at once when there
        is nothing to answer. (A long-poll takes no messages: ``Request.client_gone``.)"""
        self.ended = True
        # (Nothing waits in _unparsed: reading resumes, and EOF is seen, only once it is
        # parsed.)
        if self._reading and (self._in_head or self._parsing is not None):
            self._refuse("the client ended its side of the connection inside a request "
                         "(its head or body is incomplete)", noise=True)
        self._reading = False
        if self._task is None:
            return None  # the transport closes
        return True  # _serve closes it after the last answer

    # -- parser callbacks (httptools) ----------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts."""
        self._in_head = True
        self._began = True
        self._url = b""
        self._headers = {}
        self._count = 0
        self._head_bytes = self._head_chunks = 0

    def on_url(self, url: bytes) -> None:
        """(Part of) the request target."""
        self._url += url
        self._head_bytes += len(url)
        if len(self._url) > MAX_LINE_BYTES:
            self._fail_head(f"request target over {MAX_LINE_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header field, or a trailer field (counted with the head, then dropped)."""
        name_bytes, value_bytes = len(name), len(value)
        count = self._count = self._count + 1
        size = self._head_bytes = self._head_bytes + name_bytes + value_bytes + 4
        # (One test of every bound on the usual field; which one failed, when one did.)
        if (count > MAX_HEADERS or size > MAX_HEAD_BYTES
                or name_bytes > MAX_LINE_BYTES or value_bytes > MAX_LINE_BYTES):
            if count > MAX_HEADERS:
                self._fail_head(f"more than {MAX_HEADERS} header fields")
            if name_bytes > MAX_LINE_BYTES or value_bytes > MAX_LINE_BYTES:
                self._fail_head(f"a header field over {MAX_LINE_BYTES} bytes")
            self._fail_head(f"request head over {MAX_HEAD_BYTES} bytes")
        if self._parsing is not None:
            return  # a trailer field (after a chunked body): bounded, never a header
        key = _HEADER_KEYS.get(name) or name.decode("latin-1").lower()
        headers = self._headers
        if key not in headers:
            headers[key] = value.decode("utf-8", "surrogateescape")
        elif key in _ONCE_ONLY:
            self._fail_head(f"more than one {name.decode('latin-1')} header")

    def on_headers_complete(self) -> None:
        """The head is complete: queue the request."""
        parser = self._parser
        version = parser.get_http_version()
        headers = self._headers
        if version == "1.1" and "host" not in headers:
            self._fail_head("missing Host header")
        # llhttp takes any coding list ending in chunked, and chunked on HTTP/1.0; this
        # server undoes no transfer coding but chunked, and a 1.0 message with one has
        # faulty framing (RFC 9112, 6.1): either would be read as another server does not.
        if (coding := headers.get("transfer-encoding")) is not None and (
            version != "1.1" or coding.strip(" \t").lower() != "chunked"
        ):
            self._fail_head("Transfer-Encoding other than chunked, or on HTTP/1.0")
        request = Request(
            self,
            parser.get_method().decode("ascii"),
            self._url,
            version,
            self._headers,
            parser.should_keep_alive(),
            self._server.max_body_bytes,
        )
        self._in_head = False
        self._parsing = request
        self._deadline = None
        self._enqueue(request)

    def on_chunk_header(self) -> None:
        """A chunk's size line ended: till its data (after the last one: through the
        trailer fields, which httptools holds while incomplete) input is bounded as a
        head's."""
        self._in_head = True
        self._began = True
        self._head_chunks = 0

    def on_body(self, chunk: bytes) -> None:
        """Part of the current request's body."""
        self._in_head = False
        if self._parsing is not None:
            self._parsing._feed(chunk)

    def on_message_complete(self) -> None:
        """The current request's body is complete."""
        request, self._parsing = self._parsing, None
        self._in_head = False
        if request is not None:
            request._finish()
            self._update_reading()

    def _fail_head(self, message: str) -> None:
        self._head_error = message
        raise _HeadError(message)

    # -- serving -------------------------------------------------------------------

    def gone(self) -> bool:
        """Whether the connection is closed or closing."""
        transport = self._transport
        return self._lost or transport is None or transport.is_closing()

    def write(self, data: bytes) -> None:
        """Send ``data`` unless the connection is gone."""
        if not self.gone():
            cast(asyncio.Transport, self._transport).write(data)

    def abort(self) -> None:
        """Close at once (a reset): the guard makes room."""
        if self._transport is not None:
            self._transport.abort()

    def shutdown(self) -> None:
        """Stop taking requests: close now if idle, else after the answer in progress."""
        self._reading = False
        self._closing = True
        self._unpark(False)
        if self._task is None and self._transport is not None:
            self._transport.close()

    def _refuse(self, message: str, *, noise: bool = False) -> None:
        """Answer the malformed input with 400 after what came before it, then close."""
        log.log(logging.DEBUG if noise else logging.WARNING,
                "http: malformed request from %s: %s", self.remote, message)
        self._abandon()
        request, self._parsing = self._parsing, None
        if request is None:
            self._enqueue(_BadRequest(self, message))
        elif request is self._serving or request.discarding:
            # Its body cannot be read: its handler answers, or has answered (and the
            # connection closes once the rest is no longer dropped).
            request._fail(BodyError(400, f"malformed request body: {message}", close=True))
        else:  # (the last queued) not answered yet: it is the malformed request
            self._queue[-1] = _BadRequest(self, message)

    def _abandon(self) -> None:
        """Read no more input: the requests queued are answered, then the connection
        closes (``_linger_close``)."""
        self._reading = False
        self._abandoned = True

    def _enqueue(self, request: Request) -> None:
        self._queue.append(request)
        self._update_reading()
        if self._task is None:
            self._deadline = None
            if self._parked is not None:
                self._task = self._worker
                self._unpark(True)
                return
            task = asyncio.get_running_loop().create_task(self._serve())
            self._task = self._worker = task
            self._server.track(task)

    def _unpark(self, queued: bool) -> None:
        """Wake the idle worker, if there is one: a request was queued, or none will be."""
        parked, self._parked = self._parked, None
        if parked is not None and not parked.done():
            parked.set_result(queued)

    def _update_reading(self) -> None:
        """Pause reading while requests wait behind the one answered (a later one's
        body arriving, or ``QUEUE_MAX`` of them); resume once they are answered."""
        queue = self._queue
        if len(queue) < 2 and not self._read_paused:
            return  # (the usual case, asked after every request: nothing waits, nothing to resume)
        transport = self._transport
        if transport is None or self._lost:
            return
        waiting = len(queue) > 1 and (
            len(queue) >= QUEUE_MAX or (self._parsing is not None and self._parsing is not queue[0])
        )
        if waiting and not self._read_paused:
            self._read_paused = True
            transport.pause_reading()
        elif not waiting and self._read_paused:
            self._read_paused = False
            if self._reading and (data := self._unparsed):
                self._unparsed = b""
                self._parse(data)
                if self._read_paused:  # it filled the queue again
                    return
            transport.resume_reading()

    async def _serve(self) -> None:
        """Answer the queued requests in order, then wait for the next (idle timer), for
        as long as the connection takes requests: one task a connection, not one a
        request (a task made, tracked and ended per request cost several thousand
        instructions more than waking this one)."""
        while True:
            try:
                if not await self._answer_queued():
                    return
            finally:
                self._task = None
            self._arm_timer()
            if self.gone() or not self._reading or self._closing:
                return
            self._parked = asyncio.get_running_loop().create_future()
            if not await self._parked:
                return

    async def _answer_queued(self) -> bool:
        """Answer the queued requests in order; False when the connection is done with
        (closed, or closing after the last answer)."""
        guard, queue, server = self._guard, self._queue, self._server
        while queue:
            request = queue[0]
            self.busy = True
            guard.touch(self)
            try:
                if isinstance(request, _BadRequest):
                    response = server.refuse(request.error)
                else:
                    self._serving = request
                    response = await server.handler(request)
            except ConnectionError:
                self._close()
                return False
            except Exception:  # the handler answers every error: a bug, not the client
                log.exception("http: no answer for %s %s", request.method, request.path)
                self._close()
                return False
            finally:
                self._serving = None
                self.busy = False
                guard.touch(self)
            if self.gone():
                return False
            if request.expecting and not request.complete:
                # Refused before its body was asked for (no 100 Continue sent): the
                # client may send the body or not, so what comes next could not be
                # told from a next request. Nothing more is read.
                self._abandon()
            # (No more input read: the connection closes after the last queued
            # answer: say so.)
            keep = (request.keep_alive and not response.close and not self._closing
                    and (self._reading or len(queue) > 1))
            self._send(request, response, keep)
            if self._write_paused and not await self._drained():
                return False
            # The unread rest of a body is dropped (for a while) before the next
            # request, or the close, so the client is not reset before it reads.
            if not request.complete and not (
                self._reading and await request._drop_rest(server.header_timeout)
            ):
                keep = False
            queue.popleft()
            self._update_reading()
            if self._abandoned and not queue:
                self._linger_close()
                return False
            if not keep or (not self._reading and not queue):
                self._close()
                return False
        return True

    def _send(self, request: Request, response: Response, keep_alive: bool) -> None:
        body = response.body
        version = request.version
        head = b"".join((
            _status_line(version, response.status),
            response.head,
            b"Content-Length: %d\r\n" % len(body),
            _date.get(),
            _connection_line(version, keep_alive),
            b"\r\n",
        ))
        # A HEAD's answer has the GET's head, without its body.
        self.write(head if request.method == "HEAD" else head + body)
        self._answered = True

    async def _drained(self) -> bool:
        """Wait till the socket's buffer drains; False when the connection is gone, or
        aborted as its client read nothing of it for ``header_timeout`` seconds (else
        it would hold its answers, and the requests it sent, for as long as it likes)."""
        try:
            async with asyncio.timeout(self._server.header_timeout):
                while self._write_paused and not self.gone():
                    self._writable = asyncio.get_running_loop().create_future()
                    try:
                        await self._writable
                    finally:
                        self._writable = None
        except TimeoutError:
            self.abort()
        return not self.gone()

    def _close(self) -> None:
        self._reading = False
        transport = self._transport
        if transport is None:
            return
        transport.close()
        # A closing transport waits for its buffer to be sent: not for ever for a client
        # that does not read.
        if transport.get_write_buffer_size():
            self._cancel_timer()
            self._timer = asyncio.get_running_loop().call_later(
                self._server.header_timeout, self.abort
            )

    def _linger_close(self) -> None:
        """Close after input that is not read on: end the answer (FIN), drop what the
        client still sends until it closes or for ``header_timeout``, then close.
        Closing at once with unread input would reset the connection, and the client
        could lose the answer."""
        transport = self._transport
        if transport is None or self.gone():
            return
        if self.ended:  # nothing more comes: nothing to drop
            self._close()
            return
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(
            self._server.header_timeout, self._close
        )

    def _arm_timer(self) -> None:
        """Close the connection unless a complete request head arrives in time."""
        if self.gone():
            return
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self._server.header_timeout
        # One timer a connection, moved on when it fires early: a timer handle for
        # every request costs more than the odd early wake-up.
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._idle_too_long)

    def _cancel_timer(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_too_long(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.gone():
            return
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:
            self._timer = loop.call_at(deadline, self._idle_too_long)
        elif self._task is None and not self._queue:
            self._close()


class _BadRequest(Request):
    """Stands in the queue for input that is no request: answered by the server's
    ``refuse`` (400), then the connection closes."""

    __slots__ = ("error",)

    def __init__(self, conn: HttpConnection, error: str) -> None:
        super().__init__(conn, "", b"/", "1.1", {}, False, 0)
        self.error = error
        self.complete = True


class HttpServer:
    """Serves ``handler`` on a listening socket, under the ``guard``'s cap; input that is
    not a request is answered by ``refuse``."""

    def __init__(
        self,
        handler: Handler,
        refuse: Callable[[str], Response],
        guard: ConnectionGuard,
        *,
        max_body_bytes: int,
        header_timeout: float,
    ) -> None:
        self.handler = handler
        # The answer to input that is no request (what is wrong with it given).
        self.refuse = refuse
        self.guard = guard
        self.max_body_bytes = max_body_bytes
        self.header_timeout = header_timeout
        self.connections: set[HttpConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Server | None = None

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep ``task`` (a connection's answering) until it ends, for ``stop``."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Bind and accept; the bound address (the real port when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: HttpConnection(self), host, port, backlog=1024
        )
        found: Any = self._listener.sockets[0].getsockname()
        return found[0], found[1]

    async def stop(self, timeout: float) -> None:  # noqa: ASYNC109 - a grace period, then cancel
        """Stop accepting; close idle connections; let answers in progress finish for
        ``timeout`` seconds, then cancel them; close every connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for conn in list(self.connections):
            conn.shutdown()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for conn in list(self.connections):
            conn.abort()
        if listener is not None:
            await listener.wait_closed()

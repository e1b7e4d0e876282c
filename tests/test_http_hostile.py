"""The HTTP server (adapters/http/http11.py) against hostile clients on raw sockets: what
it holds for them stays bounded, and it answers and closes as docs/http-api.md says.
(The byte-for-byte answers to single malformed requests are tests/test_http_wire.py's.)"""

from __future__ import annotations

import asyncio
import socket
import tracemalloc

import pytest
import redis.asyncio as aioredis
from http_wire import ALICE, exchange, serving

from adapters.base import Address, Outbound, OutboundKind
from adapters.http import HttpAdapter
from adapters.http.http11 import PARSE_SLICE, QUEUE_MAX, HttpConnection

pytestmark = pytest.mark.redis

CHUNKED_POST = (f"POST {{target}} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
                "Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n{extra}\r\n")
CLOSE = "Connection: close\r\n"


def _address(adapter: HttpAdapter) -> tuple[str, int]:
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def _connection(adapter: HttpAdapter) -> HttpConnection:
    """The server's one client connection, once it has one."""
    assert adapter._server is not None
    for _ in range(1000):
        if adapter._server.connections:
            [conn] = adapter._server.connections
            return conn
        await asyncio.sleep(0.01)
    raise AssertionError("no connection")


async def test_one_read_of_thousands_of_pipelined_requests_queues_a_bounded_few(
    redis: aioredis.Redis, namespace: str
) -> None:
    """Requests written at once behind a long-poll (so none is answered meanwhile): the
    server queues ``QUEUE_MAX`` plus one slice's worth of them, not a whole read's
    thousands; the rest is parsed once the queue empties, and every one is answered."""
    async with serving(redis, namespace, long_poll_max_seconds=60) as adapter:
        reader, writer = await asyncio.open_connection(*_address(adapter))
        tiny = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        count = 20_000
        writer.write(f"GET /v1/agents/alice/inbox?wait=60 HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {ALICE}\r\n\r\n".encode()
                     + tiny * (count - 1) + tiny[:-2] + CLOSE.encode() + b"\r\n")
        conn = await _connection(adapter)
        for _ in range(1000):  # until reading pauses: the queue is as long as it gets
            if conn._read_paused:
                break
            await asyncio.sleep(0.01)
        assert conn._read_paused
        assert len(conn._queue) <= QUEUE_MAX + PARSE_SLICE // len(tiny) + 1
        await adapter.send(Outbound(Address("api", "alice"), "wake", kind=OutboundKind.NOTICE))
        answers = await asyncio.wait_for(reader.read(), 60)
        writer.close()
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == count + 1
    assert b'"wake"' in answers.partition(b"HTTP/1.1 200 OK\r\n")[2].partition(b"HTTP/1.1")[0]


async def test_a_body_in_one_byte_chunks_is_held_in_about_its_size(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A 200 KB body sent as 1-byte chunks: the server's memory grows by about the body
    (kept in one buffer), not by an object per byte (some 8 MB)."""
    size = 200_000
    data = (CHUNKED_POST.format(target="/v1/messages", extra=CLOSE).encode()
            + b"1\r\na\r\n" * size + b"0\r\n\r\n")
    async with serving(redis, namespace, max_body_bytes=262_144,
                       body_timeout_seconds=60) as adapter:
        tracemalloc.start()
        try:
            answer, _ = await exchange(*_address(adapter), [data])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert peak < 4 * len(data)


async def test_a_malformed_trailer_after_the_answer_closes_at_once(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A chunked body the handler did not read (404) goes on, after the answer, into an
    endless trailer field: the connection closes once it is over the head's bound, not
    after ``header_timeout_seconds`` of dropping it (60 s here)."""
    async with serving(redis, namespace, header_timeout_seconds=60) as adapter:
        reader, writer = await asyncio.open_connection(*_address(adapter))
        writer.write(CHUNKED_POST.format(target="/nothing", extra="").encode() + b"1\r\na\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
        writer.write(b"0\r\nX-Trailer: " + b"a" * 200_000)
        rest = await asyncio.wait_for(reader.read(), 20)  # the server's FIN
        writer.close()
    assert rest.endswith(b'"404: Not Found"}}')


async def test_a_client_that_reads_no_answer_is_disconnected(
    redis: aioredis.Redis, namespace: str
) -> None:
    """Pipelined requests whose answers outgrow the socket buffers, never read: the
    connection is aborted ``header_timeout_seconds`` (1 s) after its answers stop
    draining (whether the server was still answering or closing after the last one)."""
    async with serving(redis, namespace) as adapter:
        assert adapter._server is not None
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, _address(adapter))
        _, writer = await asyncio.open_connection(sock=sock)
        tiny = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        writer.write(tiny * 100_000 + tiny[:-2] + CLOSE.encode() + b"\r\n")
        await _connection(adapter)
        for _ in range(3000):
            if not adapter._server.connections:
                break
            await asyncio.sleep(0.01)
        assert not adapter._server.connections
        writer.transport.abort()


async def test_stop_closes_idle_and_half_sent_connections(
    redis: aioredis.Redis, namespace: str
) -> None:
    """At stop, an idle keep-alive connection and one with half a head are closed at
    once (not after ``header_timeout_seconds``, 60 s here), and stop returns. (Waiting
    long-polls answered at stop: test_http_adapter.)"""
    async with serving(redis, namespace, header_timeout_seconds=60) as adapter:
        assert adapter._server is not None
        address = _address(adapter)
        idle_reader, idle = await asyncio.open_connection(*address)
        idle.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(idle_reader.readuntil(b'"ok"}'), 10)).startswith(
            b"HTTP/1.1 200 OK\r\n")
        half_reader, half = await asyncio.open_connection(*address)
        half.write(b"GET /healthz HTTP/1.1\r\nHo")
        # Until both are held and the half head is read (unread input would make the
        # close a reset).
        for _ in range(1000):
            conns = adapter._server.connections
            if len(conns) == 2 and any(c._in_head for c in conns):
                break
            await asyncio.sleep(0.01)
        await asyncio.wait_for(adapter.stop(), 30)
        rest = [await asyncio.wait_for(r.read(), 10) for r in (idle_reader, half_reader)]
        for writer in (idle, half):
            writer.close()
    assert rest == [b"", b""]


async def test_a_keep_alive_connection_is_answered_by_one_task_that_ends_with_it(
    redis: aioredis.Redis, namespace: str
) -> None:
    """The requests of one keep-alive connection are answered by one task, which waits
    between them (no task made per request) and ends when the connection does: closed
    by the client, or by the server once idle for ``header_timeout_seconds``."""
    async with serving(redis, namespace, header_timeout_seconds=1) as adapter:
        server = adapter._server
        assert server is not None
        address = _address(adapter)
        for ender in ("client", "idle"):
            reader, writer = await asyncio.open_connection(*address)
            tasks = []
            for _ in range(3):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = await asyncio.wait_for(reader.readuntil(b'"ok"}'), 10)
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
                tasks.append(set(server._tasks))
            assert len(tasks[0]) == 1 and tasks[0] == tasks[1] == tasks[2]
            [task] = tasks[0]
            if ender == "client":
                writer.close()
            else:  # the server closes it after a second of silence
                assert await asyncio.wait_for(reader.read(), 10) == b""
            await asyncio.wait_for(asyncio.shield(task), 10)
            assert not server._tasks and not server.connections
            writer.close()

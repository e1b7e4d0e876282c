"""The store's Redis client: the pool still blocks and hands over, timeouts still hold."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from test_state_helpers import ORIGIN, T0, request

from state import connection as conn
from state.records import Outcome
from state.settings import StateSettings
from state.store import ConversationStore

from servers import PrivateValkey

Client = Callable[..., aioredis.Redis]


@pytest.fixture
async def client_of(redis_url: str) -> AsyncIterator[Client]:
    """Clients on the store's own pool class, with the options a test needs."""
    made: list[aioredis.Redis] = []

    def make(**options: object) -> aioredis.Redis:
        pool = conn._Pool.from_url(redis_url, decode_responses=True, **options)
        pool.connection_class = conn._Connection
        client: aioredis.Redis = aioredis.Redis.from_pool(pool)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def test_open_redis_uses_the_fast_pool(redis_url: str) -> None:
    handle = await conn.open_redis(StateSettings(redis_url=redis_url))
    try:
        pool = handle.client.connection_pool
        assert isinstance(pool, conn._Pool) and pool.connection_class is conn._Connection
        assert pool.max_connections == conn.POOL_MAX_CONNECTIONS
        assert await handle.client.ping()
    finally:
        await handle.close()


async def test_callers_beyond_the_pool_wait_and_all_get_served(
        client_of: Client, namespace: str) -> None:
    client = client_of(max_connections=2, timeout=10)
    key = namespace + ":list"

    async def blocked(i: int) -> object:
        # Each BLPOP holds its connection 50 ms; 12 of them need the 2 connections in turn.
        return await client.blpop([f"{key}:{i}"], timeout=0.05)

    assert await asyncio.gather(*(blocked(i) for i in range(12))) == [None] * 12
    pool = client.connection_pool
    assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 2
    await asyncio.gather(*(client.ping() for _ in range(50)))  # the quick path, then waits
    assert len(pool._available_connections) == 2


async def test_exhausted_pool_still_times_out(client_of: Client, namespace: str) -> None:
    client = client_of(max_connections=1, timeout=0.2)
    holder = asyncio.create_task(client.blpop([namespace + ":held"], timeout=1))
    await asyncio.sleep(0.05)
    with pytest.raises(RedisConnectionError, match="No connection available"):
        await client.ping()
    assert await holder is None
    assert await client.ping()  # the connection came back to the pool


async def test_reads_keep_their_timeout_and_big_commands_go_through(
        client_of: Client, namespace: str) -> None:
    client = client_of(max_connections=4, socket_timeout=0.2)
    big = "x" * (1 << 18)  # beyond the transport's high-water mark: redis-py's own send
    await client.set(namespace + ":big", big)
    assert await client.get(namespace + ":big") == big
    with pytest.raises(RedisTimeoutError):
        await client.blpop([namespace + ":never"], timeout=1)
    assert await client.ping()
    await client.delete(namespace + ":big")


async def test_without_the_private_attributes_it_takes_redis_py_own_paths(
        client_of: Client, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # As with a redis-py release that renamed what the fast paths read (with them, this
    # test sees about one slow get per connection, not one per command).
    monkeypatch.setattr(conn, "POOL_PRIVATE_ATTRS", (*conn.POOL_PRIVATE_ATTRS, "_gone"))
    monkeypatch.setattr(conn, "WRITER_ATTR", "_gone")
    slow: list[str] = []
    get, release = aioredis.BlockingConnectionPool.get_connection, \
        aioredis.BlockingConnectionPool.release

    async def counted_get(self: object, *args: object, **kw: object) -> object:
        slow.append("get")
        return await get(self, *args, **kw)  # type: ignore[arg-type]

    async def counted_release(self: object, connection: object) -> None:
        slow.append("release")
        await release(self, connection)  # type: ignore[arg-type]

    monkeypatch.setattr(aioredis.BlockingConnectionPool, "get_connection", counted_get)
    monkeypatch.setattr(aioredis.BlockingConnectionPool, "release", counted_release)
    client = client_of(max_connections=2, timeout=0.2, socket_timeout=0.2)
    key = namespace + ":fallback"
    await asyncio.gather(*(client.rpush(key, str(i)) for i in range(20)))
    assert await client.llen(key) == 20
    assert slow.count("get") == slow.count("release") >= 21  # every command, the slow way
    with pytest.raises(RedisTimeoutError):  # reads keep their timeout
        await client.blpop([namespace + ":never"], timeout=1)
    await client.delete(key)


async def test_a_lane_keeps_its_connection_and_answers_as_the_client_does(
        client_of: Client, namespace: str) -> None:
    client = client_of(max_connections=4)
    pool = client.connection_pool
    lane = conn.Lane(pool)
    stream, text, n = namespace + ":s", namespace + ":text", namespace + ":n"
    await client.xadd(stream, {"m": "1"})
    await client.set(text, "not a number")
    kept = await lane.client_id()
    assert await lane.client_id() == kept != await client.client_id()  # kept, not given back
    assert len(pool._in_use_connections) == 1 and len(pool._available_connections) == 1
    # Replies parsed as the client parses them; an error reply raised, the lane still in step.
    assert await lane.xread({stream: "0"}) == await client.xread({stream: "0"})
    with pytest.raises(ResponseError):
        await lane.incr(text)
    assert await lane.incr(n) == 1
    # A pipeline without a transaction: every reply read, an error reply in its place.
    replies = await lane.pipelined([("INCR", n), ("INCR", text), ("GET", n)],
                                   raise_on_error=False)
    assert replies[0] == 2 and isinstance(replies[1], ResponseError) and replies[2] == "2"
    with pytest.raises(ResponseError):
        await lane.pipelined([("INCR", text), ("INCR", n)])
    assert await lane.get(n) == "3"
    await lane.aclose()
    assert len(pool._in_use_connections) == 0 and len(pool._available_connections) == 2
    await client.delete(stream, text, n)


async def test_a_lane_with_more_callers_than_connections_serves_them_all(
        client_of: Client, namespace: str) -> None:
    # A blocking client's lane keeps every connection of its pool; callers beyond them
    # wait for the pool, so a connection coming back goes to them, not to the lane.
    reader = conn.blocking_client(client_of(), 1.0, 2)
    try:
        async with asyncio.timeout(30):  # a caller left waiting for ever would hang here
            blocked = [reader.blpop([f"{namespace}:list:{i}"], timeout=0.05)
                       for i in range(12)]
            assert await asyncio.gather(*blocked) == [None] * 12
        assert len(reader.connection_pool._in_use_connections) == 2  # kept for next time
    finally:
        await reader.aclose()


def test_commands_are_packed_exactly_as_redis_py_packs_them() -> None:
    ours = conn._Connection()
    theirs = aioredis.Connection()
    for args in [("SET", "k", "é", 3, 1.5, b"\x00raw"), ("CONFIG GET", "maxmemory"),
                 (b"CLIENT SETNAME", "x"), ("EVALSHA", "a" * 40, 2, "{n}:c:1", "{n}:o:1", "[1]"),
                 ("SET", "k", memoryview(b"view"))]:
        assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", True)


async def test_embedded_server_is_shared_only_with_its_own_folder(tmp_path: Path) -> None:
    mine = StateSettings(redis_url="embedded", data_dir=tmp_path / "mine")
    other = StateSettings(redis_url="embedded", data_dir=tmp_path / "other")
    first = await conn.open_redis(other)
    try:
        await first.client.set("owner", "other")
        # "mine" remembers a port that the other folder's server now holds.
        port_file = tmp_path / "mine" / "valkey" / "port"
        port_file.parent.mkdir(parents=True)
        port_file.write_text((tmp_path / "other" / "valkey" / "port").read_text())
        handle = await conn.open_redis(mine)
        try:
            assert handle.url != first.url and handle.server is not None
            assert await handle.client.get("owner") is None
        finally:
            await handle.close()
        # A second process of the other folder does share its running server.
        again = await conn.open_redis(other)
        try:
            assert again.url == first.url and again.server is None
            assert await again.client.get("owner") == "other"
        finally:
            await again.close()
    finally:
        await first.close()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
async def test_embedded_server_starts_with_the_malloc_settings(tmp_path: Path) -> None:
    if "GLIBC_TUNABLES" in os.environ:
        pytest.skip("a GLIBC_TUNABLES of the user's own is kept, not ours")
    handle = await conn.open_redis(StateSettings(redis_url="embedded", data_dir=tmp_path))
    try:
        pid = (await handle.client.info("server"))["process_id"]
        environ = (await asyncio.to_thread(Path(f"/proc/{pid}/environ").read_bytes)).split(b"\0")
        assert f"GLIBC_TUNABLES={conn.VALKEY_MALLOC_TUNABLES}".encode() in environ
        assert "GLIBC_TUNABLES" not in os.environ  # set for the start only
    finally:
        await handle.close()


async def test_embedded_server_keeps_sorted_sets_compact_up_to_32(tmp_path: Path) -> None:
    # The store's indices grow at their end: a listpack walked on every ZADD costs more
    # than the other encoding well before the server's default of 128 members.
    handle = await conn.open_redis(StateSettings(redis_url="embedded", data_dir=tmp_path))
    try:
        client = handle.client
        assert await client.config_get("zset-max-listpack-entries") == {
            "zset-max-listpack-entries": "32"}
        await client.zadd("z", {f"m{i}": 1700000000.5 + i for i in range(32)})
        assert await client.object("encoding", "z") == "listpack"
        await client.zadd("z", {"m32": 1700000032.5})
        assert await client.object("encoding", "z") == "skiplist"
    finally:
        await handle.close()


async def test_unreadable_port_file_starts_a_fresh_server(tmp_path: Path) -> None:
    port_file = tmp_path / "valkey" / "port"
    port_file.parent.mkdir(parents=True)
    port_file.write_text("not a port\n")
    handle = await conn.open_redis(StateSettings(redis_url="embedded", data_dir=tmp_path))
    try:
        assert await handle.client.ping()
        assert port_file.read_text().strip().isdigit()
    finally:
        await handle.close()


async def test_after_a_server_restart_stale_connections_are_retried_once(
        namespace: str) -> None:
    server = PrivateValkey().start()
    try:
        settings = StateSettings(redis_url=server.url, namespace=namespace)
        handle = await conn.open_redis(settings)
        client = handle.client
        try:
            store = ConversationStore(client, settings)
            await store.apply(request("before"), ORIGIN, now=T0)
            lane = conn.Lane(client.connection_pool)
            assert await lane.ping()
            # Fill the pool with idle connections, then restart the server under them.
            await asyncio.gather(*(client.blpop([f"warm:{i}"], timeout=0.05) for i in range(8)))
            assert len(client.connection_pool._available_connections) == 8
            server.stop()
            server.start()
            # Every call finds a dead connection and succeeds on a fresh one: plain
            # commands, a pipeline, and a store script (loaded again after the restart).
            replies = await asyncio.gather(*(client.set(f"{namespace}:k{i}", i)
                                             for i in range(6)))
            assert replies == [True] * 6
            async with client.pipeline(transaction=False) as pipe:
                pipe.incr(f"{namespace}:n")
                pipe.get(f"{namespace}:k0")
                assert await pipe.execute() == [1, "0"]
            assert await lane.pipelined([("INCR", f"{namespace}:n"), ("GET", f"{namespace}:k1")]
                                        ) == [2, "1"]
            applied = await store.apply(request("after"), ORIGIN, now=T0)
            assert applied.outcome is Outcome.APPLIED
        finally:
            await handle.close()
    finally:
        server.close()


async def test_a_frozen_server_times_commands_out_once_and_blocking_reads_keep_their_block(
        namespace: str) -> None:
    server = PrivateValkey().start()
    try:
        settings = StateSettings(redis_url=server.url, namespace=namespace,
                                 command_timeout_seconds=0.3)
        handle = await conn.open_redis(settings)
        client = handle.client
        reader = conn.blocking_client(client, 1.0, 1)
        lane = conn.Lane(client.connection_pool)
        try:
            # A block longer than the command timeout is not cut: it ends empty.
            assert await reader.xread({f"{namespace}:s": "$"}, block=1000) == []
            assert await lane.ping()  # each has its connection before the freeze
            pid = int((await client.info("server"))["process_id"])
            os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(RedisTimeoutError):
                    await client.incr(f"{namespace}:n")
                # A lane's too, and one up to the high-water mark, whose send is not timed
                # (it never waits).
                with pytest.raises(RedisTimeoutError):
                    await lane.set(f"{namespace}:big", "x" * 60_000)
            finally:
                os.kill(pid, signal.SIGCONT)
            # The timed-out commands ran after the freeze, and only once each: a timeout
            # is never sent again (it may have run), unlike a stale connection.
            assert await client.get(f"{namespace}:n") == "1"
            assert await client.strlen(f"{namespace}:big") == 60_000
        finally:
            await reader.aclose()
            await handle.close()
    finally:
        server.close()

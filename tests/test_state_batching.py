"""ScriptBatcher: concurrent script calls share round trips without changing results."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from state.batching import ScriptBatcher

from servers import PrivateValkey

# Appends ARGV[1] to a list and returns the list's length; 'bad' is a script error.
SCRIPT = """
if ARGV[1] == 'bad' then return redis.error_reply('bad argument') end
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""


@pytest.fixture
async def private_redis() -> AsyncIterator[tuple[PrivateValkey, aioredis.Redis]]:
    server = PrivateValkey().start()
    client: aioredis.Redis = aioredis.from_url(server.url, decode_responses=True)
    try:
        yield server, client
    finally:
        await client.aclose()
        server.close()


async def test_concurrent_calls_each_run_once_with_their_own_reply(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    batcher = ScriptBatcher(redis_client, redis_client.register_script(SCRIPT))
    key = f"{namespace}:list"
    replies = await asyncio.gather(*(batcher(keys=[key], args=[str(i)]) for i in range(300)))
    # Every call ran exactly once and got its own reply (more than one batch's worth, so
    # several pipelines were in flight at once).
    assert sorted(replies) == list(range(1, 301))
    stored = await redis_client.lrange(key, 0, -1)
    assert sorted(stored) == sorted(str(i).encode() for i in range(300))
    # Each caller got the length right after its own push.
    assert all(stored[n - 1] == str(i).encode() for i, n in enumerate(replies))
    # A lone call (nothing else pending) goes on its own and still works.
    assert await batcher(keys=[key], args=["last"]) == 301


async def test_one_failing_call_does_not_fail_the_others(
    redis_client: aioredis.Redis, namespace: str
) -> None:
    batcher = ScriptBatcher(redis_client, redis_client.register_script(SCRIPT))
    key = f"{namespace}:list"
    results = await asyncio.gather(
        batcher(keys=[key], args=["a"]),
        batcher(keys=[key], args=["bad"]),
        batcher(keys=[key], args=["b"]),
        return_exceptions=True,
    )
    # Concurrent calls may run in either order; both ran once.
    assert sorted([results[0], results[2]]) == [1, 2]  # type: ignore[type-var]
    assert isinstance(results[1], ResponseError) and "bad argument" in str(results[1])


async def test_scripts_are_reloaded_after_a_flush(
    private_redis: tuple[PrivateValkey, aioredis.Redis],
) -> None:
    _, client = private_redis
    batcher = ScriptBatcher(client, client.register_script(SCRIPT))
    replies = await asyncio.gather(*(batcher(keys=["k"], args=[str(i)]) for i in range(5)))
    assert sorted(replies) == [1, 2, 3, 4, 5]
    await client.script_flush()  # as after a server restart without persistence
    replies = await asyncio.gather(*(batcher(keys=["k"], args=[str(i)]) for i in range(5)))
    assert sorted(replies) == [6, 7, 8, 9, 10]


# Returns ARGV[1] as it came ('bad' is a script error).
ECHO_SCRIPT = """
if ARGV[1] == 'bad' then return redis.error_reply('bad argument') end
return ARGV[1]
"""


async def test_undecoded_replies_are_bytes_alone_batched_and_after_a_flush(
    private_redis: tuple[PrivateValkey, aioredis.Redis],
) -> None:
    _, client = private_redis  # (a client that decodes replies)
    batcher = ScriptBatcher(client, client.register_script(ECHO_SCRIPT), decode=False)
    assert await batcher(keys=[], args=["→ alone"]) == "→ alone".encode()
    results = await asyncio.gather(
        *(batcher(keys=[], args=[v]) for v in ("a", "bad", "→")), return_exceptions=True)
    assert results[0] == b"a" and results[2] == "→".encode()
    assert isinstance(results[1], ResponseError) and "bad argument" in str(results[1])
    await client.script_flush()  # NOSCRIPT is still told apart: loaded and run again
    assert await asyncio.gather(batcher(keys=[], args=["x"]),
                                batcher(keys=[], args=["y"])) == [b"x", b"y"]
    assert await batcher(keys=[], args=["z"]) == b"z"
    # The client's own replies are still decoded.
    assert await client.echo("→") == "→"


async def test_a_dead_server_fails_every_waiting_caller(
    private_redis: tuple[PrivateValkey, aioredis.Redis],
) -> None:
    server, client = private_redis
    batcher = ScriptBatcher(client, client.register_script(SCRIPT))
    assert await batcher(keys=["k"], args=["x"]) == 1
    server.stop()
    results = await asyncio.gather(
        *(batcher(keys=["k"], args=[str(i)]) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, (RedisConnectionError, OSError)) for r in results), results


# A batch script: ARGV[1] a prefix, then one value per call (KEYS[i] its list); one reply
# per call; 'bad' fails its own call only.
BATCH_SCRIPT = """
local out = {}
for i = 2, #ARGV do
  if ARGV[i] == 'bad' then
    out[#out + 1] = redis.error_reply('bad argument')
  else
    out[#out + 1] = redis.call('RPUSH', KEYS[i - 1], ARGV[1] .. ARGV[i])
  end
end
return out
"""


async def test_merged_calls_run_as_one_script_call_each_with_its_reply(
    private_redis: tuple[PrivateValkey, aioredis.Redis],
) -> None:
    _, client = private_redis
    batcher = ScriptBatcher(client, client.register_script(BATCH_SCRIPT), merged_head=["p-"])
    assert await batcher(keys=["k"], args=["0"]) == 1  # alone: a batch of one
    results = await asyncio.gather(
        *(batcher(keys=["k"], args=[str(i)]) for i in range(1, 300)),
        batcher(keys=["k"], args=["bad"]),
        return_exceptions=True,
    )
    assert isinstance(results[-1], ResponseError) and "bad argument" in str(results[-1])
    assert sorted(results[:-1]) == list(range(2, 301))  # type: ignore[type-var]
    assert sorted(await client.lrange("k", 0, -1)) == sorted(f"p-{i}" for i in range(300))
    stats = await client.info("commandstats")
    evalsha = int(stats["cmdstat_evalsha"]["calls"])
    # 301 calls in a handful of script calls (the loop may split them, never one each).
    assert evalsha <= 10, evalsha
    # In order, max_batch calls per script call, for bulk work.
    replies = await batcher.many([(["m"], [str(i)]) for i in range(600)])
    assert replies == list(range(1, 601))
    assert await client.lrange("m", 0, 2) == ["p-0", "p-1", "p-2"]



async def test_with_one_send_in_flight_the_calls_made_meanwhile_go_as_one_batch(
    private_redis: tuple[PrivateValkey, aioredis.Redis],
) -> None:
    _, client = private_redis
    batcher = ScriptBatcher(client, client.register_script(BATCH_SCRIPT), merged_head=["p-"],
                            max_in_flight=1)
    first = asyncio.ensure_future(batcher(keys=["k"], args=["0"]))  # goes alone, at once
    await asyncio.sleep(0)
    # Made over several loop iterations while the first is out: they wait for it.
    rest = []
    for i in range(1, 40):
        rest.append(asyncio.ensure_future(batcher(keys=["k"], args=[str(i)])))
        if i % 10 == 0:
            await asyncio.sleep(0)
    assert await first == 1
    assert sorted(await asyncio.gather(*rest)) == list(range(2, 41))
    stats = await client.info("commandstats")
    # The first call, then the 39 in one script call, or in very few if the first
    # returned while they were still being made.
    assert int(stats["cmdstat_evalsha"]["calls"]) <= 3, stats["cmdstat_evalsha"]
    assert await batcher(keys=["k"], args=["last"]) == 41  # idle again: at once

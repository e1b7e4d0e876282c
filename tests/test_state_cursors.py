"""Catch-up cursors on real Redis: monotonic compare-and-set, bounds, key layout; and the
CommitWindow that turns out-of-order commits into a cursor."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.base import CommitWindow
from state.cursors import CursorLimitError, CursorStore, order_key
from state.keys import hash_tag, tagged_key


async def test_cursor_moves_forward_only(redis_client: Any, namespace: str) -> None:
    cursors = CursorStore(redis_client, namespace).for_transport("tg")
    assert await cursors.get("chat-1") is None
    assert await cursors.advance("chat-1", "100") is True
    assert await cursors.advance("chat-1", "99") is False  # older: never moves back
    assert await cursors.advance("chat-1", "100") is False  # same: unchanged
    assert await cursors.advance("chat-1", "1000") is True  # longer number is newer
    assert await cursors.get("chat-1") == "1000"


async def test_snowflakes_beyond_double_precision_and_slack_ts(
    redis_client: Any, namespace: str
) -> None:
    cursors = CursorStore(redis_client, namespace).for_transport("discord")
    # 2**60 + 1 and 2**60 are the same double: compared as numbers they would be equal.
    assert await cursors.advance("c", str(2**60))
    assert await cursors.advance("c", str(2**60 + 1))
    assert not await cursors.advance("c", str(2**60))
    assert await cursors.get("c") == str(2**60 + 1)
    slack = CursorStore(redis_client, namespace).for_transport("slack")
    assert await slack.advance("C1", "1700000000.000100")
    assert await slack.advance("C1", "1700000000.000101")
    assert not await slack.advance("C1", "1699999999.999999")
    assert await slack.get("C1") == "1700000000.000101"


async def test_opaque_ids_compare_bytewise(redis_client: Any, namespace: str) -> None:
    cursors = CursorStore(redis_client, namespace).for_transport("ainet")
    assert await cursors.advance("inbox", "2026-12-01T10:00:00Z-a.md")
    assert not await cursors.advance("inbox", "2026-11-30T23:59:59Z-z.md")
    # Non-ASCII bytes sort by byte value whatever the server's locale.
    assert await cursors.advance("inbox", "2026-12-01T10:00:00Z-é.md")
    assert await cursors.get("inbox") == "2026-12-01T10:00:00Z-é.md"


async def test_concurrent_advances_end_at_the_newest(redis_client: Any, namespace: str) -> None:
    store = CursorStore(redis_client, namespace)
    ids = [str(n) for n in range(1, 301)]
    random.Random(7).shuffle(ids)
    # Two "replicas" (separate handles on the same store) race on one channel.
    a, b = store.for_transport("mq9"), store.for_transport("mq9")
    results: list[bool] = []
    for start in range(0, len(ids), 30):  # 30 in flight at a time (the client's pool)
        chunk = enumerate(ids[start : start + 30])
        results += await asyncio.gather(*((a if i % 2 else b).advance("box", n) for i, n in chunk))
    assert await a.get("box") == "300"
    assert 1 <= sum(results) <= 300


async def test_channels_per_transport_are_bounded(redis_client: Any, namespace: str) -> None:
    store = CursorStore(redis_client, namespace, max_channels=3)
    cursors = store.for_transport("tg")
    for channel in ("a", "b", "c"):
        assert await cursors.advance(channel, "1")
    with pytest.raises(CursorLimitError, match="3 channels"):
        await cursors.advance("d", "1")
    assert await cursors.advance("a", "2")  # known channels still advance
    await cursors.forget("b")
    assert await cursors.advance("d", "1")
    assert await cursors.all() == {"a": "2", "c": "1", "d": "1"}
    # Another transport has its own bound.
    assert await store.for_transport("other").advance("x", "1")


async def test_bad_ids_are_refused(redis_client: Any, namespace: str) -> None:
    cursors = CursorStore(redis_client, namespace).for_transport("tg")
    with pytest.raises(ValueError, match="native id"):
        await cursors.advance("c", "")
    with pytest.raises(ValueError, match="channel"):
        await cursors.advance("x" * 600, "1")


async def test_keys_are_hash_tagged_per_transport(redis_client: Any, namespace: str) -> None:
    store = CursorStore(redis_client, namespace)
    await store.for_transport("discord").advance("c", "1")
    await store.for_transport("bad}{name").advance("c", "1")
    keys = sorted([k.decode() async for k in redis_client.scan_iter(match=f"{namespace}:cur:*")])
    assert keys == sorted(
        [f"{namespace}:cur:{{discord}}", tagged_key(namespace, "cur", "bad}{name")]
    )
    tag = hash_tag("bad}{name")
    assert "{" not in tag and "}" not in tag and tag != hash_tag("bad}{name2")


@given(st.integers(min_value=0, max_value=10**30), st.integers(min_value=0, max_value=10**30))
def test_order_key_orders_numbers(a: int, b: int) -> None:
    ka, kb = order_key(str(a)).encode(), order_key(str(b)).encode()
    assert (ka < kb) == (a < b)
    assert order_key("007") == order_key("7")


def test_commit_window_advances_over_the_committed_prefix() -> None:
    window = CommitWindow(limit=3)
    for native_id in ("1", "2", "3"):
        window.track(native_id)
    assert window.commit("2") is None  # 1 is still in flight
    assert window.commit("1") == "2"  # 1 and 2 are done
    assert window.commit("unknown") is None
    window.track("4")
    window.track("5")
    with pytest.raises(OverflowError):
        window.track("6")
    assert window.commit("4") is None  # 3 holds the cursor back
    assert window.commit("3") == "4"
    assert len(window) == 1

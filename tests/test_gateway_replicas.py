"""Several gateways on one Redis, in one process: each inbound native message is processed
once, and a transport learns when an envelope is committed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from adapters.base import Disposition, OutboundKind
from gateway.app import Gateway
from protocol import build_request, render
from state.inbound import InboundClaims

from gwkit import make_config, memory, running, sent_to


async def _both(redis_url: str, namespace: str, tmp_path: Path) -> tuple[Gateway, Gateway]:
    first = Gateway(make_config(redis_url, namespace, tmp_path / "a"))
    second = Gateway(make_config(redis_url, namespace, tmp_path / "b"))
    await first.start()
    await second.start()
    return first, second


async def test_a_native_message_seen_by_two_replicas_is_processed_once(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    first, second = await _both(redis_url, namespace, tmp_path)
    try:
        outcomes = []
        for n in range(20):
            text = render(build_request(sender="Lotbot", to="Mantis", task=f"job {n}"))
            # Both replicas are connected to the channel and get the same native message,
            # at the same moment.
            got = await asyncio.gather(
                memory(first, "chat").inject(text, author_id="u-lot", native_id=f"m-{n}"),
                memory(second, "chat").inject(text, author_id="u-lot", native_id=f"m-{n}"),
            )
            outcomes.append(sorted(d.outcome for d in got))
        for pair in outcomes:
            assert pair[0] == "accepted" and pair[1] in ("busy", "duplicate"), outcomes
        for gw in (first, second):  # the replica holding the outbox lease delivers
            await gw.drain()
        relayed = [
            o
            for gw in (first, second)
            for o in sent_to(memory(gw, "side"), "mantis-room", OutboundKind.PROTOCOL)
        ]
        assert len(relayed) == 20  # each message relayed once, by one replica
        # Later, a platform redelivering one of them: remembered as processed.
        text = render(build_request(sender="Lotbot", to="Mantis", task="job 3"))
        again = await memory(second, "chat").inject(text, author_id="u-lot", native_id="m-3")
        assert again.outcome == "duplicate" and again.committed
    finally:
        await second.stop()
        await first.stop()


async def test_commit_hook_runs_only_for_committed_envelopes(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with running(make_config(redis_url, namespace, tmp_path)) as gw:
        chat = memory(gw, "chat")
        acked: list[tuple[str, str]] = []

        def hook(native_id: str) -> Any:
            async def on_commit(disposition: Disposition) -> None:
                acked.append((native_id, disposition.outcome))

            return on_commit

        text = render(build_request(sender="Lotbot", to="Mantis", task="x"))
        d = await chat.inject(text, author_id="u-lot", native_id="n-1", on_commit=hook("n-1"))
        assert d.outcome == "accepted" and acked == [("n-1", "accepted")]
        # Ordinary chat and refusals are committed too: the platform need not bring them back.
        await chat.inject("hello", author_id="u-lot", native_id="n-2", on_commit=hook("n-2"))
        assert acked[-1] == ("n-2", "ignored")
        # Another replica is processing n-3 right now: not committed here, no ack; the
        # claim is left to its holder.
        claims = InboundClaims(redis_client, namespace, processing_seconds=60, done_seconds=60)
        key = claims.key("chat", "main", "n-3")
        assert await claims.claim_many([key]) == ["new"]
        busy = await chat.inject(text, author_id="u-lot", native_id="n-3", on_commit=hook("n-3"))
        assert busy.outcome == "busy" and not busy.committed
        assert [a for a in acked if a[0] == "n-3"] == []
        assert await redis_client.get(key) == b"p"
        # Its holder finished: now a redelivery is a committed duplicate.
        await claims.settle([key], [])
        dup = await chat.inject(text, author_id="u-lot", native_id="n-3", on_commit=hook("n-3"))
        assert dup.outcome == "duplicate" and acked[-1] == ("n-3", "duplicate")


async def test_a_failing_commit_hook_does_not_fail_the_message(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with running(make_config(redis_url, namespace, tmp_path)) as gw:

        async def broken(_d: Disposition) -> None:
            raise RuntimeError("platform ack failed")

        text = render(build_request(sender="Lotbot", to="Mantis", task="y"))
        d = await memory(gw, "chat").inject(text, author_id="u-lot", on_commit=broken)
        assert d.outcome == "accepted"
        assert len(sent_to(memory(gw, "side"), "mantis-room", OutboundKind.PROTOCOL)) == 1


async def test_cursors_are_shared_through_the_sink(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    first, second = await _both(redis_url, namespace, tmp_path)
    try:
        assert await first.cursors("chat").advance("main", "41")
        assert await second.cursors("chat").get("main") == "41"
        assert not await second.cursors("chat").advance("main", "40")
    finally:
        await second.stop()
        await first.stop()


def _solo_config(redis_url: str, namespace: str, data_dir: Path) -> Any:
    return make_config(
        redis_url,
        namespace,
        data_dir,
        gateway={"adapter_modules": ["lease_kit"]},
        replicas={"lease_seconds": 1},
        transports={"chat": {"kind": "memory"}, "side": {"kind": "memory"}, "solo": {}},
    )


async def _until(predicate: Any, within: float) -> float:
    """Seconds until ``predicate()`` held (raises after ``within`` seconds)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - adapter health has no event to wait on
            await asyncio.sleep(0.02)
    return loop.time() - began


async def test_single_connection_transport_runs_on_one_replica_and_moves(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    first = Gateway(_solo_config(redis_url, namespace, tmp_path / "a"))
    second = Gateway(_solo_config(redis_url, namespace, tmp_path / "b"))
    await first.start()
    await second.start()
    gateways = [first, second]
    try:

        def states() -> list[str]:
            return [str(g.adapters["solo"].health().state) for g in gateways]

        # Generous bounds: a loaded machine may take seconds to start either replica.
        await _until(lambda: sorted(states()) == ["standby", "up"], 20)
        for _ in range(20):  # a few lease periods: never both
            assert sorted(states()) == ["standby", "up"], states()
            await asyncio.sleep(0.1)
        holder = gateways[states().index("up")]
        other = second if holder is first else first
        assert other.health()["status"] == "ok"  # standby is healthy
        epoch = holder.leases["solo"].epoch
        await holder.stop()  # a clean stop releases the lease
        await _until(lambda: other.adapters["solo"].health().state == "up", 20)
        assert other.leases["solo"].epoch > epoch
    finally:
        await second.stop()
        await first.stop()


async def test_the_pair_budget_is_shared_by_replicas(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    budget = {"pair_budget_messages": 4, "pair_cooldown_seconds": 60}
    first = Gateway(make_config(redis_url, namespace, tmp_path / "a", policy=budget))
    second = Gateway(make_config(redis_url, namespace, tmp_path / "b", policy=budget))
    await first.start()
    await second.start()
    try:
        texts = [
            render(build_request(sender="Lotbot", to="Mantis", task=f"ping {n}"))
            for n in range(8)
        ]
        outcomes = []
        for n, text in enumerate(texts):  # alternating replicas, as a load balancer would
            gw = (first, second)[n % 2]
            d = await memory(gw, "chat").inject(text, author_id="u-lot", native_id=f"b-{n}")
            outcomes.append((d.outcome, d.detail.split(":")[0]))
        # The 5th message across both replicas is refused, and every one after it.
        assert [o for o, _ in outcomes] == ["accepted"] * 4 + ["rejected"] * 4
        assert {why for _, why in outcomes[4:]} == {"loop"}
        # A retry of an accepted message on the other replica is a duplicate, not a loop.
        again = await memory(second, "chat").inject(texts[0], author_id="u-lot", native_id="b-r")
        assert again.outcome == "duplicate"
        for gw in (first, second):
            await gw.drain()
        notices = [
            o
            for gw in (first, second)
            for o in sent_to(memory(gw, "chat"), "main", OutboundKind.NOTICE)
            if "exceeded 4 messages" in o.text
        ]
        assert len(notices) == 1  # one notice for the trip, from whichever replica delivers
        relayed = [
            o
            for gw in (first, second)
            for o in sent_to(memory(gw, "side"), "mantis-room", OutboundKind.PROTOCOL)
        ]
        assert len(relayed) == 4
    finally:
        await second.stop()
        await first.stop()

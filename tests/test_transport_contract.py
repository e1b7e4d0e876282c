"""The shared transport contract: every transport, its real library, its emulator.

Parametrized over the harnesses in ``tests/harness_*.py`` (see tests/contract_harness.py
for how to add one). Each check runs a real gateway on real Redis with the transport under
test as ``t``: long output is split without breaking a block and reads back whole, the
gateway's own posts and relayed copies are dropped, a refusal with retry-after reaches the
outbox, ``stop()`` twice is safe, and health moves through starting -> up -> down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from adapters.base import (
    Address,
    Disposition,
    Envelope,
    HealthState,
    Outbound,
    OutboundKind,
    create_adapter,
)
from gateway.app import Gateway
from gateway.outbox import Item, destination, journal_entry
from protocol import build_request, build_response, parse, render

from contract_harness import TRANSPORT, Harness, load_harnesses
from gwkit import make_config, memory

pytestmark = pytest.mark.asyncio

HARNESSES = load_harnesses()
WAIT = 5.0


class RecordingGateway(Gateway):
    """The real gateway, remembering every envelope it handled and its disposition."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[tuple[Envelope, Disposition]] = []
        self._recorded: set[int] = set()  # ids of the envelopes in handled (kept alive there)
        self._changed = asyncio.Condition()

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        disposition = await super().on_envelope(envelope)
        if id(envelope) not in self._recorded:  # else it went through on_envelopes
            await self._record([envelope], [disposition])
        return disposition

    async def on_envelopes(self, envelopes: Sequence[Envelope], *, ordered: bool = True
                           ) -> list[Disposition]:
        dispositions = await super().on_envelopes(envelopes, ordered=ordered)
        await self._record(envelopes, dispositions)
        return dispositions

    async def _record(self, envelopes: Sequence[Envelope], dispositions: list[Disposition]
                      ) -> None:
        async with self._changed:
            self.handled.extend(zip(envelopes, dispositions, strict=True))
            self._recorded.update(id(e) for e in envelopes)
            self._changed.notify_all()

    async def wait_handled(
        self, count: int, where: Callable[[Envelope], bool] = lambda e: True
    ) -> list[tuple[Envelope, Disposition]]:
        """The envelopes of transport ``t`` matching ``where``, once there are ``count``."""
        async with asyncio.timeout(WAIT), self._changed:
            while len(mine := self.of_t(where)) < count:
                await self._changed.wait()
            return mine

    def of_t(
        self, where: Callable[[Envelope], bool] = lambda e: True
    ) -> list[tuple[Envelope, Disposition]]:
        return [(e, d) for e, d in self.handled if e.transport == TRANSPORT and where(e)]


@dataclass
class Env:
    harness: Harness
    gateway: RecordingGateway
    redis_url: str
    namespace: str
    extra: list[Any] = field(default_factory=list)

    @property
    def adapter(self) -> Any:
        return self.gateway.adapters[TRANSPORT]


@pytest.fixture(params=sorted(HARNESSES))
async def env(
    request: pytest.FixtureRequest,
    redis_url: str,
    redis_client: aioredis.Redis,
    namespace: str,
    tmp_path: Path,
) -> AsyncIterator[Env]:
    async with HARNESSES[request.param]() as harness:
        peer = harness.peer_agent()
        config = make_config(
            redis_url,
            namespace,
            tmp_path,
            transports={TRANSPORT: {"kind": harness.kind, **harness.options()}},
            agents={"Peer": peer} if peer else {},
            outbox={"backoff_base_seconds": 0.05, "backoff_max_seconds": 0.2},
            replicas={"lease_seconds": 2},
        )
        gateway = RecordingGateway(config)
        await gateway.start()
        state = Env(harness, gateway, redis_url, namespace)
        try:
            await harness.connected(gateway)
            yield state
        finally:
            await gateway.stop()
            for client in state.extra:
                await client.aclose()


def blocks_of(text: str) -> list[str]:
    """Every protocol block of ``text``, rendered (so equal blocks compare equal)."""
    return [render(m) for m in parse(text).messages]


def long_output(max_length: int | None) -> str:
    """Prose and blocks: one block too long for a message, several that fit, many lines."""
    size = max_length or 2000
    parts = ["Here is the answer, in several parts."]
    for n in range(4):
        parts.append(
            render(
                build_response(
                    sender="Peer",
                    to="Mantis",
                    request_id=f"peer-split{n}",
                    status="success",
                    result="\n".join(
                        f"line {i} of part {n}: " + "x" * 40 for i in range(size // 60)
                    ),
                )
            )
        )
        parts.append(f"That was part {n}.")
    parts.append(
        render(
            build_response(
                sender="Peer", to="Mantis", request_id="peer-huge", status="success",
                result="y" * (size * 3),
            )
        )
    )
    return "\n".join(parts)


async def test_splitting_keeps_blocks_whole_and_reads_back_whole(env: Env) -> None:
    h = env.harness
    text = long_output(h.max_length)
    wanted = blocks_of(text)
    assert len(wanted) == 5
    receipt = await env.adapter.send(Outbound(Address(TRANSPORT, h.channel), text))
    posted = await h.posted()
    assert len(receipt.native_ids) == len(posted) >= 1
    if h.max_length is not None:
        assert len(posted) > 1
        assert all(len(p.text) <= h.max_length for p in posted)
    seen: list[str] = []
    for p in posted:
        # Every message holds whole blocks only: nothing unterminated, nothing cut.
        result = parse(p.whole())
        assert not result.errors, result.errors
        seen.extend(render(m) for m in result.messages)
    assert seen == wanted
    # Another bot posting exactly those messages back: the transport reads them whole.
    for p in posted:
        await h.post(p.text, p.files)
    handled = await env.gateway.wait_handled(len(posted), lambda e: e.author.id == h.peer)
    read = [b for e, _ in handled for b in blocks_of(e.text)]
    assert read == wanted
    assert {d.outcome for _, d in handled} <= {"accepted", "ignored"}


async def test_own_posts_are_dropped(env: Env) -> None:
    h = env.harness
    if not h.echoes_own_posts:
        pytest.skip(f"{h.kind} never shows the gateway's posts back to it")
    receipt = await env.adapter.send(
        Outbound(Address(TRANSPORT, h.channel), "a notice from the gateway",
                 kind=OutboundKind.NOTICE)
    )
    [native_id] = receipt.native_ids
    await h.post("plain chat after it")
    [(_, chat)] = await env.gateway.wait_handled(1, lambda e: e.author.id == h.peer)
    assert chat.outcome == "ignored"
    echoes = await env.gateway.wait_handled(1, lambda e: e.native_id == native_id)
    assert [d.outcome for _, d in echoes] == ["dropped"]


async def test_relayed_copies_are_not_reingested(env: Env) -> None:
    h = env.harness
    if not h.echoes_own_posts:
        pytest.skip(f"{h.kind} never shows the gateway's posts back to it")
    side = memory(env.gateway, "side")
    request = build_request(sender="Mantis", to="Peer", task="relay me", request_id="mantis-r1")
    disposition = await side.inject(render(request), author_id="u-mantis")
    assert disposition.outcome == "accepted"
    [(copy, dropped)] = await env.gateway.wait_handled(1, lambda e: "relay me" in e.text)
    assert dropped.outcome == "dropped"
    conv = await env.gateway.store.get("mantis-r1", with_history=True)
    assert conv is not None and [ev.type for ev in conv.history] == ["REQUEST"]
    assert [p.whole() for p in await h.posted() if "relay me" in p.whole()] == [copy.text]


async def test_delivery_error_with_retry_after_reaches_the_outbox(env: Env) -> None:
    h = env.harness
    code, retry_after = await h.block(env.gateway)
    out = Outbound(Address(TRANSPORT, h.channel), "held back", kind=OutboundKind.NOTICE)
    dest = destination(TRANSPORT, env.adapter.destination(out))
    started = time.time()
    await env.gateway.outbox.enqueue(
        [journal_entry(out.text, out.kind, [(TRANSPORT, h.channel, "", "", "")])]
    )
    redis = env.gateway.outbox.redis
    keys = env.gateway.outbox.keys
    for _ in range(int(WAIT / 0.02)):  # the dispatcher's failed attempt lands in Redis
        if (raw := await redis.lindex(keys.queue(dest), 0)) is not None:
            break
        await asyncio.sleep(0.02)
    assert raw is not None, f"nothing queued for retry to {dest}"
    item = Item.from_json(raw)
    assert item.out.text == "held back" and item.attempts >= 1
    assert item.code == code
    # Not retried before the platform's retry-after.
    assert item.next_at >= item.first_failed_at + retry_after - 0.01 >= started
    blocked = await redis.hget(keys.blocked, dest)
    assert blocked is not None and blocked.startswith(code + "\t")


async def fresh_adapter(env: Env) -> Any:
    """A second instance of the transport (another name), prepared like the gateway does."""
    adapter = create_adapter(env.harness.kind, "t2", env.harness.options())
    client = aioredis.from_url(env.redis_url, decode_responses=True)
    env.extra.append(client)
    adapter.use_redis(client, env.namespace)
    return adapter


async def test_stop_twice_is_safe(env: Env) -> None:
    adapter = await fresh_adapter(env)
    await adapter.stop()  # never started: nothing to do
    await adapter.start(env.gateway)
    await adapter.stop()
    await adapter.stop()
    assert adapter.health().state is HealthState.DOWN


async def test_health_moves_from_starting_to_up_to_down(env: Env) -> None:
    adapter = await fresh_adapter(env)
    assert adapter.health().state is HealthState.STARTING
    await adapter.start(env.gateway)
    try:
        assert adapter.health().state is HealthState.UP
    finally:
        await adapter.stop()
    assert adapter.health().state is HealthState.DOWN
    assert env.gateway.health()["transports"][TRANSPORT]["state"] == "up"

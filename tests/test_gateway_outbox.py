"""The durable outbox on real Redis: journal in the same commit, retries in order, dead
letters kept and re-sendable, once-only delivery after a lost answer, shared echoes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import gateway.dispatch as dispatch
import gateway.outbox as outbox_module
from adapters.base import (
    Adapter,
    Address,
    Capabilities,
    DeliveryError,
    GatewaySink,
    HealthState,
    Outbound,
    OutboundKind,
    Receipt,
    register_adapter,
)
from gateway.app import Gateway
from gateway.outbox import Item, Outbox, OutboxKeys, items_of, journal_entry
from protocol import build_request, parse, render, reply_response
from state.records import Origin, Outcome

from gwkit import make_config, memory, running, sent_to


@register_adapter("flaky")
class FlakyAdapter(Adapter):
    """A destination that fails while ``down`` (with an optional retry-after hint)."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.down = False
        self.retry_after: float | None = None
        self.sent: list[Outbound] = []
        self.failures = 0
        self.slow = 0.0  # seconds the platform takes to answer a post it already has
        self.answered = 0
        self._ids = 0

    async def start(self, sink: GatewaySink) -> None:
        self.set_health(HealthState.UP)

    async def stop(self) -> None:
        self.set_health(HealthState.DOWN)

    async def send(self, message: Outbound) -> Receipt:
        if self.down:
            self.failures += 1
            raise DeliveryError("platform unavailable", retry_after=self.retry_after,
                                code="rate_limited")
        self.sent.append(message)
        if self.slow:
            await asyncio.sleep(self.slow)
        self.answered += 1
        self._ids += 1
        return Receipt((f"{self.name}-{self._ids}",))


@register_adapter("sidebyside")
class SideBySideAdapter(FlakyAdapter):
    """Sends a batch's conversations side by side: a refused message stops only its own
    conversation, the others' messages after it go out all the same (as the mq9 bridge)."""

    capabilities = Capabilities(batched_sends=True)

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, options)
        self.refuse = set((options or {}).get("refuse", ()))  # texts refused once each

    async def send_batch(self, messages: Any) -> list[Receipt | DeliveryError]:
        out: list[Receipt | DeliveryError] = []
        stopped: set[str | None] = set()
        for message in messages:
            if message.request_id in stopped:
                out.append(DeliveryError("not tried"))
            elif message.text in self.refuse:
                self.refuse.discard(message.text)
                stopped.add(message.request_id)
                out.append(DeliveryError("refused once", retry_after=0.05))
            else:
                out.append(await self.send(message))
        return out


def _config(cfg: tuple[str, str, Path], far: dict[str, Any] | None = None, **outbox: Any
            ) -> Any:
    redis_url, namespace, tmp_path = cfg
    return make_config(
        redis_url,
        namespace,
        tmp_path,
        agents={
            "Lotbot": {"addresses": ["chat:main"], "identities": ["chat:u-lot"]},
            "Mantis": {"addresses": ["far:mantis-room"], "identities": ["far:u-mantis"]},
        },
        transports={"chat": {"kind": "memory"}, "far": far or {"kind": "flaky"}},
        outbox={"backoff_base_seconds": 0.02, "backoff_max_seconds": 0.1, **outbox},
        permissions={"read": ["*"], "operators": ["chat:op"]},
    )


@pytest.fixture
def cfg(redis_url: str, namespace: str, tmp_path: Path) -> tuple[str, str, Path]:
    return redis_url, namespace, tmp_path


def _far(gw: Gateway) -> FlakyAdapter:
    adapter = gw.adapters["far"]
    assert isinstance(adapter, FlakyAdapter)
    return adapter


async def _until(check: Any, limit: float = 10.0) -> None:
    """Wait (bounded) for state another task writes (the dispatcher's retry workers)."""
    async with asyncio.timeout(limit):
        while not check():  # noqa: ASYNC110 - no event to wait on across the outbox
            await asyncio.sleep(0.02)


async def test_failing_destination_gets_everything_in_order_after_it_recovers(
    cfg, redis_client
) -> None:
    async with running(_config(cfg, max_attempts=1000)) as gw:
        chat, far = memory(gw, "chat"), _far(gw)
        far.down = True
        far.retry_after = 0.05
        reqs = [build_request(sender="Lotbot", to="Mantis", task=f"job {i}") for i in range(3)]
        for req in reqs:
            d = await chat.inject(render(req), author_id="u-lot")
            assert d.outcome == "accepted", d
        await _until(lambda: far.failures >= 3)
        # While the destination fails, a sender is told its message is queued behind it.
        d = await chat.inject(
            render(build_request(sender="Lotbot", to="Mantis", task="job 3")), author_id="u-lot"
        )
        assert [w["code"] for w in d.warnings] == ["rate_limited"], d
        assert "queued" in d.warnings[0]["detail"]
        stats = await gw.outbox.stats()
        assert stats["queued"] == {"far:mantis-room": 4}
        far.down = False
        await _until(lambda: len(far.sent) == 4)
        tasks = [parse(o.text).messages[0].task for o in far.sent]  # type: ignore[union-attr]
        assert tasks == ["job 0", "job 1", "job 2", "job 3"]
        await gw.drain()
        for _ in range(100):
            stats = await gw.outbox.stats()
            if not stats["queued"] and not stats["blocked"]:
                break
            await asyncio.sleep(0.02)
        assert stats["queued"] == {} and stats["blocked"] == {}


async def test_a_refusal_holds_back_its_own_conversation_only(cfg, redis_client) -> None:
    """A transport that sends conversations side by side: what went out beside a refused
    message is recorded and never sent again; the refused conversation follows in order."""
    _, namespace, _ = cfg
    # Journaled before the gateway starts, so the dispatcher reads them in one batch.
    await Outbox(redis_client, namespace).enqueue([
        journal_entry(f"{conv}-{i}", OutboundKind.PROTOCOL,
                      [("far", "mantis-room", "", "Mantis", "")], request_id=conv)
        for i in range(2) for conv in ("a", "b")])
    config = _config(cfg, far={"kind": "sidebyside", "refuse": ["a-0"]})
    async with running(config) as gw:
        far = gw.adapters["far"]
        assert isinstance(far, SideBySideAdapter)
        await _until(lambda: len(far.sent) == 4)
        await gw.drain()
        await asyncio.sleep(0.2)  # a second delivery would have come by now
        assert [o.text for o in far.sent] == ["b-0", "b-1", "a-0", "a-1"]
        assert far.failures == 0 and (await gw.outbox.stats())["queued"] == {}


async def test_destination_that_never_recovers_is_dead_lettered_and_resendable(
    cfg, redis_client
) -> None:
    async with running(_config(cfg, max_attempts=3)) as gw:
        chat, far = memory(gw, "chat"), _far(gw)
        far.down = True
        req = build_request(sender="Lotbot", to="Mantis", task="never arrives")
        assert (await chat.inject(render(req), author_id="u-lot")).outcome == "accepted"
        # The sender is told, with the RequestId, once the outbox gives up.
        await chat.wait_sent(
            lambda o: o.kind is OutboundKind.NOTICE and "dead-lettered" in o.text, timeout=10
        )
        assert far.failures == 3
        stats = await gw.outbox.stats()
        assert stats["dead_letters"] == {"far:mantis-room": 1}
        assert stats["dead_lettered"] == {"far:mantis-room": 1}
        status = await chat.command("status", author_id="op")
        assert "far:mantis-room: 1" in dict(status.fields)["dead letters"]

        listed = await chat.command("outbox", "list", author_id="op")
        assert listed.ok and len(listed.rows) == 1
        letter_id, dest, request_id = listed.rows[0][:3]
        assert (dest, request_id) == ("far:mantis-room", req.request_id)

        far.down = False
        again = await chat.command("outbox", "retry", letter_id, author_id="op")
        assert again.ok and again.title.startswith("1 ")
        await _until(lambda: len(far.sent) == 1)
        assert parse(far.sent[0].text).messages[0] == req
        assert (await gw.outbox.stats())["dead_letters"] == {}


async def test_dead_letters_can_be_dropped(cfg, redis_client) -> None:
    async with running(_config(cfg, max_attempts=1)) as gw:
        chat, far = memory(gw, "chat"), _far(gw)
        far.down = True
        for i in range(2):
            req = build_request(sender="Lotbot", to="Mantis", task=f"t{i}")
            await chat.inject(render(req), author_id="u-lot")
        await _until(lambda: far.failures == 2)
        await gw.drain()
        assert (await gw.outbox.stats())["dead_letters"] == {"far:mantis-room": 2}
        refused = await chat.command("outbox", "drop", "all", author_id="u-lot")
        assert not refused.ok  # operators only
        # The CLI sees the same dead letters and drops one by id.
        listed = json.loads(await _bpgw(cfg, "outbox", "list", "--json"))
        assert [r[1] for r in listed["rows"]] == ["far:mantis-room"] * 2
        out = await _bpgw(cfg, "outbox", "drop", listed["rows"][0][0])
        assert out.startswith("1 dead letter(s) discarded")
        dropped = await chat.command("outbox", "drop", "all", author_id="op")
        assert dropped.title.startswith("1 ")
        stats = await gw.outbox.stats()
        assert stats["dead_letters"] == {} and stats["dead_lettered"] == {"far:mantis-room": 2}


async def _bpgw(cfg: tuple[str, str, Path], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, "--redis-url", cfg[0],
        "--namespace", cfg[1], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_a_send_in_progress_when_the_gateway_stops_is_finished_not_repeated(
    cfg, redis_client
) -> None:
    """The platform has the post but has not answered yet when the gateway is stopped:
    the send finishes and is recorded before the dispatcher lets go, so the next gateway
    does not post it again."""
    config = _config(cfg)
    async with running(config) as gw:
        chat, far = memory(gw, "chat"), _far(gw)
        far.slow = 0.5
        # inject waits for the dispatch; the gateway is stopped while the send is out.
        injected = asyncio.create_task(chat.inject(
            render(build_request(sender="Lotbot", to="Mantis", task="slow")), author_id="u-lot"))
        await _until(lambda: len(far.sent) == 1)
        assert far.answered == 0
    assert far.answered == 1  # the stop waited for the answer
    assert (await injected).outcome == "accepted"
    async with running(config) as again:
        await again.drain()
        await asyncio.sleep(0.3)  # a retry worker would have run by now
        assert _far(again).sent == []
    assert await redis_client.xlen(OutboxKeys(cfg[1]).journal) == 0


async def test_relays_commit_with_the_state_change(cfg, redis_client) -> None:
    """Applying with a journal entry appends it in the same script; a duplicate does not."""
    async with running(_config(cfg)) as gw:
        await gw.stop()  # no dispatcher: look at the journal as the commit left it
        keys = OutboxKeys(cfg[1])
        req = build_request(sender="Lotbot", to="Mantis", task="atomic")
        origin = Origin("chat", "main", "th-1", "n-1")
        entry = (
            '{"k":"protocol","t":"x","r":"","tr":"","d":[["chat","main","","Lotbot",""]],'
            '"s":null}'
        )
        first = await gw_store(cfg).apply(req, origin, journal=entry)
        again = await gw_store(cfg).apply(req, origin, journal=entry)
        assert first.outcome is Outcome.APPLIED and again.outcome is Outcome.DUPLICATE
        rows = await redis_client.xrange(keys.journal)
        assert len(rows) == 1
        # Placement resolved inside the script from the conversation's origin.
        assert b'["chat","main","th-1","Lotbot","n-1"]' in rows[0][1][b"m"]


async def test_entries_read_and_not_finished_are_dispatched_by_the_next_holder(
    cfg, redis_client
) -> None:
    """The journal is read without a pending list: what a dead holder read but did not
    finish is the journal up to the group's last read id, which the next holder
    dispatches (an entry left pending by an earlier version too, and acknowledged)."""
    config = _config(cfg)
    keys = OutboxKeys(cfg[1])
    async with running(config) as gw:
        await gw.stop()  # the group exists; no dispatcher from here on
        for task in ("read, then the holder died", "pending from an earlier version",
                     "never read"):
            entry = journal_entry(task, OutboundKind.PROTOCOL,
                                  [("far", "mantis-room", "", "Mantis", "")])
            await redis_client.xadd(keys.journal, {"m": entry})
        await redis_client.xreadgroup("dispatch", "dead", {keys.journal: ">"}, count=1,
                                      noack=True)
        await redis_client.xreadgroup("dispatch", "old", {keys.journal: ">"}, count=1)
    async with running(config) as again:
        await again.drain()
        await _until(lambda: len(_far(again).sent) == 3)
        assert [m.text for m in _far(again).sent] == [
            "read, then the holder died", "pending from an earlier version", "never read"]
    assert await redis_client.xlen(keys.journal) == 0
    assert (await redis_client.xpending(keys.journal, "dispatch"))["pending"] == 0


@pytest.mark.parametrize(
    ("channel", "elsewhere"),
    [("main", False), ("main", True), ("a/b \"q\"", False), ("a/b", True)],
)
async def test_placement_is_resolved_whatever_the_entry_holds(
    cfg, redis_client, channel: str, elsewhere: bool
) -> None:
    """The script skips decoding an entry only when no delivery is on the origin channel:
    a text or a sender address that looks like such a delivery changes nothing, and a
    channel JSON escapes is still placed."""
    async with running(_config(cfg)) as gw:
        await gw.stop()
        keys = OutboxKeys(cfg[1])
        req = build_request(sender="Lotbot", to="Mantis", task="placed")
        origin = Origin("chat", channel, "th-1", "n-1")
        decoy = f'"d":[["chat",{json.dumps(channel)},"","x",""]],"s":'
        deliveries = [("side", "room", "", "Mantis", "")]
        if not elsewhere:
            deliveries.append(("chat", channel, "", "Lotbot", ""))
        entry = journal_entry(decoy, OutboundKind.PROTOCOL, deliveries,
                              sender_at=Address("chat", channel))
        applied = await gw_store(cfg).apply(req, origin, journal=entry)
        assert applied.outcome is Outcome.APPLIED
        [(_, fields)] = await redis_client.xrange(keys.journal)
        stored = json.loads(fields[b"m"])
        assert stored["t"] == decoy
        expected = [list(d) for d in deliveries]
        if not elsewhere:
            expected[1][2:] = ["th-1", "Lotbot", "n-1"]
        assert stored["d"] == expected


def gw_store(cfg: tuple[str, str, Path]) -> Any:
    import redis.asyncio as aioredis

    from state.settings import StateSettings
    from state.store import ConversationStore

    client = aioredis.from_url(cfg[0], decode_responses=True)
    return ConversationStore(client, StateSettings(redis_url=cfg[0], namespace=cfg[1]))


async def test_retry_after_a_lost_answer_is_already_accepted_and_delivered_once(
    cfg, redis_client
) -> None:
    """The first attempt committed (state + journal) but its answer never reached the
    client; the client's retry is told it was already accepted, and the recipient gets
    the message exactly once."""
    async with running(_config(cfg)) as gw:
        chat, far = memory(gw, "chat"), _far(gw)
        req = build_request(sender="Lotbot", to="Mantis", task="once")
        entry = (
            '{"k":"protocol","t":' + _json(render(req)) + ',"r":"' + req.request_id
            + '","tr":"","d":[["far","mantis-room","","Mantis",""]],"s":null}'
        )
        committed = await gw.store.apply(req, Origin("chat", "main"), journal=entry)
        assert committed.outcome is Outcome.APPLIED
        d = await chat.inject(render(req), author_id="u-lot")
        assert d.outcome == "duplicate" and d.detail.startswith("already accepted"), d
        await gw.drain()
        assert [parse(o.text).messages[0] for o in far.sent] == [req]


def _json(text: str) -> str:
    return json.dumps(text)


async def test_echoes_are_recognised_by_every_replica(cfg, redis_client) -> None:
    """A native id the gateway posted is dropped when a platform shows it back, even by a
    replica that did not send it (the echo memory is in Redis)."""
    config = _config(cfg)
    async with running(config) as gw1, running(config) as gw2:
        chat1 = memory(gw1, "chat")
        req = build_request(sender="Mantis", to="Lotbot", task="echo?")
        d = await _far_inject(gw1, req)
        assert d == "accepted"
        await gw1.drain()
        await gw2.drain()
        relayed = sent_to(chat1, "main", OutboundKind.PROTOCOL) + sent_to(
            memory(gw2, "chat"), "main", OutboundKind.PROTOCOL
        )
        assert len(relayed) == 1
        sender = chat1 if sent_to(chat1, "main") else memory(gw2, "chat")
        native = sender.sent_ids[sender.sent.index(relayed[0])]
        for gw in (gw1, gw2):
            again = await memory(gw, "chat").inject(
                relayed[0].text, author_id="someone", native_id=native
            )
            assert again.outcome == "dropped"


async def _far_inject(gw: Gateway, req: Any) -> str:
    from adapters.base import Author, Envelope

    env = Envelope("far", "mantis-room", Author("u-mantis"), render(req), native_id="f-1")
    return (await gw.on_envelope(env)).outcome


async def test_reply_placement_follows_the_conversation_origin(cfg, redis_client) -> None:
    async with running(_config(cfg)) as gw:
        chat = memory(gw, "chat")
        req = build_request(sender="Lotbot", to="Mantis", task="threaded")
        await chat.inject(render(req), author_id="u-lot", thread="t-7", native_id="root-1")
        answer = reply_response(req, sender="Mantis", status="done", result="ok")
        assert await _far_inject(gw, answer) == "accepted"
        await gw.drain()
        [back] = sent_to(chat, "main", OutboundKind.PROTOCOL)
        assert (back.address.thread, back.reply_to) == ("t-7", "root-1")


def test_a_journal_entry_is_the_json_of_its_fields_whatever_the_text() -> None:
    """journal_entry writes its JSON by hand: any text reads back as it went in."""
    text = 'quote " backslash \\ nul \x00 sep \u2028 emoji \U0001f600 ``` \n line'
    entry = journal_entry(
        text, OutboundKind.PROTOCOL,
        [("chat", "main", "", "Lotbot", ""), ("side", 'c"', "t", "", "r")],
        request_id="r-1", trace_id=None, sender_at=Address("side", "room", None),
    )
    assert json.loads(entry) == {
        "k": "protocol", "t": text, "r": "r-1", "tr": "",
        "d": [["chat", "main", "", "Lotbot", ""], ["side", 'c"', "t", "", "r"]],
        "s": ["side", "room", ""],
    }
    [item, _] = items_of("1-1", entry, {})
    assert item.out.text == text and item.sender_at == Address("side", "room", None)
    assert json.loads(journal_entry("n", OutboundKind.NOTICE, []))["s"] is None


def test_places_in_journal_entries_read_back_whatever_is_remembered() -> None:
    """A delivery's and a sender's place are written from memory once seen (bounded in
    count and in characters): every entry reads back with its own places, through the
    memory's emptying, for places too long to remember and for hostile names."""
    count = outbox_module.PLACES_CACHED + 50
    long = "x" * outbox_module.PLACE_CACHED_MAX_CHARS
    for round_ in range(2):  # the second time, from memory (or after it was emptied)
        for i in range(count):
            place = ("chat", f'c"{i}\\\u2028' if i % 2 else f"{long}{i}", "", "", "")
            sender = Address("side", f"room {i} é", f"t{i}" if i % 3 else None)
            entry = json.loads(journal_entry("t", OutboundKind.PROTOCOL, [place],
                                             sender_at=sender))
            assert entry["d"] == [list(place)], (round_, i)
            assert entry["s"] == ["side", f"room {i} é", sender.thread or ""]
            assert len(outbox_module._places) <= outbox_module.PLACES_CACHED
    assert all(len(v) <= outbox_module.PLACE_CACHED_MAX_CHARS
               for v in outbox_module._places.values())


def test_items_of_gives_the_same_items_from_memory_as_from_the_json() -> None:
    """journal_entry remembers each entry it wrote decoded, and items_of takes it from
    there once; an entry not remembered (another replica's, one from before a restart)
    is decoded from its JSON into the same items. The memory is bounded."""
    args = ("a \"quoted\" text\non two lines", OutboundKind.PROTOCOL,
            [("chat", "main", "", "Lotbot", ""), ("side", "room", "t", "", "r")])
    entry = journal_entry(*args, request_id="r-1", trace_id="tr-1",
                          sender_at=Address("side", "room", None))
    remembered = items_of("2-1", entry, {})
    assert entry not in outbox_module._journaled  # (taken: the next read decodes it)
    assert items_of("2-1", entry, {}) == remembered
    for i in range(outbox_module.JOURNALED_MAX + 5):
        journal_entry(f"text {i}", OutboundKind.NOTICE, [])
    assert len(outbox_module._journaled) == outbox_module.JOURNALED_MAX


def test_journal_memory_is_bounded_in_characters() -> None:
    """Long entries (an agent's 256 KB messages, say) are remembered within
    JOURNALED_MAX_CHARS together, oldest out first; one longer than that is not kept, and
    every entry still gives its items."""
    to = [("chat", "main", "", "Lotbot", "")]
    long_text = "x" * (outbox_module.JOURNALED_MAX_CHARS // 3)
    texts = [long_text + str(i) for i in range(5)]
    entries = [journal_entry(t, OutboundKind.NOTICE, to) for t in texts]
    assert [e in outbox_module._journaled for e in entries] == [False, False, False, True,
                                                                True]
    huge_text = "y" * outbox_module.JOURNALED_MAX_CHARS
    huge = journal_entry(huge_text, OutboundKind.NOTICE, to)
    assert huge not in outbox_module._journaled
    assert entries[3] in outbox_module._journaled  # (nothing pushed out for it)
    for i, (text, entry) in enumerate(zip([*texts, huge_text], [*entries, huge],
                                          strict=True)):
        [item] = items_of(f"3-{i}", entry, {})
        assert item.out.text == text
    assert len(outbox_module._journaled) == 0


def test_items_of_makes_what_the_constructors_make() -> None:
    """items_of builds its Outbound and Item without their __init__: the same frozen
    objects (equal, hashable, immutable, replaceable) as the constructors make."""
    entry = journal_entry(
        "hi", OutboundKind.PROTOCOL, [("side", "room", "t-1", "Mantis", "n-9")],
        request_id="r-1", trace_id="t", sender_at=Address("chat", "main", None),
    )
    [item] = items_of("5-1", entry, {})
    expected = Item(
        "5-1", "side:room",
        Outbound(Address("side", "room", "t-1"), "hi", OutboundKind.PROTOCOL, recipient="Mantis",
                 reply_to="n-9", request_id="r-1", trace_id="t", id="5-1"),
        Address("chat", "main", None),
    )
    assert item == expected and hash(item) == hash(expected) and repr(item) == repr(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.attempts = 3  # type: ignore[misc]
    assert dataclasses.replace(item, attempts=2) == dataclasses.replace(expected, attempts=2)
    assert Item.from_json(item.to_json()) == item


async def test_a_batch_is_acknowledged_whole_and_alone(redis_client, namespace) -> None:
    """The acknowledgement of a dispatched batch removes just its entries: by one XTRIM
    when none is older, else one by one, so an older batch still being finished (by a
    replica that lost the lease) stays in the journal for the next holder to replay."""
    journal = f"{namespace}:ack-test"
    ids = [str(await redis_client.xadd(journal, {"m": str(i)}, id=f"5-{i}"), "ascii")
           for i in range(1, 6)]
    ids.append(str(await redis_client.xadd(journal, {"m": "6"},
                                           id=f"5-{2**64 - 1}"), "ascii"))
    ids.append(str(await redis_client.xadd(journal, {"m": "7"}, id="6-0"), "ascii"))

    async def ack(first: int, last: int) -> list[str]:
        args = [ids[first], ids[last], dispatch._id_after(ids[last])]
        await redis_client.eval(dispatch._ACK, 1, journal, *args)
        return [str(i, "ascii") for i, _ in await redis_client.xrange(journal)]

    assert await ack(2, 3) == [ids[0], ids[1], ids[4], ids[5], ids[6]]  # 5-1, 5-2 older
    assert await ack(0, 1) == [ids[4], ids[5], ids[6]]  # none older: trimmed
    assert dispatch._id_after(ids[5]) == "6-0"
    assert await ack(4, 5) == [ids[6]]
    await redis_client.xdel(journal, ids[6])
    assert await ack(6, 6) == []  # already gone (deleted under us)


async def test_the_acknowledgement_loads_its_script_when_the_server_lost_it(
    cfg, redis_client
) -> None:
    """After SCRIPT FLUSH a batch is still acknowledged (the script loaded again)."""
    config = _config(cfg)
    keys = OutboxKeys(cfg[1])
    async with running(config) as gw:
        for task in ("before", "after"):
            await redis_client.script_flush()
            entry = journal_entry(task, OutboundKind.PROTOCOL,
                                  [("far", "mantis-room", "", "Mantis", "")])
            await redis_client.xadd(keys.journal, {"m": entry})
            await gw.drain()
        await _until(lambda: len(_far(gw).sent) == 2)
        assert await redis_client.xlen(keys.journal) == 0

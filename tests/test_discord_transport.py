"""The discord transport end to end: the real discord.py client against the emulator
(tests/discord_emulator.py), a real gateway on real Redis, a memory transport ``side``.

``Peer`` is another bot in the emulated guild (bound to its Discord user id), ``Mantis``
lives on ``side``; the emulated user ``op`` has the role Ops, which may run operator
commands; ``visitor`` may only read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import discord
import pytest
import redis.asyncio as aioredis

from adapters.base import Address, ConfigError, HealthState, Outbound
from adapters.discord import DiscordAdapter
from adapters.discord.settings import DiscordSettings, load_settings
from gateway.app import Gateway
from protocol import build_request, parse, render

from chat_checks import (
    SinkWithoutCursors,
    options_are_documented,
    probe_reports_refusals,
    refusals_are_classified,
    refused_token_leaves_it_down,
    retried_parts_are_posted_once,
)
from discord_emulator import MESSAGE_CONTENT_INTENT, TOKEN, DiscordEmulator
from gwkit import (
    QUICK_RETRIES,
    make_config,
    memory,
    request_block,
    response_block,
    wait_state,
    wait_up,
)
from harness_discord import discord_options
from servers import PrivateValkey

EPHEMERAL = 1 << 6


@pytest.fixture
async def emulator() -> AsyncIterator[DiscordEmulator]:
    async with DiscordEmulator() as emu:
        yield emu


@pytest.fixture
def start_gateway(
    emulator: DiscordEmulator, redis_url: str, redis_client: aioredis.Redis, namespace: str,
    tmp_path: Path,
) -> Callable[..., Any]:
    """``async with start_gateway() as gw``: a gateway with transport ``dc`` running
    (on ``redis_url``, or on the URL given as ``state_url``)."""

    @asynccontextmanager
    async def start(
        *, wait: bool = True, state_url: str | None = None, **options: Any
    ) -> AsyncIterator[Gateway]:
        general = emulator.channels["general"]
        config = make_config(
            state_url or redis_url, namespace, tmp_path,
            transports={"dc": {"kind": "discord", **discord_options(emulator, **options)}},
            agents={"Peer": {"addresses": [f"dc:{general}"],
                             "identities": [f"dc:{emulator.uid('peer')}"]}},
            permissions={"read": ["*"], "operators": ["role:dc:Ops"]},
            **QUICK_RETRIES,
        )
        gateway = Gateway(config)
        await gateway.start()
        try:
            if wait:
                await wait_up(gateway, "dc")
            yield gateway
        finally:
            await gateway.stop()

    return start


def request_text(request_id: str, task: str = "check disk", sender: str = "Peer") -> str:
    return request_block(request_id, to="Mantis", task=task, sender=sender)


response_to = response_block


def reaction(emulator: DiscordEmulator, message: dict[str, Any], emoji: str) -> bool:
    return (int(message["channel_id"]), int(message["id"]), emoji) in emulator.reactions


def replies_to(emulator: DiscordEmulator, message: dict[str, Any]) -> list[dict[str, Any]]:
    """The bot's messages replying to ``message``."""
    return [
        m for m in emulator.by_bot(int(message["channel_id"]))
        if m.get("message_reference", {}).get("message_id") == message["id"]
    ]


# -- relaying, replies, reactions ------------------------------------------------------


async def test_request_relayed_and_response_replied_in_the_thread(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        assert emulator.intents[-1] & MESSAGE_CONTENT_INTENT
        side = memory(gw, "side")
        asked = request_text("peer-1")
        original = await emulator.post("peer", "please:\n" + asked, thread=True)
        relayed = await side.wait_sent(lambda o: "peer-1" in o.text)
        assert relayed.address.channel == "mantis-room"
        assert await emulator.wait_for(lambda: reaction(emulator, original, "✅"))
        conv = await gw.store.get("peer-1", with_history=False)
        assert conv is not None
        assert (conv.origin.channel, conv.origin.thread) == (
            str(emulator.channels["general"]), str(emulator.thread))

        response = response_to(asked, "Mantis", "sda is 40% full")
        assert (await side.inject(response, author_id="u-mantis",
                                  channel="mantis-room")).outcome == "accepted"
        [reply] = await emulator.wait_for(lambda: replies_to(emulator, original))
        assert int(reply["channel_id"]) == emulator.thread  # in the thread it started in
        [got] = parse(reply["content"]).messages
        assert got.request_id == "peer-1" and "40% full" in render(got)
        # The bot's own post came back through the gateway socket and was dropped.
        assert len([o for o in side.sent if "peer-1" in o.text]) == 1


async def test_malformed_block_gets_an_error_reply_and_a_cross(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        broken = await emulator.post("peer", "```\n[REQUEST → @Mantis]\nTask: no sender\n```")
        [reply] = await emulator.wait_for(lambda: replies_to(emulator, broken))
        assert "From" in reply["content"]
        assert await emulator.wait_for(lambda: reaction(emulator, broken, "❌"))
        assert not reaction(emulator, broken, "✅")


async def test_impersonation_by_another_bot_is_rejected(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        fake = await emulator.post("rogue", request_text("peer-fake", sender="Peer"))
        [reply] = await emulator.wait_for(lambda: replies_to(emulator, fake))
        assert "may not speak as @Peer" in reply["content"]
        assert await emulator.wait_for(lambda: reaction(emulator, fake, "❌"))
        assert await gw.store.get("peer-fake", with_history=False) is None
        assert not [o for o in memory(gw, "side").sent if "peer-fake" in o.text]


async def test_a_6000_character_response_is_attached_and_read_back_whole(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    general = emulator.channels["general"]
    async with start_gateway() as gw:
        side = memory(gw, "side")
        asked = request_text("peer-big")
        await emulator.post("peer", asked)
        await side.wait_sent(lambda o: "peer-big" in o.text)
        body = "\n".join(f"row {i}: " + "z" * 90 for i in range(60))
        big = response_to(asked, "Mantis", body)
        assert len(big) > 6000
        await side.inject(big, author_id="u-mantis", channel="mantis-room")
        posts = await emulator.wait_for(
            lambda: [m for m in emulator.by_bot(general) if m["attachments"]])
        [post] = posts
        assert post["content"] == "[RESPONSE → @Peer]" and len(post["content"]) <= 2000
        [attachment] = post["attachments"]
        assert attachment["filename"] == "peer-big.txt"
        stored = emulator.files[attachment["url"].rsplit("/", 1)[1]].decode()
        assert [render(m) for m in parse(stored).messages] == [big]

        # Read back: Peer answers a new request with a 6,000-character RESPONSE as a file.
        wanted = render(build_request(sender="Mantis", to="Peer", task="send logs",
                                      request_id="mantis-logs"))
        await side.inject(wanted, author_id="u-mantis", channel="mantis-room")
        logs = response_to(wanted, "Peer", body)
        await emulator.post("peer", "[RESPONSE → @Mantis]", files=(("logs.txt", logs),))
        got = await side.wait_sent(lambda o: "mantis-logs" in o.text and "row 59" in o.text)
        assert [render(m) for m in parse(got.text).messages] == [logs]


async def test_attachment_bounds_and_bare_blocks(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway(attachment_max_bytes=2048) as gw:
        side = memory(gw, "side")
        bare = request_text("peer-bare").removeprefix("```\n").removesuffix("\n```")
        await emulator.post("peer", "see file", files=(("req.txt", bare),
                                                       ("ignored.png", "not text")))
        got = await side.wait_sent(lambda o: "peer-bare" in o.text)
        assert parse(got.text).messages[0].request_id == "peer-bare"
        huge = await emulator.post("peer", "big", files=(("big.txt", "x" * 5000),))
        adapter = gw.adapters["dc"]
        assert isinstance(adapter, DiscordAdapter)
        inbound = adapter._inbound
        assert inbound is not None
        from_api = [m for m in emulator.messages[emulator.channels["general"]]
                    if m["id"] == huge["id"]]
        assert from_api  # the emulator kept it; the transport names the file it skipped
        text = await inbound.text_of(
            await adapter._client.get_partial_messageable(  # type: ignore[union-attr]
                emulator.channels["general"]).fetch_message(int(huge["id"])))
        assert "big.txt not read: 5000 bytes is over attachment_max_bytes 2048" in text


# -- commands --------------------------------------------------------------------------


def answer(emulator: DiscordEmulator, token: str) -> dict[str, Any] | None:
    return next((a for a in emulator.interaction_answers if a["token"] == token), None)


async def test_protocol_command_synced_and_answered_with_embeds(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        [command] = emulator.synced[str(emulator.guild_id)]
        assert command["name"] == "protocol"
        assert {o["name"] for o in command["options"]} == {
            "status", "show", "list", "agents", "cancel", "key", "help"}
        show = next(o for o in command["options"] if o["name"] == "show")
        assert show["options"][0]["name"] == "request_id" and show["options"][0]["required"]

        await emulator.post("peer", request_text("peer-7"))
        await memory(gw, "side").wait_sent(lambda o: "peer-7" in o.text)
        token = await emulator.interact("visitor", "status")
        status = await emulator.wait_for(lambda: answer(emulator, token))
        assert status["type"] == 4 and not status["data"].get("flags", 0) & EPHEMERAL
        [embed] = status["data"]["embeds"]
        assert embed["title"] == "bot-protocol status"
        fields = {f["name"]: f["value"] for f in embed["fields"]}
        assert "connected: True" in fields["transport dc"]
        assert "peer-7" in embed["description"]

        token = await emulator.interact("visitor", "show", {"request_id": "peer-7"})
        shown = await emulator.wait_for(lambda: answer(emulator, token))
        assert "peer-7" in shown["data"]["embeds"][0]["title"]


async def test_cancel_refused_ephemeral_for_a_non_operator_allowed_by_role(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        await emulator.post("peer", request_text("peer-9"))
        await memory(gw, "side").wait_sent(lambda o: "peer-9" in o.text)
        token = await emulator.interact("visitor", "cancel", {"request_id": "peer-9"})
        refused = await emulator.wait_for(lambda: answer(emulator, token))
        assert refused["data"]["flags"] & EPHEMERAL
        assert "permission denied" in refused["data"]["embeds"][0]["title"]
        conv = await gw.store.get("peer-9", with_history=False)
        assert conv is not None and str(conv.status) == "open"

        token = await emulator.interact("op", "cancel", {"request_id": "peer-9",
                                                         "reason": "not needed"})
        done = await emulator.wait_for(lambda: answer(emulator, token))
        assert not done["data"].get("flags", 0) & EPHEMERAL
        conv = await gw.store.get("peer-9", with_history=False)
        assert conv is not None and str(conv.status) == "cancelled"


async def test_a_slow_command_is_deferred_then_followed_up(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        adapter = gw.adapters["dc"]
        assert isinstance(adapter, DiscordAdapter)
        adapter.answer_within_seconds = 0.0  # as if the gateway took longer than Discord's 3 s
        token = await emulator.interact("visitor", "help")
        await emulator.wait_for(lambda: len(
            [a for a in emulator.interaction_answers if a["token"] == token]) == 2)
        deferred, followup = [a for a in emulator.interaction_answers if a["token"] == token]
        assert deferred["type"] == 5  # "thinking"
        assert followup["type"] == "followup"
        assert followup["data"]["embeds"][0]["title"] == "bot-protocol gateway commands"


async def test_allow_lists_limit_channels_and_commands(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway(channels=[emulator.channels["ops"]]) as gw:
        side = memory(gw, "side")
        await emulator.post("peer", request_text("peer-a1"))  # general: not read
        await emulator.post("peer", request_text("peer-a2"), channel="ops")
        got = await side.wait_sent(lambda o: "peer-a" in o.text)
        assert "peer-a2" in got.text and await gw.store.get("peer-a1") is None
        token = await emulator.interact("op", "status")  # asked in general
        refused = await emulator.wait_for(lambda: answer(emulator, token))
        assert refused["data"]["flags"] & EPHEMERAL
        assert "not enabled in this channel" in refused["data"]["embeds"][0]["title"]


async def test_text_commands_keep_working_with_roles(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        asked = await emulator.post("visitor", "/protocol help")
        [reply] = await emulator.wait_for(lambda: replies_to(emulator, asked))
        assert reply["content"].startswith("**bot-protocol gateway commands**")
        denied = await emulator.post("visitor", "/protocol outbox")
        [no] = await emulator.wait_for(lambda: replies_to(emulator, denied))
        assert "permission denied" in no["content"]
        allowed = await emulator.post("op", "/protocol outbox")
        [yes] = await emulator.wait_for(lambda: replies_to(emulator, allowed))
        assert "permission denied" not in yes["content"]


# -- catch-up, resume ------------------------------------------------------------------


async def test_messages_posted_while_down_are_caught_up_once_in_order(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        first = await emulator.post("peer", request_text("peer-c1"))
        await memory(gw, "side").wait_sent(lambda o: "peer-c1" in o.text)
        assert await emulator.wait_for(lambda: reaction(emulator, first, "✅"))
    missed = [await emulator.post("peer", request_text(f"peer-c{n}")) for n in (2, 3, 4)]
    await emulator.post("visitor", "just chat")
    async with start_gateway() as gw:
        side = memory(gw, "side")
        for n in (2, 3, 4):
            await side.wait_sent(lambda o, n=n: f"peer-c{n}" in o.text)
        assert [o.text.split("RequestId: ")[1][:7] for o in side.sent] == [
            "peer-c2", "peer-c3", "peer-c4"]  # in order, and c1 not again
        for message in missed:
            assert await emulator.wait_for(lambda m=message: reaction(emulator, m, "✅"))
        for _ in range(250):  # the plain chat after them is read too
            stats = gw.health()["transports"]["dc"]
            if stats["caught_up"] >= 4:
                break
            await asyncio.sleep(0.02)
        assert stats["caught_up"] == 4 and stats["reconnects"] == 0
    ticks = [r for r in emulator.reactions if r[2] == "✅"]
    assert len(ticks) == len(set(ticks)) == 4  # each message once


async def test_a_channel_first_used_while_down_is_caught_up(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        pass  # nothing posted anywhere yet: every channel is tracked from now on
    missed = await emulator.post("peer", request_text("peer-o1"), channel="ops")
    async with start_gateway() as gw:
        got = await memory(gw, "side").wait_sent(lambda o: "peer-o1" in o.text)
        assert got.address.channel == "mantis-room"
        assert await emulator.wait_for(lambda: reaction(emulator, missed, "✅"))


async def test_a_message_not_committed_while_redis_is_down_is_processed_after(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any], durable_valkey: PrivateValkey
) -> None:
    valkey = durable_valkey
    async with start_gateway(state_url=valkey.url) as gw:
        side = memory(gw, "side")
        await emulator.post("peer", request_text("peer-f1"))
        await side.wait_sent(lambda o: "peer-f1" in o.text)
        await asyncio.to_thread(valkey.stop)
        missed = await emulator.post("peer", request_text("peer-f2"))
        await asyncio.sleep(0.5)  # handed to the gateway, which cannot commit it
        assert not reaction(emulator, missed, "✅")
        await asyncio.to_thread(valkey.start)
        await side.wait_sent(lambda o: "peer-f2" in o.text, timeout=15)
        assert await emulator.wait_for(lambda: reaction(emulator, missed, "✅"))
        assert [o.text.count("peer-f") for o in side.sent] == [1, 1]
        conv = await gw.store.get("peer-f2", with_history=True)
        assert conv is not None and [e.type for e in conv.history] == ["REQUEST"]


async def test_dropped_websocket_resumes_and_nothing_is_lost_or_doubled(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        side = memory(gw, "side")
        await emulator.post("peer", request_text("peer-r1"))
        await side.wait_sent(lambda o: "peer-r1" in o.text)
        await emulator.drop_connections()
        for n in (2, 3):
            await emulator.post("peer", request_text(f"peer-r{n}"))
        for n in (2, 3):
            await side.wait_sent(lambda o, n=n: f"peer-r{n}" in o.text, timeout=10)
        assert emulator.resumes == 1 and emulator.identifies == 1
        health = gw.health()["transports"]["dc"]
        assert health["state"] == "up" and health["resumes"] == 1
        assert sorted(o.text.split("RequestId: ")[1][:7] for o in side.sent) == [
            "peer-r1", "peer-r2", "peer-r3"]


async def test_a_reconnect_that_cannot_resume_catches_up_from_history(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        side = memory(gw, "side")
        await emulator.post("peer", request_text("peer-n1"))
        await side.wait_sent(lambda o: "peer-n1" in o.text)
        emulator.refuse_resume = True  # the session is gone: a new one starts
        await emulator.drop_connections()
        missed = await emulator.post("peer", request_text("peer-n2"))
        got = await side.wait_sent(lambda o: "peer-n2" in o.text, timeout=10)
        assert got.address.channel == "mantis-room"
        assert await emulator.wait_for(lambda: reaction(emulator, missed, "✅"))
        assert emulator.identifies == 2 and emulator.resumes == 0
        health = gw.health()["transports"]["dc"]
        assert health["reconnects"] == 1 and health["caught_up"] >= 1
        assert [o.text.count("peer-n") for o in side.sent] == [1, 1]


async def test_one_gateway_session_per_token_across_replicas(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as first:
        async with start_gateway(wait=False) as second:
            await wait_state(second, "dc", HealthState.STANDBY)
            await asyncio.sleep(0.6)  # three more lease attempts of the second replica
            assert second.adapters["dc"].health().state is HealthState.STANDBY
            assert emulator.identifies == 1
            assert len([s for s in emulator.sessions.values() if s.ws is not None]) == 1
            await first.stop()  # releases the lease: the standby takes over at once
            await wait_up(second, "dc")
            assert emulator.identifies == 2
            assert len([s for s in emulator.sessions.values() if s.ws is not None]) == 1
            await emulator.post("peer", request_text("peer-l1"))
            await memory(second, "side").wait_sent(lambda o: "peer-l1" in o.text)


async def test_a_replica_on_standby_posts_through_rest(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    general = emulator.channels["general"]
    async with start_gateway(), start_gateway(wait=False) as standby:
        adapter = standby.adapters["dc"]
        await wait_state(standby, "dc", HealthState.STANDBY)
        # The outbox may dispatch on this replica: posting needs no gateway session.
        receipt = await adapter.send(Outbound(Address("dc", str(general)), "from standby"))
        assert [m["content"] for m in emulator.by_bot(general)] == ["from standby"]
        assert receipt.native_ids == (emulator.by_bot(general)[0]["id"],)
        assert emulator.identifies == 1
    assert adapter.health().state is HealthState.DOWN  # its REST client closed at stop


async def test_health_reports_latency_and_events(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    emulator.heartbeat_ms = 100
    async with start_gateway() as gw:
        await emulator.post("visitor", "hello")
        for _ in range(250):
            stats = gw.health()["transports"]["dc"]
            if stats["latency_ms"] is not None:
                break
            await asyncio.sleep(0.02)
        assert stats["state"] == "up" and stats["connected"] is True
        assert stats["latency_ms"] is not None and stats["latency_ms"] >= 0
        assert stats["last_event_seconds_ago"] is not None
        assert stats["commands"] == "1 guild(s)"
        status = await memory(gw, "chat").command("status", author_id="op")
        [line] = [v for k, v in status.fields if k == "transport dc"]
        assert "latency_ms" in line and "resumes: 0" in line
        body, _ = await gw.metrics()
        scraped = body.decode()
        assert 'bpgw_transport_stat{stat="resumes",transport="dc"} 0.0' in scraped
        assert 'bpgw_transport_stat{stat="connected",transport="dc"} 1.0' in scraped
        assert 'bpgw_transport_stat{stat="latency_ms",transport="dc"}' in scraped


# -- delivery errors, lifecycle, options, probe ----------------------------------------


async def test_short_429_waited_out_by_the_library_long_one_to_the_outbox(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    general = emulator.channels["general"]
    async with start_gateway() as gw:
        adapter = gw.adapters["dc"]
        emulator.rate_limit(general, 0.1)
        receipt = await adapter.send(Outbound(Address("dc", str(general)), "after a wait"))
        assert [m["id"] for m in emulator.by_bot(general)] == list(receipt.native_ids)
        await refusals_are_classified(
            adapter, str(general), rate_limit=lambda wait: emulator.rate_limit(general, wait),
            not_a_channel="general", unknown="12345")


async def test_a_retried_message_does_not_post_its_parts_twice(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    general = emulator.channels["general"]
    text = "\n".join(f"line {i} " + "w" * 90 for i in range(50))  # three messages
    async with start_gateway() as gw:
        await retried_parts_are_posted_once(
            gw.adapters["dc"], str(general), text,
            refuse_second_part=lambda: emulator.rate_limit(general, None, 120.0),
            posted=lambda: [(m["id"], m["content"]) for m in emulator.by_bot(general)])


async def test_stop_is_clean_and_a_second_session_can_start(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        adapter = gw.adapters["dc"]
    assert adapter.health().state is HealthState.DOWN
    assert all(s.ws is None for s in emulator.sessions.values())  # no socket left open
    async with start_gateway():
        assert emulator.identifies == 2


async def test_a_refused_token_leaves_the_transport_down(emulator: DiscordEmulator) -> None:
    adapter = DiscordAdapter("dc", discord_options(emulator, token="x" * 30))
    await refused_token_leaves_it_down(adapter, discord.LoginFailure)


async def test_the_message_content_intent_not_enabled_says_how_to_fix_it(
    emulator: DiscordEmulator,
) -> None:
    emulator.app_flags = 0  # Developer Portal: Message Content Intent off
    adapter = DiscordAdapter("dc", discord_options(emulator))
    with pytest.raises(discord.PrivilegedIntentsRequired):
        await adapter.start(SinkWithoutCursors())  # type: ignore[arg-type]
    assert adapter.health().state is HealthState.DOWN
    assert "Message Content Intent" in adapter.health().detail
    await adapter.stop()


@pytest.mark.parametrize(("mode", "where"), [("global", "global"), ("off", None)])
async def test_command_sync_global_or_off(
    emulator: DiscordEmulator, start_gateway: Callable[..., Any], mode: str, where: str | None
) -> None:
    async with start_gateway(sync_commands=mode) as gw:
        assert list(emulator.synced) == ([where] if where else [])
        assert gw.health()["transports"]["dc"]["commands"] == mode


async def test_probe_checks_the_token_and_the_intent(emulator: DiscordEmulator) -> None:
    good = DiscordAdapter("dc", discord_options(emulator))
    token, intent = await good.probe()
    assert token.ok and "bot" in token.detail and intent.ok
    assert ("GET", "/api/v10/users/@me") in emulator.requests
    emulator.app_flags = 0
    _, missing = await good.probe()
    assert not missing.ok and "Message Content Intent" in missing.fix
    await probe_reports_refusals(lambda **o: DiscordAdapter("dc", discord_options(emulator, **o)),
                                 token="y" * 30, api_base_url="http://127.0.0.1:9/api/v10",
                                 refused="401")


def test_options_name_the_key_and_the_token_comes_from_the_environment() -> None:
    with pytest.raises(ConfigError, match=r"transports\.dc\.guilds"):
        DiscordAdapter("dc", {"token": TOKEN, "guilds": ["general"]})
    with pytest.raises(ConfigError, match=r"transports\.dc\.api_base_url"):
        DiscordAdapter("dc", {"token": TOKEN, "api_base_url": "ftp://x"})
    with pytest.raises(ConfigError, match="DISCORD_BOT_TOKEN"):
        load_settings("dc", {}, environ={})
    settings, token = load_settings("dc", {"token_env": "MY_BOT"}, environ={"MY_BOT": TOKEN})
    assert token == TOKEN and settings.token is None
    assert TOKEN not in repr(load_settings("dc", {"token": TOKEN})[0])
    assert json.dumps(DiscordAdapter("dc", {"token": TOKEN}).stats())


def test_every_option_is_documented() -> None:
    options_are_documented(DiscordSettings, "discord.md")

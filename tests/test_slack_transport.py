"""The slack transport end to end: the real slack-bolt app and slack_sdk client against
the emulator (tests/slack_emulator.py), a real gateway on real Redis, and agent
``Worker`` on a second transport, the HTTP API (``api``).

``Peer`` is another bot in the emulated workspace (bound to its bot user id), ``op`` an
operator (by Slack user id), ``alice`` a person who may only read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from slack_sdk.errors import SlackApiError

from adapters.base import Address, ConfigError, HealthState, Outbound, create_adapter
from adapters.slack import SlackAdapter
from adapters.slack.settings import SlackSettings, load_settings
from adapters.slack.text import escape, unescape
from adapters.slack.transport import AppTokenRefused
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
from gwkit import HttpAgent, http_url, make_config, request_block, response_block
from harness_slack import point_events, slack_options
from servers import PrivateValkey
from slack_emulator import APP_TOKEN, SlackEmulator

WORKER_TOKEN = "worker-token-slack-e2e"


@pytest.fixture
def start_gateway(
    emulator: SlackEmulator, redis_url: str, redis_client: aioredis.Redis, namespace: str,
    tmp_path: Path,
) -> Callable[..., Any]:
    """``async with start_gateway(**options) as gw``: transport ``sl`` (slack) and ``api``
    (HTTP, where ``Worker`` holds a token)."""

    @asynccontextmanager
    async def start(*, state_url: str | None = None, **options: Any) -> AsyncIterator[Gateway]:
        config = make_config(
            state_url or redis_url, namespace, tmp_path,
            transports={"sl": {"kind": "slack", **slack_options(emulator, **options)},
                        "api": {"kind": "http", "port": 0,
                                "tokens": {"Worker": WORKER_TOKEN}}},
            agents={
                "Peer": {"addresses": [f"sl:{emulator.general}"],
                         "identities": [f"sl:{emulator.uid('peer')}"]},
                "Lotbot": {"addresses": [f"sl:{emulator.general}"], "identities": ["sl:B0LOT"]},
            },
            permissions={"read": ["*"], "operators": [f"sl:{emulator.uid('op')}"]},
            outbox={"backoff_base_seconds": 0.05, "backoff_max_seconds": 0.2},
        )
        gateway = Gateway(config)
        await gateway.start()
        try:
            if options.get("mode") != "socket":
                point_events(emulator, gateway, "sl")
            yield gateway
        finally:
            await gateway.stop()

    return start


class Worker:
    """Agent ``Worker`` on the HTTP API, remembering everything delivered to it."""

    def __init__(self, gateway: Gateway, http: aiohttp.ClientSession) -> None:
        self.agent = HttpAgent(http_url(gateway, "api"), "Worker", WORKER_TOKEN, http)
        self.seen: list[str] = []

    async def inbox(self, wait: float = 0) -> list[str]:
        """Every message delivered to Worker so far."""
        self.seen.extend(await self.agent.take(wait))
        return self.seen

    async def wait_for(self, needle: str) -> str:
        async with asyncio.timeout(5):
            while not (found := [t for t in await self.inbox(wait=0.5) if needle in t]):
                pass
            return found[0]

    async def say(self, text: str) -> dict[str, Any]:
        return await self.agent.post_text(text)


@pytest.fixture
async def emulator() -> AsyncIterator[SlackEmulator]:
    """The emulated workspace on 127.0.0.1."""
    async with SlackEmulator() as emu:
        yield emu


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def request_to_worker(request_id: str, task: str = "check disk", sender: str = "Peer") -> str:
    return request_block(request_id, to="Worker", task=task, sender=sender)


answer = response_block


def adapter_of(gateway: Gateway) -> SlackAdapter:
    adapter = gateway.adapters["sl"]
    assert isinstance(adapter, SlackAdapter)
    return adapter


# -- relaying, threads, reactions ------------------------------------------------------


async def test_another_bots_request_is_tracked_relayed_and_answered_in_its_thread(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        worker = Worker(gw, http)
        task = "check that a > b & c for @alice in #general, see https://x.example/a?b=1"
        asked = request_to_worker("peer-1", task)
        # As Slack stores what the bot typed: escaped, the mention and channel as tokens.
        stored = (escape(asked).replace("@alice", "<@U0ALICE>")
                  .replace("#general", "<#C0GENERAL|general>")
                  .replace("https://x.example/a?b=1", "<https://x.example/a?b=1>"))
        assert "&gt;" in stored and "&amp;" in stored and "<@U0ALICE>" in stored
        original = await emulator.post("peer", stored)

        relayed = await worker.wait_for("peer-1")
        assert [render(m) for m in parse(relayed).messages] == [asked]
        conv = await gw.store.get("peer-1", with_history=False)
        assert conv is not None and conv.task == task
        assert (conv.origin.transport, conv.origin.channel) == ("sl", emulator.general)
        assert await emulator.wait_for(lambda: emulator.reacted(original, "white_check_mark"))

        response = answer(asked, "Worker", "yes: a > b <always> & more")
        assert (await worker.say(response))["outcome"] == "accepted"
        [reply] = await emulator.wait_for(lambda: emulator.replies_in(original["ts"]))
        assert "&gt;" in reply["text"] and "<always>" not in reply["text"]  # escaped
        [got] = parse(unescape(reply["text"])).messages
        assert got.request_id == "peer-1" and render(got) == response
        # The bot's own reply came back as an event and was dropped: relayed once.
        await asyncio.sleep(0.2)
        assert len([t for t in await worker.inbox() if "peer-1" in t]) == 1
        conv = await gw.store.get("peer-1", with_history=True)
        assert conv is not None and [e.type for e in conv.history] == ["REQUEST", "RESPONSE"]


async def test_legacy_bot_message_in_a_thread_is_answered_in_that_thread(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        worker = Worker(gw, http)
        parent = await emulator.post("alice", "let's ask the bots")
        asked = request_to_worker("lot-1", sender="Lotbot")
        sent = await emulator.post("lotbot", asked, thread_ts=parent["ts"], legacy_bot=True)
        assert sent["subtype"] == "bot_message" and "user" not in sent
        await worker.wait_for("lot-1")
        conv = await gw.store.get("lot-1", with_history=False)
        assert conv is not None and conv.origin.thread == parent["ts"]
        await worker.say(answer(asked, "Worker", "done"))
        [reply] = await emulator.wait_for(lambda: emulator.replies_in(parent["ts"]))
        assert parse(unescape(reply["text"])).messages[0].request_id == "lot-1"


async def test_malformed_block_is_answered_in_its_thread_with_a_cross(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        broken = await emulator.post("peer", "```[REQUEST → @Worker]\nTask: no sender```")
        [reply] = await emulator.wait_for(lambda: emulator.replies_in(broken["ts"]))
        assert "From" in unescape(reply["text"])
        assert await emulator.wait_for(lambda: emulator.reacted(broken, "x"))
        assert not emulator.reacted(broken, "white_check_mark")


async def test_a_long_response_is_uploaded_and_a_file_is_read_back_whole(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        worker = Worker(gw, http)
        asked = request_to_worker("peer-big")
        original = await emulator.post("peer", escape(asked))
        await worker.wait_for("peer-big")
        body = "\n".join(f"row {i}: a<b " + "z" * 90 for i in range(60))
        big = answer(asked, "Worker", body)
        assert len(big) > 4000
        await worker.say(big)
        [post] = await emulator.wait_for(
            lambda: [m for m in emulator.replies_in(original["ts"]) if m.get("files")])
        assert post["text"] == "[RESPONSE → @Peer]"
        [(name, content)] = emulator.file_text(post)
        assert name == "peer-big.txt"
        assert [render(m) for m in parse(content).messages] == [big]

        # Read back: Peer answers Worker's request with a RESPONSE as a file.
        wanted = render(build_request(sender="Worker", to="Peer", task="send logs",
                                      request_id="worker-logs"))
        await worker.say(wanted)
        logs = answer(wanted, "Peer", body)
        await emulator.post("peer", "[RESPONSE → @Worker]", files=(("logs.txt", logs),))
        got = await worker.wait_for("row 59")
        assert [render(m) for m in parse(got).messages] == [logs]


async def test_split_output_keeps_blocks_whole(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway(max_message_chars=1000) as gw:
        blocks = [request_to_worker(f"split-{n}", "t" * 600) for n in range(3)]
        receipt = await adapter_of(gw).send(
            Outbound(Address("sl", emulator.general), "\n".join(blocks)))
        posts = emulator.by_bot()
        assert len(receipt.native_ids) == len(posts) == 3
        assert all(len(p["text"]) <= 1000 for p in posts)
        assert [render(m) for p in posts for m in parse(unescape(p["text"])).messages] == blocks


# -- slash command -------------------------------------------------------------------


async def test_protocol_status_is_acknowledged_at_once_and_answered_with_block_kit(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        status, seconds, n = await emulator.command("alice", "status")
        assert status == 200 and seconds < 3
        answered = await emulator.response(n)
        assert answered["response_type"] == "in_channel"
        header = answered["blocks"][0]
        assert header["type"] == "header" and header["text"]["type"] == "plain_text"
        fields = {f["text"].split("\n")[0]: f["text"] for b in answered["blocks"]
                  for f in b.get("fields", [])}
        assert "sl: up" in fields["*transports*"]
        assert "bad_signatures: 0" in fields["*transport sl*"]  # the health figures
        assert answered["text"].startswith("*bot-protocol status*")
        assert adapter_of(gw).stats()["commands"] == 1


async def test_operator_commands_follow_permissions_by_user_id(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        await emulator.post("peer", escape(request_to_worker("peer-c")))
        await Worker(gw, http).wait_for("peer-c")
        _, _, refused = await emulator.command("alice", 'cancel peer-c "not yours"')
        no = await emulator.response(refused)
        assert no["response_type"] == "ephemeral"
        conv = await gw.store.get("peer-c", with_history=False)
        assert conv is not None and conv.status.value == "open"
        _, _, allowed = await emulator.command("op", 'cancel peer-c "ops said so"')
        yes = await emulator.response(allowed)
        assert yes["response_type"] == "in_channel", yes
        conv = await gw.store.get("peer-c", with_history=False)
        assert conv is not None and conv.status.value == "cancelled"


# -- signatures and retries ----------------------------------------------------------


async def test_bad_or_stale_signatures_are_refused_and_counted(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        adapter = adapter_of(gw)
        message = emulator.add("peer", escape(request_to_worker("peer-forged")))
        body = json.dumps(emulator.event_body(message))
        assert (await emulator.send_signed(body, "application/json",
                                           secret="not-the-secret"))[0] == 401
        assert (await emulator.send_signed(body, "application/json", age=600))[0] == 401
        assert emulator.events_url is not None
        async with aiohttp.ClientSession() as raw, raw.post(
                emulator.events_url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 401
        assert adapter.stats()["bad_signatures"] == 3
        assert adapter.stats()["events"] == 0
        assert await gw.store.get("peer-forged", with_history=False) is None
        # The right secret, a fresh timestamp: taken.
        assert (await emulator.send_signed(body, "application/json"))[0] == 200
        assert await gw.store.get("peer-forged", with_history=False) is not None


async def test_a_slack_retry_of_the_same_event_is_processed_once(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        worker = Worker(gw, http)
        message = emulator.add("peer", escape(request_to_worker("peer-retry")))
        body = json.dumps(emulator.event_body(message, "Ev0RETRY"))
        first, retried = await asyncio.gather(
            emulator.send_signed(body, "application/json"),
            emulator.send_signed(body, "application/json",
                                 {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "timeout"}))
        again = await emulator.send_signed(
            body, "application/json", {"X-Slack-Retry-Num": "2",
                                       "X-Slack-Retry-Reason": "http_timeout"})
        statuses = [first[0], retried[0], again[0]]
        assert statuses.count(200) >= 2 and set(statuses) <= {200, 503}
        await worker.wait_for("peer-retry")
        await asyncio.sleep(0.2)
        assert len([t for t in await worker.inbox() if "peer-retry" in t]) == 1
        assert emulator.reactions.count((emulator.general, message["ts"],
                                         "white_check_mark")) == 1
        assert adapter_of(gw).stats()["slack_retries"] == 2


# -- nothing lost ----------------------------------------------------------------------


async def test_messages_posted_while_down_are_caught_up_once_after_restart(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        first = await emulator.post("peer", escape(request_to_worker("before")))
        await Worker(gw, http).wait_for("before")
    # Down: nothing is pushed; what was posted stays in the channel's history.
    parent_reply = emulator.add("peer", escape(request_to_worker("in-old-thread")),
                                thread_ts=first["ts"])
    emulator.add("alice", "just chatting")
    emulator.add("peer", escape(request_to_worker("while-down")))
    assert parent_reply["thread_ts"] == first["ts"]
    async with start_gateway() as gw:
        worker = Worker(gw, http)
        await worker.wait_for("while-down")
        await worker.wait_for("in-old-thread")
        await asyncio.sleep(0.3)
        texts = await worker.inbox()
        assert [t for t in texts if "before" in t] == []  # not again
        assert len([t for t in texts if "while-down" in t]) == 1
        assert adapter_of(gw).stats()["caught_up"] >= 2
    async with start_gateway() as gw:  # and once only: a second restart finds nothing
        worker = Worker(gw, http)
        await asyncio.sleep(0.5)
        assert [t for t in await worker.inbox() if "while-down" in t] == []
        assert adapter_of(gw).stats()["caught_up"] == 0
    conv = await gw.store.get("while-down", with_history=True)
    assert conv is not None and [e.type for e in conv.history] == ["REQUEST"]


async def test_an_event_not_committed_while_redis_is_down_is_refused_then_processed_once(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession,
    durable_valkey: PrivateValkey,
) -> None:
    valkey = durable_valkey
    async with start_gateway(state_url=valkey.url) as gw:
        await emulator.post("peer", escape(request_to_worker("peer-f1")))
        await Worker(gw, http).wait_for("peer-f1")
        await asyncio.to_thread(valkey.stop)
        emulator.retry_delay = 0.1
        missed = emulator.add("peer", escape(request_to_worker("peer-f2")))
        # Slack's first delivery and its retries: not committed, so not acknowledged.
        assert await emulator.deliver(missed, retries=1) == 503
        assert not emulator.reacted(missed, "white_check_mark")
        await asyncio.to_thread(valkey.start)
        worker = Worker(gw, http)
        async with asyncio.timeout(15):  # the lane's catch-up brings it once Redis is back
            while not [t for t in await worker.inbox(wait=0.5) if "peer-f2" in t]:
                pass
        # Slack's last retry arrives later: a duplicate, acknowledged.
        assert await emulator.deliver(missed, retries=0) == 200
        await asyncio.sleep(0.2)
        assert len([t for t in await worker.inbox() if "peer-f2" in t]) == 1
        assert await emulator.wait_for(lambda: emulator.reacted(missed, "white_check_mark"))


# -- Socket Mode -----------------------------------------------------------------------


async def test_socket_mode_takes_events_and_commands_and_catches_up_after_a_reconnect(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    # Socket Mode needs no signing secret: nothing reaches the gateway over HTTP.
    async with start_gateway(mode="socket", app_token=APP_TOKEN, signing_secret=None) as gw:
        adapter = adapter_of(gw)
        assert adapter.mode == "socket" and adapter.port is None
        assert "apps.connections.open" in emulator.calls
        await emulator.wait_for(emulator.sockets)
        worker = Worker(gw, http)
        # Acknowledged (the envelope's ack) once committed.
        original = await emulator.post("peer", escape(request_to_worker("sock-1")))
        assert emulator.deliveries == []  # nothing over HTTP
        await worker.wait_for("sock-1")
        assert await emulator.wait_for(lambda: emulator.reacted(original, "white_check_mark"))
        status, seconds, n = await emulator.command("op", "status")
        assert status == 200 and seconds < 3
        assert (await emulator.response(n))["blocks"][0]["type"] == "header"

        await emulator.drop_sockets()
        emulator.add("peer", escape(request_to_worker("sock-2")))  # while disconnected
        await emulator.wait_for(emulator.sockets, timeout=15)  # the client reconnects
        await worker.wait_for("sock-2")
        assert adapter.stats()["reconnects"] >= 1


# -- delivery, readiness, options ------------------------------------------------------


async def test_refusals_become_the_right_delivery_errors(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as gw:
        general = emulator.general
        await refusals_are_classified(
            adapter_of(gw), general,
            rate_limit=lambda wait: emulator.rate_limit(general, wait),
            not_a_channel="general", unknown="C0UNKNOWN")


async def test_a_retried_message_does_not_post_its_parts_twice(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    text = "\n".join(f"line {i} " + "w" * 90 for i in range(100))  # three messages
    async with start_gateway() as gw:
        await retried_parts_are_posted_once(
            adapter_of(gw), emulator.general, text,
            refuse_second_part=lambda: setattr(emulator, "refuse_after", 1),
            posted=lambda: [(m["ts"], unescape(m["text"])) for m in emulator.by_bot()])


def slack_adapter(emulator: SlackEmulator, **options: Any) -> SlackAdapter:
    """A slack transport on ``emulator``; option ``token`` is the bot token."""
    if "token" in options:
        options["bot_token"] = options.pop("token")
    return SlackAdapter("sl", slack_options(emulator, **options))


async def test_a_refused_token_leaves_the_transport_down(emulator: SlackEmulator) -> None:
    await refused_token_leaves_it_down(slack_adapter(emulator, token="xoxb-refused-0000"),
                                       SlackApiError)


async def test_a_refused_app_token_leaves_socket_mode_down(emulator: SlackEmulator) -> None:
    adapter = slack_adapter(emulator, mode="socket", app_token="xapp-refused-0000")
    with pytest.raises(AppTokenRefused):
        await adapter.start(SinkWithoutCursors())  # type: ignore[arg-type]
    assert adapter.health().state is HealthState.DOWN
    assert "app-level token" in adapter.health().detail
    await adapter.stop()


async def test_probe_checks_the_token_and_scopes(emulator: SlackEmulator) -> None:
    token, scopes, mode = await slack_adapter(emulator).probe()
    assert token.ok and "U0GATEWAY" in token.detail
    assert scopes.ok and scopes.detail == "all granted"
    assert mode.ok and "/slack/events" in mode.detail
    busy = await slack_adapter(emulator, listen_port=int(emulator.url.rsplit(":", 1)[1])).probe()
    assert not busy[-1].ok and "cannot listen" in busy[-1].detail and busy[-1].fix
    [_, _, socket] = await slack_adapter(emulator, mode="socket", app_token=APP_TOKEN).probe()
    assert socket.ok and "app-level token accepted" in socket.detail
    [_, _, refused] = await slack_adapter(emulator, mode="socket",
                                          app_token="xapp-refused-0000").probe()
    assert not refused.ok and "invalid_auth" in refused.detail and refused.fix
    await probe_reports_refusals(lambda **o: slack_adapter(emulator, **o),
                                 token="xoxb-refused-0000",
                                 api_base_url="http://127.0.0.1:9/api/", refused="invalid_auth")


def test_options_name_the_key_and_secrets_come_from_the_environment() -> None:
    base = {"bot_token": "xoxb-1234567890", "signing_secret": "s" * 20}
    with pytest.raises(ConfigError, match=r"transports\.sl\.listen_port"):
        SlackAdapter("sl", {**base, "listen_port": 70000})
    with pytest.raises(ConfigError, match=r"transports\.sl\.channels"):
        SlackAdapter("sl", {**base, "channels": ["general"]})
    with pytest.raises(ConfigError, match="SLACK_BOT_TOKEN"):
        load_settings("sl", {}, environ={})
    with pytest.raises(ConfigError, match="SLACK_SIGNING_SECRET"):
        load_settings("sl", {}, environ={"SLACK_BOT_TOKEN": "xoxb-1234567890"})
    with pytest.raises(ConfigError, match="app-level token"):
        load_settings("sl", {"mode": "socket"}, environ={"SLACK_BOT_TOKEN": "xoxb-1"})
    settings, secrets = load_settings("sl", {"api_base_url": "http://127.0.0.1:1/api"}, environ={
        "SLACK_BOT_TOKEN": "xoxb-env", "SLACK_SIGNING_SECRET": "sec", "SLACK_APP_TOKEN": "xapp-1"})
    assert settings.api_base_url == "http://127.0.0.1:1/api/"
    assert (secrets.bot_token, secrets.signing_secret, secrets.app_token) == (
        "xoxb-env", "sec", "xapp-1")
    assert secrets.socket_mode
    _, http_mode = load_settings("sl", {"mode": "http"}, environ={
        "SLACK_BOT_TOKEN": "xoxb-env", "SLACK_SIGNING_SECRET": "sec", "SLACK_APP_TOKEN": "xapp-1"})
    assert not http_mode.socket_mode
    assert isinstance(create_adapter("slack", "sl", base), SlackAdapter)


def test_every_option_is_documented() -> None:
    options_are_documented(SlackSettings, "slack.md")


async def test_hostile_or_odd_events_are_answered_and_never_crash_the_transport(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway() as gw:
        adapter = adapter_of(gw)
        odd_events: list[dict[str, Any]] = [
            {"type": "message", "text": "no channel", "ts": "1.000001"},
            {"type": "message", "channel": emulator.general, "text": "no ts"},
            {"type": "message", "channel": emulator.general, "ts": "../../x", "text": "bad ts"},
            {"type": "message", "channel": "not-a-channel", "ts": "1.000002", "text": "x"},
            {"type": "message", "subtype": "channel_join", "channel": emulator.general,
             "ts": "1.000003", "user": "U0ALICE", "text": "joined"},
        ]
        for event in odd_events:
            body = emulator.event_body({"ts": "1.0"})
            body["event"] = event
            status, _ = await emulator.send_signed(json.dumps(body), "application/json")
            assert status == 200, event
        # A file list of the wrong shape and a number as text: read as what they are.
        odd = emulator.add("peer", "x")
        odd.update(text=12345, files={"name": "x.txt"})
        assert await emulator.deliver(odd) == 200
        assert await gw.store.get("x", with_history=False) is None
        # An id Slack does not know is shown as it is, and asked about once.
        worker = Worker(gw, http)
        for n in range(2):
            await emulator.post("peer", escape(request_to_worker(f"ghost-{n}", "ask @ghost"))
                                .replace("@ghost", "<@U0GHOST>"))
            await worker.wait_for(f"ghost-{n}")
        conv = await gw.store.get("ghost-1", with_history=False)
        assert conv is not None and conv.task == "ask @U0GHOST"
        assert emulator.calls.count("users.info") == 1
        assert adapter.health().state.value == "up"


async def test_a_command_typed_as_a_message_is_answered_in_its_thread(
    emulator: SlackEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        typed = await emulator.post("op", "/protocol status")
        [reply] = await emulator.wait_for(lambda: emulator.replies_in(typed["ts"]))
        assert reply["text"].startswith("*")  # mrkdwn: the bold title


async def test_listed_channels_are_the_only_ones_read_and_are_tracked_from_the_start(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], http: aiohttp.ClientSession
) -> None:
    async with start_gateway(channels=[emulator.general]):
        pass  # nothing posted yet: the listed channel gets a cursor at "now" anyway
    missed = emulator.add("peer", escape(request_to_worker("listed-1")))
    async with start_gateway(channels=[emulator.general]) as gw:
        worker = Worker(gw, http)
        await worker.wait_for("listed-1")
        elsewhere = await emulator.post("peer", escape(request_to_worker("other-1")),
                                        channel="C0OTHER")
        _, _, n = await emulator.command("op", "status", channel="C0OTHER")
        refused = await emulator.response(n)
        assert refused["response_type"] == "ephemeral"
        assert "not enabled in this channel" in refused["text"]
        assert await gw.store.get("other-1", with_history=False) is None
        assert not emulator.reacted(elsewhere, "white_check_mark")
        assert emulator.reacted(missed, "white_check_mark")


async def test_a_slash_command_is_acknowledged_at_once_even_when_the_state_store_is_down(
    emulator: SlackEmulator, start_gateway: Callable[..., Any], durable_valkey: PrivateValkey
) -> None:
    async with start_gateway(state_url=durable_valkey.url):
        await asyncio.to_thread(durable_valkey.stop)
        status, seconds, n = await emulator.command("op", "list")
        assert status == 200 and seconds < 1.0  # Slack wants it within 3 s
        answered = await emulator.response(n, timeout=15)
        assert answered["response_type"] == "ephemeral", answered  # the failure, privately
        assert answered["text"].startswith("*/protocol list failed*")
        await asyncio.to_thread(durable_valkey.start)

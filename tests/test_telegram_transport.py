"""The telegram transport end to end: the real python-telegram-bot against the emulator
(tests/telegram_emulator.py), a real gateway on real Redis, and a second transport: the
HTTP API, where agent Mantis reads its inbox and posts its answers.

``Peer`` is another bot in the forum supergroup ``ops`` (its address is topic ``TOPIC``);
``op`` (a person) may run operator commands, ``visitor`` may only read.
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
from telegram.error import InvalidToken

from adapters.base import ConfigError, HealthState, WebRequest
from adapters.telegram import TelegramAdapter
from adapters.telegram.settings import TelegramSettings, load_settings
from gateway.app import Gateway
from gateway.config import GatewayConfig
from protocol import build_request, parse, render, reply_response

from chat_checks import (
    options_are_documented,
    probe_reports_refusals,
    refusals_are_classified,
    refused_token_leaves_it_down,
    retried_parts_are_posted_once,
)
from gwkit import QUICK_RETRIES, HttpAgent, http_url, make_config, wait_up
from harness_telegram import telegram_options
from telegram_emulator import LOUNGE, OPS, TOKEN, TOPIC, USERS, TelegramEmulator, as_fenced

MANTIS_TOKEN = "tok-mantis-telegram"
SECRET = "webhook-secret-0123456789"
WRONG_TOKEN = "987654321:AAWrongTokenWrongTokenWrong00"


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator() as emu:
        yield emu


class Mantis(HttpAgent):
    """Agent Mantis on the HTTP transport: reads its inbox, posts answers."""

    def __init__(self, gateway: Gateway, http: aiohttp.ClientSession) -> None:
        super().__init__(http_url(gateway, "api"), "Mantis", MANTIS_TOKEN, http)

    async def post(self, text: str) -> dict[str, Any]:
        return await self.post_text(text)

    async def inbox(self, until: Callable[[list[str]], bool], wait: float = 5.0) -> list[str]:
        """Texts in Mantis's inbox (acknowledged as read) once ``until`` holds."""
        texts: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not until(texts) and loop.time() < deadline:
            texts += await self.take(1.0)
        assert until(texts), texts
        return texts


@asynccontextmanager
async def running_with_mantis(config: GatewayConfig, *, wait: bool
                              ) -> AsyncIterator[tuple[Gateway, Mantis]]:
    """The started gateway (transport ``tg`` up unless ``wait`` is False) and Mantis."""
    gateway = Gateway(config)
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as http:
            if wait:
                await wait_up(gateway, "tg")
            yield gateway, Mantis(gateway, http)
    finally:
        await gateway.stop()


@pytest.fixture
def start_gateway(
    emulator: TelegramEmulator, redis_url: str, redis_client: aioredis.Redis, namespace: str,
    tmp_path: Path,
) -> Callable[..., Any]:
    """``async with start_gateway(**options) as (gw, mantis)``: transport ``tg`` with
    ``options``, Mantis on the http transport ``api``."""

    def start(*, wait: bool = True, **options: Any) -> Any:
        tg = {"kind": "telegram", **telegram_options(emulator, **options)}
        api = {"kind": "http", "port": 0, "tokens": {"Mantis": MANTIS_TOKEN}}
        peer = {"addresses": [f"tg:{OPS}#{TOPIC}"], "identities": [f"tg:{USERS['peer']['id']}"]}
        return running_with_mantis(make_config(
            redis_url, namespace, tmp_path, transports={"tg": tg, "api": api},
            agents={"Peer": peer,
                    "Mantis": {"addresses": ["api:Mantis"], "identities": ["api:Mantis"]}},
            permissions={"read": ["*"], "operators": [f"tg:{USERS['op']['id']}"]},
            **QUICK_RETRIES,
        ), wait=wait)

    return start


def request_text(request_id: str, task: str = "check disk", sender: str = "Peer",
                 to: str = "Mantis") -> str:
    return render(build_request(sender=sender, to=to, task=task, request_id=request_id))


def response_to(request: str, sender: str, result: str) -> str:
    return render(reply_response(parse(request).messages[0], sender=sender, status="success",
                                 result=result))


async def requested(emulator: TelegramEmulator, mantis: Mantis, request_id: str) -> None:
    """Peer asks Mantis something in the topic; returns once Mantis has it."""
    await emulator.post("peer", request_text(request_id), thread=TOPIC)
    await mantis.inbox(lambda t: any(request_id in x for x in t))


def shown(message: dict[str, Any]) -> str:
    """A bot message as a reader sees it (``pre`` entities fenced)."""
    return as_fenced(message.get("text", ""), message.get("entities", []))


# -- relaying, replies, reactions ------------------------------------------------------


async def test_bot_request_in_a_topic_relayed_to_http_and_response_replied_in_the_topic(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (gw, mantis):
        asked = request_text("peer-1")
        original = await emulator.post("peer", "please 😀:\n" + asked, thread=TOPIC)
        [relayed] = await mantis.inbox(lambda t: len(t) >= 1)
        assert [m.request_id for m in parse(relayed).messages] == ["peer-1"]
        assert await emulator.wait_for(lambda: emulator.reacted(original, "👍"))
        conv = await gw.store.get("peer-1", with_history=False)
        assert conv is not None
        assert (conv.origin.channel, conv.origin.thread) == (str(OPS), str(TOPIC))

        answer = response_to(asked, "Mantis", "sda is 40% full & <fine>")
        assert (await mantis.post(answer))["outcome"] == "accepted"
        [reply] = await emulator.wait_for(lambda: emulator.replies_to(original))
        assert reply["message_thread_id"] == TOPIC  # in the topic it started in
        assert "<pre>" in reply["html"] and "&amp; &lt;fine&gt;" in reply["html"]
        [got] = parse(shown(reply)).messages
        assert got.request_id == "peer-1" and render(got) == answer
        assert emulator.requests["getUpdates"] >= 1 and emulator.commands[0]["command"] == (
            "protocol")


async def test_plain_fences_in_a_private_chat_and_other_chats_ignored(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    private = emulator.private_chat("peer")
    async with start_gateway(chats=[OPS, private]) as (_, mantis):
        await emulator.post("peer", request_text("peer-lounge"), chat=LOUNGE)
        first = await emulator.post("peer", "typed:\n" + request_text("peer-dm"), chat=private,
                                    raw=True)
        [relayed] = await mantis.inbox(lambda t: len(t) >= 1)
        assert parse(relayed).messages[0].request_id == "peer-dm"
        assert await emulator.wait_for(lambda: emulator.reacted(first, "👍"))
        assert not emulator.reactions[1:]  # the lounge (not listed) was left alone


async def test_malformed_block_answered_with_the_error_and_a_thumbs_down(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway():
        broken = await emulator.post("peer", "```\n[REQUEST → @Mantis]\nTask: no sender\n```",
                                     thread=TOPIC)
        [reply] = await emulator.wait_for(lambda: emulator.replies_to(broken))
        assert "From" in reply["text"] and reply["message_thread_id"] == TOPIC
        assert await emulator.wait_for(lambda: emulator.reacted(broken, "👎"))


async def test_a_long_response_goes_as_a_document_and_is_read_back_whole(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (_, mantis):
        asked = request_text("peer-big")
        original = await emulator.post("peer", asked, thread=TOPIC)
        await mantis.inbox(lambda t: len(t) >= 1)
        body = "\n".join(f"row {i}: " + "z" * 90 for i in range(100))
        big = response_to(asked, "Mantis", body)
        assert len(big) > 9000
        await mantis.post(big)
        [post] = await emulator.wait_for(lambda: emulator.replies_to(original))
        assert post["caption"] == "[RESPONSE → @Peer]"
        name, data = emulator.files[post["document"]["file_id"]]
        assert name == "peer-big.txt"
        assert [render(m) for m in parse(data.decode()).messages] == [big]

        # Read back: Peer answers a request of Mantis's with a document of its own.
        wanted = request_text("mantis-logs", sender="Mantis", to="Peer", task="send logs")
        await mantis.post(wanted)
        await emulator.wait_for(lambda: any("mantis-logs" in shown(m)
                                            for m in emulator.by_bot(OPS)))
        logs = response_to(wanted, "Peer", body)
        await emulator.post("peer", "[RESPONSE → @Mantis]", thread=TOPIC,
                            document=("logs.txt", logs))
        texts = await mantis.inbox(lambda t: any("row 99" in x for x in t))
        [got] = [t for t in texts if "row 99" in t]
        assert [render(m) for m in parse(got).messages] == [logs]


# -- commands --------------------------------------------------------------------------


async def test_protocol_status_and_show_with_the_bot_name_answered_in_html(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (_, mantis):
        await requested(emulator, mantis, "peer-7")
        status = await emulator.post("visitor", "/protocol status", thread=TOPIC)
        [answer] = await emulator.wait_for(lambda: emulator.replies_to(status))
        assert answer["html"].startswith("<b>bot-protocol status</b>")
        assert answer["message_thread_id"] == TOPIC
        assert "transport tg:" in answer["text"] and "mode: polling" in answer["text"]
        assert "group_messages: all" in answer["text"]

        show = await emulator.post("visitor", "/protocol@bpgw_test_bot show peer-7")
        [shown_answer] = await emulator.wait_for(lambda: emulator.replies_to(show))
        assert "peer-7" in shown_answer["text"].split("\n")[0]
        other = await emulator.post("visitor", "/protocol@someone_else_bot status")
        stranger = await emulator.post("visitor", "/protocol status")  # after it, answered
        await emulator.wait_for(lambda: emulator.replies_to(stranger))
        assert not emulator.replies_to(other)


async def test_cancel_needs_an_operator_by_telegram_user_id(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (gw, mantis):
        await requested(emulator, mantis, "peer-9")
        denied = await emulator.post("visitor", "/protocol cancel peer-9")
        [no] = await emulator.wait_for(lambda: emulator.replies_to(denied))
        assert "permission denied" in no["text"]
        conv = await gw.store.get("peer-9", with_history=False)
        assert conv is not None and str(conv.status) == "open"
        allowed = await emulator.post("op", "/protocol cancel peer-9 not needed")
        await emulator.wait_for(lambda: emulator.replies_to(allowed))
        conv = await gw.store.get("peer-9", with_history=False)
        assert conv is not None and str(conv.status) == "cancelled"


async def test_privacy_mode_reported_in_health_and_status_with_the_fix(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    emulator.can_read_all_group_messages = False
    async with start_gateway() as (_, mantis):
        async with mantis.http.get(f"{mantis.base}/healthz") as resp:
            health = (await resp.json())["transports"]["tg"]
        assert health["state"] == "up"
        assert "privacy mode on" in health["detail"] and "Group Privacy" in health["detail"]
        assert health["group_messages"].startswith("limited")
        asked = await emulator.post("op", "/protocol status")
        [answer] = await emulator.wait_for(lambda: emulator.replies_to(asked))
        assert "group_messages: limited: privacy mode is on" in answer["text"]
        assert "Bot-to-Bot Communication Mode" in answer["text"]


# -- webhook, flood limits, lease ------------------------------------------------------


async def test_webhook_refuses_a_wrong_secret_and_processes_the_right_one(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELEGRAM_WEBHOOK_SECRET", SECRET)
    url = "https://gw.example.invalid/telegram/tg"
    async with start_gateway(mode="webhook", webhook_url=url) as (gw, mantis):
        assert emulator.webhook == {"url": url, "secret_token": SECRET,
                                    "allowed_updates": ["message"]}
        message = await emulator.post("peer", request_text("peer-hook"), thread=TOPIC)
        [update] = [u for u in emulator.updates if u["message"] is message]
        hook = f"{mantis.base}/telegram/tg"
        for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "wrong-secret-0123456789"}):
            async with mantis.http.post(hook, json=update, headers=headers) as resp:
                assert resp.status == 401
        assert gw.health()["transports"]["tg"]["webhook_refused"] == 2
        right = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        junks = (b"{not json", b"[]", b'{"update_id": "a"}', b'{"update_id": 1, "message": "x"}',
                 b'{"update_id": 1, "message": {"chat": 5}}', b"\xff\xfe")
        for junk in junks:
            async with mantis.http.post(hook, data=junk, headers=right) as resp:
                assert resp.status == 400, junk
        async with mantis.http.post(hook, json=update, headers=right) as resp:
            assert resp.status == 200
        [relayed] = await mantis.inbox(lambda t: len(t) >= 1)
        assert "peer-hook" in relayed
        async with mantis.http.post(hook, json=update, headers=right) as resp:
            assert resp.status == 200  # Telegram retrying: recognised, not processed again
        assert emulator.requests["getUpdates"] == 0
        assert gw.adapters["tg"].capabilities.single_connection is False
        body, _ = await gw.metrics()
        assert 'bpgw_transport_stat{stat="webhook_refused",transport="tg"} 2.0' in body.decode()


async def test_a_429_retry_after_is_honoured_by_the_outbox(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (gw, mantis):
        emulator.rate_limit(OPS, 1.0)
        asked = request_text("mantis-429", sender="Mantis", to="Peer", task="wait for it")
        await mantis.post(asked)
        [delivered] = await emulator.wait_for(lambda: emulator.by_bot(OPS), timeout=10)
        [(_, refused_at)] = emulator.limited_at
        assert delivered["sent_at"] >= refused_at + 1.0
        assert "mantis-429" in shown(delivered)
        await refusals_are_classified(
            gw.adapters["tg"], str(OPS), rate_limit=lambda wait: emulator.rate_limit(OPS, wait),
            not_a_channel="ops", unknown="-100999")


async def test_a_retried_message_does_not_post_its_parts_twice(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    text = "\n".join(f"line {i} " + "w" * 90 for i in range(100))  # three messages
    async with start_gateway() as (gw, _):
        await retried_parts_are_posted_once(
            gw.adapters["tg"], str(OPS), text,
            refuse_second_part=lambda: emulator.rate_limit(OPS, 30.0, after=1),
            posted=lambda: [(f"{OPS}:{m['message_id']}", m["text"])
                            for m in emulator.by_bot(OPS)])


async def test_one_poller_per_token_across_replicas(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (first, _):
        async with start_gateway(wait=False) as (second, mantis):
            await asyncio.sleep(0.6)
            assert second.adapters["tg"].health().state is HealthState.STANDBY
            await first.stop()  # releases the lease: the standby takes over
            await wait_up(second, "tg")
            await emulator.post("peer", request_text("peer-l1"), thread=TOPIC)
            [relayed] = await mantis.inbox(lambda t: len(t) >= 1)
            assert "peer-l1" in relayed


# -- lifecycle, probe, options ---------------------------------------------------------


async def test_a_refused_token_leaves_the_transport_down(emulator: TelegramEmulator) -> None:
    adapter = TelegramAdapter("tg", telegram_options(emulator, token=WRONG_TOKEN))
    await refused_token_leaves_it_down(adapter, InvalidToken)


@pytest.mark.parametrize(("options", "problem"), [
    ({"chats": ["ops"]}, r"transports\.tg\.chats"),
    ({"accepted_reaction": "✅"}, r"transports\.tg\.accepted_reaction.*no ✅"),
    ({"mode": "webhook"}, "webhook_url: required"),
    ({"webhook_url": "http://plain.invalid/"}, r"transports\.tg\.webhook_url"),
    ({"poll_timeout_seconds": 99}, r"transports\.tg\.poll_timeout_seconds"),
])
def test_bad_options_name_the_key(options: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        TelegramAdapter("tg", {"token": TOKEN, **options})


def test_secrets_come_from_the_environment() -> None:
    with pytest.raises(ConfigError, match="TELEGRAM_BOT_TOKEN"):
        load_settings("tg", {}, environ={})
    with pytest.raises(ConfigError, match="does not look like a bot token"):
        load_settings("tg", {"token": "nope"})
    with pytest.raises(ConfigError, match="TELEGRAM_WEBHOOK_SECRET"):
        load_settings("tg", {"mode": "webhook", "webhook_url": "https://x.invalid/h"},
                      environ={"TELEGRAM_BOT_TOKEN": TOKEN})
    settings, token, secret = load_settings(
        "tg", {"token_env": "MY_BOT", "mode": "webhook", "webhook_url": "https://x.invalid/h"},
        environ={"MY_BOT": TOKEN, "TELEGRAM_WEBHOOK_SECRET": SECRET})
    assert token == TOKEN and secret == SECRET and settings.token is None
    assert TOKEN not in repr(load_settings("tg", {"token": TOKEN})[0])
    assert json.dumps(TelegramAdapter("tg", {"token": TOKEN}).stats())


async def test_webhook_mode_needs_an_http_transport(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    config = make_config(redis_url, namespace, tmp_path, transports={"tg": {
        "kind": "telegram", "token": TOKEN, "mode": "webhook", "webhook_secret": SECRET,
        "webhook_url": "https://x.invalid/telegram/tg"}})
    with pytest.raises(ConfigError, match="needs an enabled transport that serves web routes"):
        await Gateway(config).start()


def test_every_option_is_documented() -> None:
    options_are_documented(TelegramSettings, "telegram.md")


async def test_probe_reads_get_me(emulator: TelegramEmulator) -> None:
    good = TelegramAdapter("tg", telegram_options(emulator))
    token, groups = await good.probe()
    assert token.ok and "@bpgw_test_bot" in token.detail and groups.ok and not groups.fix
    emulator.can_read_all_group_messages = False
    _, limited = await good.probe()
    assert limited.ok and "privacy mode is on" in limited.detail and "BotFather" in limited.fix
    await probe_reports_refusals(lambda **o: TelegramAdapter("tg", telegram_options(emulator, **o)),
                                 token=WRONG_TOKEN, api_base_url="http://127.0.0.1:9/bot",
                                 refused="refused")


async def test_a_lost_document_holds_the_chat_back_only_a_few_attempts(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway(file_read_attempts=2) as (gw, mantis):
        lost = emulator.next_update_id
        await emulator.post("peer", "[REQUEST → @Mantis]", thread=TOPIC,
                            document=("gone.txt", None))  # Telegram cannot serve the file
        await requested(emulator, mantis, "peer-after")  # read once the lost one gave up
        assert emulator.fetched[lost] == 2  # fetched again once, then read without it
        assert gw.health()["transports"]["tg"]["state"] == "up"


async def test_a_conflicting_poller_degrades_health_until_it_goes_away(
    emulator: TelegramEmulator, start_gateway: Callable[..., Any]
) -> None:
    async with start_gateway() as (gw, mantis):
        emulator.webhook = {"url": "https://elsewhere.invalid/hook"}  # someone set a webhook
        for _ in range(250):
            health = gw.health()["transports"]["tg"]
            if health["state"] == "degraded":
                break
            await asyncio.sleep(0.02)
        assert health["state"] == "degraded" and "conflict" in health["detail"]
        assert health["errors"] >= 1 and "webhook" in health["last_error"]
        emulator.webhook = None
        await wait_up(gw, "tg")
        await requested(emulator, mantis, "peer-back")


async def test_the_webhook_route_answers_503_while_the_transport_is_not_running(
    emulator: TelegramEmulator,
) -> None:
    adapter = TelegramAdapter("tg", telegram_options(
        emulator, mode="webhook", webhook_url="https://x.invalid/telegram/tg",
        webhook_secret=SECRET))
    [route] = adapter.web_routes()
    assert (route.path, route.method, route.transport) == ("/telegram/tg", "POST", "tg")
    answer = await route.handler(WebRequest({"x-telegram-bot-api-secret-token": SECRET}, b"{}"))
    assert answer.status == 503 and answer.headers["Retry-After"]
    assert TelegramAdapter("tg", telegram_options(emulator)).web_routes() == ()

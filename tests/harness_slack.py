"""Contract harness of the ``slack`` transport: the real slack-bolt app (HTTP mode) and
slack_sdk client against the emulator in tests/slack_emulator.py; ``Peer`` is the
emulator's ``peer`` bot posting in ``general``."""

from __future__ import annotations

from typing import Any

from adapters.slack import SlackAdapter
from gateway.app import Gateway

from contract_harness import TRANSPORT, ChatHarness, Posted, register_emulated
from slack_emulator import BOT_TOKEN, SIGNING_SECRET, SlackEmulator

RETRY_AFTER = 45.0
MAX_CHARS = 4000


def slack_options(emulator: SlackEmulator, **extra: Any) -> dict[str, Any]:
    """Options of a slack transport (HTTP mode, any free port) talking to ``emulator``;
    an ``extra`` option set to None is left out."""
    options = {
        "bot_token": BOT_TOKEN,
        "signing_secret": SIGNING_SECRET,
        "api_base_url": emulator.api_base_url,
        "mode": "http",
        "listen_port": 0,
        "max_message_chars": MAX_CHARS,
        **extra,
    }
    return {key: value for key, value in options.items() if value is not None}


def point_events(emulator: SlackEmulator, gateway: Gateway, name: str = TRANSPORT) -> None:
    """Have the emulator push events to the running transport ``name`` (HTTP mode)."""
    adapter = gateway.adapters[name]
    assert isinstance(adapter, SlackAdapter) and adapter.port is not None
    emulator.events_url = f"http://127.0.0.1:{adapter.port}{adapter.settings.events_path}"


class SlackHarness(ChatHarness):
    """Drives the emulated workspace's ``general`` channel."""

    kind = "slack"
    max_length = MAX_CHARS
    echoes_own_posts = True

    def __init__(self, emulator: SlackEmulator) -> None:
        self.emulator = emulator
        self.channel = emulator.general
        self.peer = emulator.uid("peer")

    def options(self) -> dict[str, Any]:
        return slack_options(self.emulator)

    async def connected(self, gateway: Gateway) -> None:
        await super().connected(gateway)
        point_events(self.emulator, gateway)

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        await self.emulator.post("peer", text, files=files)

    async def posted(self) -> list[Posted]:
        return [Posted(m["text"], tuple(self.emulator.file_text(m)))
                for m in self.emulator.by_bot(self.channel)]

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        self.emulator.rate_limit(self.channel, RETRY_AFTER)
        return "rate_limited", RETRY_AFTER


register_emulated("slack", SlackEmulator, SlackHarness)

"""Contract harness of the ``discord`` transport: the real discord.py client against the
emulator in tests/discord_emulator.py; ``Peer`` is the emulator's ``peer`` bot."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.app import Gateway

from contract_harness import ChatHarness, Posted, register_emulated
from discord_emulator import TOKEN, DiscordEmulator

RETRY_AFTER = 45.0  # over max_ratelimit_seconds: discord.py hands it to us


def discord_options(emulator: DiscordEmulator, **extra: Any) -> dict[str, Any]:
    """Options of a discord transport talking to ``emulator``."""
    return {
        "token": TOKEN,
        "api_base_url": emulator.api_base_url,
        "gateway_url": emulator.gateway_url,
        "guilds": [emulator.guild_id],
        "guild_ready_timeout_seconds": 0.1,
        "ready_timeout_seconds": 10,
        **extra,
    }


class DiscordHarness(ChatHarness):
    """Drives the emulated guild's ``general`` channel."""

    kind = "discord"
    max_length = 2000
    echoes_own_posts = True

    def __init__(self, emulator: DiscordEmulator) -> None:
        self.emulator = emulator
        self.channel = str(emulator.channels["general"])
        self.peer = emulator.uid("peer")

    def options(self) -> dict[str, Any]:
        return discord_options(self.emulator)

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        await self.emulator.post("peer", text, files=files)

    async def posted(self) -> list[Posted]:
        out = []
        async with aiohttp.ClientSession() as http:
            for message in self.emulator.by_bot(int(self.channel)):
                files = []
                for attachment in message["attachments"]:
                    async with http.get(attachment["url"]) as resp:
                        files.append((attachment["filename"], await resp.text()))
                out.append(Posted(message["content"], tuple(files)))
        return out

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        self.emulator.rate_limit(int(self.channel), RETRY_AFTER)
        return "rate_limited", RETRY_AFTER


register_emulated("discord", DiscordEmulator, DiscordHarness)

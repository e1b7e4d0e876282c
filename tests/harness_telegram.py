"""Contract harness of the ``telegram`` transport: the real python-telegram-bot against the
emulator in tests/telegram_emulator.py; ``Peer`` is the emulator's ``peer`` bot posting in
the forum supergroup ``ops``. Telegram never shows a bot its own messages."""

from __future__ import annotations

import os
from typing import Any

from gateway.app import Gateway

from contract_harness import ChatHarness, Posted, register_emulated
from telegram_emulator import OPS, TOKEN, USERS, TelegramEmulator, as_fenced

RETRY_AFTER = 45.0


def telegram_options(emulator: TelegramEmulator, **extra: Any) -> dict[str, Any]:
    """Options of a telegram transport talking to ``emulator`` (short polls: fast stops)."""
    os.environ["NO_PROXY"] = "127.0.0.1"  # httpx honours proxy variables
    return {
        "token": TOKEN,
        "api_base_url": emulator.api_base_url,
        "file_base_url": emulator.file_base_url,
        "poll_timeout_seconds": 1,
        "request_timeout_seconds": 5,
        **extra,
    }


class TelegramHarness(ChatHarness):
    """Drives the emulated supergroup ``ops``."""

    kind = "telegram"
    channel = str(OPS)
    peer = str(USERS["peer"]["id"])
    max_length = 4096
    echoes_own_posts = False  # Telegram never shows a bot its own messages

    def __init__(self, emulator: TelegramEmulator) -> None:
        self.emulator = emulator

    def options(self) -> dict[str, Any]:
        return telegram_options(self.emulator)

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        for name, content in files or ((None, None),):
            document = (name, content) if name is not None and content is not None else None
            await self.emulator.post("peer", text, chat=OPS, document=document)

    async def posted(self) -> list[Posted]:
        out = []
        for message in self.emulator.by_bot(OPS):
            if "document" in message:
                name, data = self.emulator.files[message["document"]["file_id"]]
                text = as_fenced(message.get("caption", ""), message.get("caption_entities", []))
                out.append(Posted(text, ((name, data.decode()),)))
            else:
                out.append(Posted(as_fenced(message["text"], message.get("entities", []))))
        return out

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        self.emulator.rate_limit(OPS, RETRY_AFTER)
        return "rate_limited", RETRY_AFTER


register_emulated("telegram", TelegramEmulator, TelegramHarness)

"""Transport kind ``telegram``: a python-telegram-bot bot (docs/telegram.md). Needs
``bpgw[telegram]``."""

from __future__ import annotations

from adapters.base import register_adapter
from adapters.telegram.transport import TelegramAdapter

register_adapter("telegram")(TelegramAdapter)

__all__ = ["TelegramAdapter"]

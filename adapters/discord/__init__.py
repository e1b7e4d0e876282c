"""Transport kind ``discord``: a discord.py bot (docs/discord.md). Needs ``bpgw[discord]``."""

from __future__ import annotations

from adapters.base import register_adapter
from adapters.discord.transport import DiscordAdapter

register_adapter("discord")(DiscordAdapter)

__all__ = ["DiscordAdapter"]

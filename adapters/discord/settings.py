"""Options of the ``discord`` transport (docs/discord.md), validated with pydantic."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from adapters.base import ConfigError
from adapters.options import load_options

Snowflake = Annotated[int, Field(gt=0, lt=1 << 64)]
TOKEN_ENV = "DISCORD_BOT_TOKEN"
"""Where the bot token is read from when ``token`` is not set."""


class DiscordSettings(BaseModel):
    """Options of one ``discord`` transport."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The bot token; unset: read from the environment variable named by token_env.
    token: SecretStr | None = Field(default=None, min_length=20, max_length=200)
    token_env: str = Field(default=TOKEN_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Allow-lists: empty means every guild / text channel and thread the bot can see.
    # The application command is synced to each listed guild.
    guilds: list[Snowflake] = Field(default_factory=list, max_length=1000)
    channels: list[Snowflake] = Field(default_factory=list, max_length=10_000)
    # Where /protocol is registered at start: the listed guilds (instant), globally (can
    # take up to an hour to appear), or not at all.
    sync_commands: Literal["guilds", "global", "off"] = "guilds"
    command_name: str = Field(default="protocol", pattern=r"^[a-z0-9_-]{1,32}$")
    # Discord's REST base and gateway; a rate-limit proxy in front of Discord, or a local
    # emulator in tests. Every discord transport of one process must use the same ones.
    api_base_url: str = Field(default="https://discord.com/api/v10", pattern=r"^https?://\S+$")
    gateway_url: str = Field(default="wss://gateway.discord.gg/", pattern=r"^wss?://\S+$")
    # Catch-up after a restart or a new session: at most this many messages per channel.
    catch_up_max_messages: int = Field(default=1000, ge=0, le=100_000)
    # Blocks are read from .txt attachments up to this size and count per message.
    attachment_max_bytes: int = Field(default=1_048_576, ge=1024, le=25 * 1024 * 1024)
    attachments_per_message: int = Field(default=4, ge=0, le=10)
    # ✅ on accepted blocks, ❌ on rejected or malformed ones.
    reactions: bool = True
    # Messages waiting per channel while one is processed; beyond, the oldest wait for
    # catch-up instead (the cursor is not advanced past them).
    channel_queue_max: int = Field(default=1000, ge=1, le=100_000)
    # A 429 asking to wait longer than this is handed to the outbox as retry-after;
    # shorter ones discord.py waits out itself (Discord's minimum here is 30).
    max_ratelimit_seconds: float = Field(default=30.0, ge=30, le=3600, allow_inf_nan=False)
    ready_timeout_seconds: float = Field(default=30.0, gt=0, le=600, allow_inf_nan=False)
    # How long discord.py waits for guild data before "ready".
    guild_ready_timeout_seconds: float = Field(default=2.0, ge=0, le=60, allow_inf_nan=False)

    @field_validator("api_base_url", "gateway_url")
    @classmethod
    def _no_trailing_slash_for_api(cls, value: str) -> str:
        return value.rstrip("/") if value.startswith("http") else value


def load_settings(
    name: str, options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> tuple[DiscordSettings, str]:
    """The validated options and the bot token (from ``token`` or ``token_env``)."""
    settings = load_options(DiscordSettings, name, options)
    if settings.token is not None:
        return settings, settings.token.get_secret_value().strip()
    env = os.environ if environ is None else environ
    token = env.get(settings.token_env, "").strip()
    if not token:
        raise ConfigError(
            f"transports.{name}.token: no bot token; set token = \"env:VAR\" or the "
            f"environment variable {settings.token_env} (docs/discord.md, step 2)"
        )
    return settings, token

"""Options of the ``telegram`` transport (docs/telegram.md), validated with pydantic."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from telegram.constants import ReactionEmoji

from adapters.base import ConfigError
from adapters.options import load_options

TOKEN_ENV = "TELEGRAM_BOT_TOKEN"
"""Where the bot token is read from when ``token`` is not set."""
SECRET_ENV = "TELEGRAM_WEBHOOK_SECRET"
"""Where the webhook secret is read from when ``webhook_secret`` is not set."""
ChatId = Annotated[int, Field(ge=-(10**16), le=10**16)]
_TOKEN = re.compile(r"^\d{1,20}:[A-Za-z0-9_-]{20,100}$")
REACTION_EMOJI = frozenset(e.value for e in ReactionEmoji)


class TelegramSettings(BaseModel):
    """Options of one ``telegram`` transport."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The bot token from @BotFather; unset: read from the variable named by token_env.
    token: SecretStr | None = None
    token_env: str = Field(default=TOKEN_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Chats read and answered (group, supergroup and private chat ids); [] = every chat.
    chats: list[ChatId] = Field(default_factory=list, max_length=10_000)
    # Where the Bot API and its files are: Telegram's, or your own local Bot API server.
    api_base_url: str = Field(default="https://api.telegram.org/bot", pattern=r"^https?://\S+$")
    file_base_url: str = Field(default="https://api.telegram.org/file/bot",
                               pattern=r"^https?://\S+$")
    # "polling" (getUpdates, one poller per token) or "webhook" (served by an http transport).
    mode: Literal["polling", "webhook"] = "polling"
    # Long-polling: how long one getUpdates waits for news, and updates per call.
    poll_timeout_seconds: int = Field(default=30, ge=0, le=50)
    poll_limit: int = Field(default=100, ge=1, le=100)
    # Webhook: the public https URL Telegram posts to (routed to webhook_path on an http
    # transport), the path served, and the secret Telegram sends back in a header.
    webhook_url: str | None = Field(default=None, pattern=r"^https://\S+$")
    webhook_path: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9/_.-]{1,200}$")
    webhook_secret: SecretStr | None = None
    webhook_secret_env: str = Field(default=SECRET_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    webhook_max_connections: int = Field(default=40, ge=1, le=100)
    command_name: str = Field(default="protocol", pattern=r"^[a-z0-9_]{1,32}$")
    # Register /command with setMyCommands at start (shown in Telegram's command menu).
    set_commands: bool = True
    # Reactions on read blocks: accepted, and rejected or malformed (Telegram's set only).
    reactions: bool = True
    accepted_reaction: str = "👍"
    refused_reaction: str = "👎"
    # Blocks are read from .txt documents up to this size (the cloud Bot API serves 20 MB).
    attachment_max_bytes: int = Field(default=1_048_576, ge=1024, le=20 * 1024 * 1024)
    # Attempts at downloading a document before the message is read without it.
    file_read_attempts: int = Field(default=3, ge=1, le=100)
    # Timeouts of each Bot API call (a getUpdates waits poll_timeout_seconds on top).
    request_timeout_seconds: float = Field(default=20.0, gt=0, le=300, allow_inf_nan=False)

    @field_validator("accepted_reaction", "refused_reaction")
    @classmethod
    def _telegram_reaction(cls, value: str) -> str:
        if value not in REACTION_EMOJI:
            raise ValueError(
                f"{value!r} is not one of Telegram's reaction emoji (it has no ✅ or ❌); "
                "e.g. 👍 👎 👌 🤝 👀 🔥"
            )
        return value

    @model_validator(mode="after")
    def _webhook_needs_url(self) -> TelegramSettings:
        if self.mode == "webhook" and self.webhook_url is None:
            raise ValueError("webhook_url: required with mode = \"webhook\" (the public https "
                             "URL Telegram posts updates to)")
        return self


def _from_env(
    name: str, key: str, value: SecretStr | None, var: str, env: Mapping[str, str], why: str
) -> str:
    if value is not None:
        return value.get_secret_value().strip()
    found = env.get(var, "").strip()
    if not found:
        raise ConfigError(f"transports.{name}.{key}: no {why}; set {key} = \"env:VAR\" or the "
                          f"environment variable {var} (docs/telegram.md)")
    return found


def load_settings(
    name: str, options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> tuple[TelegramSettings, str, str | None]:
    """The validated options, the bot token and (in webhook mode) the webhook secret."""
    settings = load_options(TelegramSettings, name, options)
    env = os.environ if environ is None else environ
    token = _from_env(name, "token", settings.token, settings.token_env, env, "bot token")
    if not _TOKEN.match(token):
        raise ConfigError(f"transports.{name}.token: does not look like a bot token from "
                          "@BotFather (digits, a colon, then letters)")
    secret = None
    if settings.mode == "webhook":
        secret = _from_env(name, "webhook_secret", settings.webhook_secret,
                           settings.webhook_secret_env, env, "webhook secret")
        if not re.fullmatch(r"[A-Za-z0-9_-]{16,256}", secret):
            raise ConfigError(f"transports.{name}.webhook_secret: 16-256 characters of "
                              "A-Z, a-z, 0-9, _ and - (Telegram's rule), at least 16")
    return settings, token, secret

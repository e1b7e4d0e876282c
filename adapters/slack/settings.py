"""Options of the ``slack`` transport (docs/slack.md), validated with pydantic.

Secrets (bot token, signing secret, app-level token) come from the options (usually as
``env:VAR``) or, when unset, from the environment variables named by the ``*_env`` keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from adapters.base import ConfigError
from adapters.options import load_options

EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
ChannelId = Annotated[str, Field(pattern=r"^[CGD][A-Z0-9]{2,30}$")]
Secret = Annotated[SecretStr | None, Field(default=None, min_length=8, max_length=500)]

# Slack's own ceiling for chat.postMessage text (longer is truncated by Slack).
SLACK_TEXT_MAX = 40_000


class SlackSettings(BaseModel):
    """Options of one ``slack`` transport."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Bot token (xoxb-...), request signing secret and, for Socket Mode, the app-level
    # token (xapp-... with connections:write); unset: read from the *_env variables.
    bot_token: Secret = None
    bot_token_env: EnvName = "SLACK_BOT_TOKEN"
    signing_secret: Secret = None
    signing_secret_env: EnvName = "SLACK_SIGNING_SECRET"
    app_token: Secret = None
    app_token_env: EnvName = "SLACK_APP_TOKEN"
    # "socket" needs the app token, "http" serves the Events API; "auto": socket when an
    # app token is configured, else http.
    mode: str = Field(default="auto", pattern=r"^(auto|socket|http)$")
    # Slack's Web API; GovSlack lives at another host, tests point it at an emulator.
    api_base_url: str = Field(default="https://slack.com/api/", pattern=r"^https?://\S+$")
    # HTTP mode: the gateway's own listener for Events API and slash-command requests
    # (behind the TLS proxy whose public URL is the app's Request URL).
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=3000, ge=0, le=65535)
    events_path: str = Field(default="/slack/events", pattern=r"^/[A-Za-z0-9/_.-]{0,200}$")
    max_body_bytes: int = Field(default=1_048_576, ge=4096, le=16 * 1024 * 1024)
    # Allow-list of channel ids read (empty: every channel the bot is in); listed
    # channels are caught up even when nothing was processed there yet.
    channels: list[ChannelId] = Field(default_factory=list, max_length=10_000)
    command_name: str = Field(default="/protocol", pattern=r"^/[a-z0-9_-]{1,31}$")
    # Outbound text per message (Slack truncates at 40,000; 4,000 reads best).
    max_message_chars: int = Field(default=4000, ge=500, le=SLACK_TEXT_MAX)
    # Catch-up after a restart or reconnect: messages per channel, and how far back
    # threads are looked for new replies.
    catch_up_max_messages: int = Field(default=1000, ge=0, le=100_000)
    thread_lookback_seconds: float = Field(default=7 * 86400, ge=0, le=90 * 86400,
                                           allow_inf_nan=False)
    # Blocks are read from .txt files up to this size and count per message.
    attachment_max_bytes: int = Field(default=1_048_576, ge=1024, le=25 * 1024 * 1024)
    attachments_per_message: int = Field(default=4, ge=0, le=10)
    # ✅ (white_check_mark) on accepted blocks, ❌ (x) on rejected or malformed ones.
    reactions: bool = True
    # User ids -> display names remembered for turning <@U...> back into @name.
    name_cache_max: int = Field(default=10_000, ge=0, le=1_000_000)
    request_timeout_seconds: float = Field(default=10.0, gt=0, le=120, allow_inf_nan=False)


@dataclass(frozen=True)
class SlackSecrets:
    """The credentials a transport runs with (never logged)."""

    bot_token: str
    signing_secret: str
    app_token: str | None

    @property
    def socket_mode(self) -> bool:
        """Whether the transport connects through Socket Mode."""
        return self.app_token is not None


def _secret(value: SecretStr | None, env_name: str, env: Mapping[str, str]) -> str:
    if value is not None:
        return value.get_secret_value().strip()
    return env.get(env_name, "").strip()


def load_settings(
    name: str, options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> tuple[SlackSettings, SlackSecrets]:
    """The validated options and credentials (options first, then the environment)."""
    settings = load_options(SlackSettings, name, options)
    env = os.environ if environ is None else environ
    bot = _secret(settings.bot_token, settings.bot_token_env, env)
    secret = _secret(settings.signing_secret, settings.signing_secret_env, env)
    app = _secret(settings.app_token, settings.app_token_env, env) or None
    if not bot:
        raise ConfigError(
            f"transports.{name}.bot_token: no bot token; set bot_token = \"env:VAR\" or the "
            f"environment variable {settings.bot_token_env} (docs/slack.md, step 3)"
        )
    if settings.mode == "http":
        app = None
    elif settings.mode == "socket" and app is None:
        raise ConfigError(
            f"transports.{name}.app_token: mode = \"socket\" needs an app-level token "
            f"(xapp-..., scope connections:write) in app_token or {settings.app_token_env}"
        )
    if app is None and not secret:
        raise ConfigError(
            f"transports.{name}.signing_secret: HTTP mode needs the app's signing secret; "
            f"set signing_secret = \"env:VAR\" or {settings.signing_secret_env} "
            "(docs/slack.md, step 3)"
        )
    if not settings.api_base_url.endswith("/"):
        settings = settings.model_copy(update={"api_base_url": settings.api_base_url + "/"})
    return settings, SlackSecrets(bot, secret, app)

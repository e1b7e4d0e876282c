"""Transport kind ``discord``: a discord.py bot reading every channel it may, posting
blocks as fences, answering ``/protocol`` natively. Setup: docs/discord.md.

One gateway session per bot token across replicas: ``single_connection``, so the gateway
runs it only on the replica holding the transport's lease. Inbound handling (order,
commit, catch-up) is in ``inbound.py``; ``/protocol`` in ``commands.py``; embeds in
``render.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import discord
import yarl
from discord import app_commands

from adapters.attachments import block_filename
from adapters.base import (
    Adapter,
    Author,
    Capabilities,
    CommandRequest,
    CommandResult,
    ConfigError,
    DeliveryError,
    Disposition,
    GatewaySink,
    HealthState,
    Outbound,
    Probe,
    Receipt,
)
from adapters.chunking import split_message
from adapters.delivery import Background, PartialSends, reaction_for
from adapters.discord.commands import protocol_group
from adapters.discord.inbound import Inbound, roles_of
from adapters.discord.render import embed, markdown
from adapters.discord.settings import DiscordSettings, load_settings

log = logging.getLogger("bpgw.adapters.discord")

MESSAGE_MAX = 2000
ACCEPTED_REACTION = "✅"
REFUSED_REACTION = "❌"
# Discord wants an interaction answered within 3 s; slower commands are deferred first.
ANSWER_WITHIN_SECONDS = 2.5
# How long stop() lets each channel finish the message in hand.
STOP_GRACE_SECONDS = 5.0
PROBE_TIMEOUT_SECONDS = 5.0
# Application flags: GATEWAY_MESSAGE_CONTENT and its "limited" form (under 100 guilds).
MESSAGE_CONTENT_FLAGS = (1 << 18) | (1 << 19)

# discord.py reads its REST base and gateway URL from class attributes: one pair per
# process. Remember the library's own, and which running transport set them.
_LIBRARY_DEFAULTS = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
_POINTED: dict[int, tuple[str, str]] = {}


def _point_library(owner: int, settings: DiscordSettings) -> None:
    urls = (settings.api_base_url, settings.gateway_url)
    for other, theirs in _POINTED.items():
        if other != owner and theirs != urls:
            raise ConfigError(
                "every discord transport of one process must use the same api_base_url "
                f"and gateway_url (one runs with {theirs[0]}, {theirs[1]})"
            )
    _POINTED[owner] = urls
    discord.http.Route.BASE = settings.api_base_url
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.gateway_url)


def _release_library(owner: int) -> None:
    _POINTED.pop(owner, None)
    if not _POINTED:
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = (
            _LIBRARY_DEFAULTS
        )


class _Bot(discord.Client):
    """The discord.py client; every event goes to the adapter."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        s = adapter.settings
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(
            intents=intents,
            max_ratelimit_timeout=s.max_ratelimit_seconds,
            guild_ready_timeout=s.guild_ready_timeout_seconds,
            enable_debug_events=True,
            chunk_guilds_at_startup=False,
        )
        self.adapter = adapter
        self.tree = app_commands.CommandTree(self)
        self.tree.add_command(protocol_group(s.command_name, adapter.run_command))

    async def on_ready(self) -> None:
        await self.adapter.on_session(resumed=False)

    async def on_resumed(self) -> None:
        await self.adapter.on_session(resumed=True)

    async def on_disconnect(self) -> None:
        self.adapter.on_disconnect()

    async def on_socket_event_type(self, event_type: str) -> None:
        self.adapter.last_event_at = time.time()

    async def on_message(self, message: discord.Message) -> None:
        self.adapter.on_message(message)


class DiscordAdapter(Adapter):
    """Transport kind ``discord`` (see the module docstring)."""

    capabilities = Capabilities(
        max_message_length=MESSAGE_MAX,
        threads=True,
        reactions=True,
        sees_other_bots=True,
        native_commands=True,
        single_connection=True,
    )

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings, self._token = load_settings(name, options)
        self._client: _Bot | None = None
        # Posting without a gateway session (this replica is on standby): REST only.
        self._rest: discord.Client | None = None
        self._rest_lock = asyncio.Lock()
        self._runner: asyncio.Task[None] | None = None
        self._inbound: Inbound | None = None
        self._sink: GatewaySink | None = None
        self._ready = asyncio.Event()
        self._sessions = 0
        self._reactions = Background(log)
        self._partial = PartialSends()
        self.last_event_at: float | None = None
        self.reconnects = 0
        self.resumes = 0
        self.commands_synced = "not yet"
        # A command not answered within this is deferred ("thinking"), then followed up.
        self.answer_within_seconds = ANSWER_WITHIN_SECONDS

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, sink: GatewaySink) -> None:
        """Log in, open the gateway session, return once Discord says ready.

        Raises (health ``down``) when the token is refused, the message-content intent
        is not enabled, or Discord does not get ready within ``ready_timeout_seconds``.
        """
        if self._client is not None:
            raise RuntimeError(f"discord transport {self.name} is already running")
        _point_library(id(self), self.settings)
        self.set_health(HealthState.STARTING, "connecting to Discord")
        self._sink = sink
        await self._close_rest()  # the bot posts from now on
        self._ready.clear()
        self._sessions = 0
        client = self._client = _Bot(self)
        try:
            await client.login(self._token)
            self._inbound = Inbound(self.name, self.settings, client, sink, self._react)
            self._runner = asyncio.create_task(client.connect(reconnect=True))
            ready = asyncio.create_task(self._ready.wait())
            done, _ = await asyncio.wait(
                {ready, self._runner}, timeout=self.settings.ready_timeout_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
            ready.cancel()
            if self._runner in done:
                self._runner.result()  # raises what ended the connection
                raise ConnectionError("the gateway connection ended before ready")
            if not done:
                raise TimeoutError(
                    f"Discord did not get ready within {self.settings.ready_timeout_seconds:g}s"
                )
        except BaseException as exc:
            await self.start_failed(_why_down(exc), self._shutdown, log)
            raise
        self._runner.add_done_callback(self._connection_ended)
        log.info("discord transport %s connected as %s", self.name, client.user,
                 extra={"transport": self.name})

    async def stop(self) -> None:
        """Finish the messages in hand, close the session; safe to call twice."""
        if self._client is not None:
            await self._shutdown()
            log.info("discord transport %s stopped", self.name, extra={"transport": self.name})
        await self._close_rest()
        _release_library(id(self))
        self.set_health(HealthState.DOWN, "stopped")

    async def _close_rest(self) -> None:
        rest, self._rest = self._rest, None
        if rest is not None:
            with contextlib.suppress(Exception):
                await rest.close()

    async def _shutdown(self) -> None:
        client, runner, inbound = self._client, self._runner, self._inbound
        self._client = self._runner = self._inbound = None
        if inbound is not None:
            await inbound.close(STOP_GRACE_SECONDS)
        self._reactions.cancel_all()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(BaseException):
                await runner

    def _connection_ended(self, task: asyncio.Task[None]) -> None:
        if self._runner is not task:
            return  # stopped on purpose
        error = None if task.cancelled() else task.exception()
        detail = _why_down(error) if error else "the gateway connection ended"
        log.error("discord transport %s: %s", self.name, detail, extra={"transport": self.name})
        self.set_health(HealthState.DOWN, detail)

    # -- connection events -----------------------------------------------------------

    async def on_session(self, *, resumed: bool) -> None:
        """READY (a new session) or RESUMED (Discord replays what was missed)."""
        client, inbound = self._client, self._inbound
        if client is None or inbound is None:
            return
        if resumed:
            self.resumes += 1
        else:
            self._sessions += 1
            if self._sessions > 1:
                self.reconnects += 1
        if not resumed:
            if self._sessions == 1:
                await self._sync_commands(client)
            # A new session missed whatever was posted since the cursors.
            await inbound.catch_up_all()
        self.set_health(HealthState.UP, f"connected as {client.user}")
        self._ready.set()

    def on_disconnect(self) -> None:
        """The websocket closed; discord.py reconnects (and resumes when it can)."""
        if self._client is not None and not self._client.is_closed():
            self.set_health(HealthState.DEGRADED, "disconnected from Discord; reconnecting")

    def on_message(self, message: discord.Message) -> None:
        """A live MESSAGE_CREATE: queue it on its channel's lane."""
        inbound = self._inbound
        if inbound is None:
            return
        channel = message.channel
        parent = getattr(channel, "parent_id", None)
        if inbound.wanted(message.guild.id if message.guild else None, channel.id, parent):
            inbound.offer(message)

    async def _sync_commands(self, client: _Bot) -> None:
        mode = self.settings.sync_commands
        if mode == "off":
            self.commands_synced = "off"
            return
        try:
            if mode == "global":
                await client.tree.sync()
                self.commands_synced = "global"
                return
            guild_ids = self.settings.guilds or [g.id for g in client.guilds]
            for guild_id in guild_ids:
                guild = discord.Object(guild_id)
                client.tree.copy_global_to(guild=guild)
                await client.tree.sync(guild=guild)
            self.commands_synced = f"{len(guild_ids)} guild(s)"
        except (discord.HTTPException, aiohttp.ClientError) as exc:
            self.commands_synced = f"failed: {exc}"
            log.warning("could not sync /%s: %s", self.settings.command_name, exc,
                        extra={"transport": self.name})

    def stats(self) -> Mapping[str, Any]:
        """Connection figures for /healthz and /protocol status."""
        client = self._client
        latency = client.latency if client is not None else float("nan")
        return {
            "connected": client is not None and client.is_ready() and not client.is_closed(),
            "latency_ms": round(latency * 1000, 1) if latency == latency and latency != float(
                "inf") else None,
            "last_event_seconds_ago": None if self.last_event_at is None
            else round(time.time() - self.last_event_at, 1),
            "reconnects": self.reconnects,
            "resumes": self.resumes,
            "caught_up": self._inbound.caught_up if self._inbound else 0,
            "commands": self.commands_synced,
        }

    # -- reactions -------------------------------------------------------------------

    async def _react(self, message: discord.Message, disposition: Disposition) -> None:
        emoji = reaction_for(disposition.outcome, ACCEPTED_REACTION, REFUSED_REACTION)
        if not self.settings.reactions or emoji is None:
            return
        # In the background: a rate-limited reaction must not hold up the channel.
        self._reactions.run(self._add_reaction(message, emoji), f"{emoji} on {message.id}")

    async def _add_reaction(self, message: discord.Message, emoji: str) -> None:
        try:
            await message.add_reaction(emoji)
        except (discord.HTTPException, aiohttp.ClientError) as exc:
            log.info("could not react %s to %s: %s", emoji, message.id, exc,
                     extra={"transport": self.name, "native_id": str(message.id)})

    # -- commands --------------------------------------------------------------------

    async def run_command(
        self, interaction: discord.Interaction, name: str, args: tuple[str, ...]
    ) -> None:
        """Run ``/protocol <name>`` through the gateway and answer with an embed;
        refusals and errors only the caller sees."""
        result = None
        sink, inbound = self._sink, self._inbound
        channel_id = interaction.channel_id or 0
        parent = getattr(interaction.channel, "parent_id", None)
        if sink is None or inbound is None:
            result = CommandResult(title="the gateway is stopping; try again", ok=False)
        elif not inbound.wanted(interaction.guild_id, channel_id, parent):
            result = CommandResult(
                title=f"/{self.settings.command_name} is not enabled in this channel", ok=False
            )
        if result is not None:
            await interaction.response.send_message(embed=embed(result), ephemeral=True)
            return
        assert sink is not None and inbound is not None
        channel, thread = await inbound.where(channel_id)
        user = interaction.user
        request = CommandRequest(
            transport=self.name,
            channel=channel,
            thread=thread,
            author=Author(id=str(user.id), display_name=user.display_name, is_bot=user.bot),
            name=name,
            args=args,
            roles=roles_of(user),
        )
        running = asyncio.ensure_future(sink.on_command(request))
        done, _ = await asyncio.wait({running}, timeout=self.answer_within_seconds)
        if not done:
            await interaction.response.defer(thinking=True)
        try:
            result = await running
        except Exception as exc:  # the gateway went away mid-command
            log.exception("command failed", extra={"transport": self.name})
            result = CommandResult(title=f"/{self.settings.command_name} {name} failed",
                                   fields=(("error", str(exc)),), ok=False)
        if done:
            await interaction.response.send_message(embed=embed(result), ephemeral=not result.ok)
        else:
            await interaction.followup.send(embed=embed(result), ephemeral=not result.ok)

    def render_command_result(self, result: CommandResult) -> str:
        """Text commands (``/protocol status`` typed as a message) answer in markdown."""
        return markdown(result)

    # -- outbound --------------------------------------------------------------------

    async def send(self, message: Outbound) -> Receipt:
        """Post ``message`` in its channel or thread, as a reply to ``reply_to``.

        Split at 2,000 characters without breaking a block; a block longer than that goes
        as a ``.txt`` attachment with its header line as the message. A 429 that asks for
        more than ``max_ratelimit_seconds`` becomes ``DeliveryError(retry_after=...)``.
        """
        target = message.address.thread or message.address.channel
        if not target.isdigit():
            raise DeliveryError(f"{message.address} does not name a Discord channel id",
                                code="bad_address")
        channel = (await self._poster(message)).get_partial_messageable(int(target))
        reference = None
        if message.reply_to and message.reply_to.isdigit():
            reference = discord.MessageReference(
                message_id=int(message.reply_to), channel_id=int(target),
                fail_if_not_exists=False,
            )
        ids = self._partial.take(message.id)
        for index, part in enumerate(split_message(message.text, MESSAGE_MAX)):
            if index < len(ids):
                continue  # posted by an earlier attempt
            extra: dict[str, Any] = {"allowed_mentions": discord.AllowedMentions.none()}
            if part.block is not None:
                extra["file"] = discord.File(io.BytesIO(part.block.encode()),
                                             filename=block_filename(message.request_id))
            if index == 0 and reference is not None:
                extra["reference"] = reference
            try:
                sent = await channel.send(part.text or None, **extra)
            except Exception as exc:
                self._partial.keep(message.id, ids)
                raise _delivery_error(exc, message) from None
            ids.append(str(sent.id))
        return Receipt(tuple(ids))

    async def _poster(self, message: Outbound) -> discord.Client:
        """The client to post with: the running bot, else a REST-only login. Posting needs
        no gateway session, so a replica on standby delivers what its outbox dispatches
        while another replica holds the session."""
        client = self._client
        if client is not None and not client.is_closed():
            return client
        async with self._rest_lock:
            rest = self._rest
            if rest is None or rest.is_closed():
                _point_library(id(self), self.settings)
                rest = discord.Client(intents=discord.Intents.none(),
                                      max_ratelimit_timeout=self.settings.max_ratelimit_seconds)
                try:
                    await rest.login(self._token)
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        await rest.close()
                    if isinstance(exc, discord.LoginFailure):
                        raise DeliveryError("Discord refused the bot token",
                                            code="unauthorized") from None
                    raise _delivery_error(exc, message) from None
                self._rest = rest
            return rest

    # -- readiness -------------------------------------------------------------------

    async def probe(self) -> Sequence[Probe]:
        """The token-check call (``GET /users/@me``) and the message-content intent."""
        api = self.settings.api_base_url
        headers = {"Authorization": f"Bot {self._token}"}
        check = f"transport {self.name}: discord token"
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
            ) as http:
                async with http.get(f"{api}/users/@me", headers=headers) as resp:
                    if resp.status == 401:
                        return (Probe(check, False, "Discord refused the token (401)",
                                      "copy the token again (Developer Portal -> Bot -> Reset "
                                      "Token) into the variable token/token_env names"),)
                    if resp.status != 200:
                        return (Probe(check, False, f"GET /users/@me answered {resp.status}",
                                      "check api_base_url and Discord's status page"),)
                    me = await resp.json(content_type=None)
                async with http.get(f"{api}/oauth2/applications/@me", headers=headers) as resp:
                    app = await resp.json(content_type=None) if resp.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return (Probe(check, False, f"cannot reach {api}: {exc or type(exc).__name__}",
                          "check the network and api_base_url"),)
        if not isinstance(me, dict):
            return (Probe(check, False, "GET /users/@me did not answer a user object",
                          "check api_base_url: it must point at Discord's API (or a proxy)"),)
        found = [Probe(check, True, f"bot {me.get('username')} ({me.get('id')})")]
        flags = int(app.get("flags") or 0) if isinstance(app, dict) else 0
        intent = f"transport {self.name}: message content intent"
        if flags & MESSAGE_CONTENT_FLAGS:
            found.append(Probe(intent, True, "enabled"))
        else:
            found.append(Probe(intent, False, "not enabled: the bot would see empty messages",
                               "Developer Portal -> Bot -> Privileged Gateway Intents -> "
                               "Message Content Intent (docs/discord.md, step 3)"))
        return found


def _delivery_error(exc: Exception, message: Outbound) -> DeliveryError:
    """What the outbox should do about a failed post."""
    where = str(message.address)
    if isinstance(exc, discord.RateLimited):
        return DeliveryError(f"Discord rate limit on {where}: retry in {exc.retry_after:.1f}s",
                             retry_after=exc.retry_after, code="rate_limited")
    if isinstance(exc, discord.HTTPException):
        if exc.status == 429:
            retry = _retry_after(exc)
            return DeliveryError(f"Discord rate limit on {where}", retry_after=retry,
                                 code="rate_limited")
        if exc.status == 403:
            return DeliveryError(
                f"the bot may not post in {where} ({exc.text or 'Forbidden'}): grant it View "
                "Channel, Send Messages, Send Messages in Threads and Attach Files",
                code="forbidden")
        if exc.status == 404:
            return DeliveryError(f"{where}: unknown channel ({exc.text})", code="not_found")
        code = "platform_error" if exc.status >= 500 else "rejected"
        return DeliveryError(f"Discord answered {exc.status} for {where}: {exc.text}", code=code)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return DeliveryError(f"cannot reach Discord: {exc or type(exc).__name__}",
                             code="unreachable")
    return DeliveryError(f"posting to {where} failed: {type(exc).__name__}: {exc}")


def _retry_after(exc: discord.HTTPException) -> float | None:
    header = exc.response.headers.get("Retry-After") if exc.response is not None else None
    try:
        return float(header) if header else None
    except ValueError:
        return None


def _why_down(exc: BaseException | None) -> str:
    """A health detail telling the operator what to fix."""
    if isinstance(exc, discord.LoginFailure):
        return "Discord refused the bot token (check token / token_env)"
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return ("the message-content intent is not enabled: Developer Portal -> Bot -> "
                "Privileged Gateway Intents -> Message Content Intent")
    if isinstance(exc, asyncio.CancelledError):
        return "start cancelled"
    return f"{type(exc).__name__}: {exc}" if exc else "disconnected"

"""Transport kind ``slack``: a slack-bolt ``AsyncApp`` reading every channel it is in,
posting blocks as fences, answering ``/protocol`` with Block Kit. Setup: docs/slack.md.

Socket Mode when an app-level token is configured (the websocket URL comes from
``apps.connections.open`` on ``api_base_url``), otherwise HTTP mode: the transport serves
the Events API and the slash command on its own aiohttp listener (``listen_host``,
``listen_port``, ``events_path``) behind the operator's TLS proxy. Every HTTP request's
signature is verified by Bolt (a bad or stale one: 401, counted). Bolt processes a
request before answering it (``process_before_response``), so an event is acknowledged
(HTTP 200, a Socket Mode ack) only after the gateway committed it; one it could not
commit is answered 503 (HTTP) or not acknowledged (Socket Mode), and Slack delivers it
again. Inbound order, commit and catch-up are in ``inbound.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters.attachments import block_filename
from adapters.base import (
    Adapter,
    Author,
    Capabilities,
    CommandRequest,
    CommandResult,
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
from adapters.slack.inbound import CHANNEL_ID, Inbound, Me, Wiring
from adapters.slack.render import blocks, mrkdwn
from adapters.slack.settings import load_settings
from adapters.slack.text import escape

log = logging.getLogger("bpgw.adapters.slack")

ACCEPTED_REACTION = "white_check_mark"
REFUSED_REACTION = "x"
# How long stop() lets catch-ups finish the message in hand; probe()'s bound.
STOP_GRACE_SECONDS = 5.0
PROBE_TIMEOUT_SECONDS = 5
# Slack redelivers an event answered with anything but 2xx; we ask for a second.
RETRY_AFTER_SECONDS = 1
# Scopes the transport uses (docs/slack.md, the manifest); probe() names missing ones.
SCOPES = ("channels:history", "groups:history", "chat:write", "reactions:write",
          "files:read", "files:write", "users:read", "commands")


class AppTokenRefused(Exception):
    """Socket Mode could not open: Slack refused the app-level token."""


class NotCommitted(Exception):
    """An event the gateway could not commit: answered so that Slack delivers it again."""


class SlackAdapter(Adapter):
    """Transport kind ``slack`` (see the module docstring)."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings, self._secrets = load_settings(name, options)
        self.capabilities = Capabilities(
            max_message_length=self.settings.max_message_chars,
            threads=True,
            reactions=True,
            sees_other_bots=True,
            native_commands=True,
        )
        self.mode = "socket" if self._secrets.socket_mode else "http"
        self._http: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._app: AsyncApp | None = None
        self._inbound: Inbound | None = None
        self._sink: GatewaySink | None = None
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._background = Background(log)
        self._partial = PartialSends()
        self.me: Me | None = None
        self.port: int | None = None
        self.last_event_at: float | None = None
        self.events = 0
        self.retries = 0
        self.bad_signatures = 0
        self.commands = 0
        self.connections = 0  # Socket Mode hellos
        self.socket_connected = False

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, sink: GatewaySink) -> None:
        """Check the token (``auth.test``), build the Bolt app, then listen (HTTP mode)
        or connect (Socket Mode); catch-up of missed messages runs in the background.
        Raises (health ``down``) when the token is refused or Slack cannot be reached."""
        if self._app is not None:
            raise RuntimeError(f"slack transport {self.name} is already running")
        self.set_health(HealthState.STARTING, f"connecting to Slack ({self.mode} mode)")
        self._sink = sink
        try:
            client = self._web_client()
            auth = await client.auth_test()
            self.me = Me(str(auth.get("user_id") or ""), str(auth.get("bot_id") or ""),
                         str(auth.get("team_id") or ""))
            self._inbound = Inbound(Wiring(self.name, self.settings, client, self._session(),
                                           self._secrets.bot_token, self.me, sink, self._react))
            app = self._app = self._bolt_app(client, self.me)
            if self._secrets.app_token is not None:
                await self._connect_socket(app, self._secrets.app_token)
            else:
                await self._listen(app)
        except BaseException as exc:
            await self.start_failed(_why_down(exc), self._shutdown, log)
            raise
        self._inbound.catch_up_all()
        where = f"listening on port {self.port}" if self.port is not None else "socket mode"
        self.set_health(HealthState.UP, f"connected as {self.me.user_id} ({where})")
        log.info("slack transport %s up: %s", self.name, where, extra={"transport": self.name})

    async def stop(self) -> None:
        """Stop listening, let in-flight messages finish briefly, close connections."""
        await self._shutdown()
        self.set_health(HealthState.DOWN, "stopped")

    async def _shutdown(self) -> None:
        self._app = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close_async()  # type: ignore[no-untyped-call]
            self._socket = None
        if self._inbound is not None:
            await self._inbound.close(STOP_GRACE_SECONDS)
            self._inbound = None
        self._background.cancel_all()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._client = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_seconds))
        return self._http

    def _web_client(self) -> AsyncWebClient:
        if self._client is None:
            self._client = AsyncWebClient(
                token=self._secrets.bot_token, base_url=self.settings.api_base_url,
                session=self._session(), timeout=int(self.settings.request_timeout_seconds),
            )
        return self._client

    def _bolt_app(self, client: AsyncWebClient, me: Me) -> AsyncApp:
        token = self._secrets.bot_token

        async def authorize(**_: Any) -> AuthorizeResult:
            # From the auth.test at start: Bolt need not call it on every request.
            return AuthorizeResult(enterprise_id=None, team_id=me.team_id,
                                   bot_user_id=me.user_id, bot_id=me.bot_id, bot_token=token)

        app = AsyncApp(
            # Without a token: Bolt takes the bot token from ``authorize`` (a client with
            # one of its own makes Bolt warn that it is ignored).
            client=AsyncWebClient(base_url=client.base_url, session=client.session,
                                  timeout=client.timeout),
            signing_secret=self._secrets.signing_secret or None,
            authorize=authorize,
            process_before_response=True,
            # Our own posts go to the gateway too (it drops them, and the cursor moves).
            ignoring_self_events_enabled=False,
            request_verification_enabled=self._secrets.app_token is None,
            logger=log.getChild("bolt"),
        )
        app.event("message")(self._on_message)
        app.command(self.settings.command_name)(self._on_command)
        app.error(self._on_error)
        return app

    async def _on_error(self, error: Exception) -> None:
        """A listener failed; Bolt answers 500 (HTTP, mapped to 503) or does not ack."""
        if isinstance(error, NotCommitted):
            log.info("message %s not committed yet: Slack delivers it again", error,
                     extra={"transport": self.name, "native_id": str(error)})
        else:
            log.error("slack listener failed: %s: %s", type(error).__name__, error,
                      exc_info=error, extra={"transport": self.name})

    async def _listen(self, app: AsyncApp) -> None:
        web_app = web.Application(client_max_size=self.settings.max_body_bytes)
        web_app.router.add_post(self.settings.events_path, self._http_request)
        runner = self._runner = web.AppRunner(web_app, access_log=None,
                                              shutdown_timeout=STOP_GRACE_SECONDS)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.listen_host, self.settings.listen_port)
        await site.start()
        bound = runner.addresses
        self.port = int(bound[0][1]) if bound else self.settings.listen_port

    async def _connect_socket(self, app: AsyncApp, app_token: str) -> None:
        handler = self._socket = AsyncSocketModeHandler(app, app_token,
                                                        logger=log.getChild("socket"))
        handler.client.message_listeners.append(self._on_socket_message)
        handler.client.on_close_listeners.append(self._on_socket_close)
        try:  # once ourselves: slack_sdk retries a refused app token forever
            await app.client.apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            raise AppTokenRefused(
                f"Slack refused the app-level token ({exc.response.get('error')}): check "
                "app_token / app_token_env (an xapp- token with connections:write)") from None
        async with asyncio.timeout(self.settings.request_timeout_seconds * 3):
            await handler.connect_async()  # type: ignore[no-untyped-call]

    async def _on_socket_message(
        self, client: AsyncBaseSocketModeClient, message: dict[str, Any], raw: str | None
    ) -> None:
        """Each ``hello`` is a (re)connection: after the first, catch up what was missed."""
        if message.get("type") != "hello":
            return
        self.connections += 1
        self.socket_connected = True
        if self.connections > 1 and self._inbound is not None:
            self._inbound.catch_up_all()
            self.set_health(HealthState.UP, "reconnected (socket mode)")

    async def _on_socket_close(self, message: aiohttp.WSMessage) -> None:
        """The websocket closed: slack_sdk reconnects (a new ``hello`` follows)."""
        self.socket_connected = False
        if self._app is not None:
            self.set_health(HealthState.DEGRADED, "disconnected from Slack; reconnecting")

    # -- HTTP mode -------------------------------------------------------------------

    async def _http_request(self, request: web.Request) -> web.Response:
        """One Events API or slash-command request, verified and dispatched by Bolt."""
        app = self._app
        if app is None:
            return _retry_later("the gateway is stopping")
        body = (await request.read()).decode("utf-8", errors="replace")
        response = await app.async_dispatch(AsyncBoltRequest(
            body=body, query=request.query_string, headers=dict(request.headers)))
        if response.status == 401:
            self.bad_signatures += 1
            log.warning("refused a request with a bad or stale signature from %s",
                        request.remote, extra={"transport": self.name})
        if response.status >= 500:
            return _retry_later("not processed yet")
        headers = {k: v[0] for k, v in response.headers.items()
                   if v and k.lower() == "content-type"}
        return web.Response(status=response.status, body=response.body, headers=headers)

    # -- events ----------------------------------------------------------------------

    async def _on_message(self, event: dict[str, Any], request: AsyncBoltRequest) -> None:
        inbound = self._inbound
        if request.headers.get("x-slack-retry-num"):  # both modes carry it (HTTP header)
            self.retries += 1
        self.events += 1
        self.last_event_at = time.time()
        if inbound is None or not await inbound.live(event):
            raise NotCommitted(str(event.get("ts")))

    # -- reactions -------------------------------------------------------------------

    async def _react(self, channel: str, ts: str, disposition: Disposition) -> None:
        name = reaction_for(disposition.outcome, ACCEPTED_REACTION, REFUSED_REACTION)
        if self.settings.reactions and name is not None:
            # In the background: a rate-limited reaction must not hold up the channel.
            self._background.run(self._add_reaction(channel, ts, name), f"{name} on {ts}")

    async def _add_reaction(self, channel: str, ts: str, name: str) -> None:
        client = self._client
        if client is None:
            return
        try:
            await client.reactions_add(channel=channel, timestamp=ts, name=name)
        except (SlackApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("could not react %s to %s: %s", name, ts, exc,
                     extra={"transport": self.name, "native_id": ts})

    # -- commands --------------------------------------------------------------------

    async def _on_command(self, ack: AsyncAck, command: dict[str, Any],
                          respond: AsyncRespond) -> None:
        """Acknowledge at once (Slack wants it within 3 s); answer through ``respond()``
        once the gateway has run the command."""
        await ack()
        self.commands += 1
        self._background.run(self._answer(command, respond),
                             f"{self.settings.command_name} for {command.get('user_id')}")

    async def _answer(self, command: Mapping[str, Any], respond: AsyncRespond) -> None:
        result = await self._run_command(command)
        try:
            await respond(text=mrkdwn(result)[:3000], blocks=blocks(result),
                          response_type="in_channel" if result.ok else "ephemeral",
                          replace_original=False)
        except Exception as exc:  # the response_url expired or cannot be reached
            log.warning("could not answer %s: %s", self.settings.command_name, exc,
                        extra={"transport": self.name})

    async def _run_command(self, command: Mapping[str, Any]) -> CommandResult:
        sink, inbound = self._sink, self._inbound
        channel = str(command.get("channel_id") or "")
        name = self.settings.command_name
        if sink is None or inbound is None:
            return CommandResult(title="the gateway is stopping; try again", ok=False)
        if not inbound.wanted(channel):
            return CommandResult(title=f"{name} is not enabled in this channel", ok=False)
        text = str(command.get("text") or "")
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        request = CommandRequest(
            transport=self.name,
            channel=channel,
            author=Author(id=str(command.get("user_id") or ""),
                          display_name=str(command.get("user_name") or "")),
            name=words[0].lower() if words else "help",
            args=tuple(words[1:]),
        )
        try:
            return await sink.on_command(request)
        except Exception as exc:  # the gateway went away mid-command
            log.exception("command failed", extra={"transport": self.name})
            return CommandResult(title=f"{name} {request.name} failed",
                                 fields=(("error", str(exc)),), ok=False)

    def render_command_result(self, result: CommandResult) -> str:
        """Text commands (``/protocol status`` typed as a message) answer in mrkdwn."""
        return mrkdwn(result)

    # -- outbound --------------------------------------------------------------------

    async def send(self, message: Outbound) -> Receipt:
        """Post ``message`` in its channel, in its thread (``thread_ts``: the address's
        thread, else the message it answers).

        Escaped as Slack requires and split at ``max_message_chars`` without breaking a
        block; a block longer than that goes as a ``.txt`` file (files.uploadV2) with its
        header line as the comment. A 429 becomes ``DeliveryError(retry_after=...)``.
        """
        client = self._client
        if client is None:
            raise DeliveryError(f"slack transport {self.name} is not running",
                                retry_after=RETRY_AFTER_SECONDS, code="unavailable")
        channel = message.address.channel
        if not CHANNEL_ID.match(channel):
            raise DeliveryError(f"{message.address} does not name a Slack channel id",
                                code="bad_address")
        thread = message.address.thread or message.reply_to or None
        ids = self._partial.take(message.id)
        parts = split_message(message.text, self.settings.max_message_chars,
                              lambda s: len(escape(s)))
        for index, part in enumerate(parts):
            if index < len(ids):
                continue  # posted by an earlier attempt
            try:
                if part.block is not None:
                    done = await client.files_upload_v2(
                        channel=channel, thread_ts=thread, content=part.block,
                        filename=block_filename(message.request_id),
                        title=block_filename(message.request_id),
                        initial_comment=escape(part.text))
                    ids.append(_shared_ts(done.get("files") or [], channel)
                               or str((done.get("file") or {}).get("id") or ""))
                else:
                    sent = await client.chat_postMessage(
                        channel=channel, thread_ts=thread, text=escape(part.text),
                        unfurl_links=False, unfurl_media=False)
                    ids.append(str(sent.get("ts")))
            except Exception as exc:
                self._partial.keep(message.id, ids)
                raise _delivery_error(exc, message) from None
        return Receipt(tuple(ids))

    # -- health ----------------------------------------------------------------------

    def stats(self) -> Mapping[str, Any]:
        """Connection figures for /healthz and /protocol status."""
        return {
            "mode": self.mode,
            "connected": self._app is not None and (
                self._socket is None or self.socket_connected),
            "port": self.port,
            "last_event_seconds_ago": None if self.last_event_at is None
            else round(time.time() - self.last_event_at, 1),
            "events": self.events,
            "slack_retries": self.retries,
            "bad_signatures": self.bad_signatures,
            "commands": self.commands,
            "caught_up": self._inbound.caught_up if self._inbound else 0,
            "reconnects": max(0, self.connections - 1),
        }

    async def probe(self) -> Sequence[Probe]:
        """``auth.test`` with the bot token and the scopes Slack says it has; then the
        app-level token (Socket Mode) or the listener's address (HTTP mode)."""
        check = f"transport {self.name}: slack token"
        api = self.settings.api_base_url
        async with aiohttp.ClientSession() as http:
            client = AsyncWebClient(token=self._secrets.bot_token, base_url=api,
                                    session=http, timeout=PROBE_TIMEOUT_SECONDS)
            try:
                auth = await client.auth_test()
            except SlackApiError as exc:
                return (Probe(check, False,
                              f"auth.test refused the bot token ({exc.response.get('error')})",
                              "copy the Bot User OAuth Token (xoxb-...) again from OAuth & "
                              "Permissions into bot_token or its *_env variable"),)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                return (Probe(check, False, f"cannot reach {api}: {exc or type(exc).__name__}",
                              "check the network and api_base_url"),)
            rows = [Probe(check, True, f"bot {auth.get('user')} ({auth.get('user_id')}) in "
                                       f"{auth.get('team')}")]
            granted = auth.headers.get("x-oauth-scopes") or auth.headers.get("X-OAuth-Scopes")
            if granted is not None:
                have = {s.strip() for s in str(granted).split(",")}
                missing = [s for s in SCOPES if s not in have]
                rows.append(Probe(
                    f"transport {self.name}: scopes", not missing,
                    "all granted" if not missing else "missing: " + ", ".join(missing),
                    "" if not missing else "add them under OAuth & Permissions (or the "
                    "manifest in docs/slack.md) and reinstall the app"))
            rows.append(await self._probe_mode(client))
        return rows

    async def _probe_mode(self, client: AsyncWebClient) -> Probe:
        check = f"transport {self.name}: {self.mode} mode"
        app_token = self._secrets.app_token
        if app_token is not None:
            try:
                await client.apps_connections_open(app_token=app_token)
            except SlackApiError as exc:
                return Probe(check, False,
                             f"Slack refused the app-level token ({exc.response.get('error')})",
                             "generate an app-level token with connections:write (Basic "
                             "Information -> App-Level Tokens) into app_token or its variable")
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                return Probe(check, False, f"apps.connections.open failed: {exc}",
                             "check the network and api_base_url")
            return Probe(check, True, "app-level token accepted")
        s = self.settings
        where = f"{s.listen_host}:{s.listen_port}"
        try:
            server = await asyncio.get_running_loop().create_server(
                asyncio.Protocol, s.listen_host, s.listen_port)
        except OSError as exc:
            return Probe(check, False, f"cannot listen on {where}: {exc.strerror or exc}",
                         "free the port or change listen_host / listen_port")
        server.close()
        await server.wait_closed()
        return Probe(check, True, f"listening on {where}{s.events_path} will work; Slack's "
                                  "Request URL must reach it (docs/slack.md, step 1)")


def _retry_later(why: str) -> web.Response:
    return web.json_response({"error": why}, status=503,
                             headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _shared_ts(files: Sequence[Any], channel: str) -> str | None:
    """The ts of the message a shared file became (files.completeUploadExternal)."""
    for item in files:
        shares = (item.get("shares") or {}) if isinstance(item, dict) else {}
        for scope in ("public", "private"):
            for share in (shares.get(scope) or {}).get(channel) or []:
                if isinstance(share, dict) and share.get("ts"):
                    return str(share["ts"])
    return None


def _delivery_error(exc: Exception, message: Outbound) -> DeliveryError:
    """What the outbox should do about a failed post."""
    where = str(message.address)
    if isinstance(exc, SlackApiError):
        status = exc.response.status_code
        error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
        if status == 429 or error == "ratelimited":
            retry = _seconds(exc.response.headers.get("Retry-After")
                             or exc.response.headers.get("retry-after"))
            return DeliveryError(f"Slack rate limit on {where}", retry_after=retry,
                                 code="rate_limited")
        if error in ("not_in_channel", "channel_is_archived", "restricted_action",
                     "missing_scope"):
            return DeliveryError(f"the bot may not post in {where} ({error}): invite it "
                                 "to the channel and check its scopes (docs/slack.md)",
                                 code="forbidden")
        if error == "channel_not_found":
            return DeliveryError(f"{where}: unknown channel", code="not_found")
        if error in ("invalid_auth", "not_authed", "token_revoked", "account_inactive"):
            return DeliveryError("Slack refused the bot token", code="unauthorized")
        code = "platform_error" if status >= 500 else "rejected"
        return DeliveryError(f"Slack answered {status} {error} for {where}", code=code)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return DeliveryError(f"cannot reach Slack: {exc or type(exc).__name__}",
                             code="unreachable")
    return DeliveryError(f"posting to {where} failed: {type(exc).__name__}: {exc}")


def _seconds(header: str | None) -> float | None:
    try:
        return float(header) if header else None
    except ValueError:
        return None


def _why_down(exc: BaseException) -> str:
    """A health detail telling the operator what to fix."""
    if isinstance(exc, AppTokenRefused):
        return str(exc)
    if isinstance(exc, SlackApiError):
        error = exc.response.get("error") if isinstance(exc.response.data, dict) else ""
        return f"Slack refused the bot token ({error}): check bot_token / bot_token_env"
    if isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
        return f"cannot listen for Slack requests: {exc}"
    if isinstance(exc, asyncio.CancelledError):
        return "start cancelled"
    return f"{type(exc).__name__}: {exc}"

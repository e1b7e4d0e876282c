"""Transport kind ``telegram``: a python-telegram-bot ``Application`` reading groups,
supergroups, forum topics and private chats, posting blocks as HTML ``<pre>``, answering
``/protocol`` through a ``CommandHandler``. Setup: docs/telegram.md.

Updates come by long polling (default; one poller per bot token across replicas, so
``single_connection``: the gateway runs it only on the replica holding the lease) or by
webhook, served on the HTTP transport's listener (``web_routes``), every replica
answering. python-telegram-bot's own ``Updater`` confirms an update as soon as it is
fetched, so the transport polls itself: ``getUpdates`` with the offset after the last
*committed* update (``inbound.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
from telegram import (
    Bot,
    BotCommand,
    InputFile,
    LinkPreviewOptions,
    Message,
    ReplyParameters,
    Update,
    User,
)
from telegram.constants import ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.ext import ApplicationBuilder, CommandHandler, MessageHandler, filters

from adapters.attachments import block_filename
from adapters.base import (
    Adapter,
    Capabilities,
    CommandResult,
    DeliveryError,
    HealthState,
    Outbound,
    Probe,
    Receipt,
    WebRequest,
    WebResponse,
    WebRoute,
)
from adapters.chunking import split_message, utf16_len
from adapters.delivery import Background, PartialSends
from adapters.results import HTML, PLAIN, rich_text
from adapters.telegram.inbound import AnyApp, CarriesBlock, Inbound, native_id, thread_of
from adapters.telegram.settings import load_settings
from adapters.telegram.text import escape, to_html

if TYPE_CHECKING:
    from adapters.base import Disposition, GatewaySink

log = logging.getLogger("bpgw.adapters.telegram")

MESSAGE_MAX = 4096  # Telegram's limit, in UTF-16 code units after entity parsing
CAPTION_MAX = 1024
ALLOWED_UPDATES = ("message",)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# After a failed getUpdates or an uncommitted update: wait, growing up to the cap.
RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0
PROBE_TIMEOUT_SECONDS = 5.0
# Chats that refused a reaction are not asked again (bounded, oldest forgotten).
NO_REACTION_CHATS_MAX = 10_000
REACTIONS = {"accepted": "accepted", "malformed": "refused", "rejected": "refused"}
COMMAND_DESCRIPTION = "bot-protocol gateway: status, show, list, agents, cancel, key, help"
PRIVACY_FIX = ("@BotFather -> /mybots -> Bot Settings -> Group Privacy -> Turn off, enable "
               "Bot-to-Bot Communication Mode there too, make the bot a group admin, then "
               "remove and re-add it to each group (docs/telegram.md, steps 2-4)")



def seconds(value: int | timedelta) -> float:
    """A Bot API time period (``RetryAfter.retry_after``) in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def retry_after(exc: RetryAfter) -> float:
    """``exc.retry_after`` in seconds (read without python-telegram-bot's int warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return seconds(exc.retry_after)


def group_visibility(me: User) -> tuple[bool, str]:
    """(sees every group message of people, what the bot can see in groups)."""
    if me.can_read_all_group_messages:
        return True, ("all (privacy mode off); other bots' messages only with Bot-to-Bot "
                      "Communication Mode on and admin rights (Telegram cannot report those)")
    return False, ("limited: privacy mode is on, so groups show the bot only commands, "
                   "replies to it and mentions")


class TelegramAdapter(Adapter):
    """Transport kind ``telegram`` (see the module docstring)."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings, self._token, self._secret = load_settings(name, options)
        polling = self.settings.mode == "polling"
        self.capabilities = Capabilities(
            max_message_length=MESSAGE_MAX,
            threads=True,
            reactions=self.settings.reactions,
            sees_other_bots=True,
            native_commands=True,
            single_connection=polling,
        )
        self._app: AnyApp | None = None
        self._spare: Bot | None = None  # sends while another replica polls
        self._inbound: Inbound | None = None
        self._poller: asyncio.Task[None] | None = None
        self._in_batch = False
        self._stopping = False
        self._reactions = Background(log)
        self._partial = PartialSends()
        self._no_reactions: OrderedDict[int, None] = OrderedDict()
        self.username = ""
        self.sees_all_group_messages = False
        self.group_messages = "unknown (not started)"
        self.commands = "not yet"
        self.last_update_at: float | None = None
        self.updates = 0
        self.errors = 0
        self.last_error = ""
        self.webhook_refused = 0

    # -- lifecycle ---------------------------------------------------------------------

    def _build(self) -> AnyApp:
        s = self.settings
        return (
            ApplicationBuilder()
            .token(self._token)
            .base_url(s.api_base_url)
            .base_file_url(s.file_base_url)
            .updater(None)
            .connect_timeout(s.request_timeout_seconds)
            .read_timeout(s.request_timeout_seconds)
            .write_timeout(s.request_timeout_seconds)
            .pool_timeout(s.request_timeout_seconds)
            .build()
        )

    async def start(self, sink: GatewaySink) -> None:
        """``getMe`` (the token check and what the bot may see), ``setMyCommands``, then
        polling (after ``deleteWebhook``, keeping pending updates) or ``setWebhook``.

        Raises (health ``down``) when Telegram refuses the token or cannot be reached.
        """
        if self._app is not None:
            raise RuntimeError(f"telegram transport {self.name} is already running")
        self.set_health(HealthState.STARTING, "connecting to Telegram")
        self._stopping = False
        app = self._app = self._build()
        try:
            await app.initialize()  # getMe
            self._read_me(app.bot.bot)
            self._inbound = inbound = Inbound(self.name, self.settings, app, sink, self._react,
                                              self._answer)
            command = self.settings.command_name
            app.add_handler(MessageHandler(filters.UpdateType.MESSAGE & CarriesBlock(),
                                           inbound.on_message))
            app.add_handler(CommandHandler(command, inbound.on_command,
                                           filters=filters.UpdateType.MESSAGE))
            app.add_handler(MessageHandler(filters.UpdateType.MESSAGE, inbound.on_message))
            await self._set_commands(app.bot)
            if self.settings.mode == "polling":
                await app.bot.delete_webhook(drop_pending_updates=False)
                offset = await inbound.start_offset()
                self._poller = asyncio.create_task(self._poll(app.bot, inbound, offset),
                                                   name=f"telegram-{self.name}")
                self._poller.add_done_callback(self._poller_ended)
            else:
                await app.bot.set_webhook(
                    self.settings.webhook_url or "", secret_token=self._secret,
                    allowed_updates=ALLOWED_UPDATES, drop_pending_updates=False,
                    max_connections=self.settings.webhook_max_connections)
        except BaseException as exc:
            await self.start_failed(_why_down(exc), self._shutdown, log)
            raise
        self._up()
        log.info("telegram transport %s running as @%s (%s)", self.name, self.username,
                 self.settings.mode, extra={"transport": self.name})

    def _read_me(self, me: User) -> None:
        self.username = me.username or ""
        self.sees_all_group_messages, self.group_messages = group_visibility(me)
        if not self.sees_all_group_messages:
            self.group_messages += f"; fix: {PRIVACY_FIX}"
            log.warning("telegram transport %s: %s", self.name, self.group_messages,
                        extra={"transport": self.name})

    def _up(self) -> None:
        how = "polling" if self.settings.mode == "polling" else "webhook"
        detail = f"{how} as @{self.username}"
        if not self.sees_all_group_messages:
            detail += f"; cannot see all group messages (privacy mode on); fix: {PRIVACY_FIX}"
        self.set_health(HealthState.UP, detail)

    async def _set_commands(self, bot: Bot) -> None:
        if not self.settings.set_commands:
            self.commands = "off"
            return
        try:
            await bot.set_my_commands([BotCommand(self.settings.command_name,
                                                  COMMAND_DESCRIPTION)])
            self.commands = f"/{self.settings.command_name} registered"
        except TelegramError as exc:
            self.commands = f"failed: {exc}"
            log.warning("could not register /%s: %s", self.settings.command_name, exc,
                        extra={"transport": self.name})

    async def stop(self) -> None:
        """Let the batch in hand finish (up to a few seconds), stop polling, close the
        HTTP clients; safe to call twice. Uncommitted updates are fetched again later."""
        await self._shutdown()
        self.set_health(HealthState.DOWN, "stopped")

    async def _shutdown(self) -> None:
        self._stopping = True
        poller, self._poller = self._poller, None
        if poller is not None:
            if not self._in_batch:
                poller.cancel()
            _, pending = await asyncio.wait({poller}, timeout=STOP_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            with contextlib.suppress(BaseException):
                await poller
        self._reactions.cancel_all()
        app, self._app, self._inbound = self._app, None, None
        spare, self._spare = self._spare, None
        for closing in (app, spare):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.shutdown()

    # -- polling -----------------------------------------------------------------------

    async def _poll(self, bot: Bot, inbound: Inbound, offset: int | None) -> None:
        """Long-poll ``getUpdates`` until stopped; the offset moves past an update only
        once it is committed (see ``inbound.py``)."""
        s = self.settings
        wait = RETRY_SECONDS
        while not self._stopping:
            try:
                updates = await bot.get_updates(
                    offset=offset, limit=s.poll_limit, timeout=s.poll_timeout_seconds,
                    allowed_updates=ALLOWED_UPDATES,
                    read_timeout=s.poll_timeout_seconds + s.request_timeout_seconds)
            except asyncio.CancelledError:
                raise
            except RetryAfter as exc:
                await self._failed(f"getUpdates flood limit: {exc}", retry_after(exc))
                continue
            except (Exception) as exc:
                await self._failed(_polling_problem(exc), wait)
                wait = min(wait * 2, RETRY_MAX_SECONDS)
                continue
            wait = RETRY_SECONDS
            if self.health().state is not HealthState.UP:
                self._up()
            if not updates:
                continue
            self.last_update_at = time.time()
            self.updates += len(updates)
            self._in_batch = True
            try:
                upto = await inbound.batch(updates)
            finally:
                self._in_batch = False
            if upto is not None:
                offset = upto + 1
            if upto is None or upto < updates[-1].update_id:
                await asyncio.sleep(RETRY_SECONDS)  # the gateway could not commit: again

    def _poller_ended(self, task: asyncio.Task[None]) -> None:
        if self._poller is not task:
            return  # stopped on purpose
        error = None if task.cancelled() else task.exception()
        detail = f"polling stopped: {type(error).__name__}: {error}" if error else (
            "polling stopped")
        log.error("telegram transport %s: %s", self.name, detail, exc_info=error,
                  extra={"transport": self.name})
        self.set_health(HealthState.DOWN, detail)

    async def _failed(self, detail: str, pause: float) -> None:
        self.errors += 1
        self.last_error = detail
        log.warning("telegram transport %s: %s", self.name, detail,
                    extra={"transport": self.name})
        self.set_health(HealthState.DEGRADED, detail)
        await asyncio.sleep(pause)

    # -- webhook -----------------------------------------------------------------------

    def web_routes(self) -> Sequence[WebRoute]:
        """In webhook mode: ``POST <webhook_path>`` (default ``/telegram/<name>``)."""
        if self.settings.mode != "webhook":
            return ()
        path = self.settings.webhook_path or f"/telegram/{self.name}"
        return (WebRoute(path, self.on_webhook, transport=self.name),)

    async def on_webhook(self, request: WebRequest) -> WebResponse:
        """One update pushed by Telegram: 401 without the right secret header (counted),
        200 once committed, 503 with Retry-After while it cannot be (Telegram retries)."""
        given = request.header(SECRET_HEADER) or ""
        if not self._secret or not hmac.compare_digest(given.encode(), self._secret.encode()):
            self.webhook_refused += 1
            log.warning("webhook call without the right secret token from %s", request.remote,
                        extra={"transport": self.name})
            return WebResponse(401, {"error": "wrong or missing secret token"})
        app, inbound = self._app, self._inbound
        if app is None or inbound is None:
            return WebResponse(503, {"error": "the telegram transport is not running"},
                               {"Retry-After": "5"})
        try:
            data = json.loads(request.body)
            update = Update.de_json(data, app.bot) if isinstance(data, dict) else None
        except Exception as exc:  # any malformed shape: the library raises what it meets
            return WebResponse(400, {"error": f"not an update: {type(exc).__name__}: {exc}"})
        if update is None or not isinstance(update.update_id, int):
            return WebResponse(400, {"error": "not an update (no integer update_id)"})
        self.last_update_at = time.time()
        self.updates += 1
        if await inbound.handle(update):
            return WebResponse(200, {"ok": True})
        return WebResponse(503, {"error": "not committed; deliver again"}, {"Retry-After": "5"})

    # -- reactions and answers -----------------------------------------------------------

    def _react(self, message: Message, disposition: Disposition) -> None:
        which = REACTIONS.get(disposition.outcome)
        if not self.settings.reactions or which is None or message.chat_id in self._no_reactions:
            return
        emoji = (self.settings.accepted_reaction if which == "accepted"
                 else self.settings.refused_reaction)
        self._reactions.run(self._add_reaction(message, emoji), f"{emoji} on {message.id}")

    async def _add_reaction(self, message: Message, emoji: str) -> None:
        app = self._app
        if app is None:
            return
        try:
            await app.bot.set_message_reaction(message.chat_id, message.message_id, emoji)
        except BadRequest as exc:  # the chat does not allow this reaction: stop asking
            self._no_reactions[message.chat_id] = None
            while len(self._no_reactions) > NO_REACTION_CHATS_MAX:
                self._no_reactions.popitem(last=False)
            log.info("chat %s refuses reaction %s: %s", message.chat_id, emoji, exc,
                     extra={"transport": self.name})
        except (TelegramError, httpx.HTTPError) as exc:
            log.info("could not react %s: %s", emoji, exc, extra={"transport": self.name})

    async def _answer(self, message: Message, result: CommandResult) -> None:
        """A command's answer in HTML, replying to the command in its chat and topic."""
        app = self._app
        if app is None:
            return
        try:
            await app.bot.send_message(
                message.chat_id, rich_text(result, HTML, MESSAGE_MAX),
                parse_mode=ParseMode.HTML, message_thread_id=thread_id(thread_of(message)),
                reply_parameters=ReplyParameters(message.message_id,
                                                 allow_sending_without_reply=True),
                link_preview_options=LinkPreviewOptions(is_disabled=True))
        except (TelegramError, httpx.HTTPError) as exc:
            log.warning("could not answer /%s in %s: %s", self.settings.command_name,
                        message.chat_id, exc, extra={"transport": self.name})

    def render_command_result(self, result: CommandResult) -> str:
        """Commands typed as messages (another prefix) answer in plain text, the table
        fenced (``send`` turns it into ``<pre>``)."""
        return rich_text(result, PLAIN, MESSAGE_MAX)

    def stats(self) -> Mapping[str, Any]:
        """Connection figures for /healthz, /metrics and /protocol status."""
        return {
            "mode": self.settings.mode,
            "connected": self._app is not None and self.health().state is HealthState.UP,
            "bot": f"@{self.username}" if self.username else None,
            "group_messages": self.group_messages,
            "last_update_seconds_ago": None if self.last_update_at is None
            else round(time.time() - self.last_update_at, 1),
            "updates": self.updates,
            "errors": self.errors,
            "last_error": self.last_error or None,
            "webhook_refused": self.webhook_refused,
            "commands": self.commands,
        }

    # -- outbound ----------------------------------------------------------------------

    async def _sender(self) -> Bot:
        if self._app is not None:
            bot: Bot = self._app.bot
            return bot
        if self._spare is None:  # not polling here (another replica holds the lease)
            spare = self._build().bot
            try:
                await spare.initialize()
            except (TelegramError, httpx.HTTPError) as exc:
                raise _delivery_error(exc, "Telegram") from None
            self._spare = spare
        return self._spare

    async def send(self, message: Outbound) -> Receipt:
        """Post ``message`` in its chat and topic, the first part replying to ``reply_to``.

        HTML ``<pre>`` blocks, split at 4,096 UTF-16 code units without breaking a block;
        a block longer than that goes as a ``.txt`` document with its header line as the
        caption. A flood limit (429) becomes ``DeliveryError(retry_after=...)``.
        """
        where = str(message.address)
        try:
            chat = int(message.address.channel)
            thread = thread_id(message.address.thread)
        except ValueError:
            raise DeliveryError(f"{where} does not name a Telegram chat id (and topic id)",
                                code="bad_address") from None
        bot = await self._sender()
        reply = _reply_to(message.reply_to, chat)
        ids = self._partial.take(message.id)
        common: dict[str, Any] = {"message_thread_id": thread, "parse_mode": ParseMode.HTML}
        for index, part in enumerate(split_message(message.text, MESSAGE_MAX, utf16_len)):
            if index < len(ids):
                continue  # posted by an earlier attempt
            extra = dict(common)
            if index == 0 and reply is not None:
                extra["reply_parameters"] = ReplyParameters(reply,
                                                            allow_sending_without_reply=True)
            try:
                if part.block is not None:
                    sent = await bot.send_document(
                        chat, InputFile(part.block.encode(),
                                        filename=block_filename(message.request_id)),
                        caption=escape(part.text[: CAPTION_MAX - 24]), **extra)
                else:
                    sent = await bot.send_message(
                        chat, to_html(part.text),
                        link_preview_options=LinkPreviewOptions(is_disabled=True), **extra)
            except (TelegramError, httpx.HTTPError) as exc:
                self._partial.keep(message.id, ids)
                raise _delivery_error(exc, where) from None
            ids.append(native_id(chat, sent.message_id))
        return Receipt(tuple(ids))

    # -- readiness -----------------------------------------------------------------------

    async def probe(self) -> Sequence[Probe]:
        """``getMe``: the token, and whether the bot sees every group message."""
        check = f"transport {self.name}: telegram token"
        bot = self._build().bot
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                await bot.initialize()
                me = bot.bot
        except InvalidToken:
            return (Probe(check, False, "Telegram refused the token",
                          "copy the token from @BotFather (/mybots -> API Token) into the "
                          "variable token/token_env names"),)
        except (TelegramError, httpx.HTTPError, TimeoutError) as exc:
            return (Probe(check, False, f"cannot reach {self.settings.api_base_url}: "
                          f"{exc or type(exc).__name__}", "check the network and api_base_url"),)
        finally:
            with contextlib.suppress(Exception):
                await bot.shutdown()
        sees_all, detail = group_visibility(me)
        groups = Probe(f"transport {self.name}: group messages", True, detail,
                       "" if sees_all else PRIVACY_FIX)
        return (Probe(check, True, f"bot @{me.username} ({me.id})"), groups)


def thread_id(thread: str | None) -> int | None:
    """A topic id from an address's thread part (``ValueError`` when not a number)."""
    return int(thread) if thread else None


def _reply_to(reply_to: str | None, chat: int) -> int | None:
    """The message id to reply to, when ``reply_to`` names a message of ``chat``."""
    if not reply_to:
        return None
    where, _, message = reply_to.rpartition(":")
    if where != str(chat) or not message.isdigit():
        return None
    return int(message)


def _delivery_error(exc: Exception, where: str) -> DeliveryError:
    """What the outbox should do about a failed Bot API call."""
    if isinstance(exc, RetryAfter):
        wait = retry_after(exc)
        return DeliveryError(f"Telegram flood limit on {where}: retry in {wait:g}s",
                             retry_after=wait, code="rate_limited")
    if isinstance(exc, ChatMigrated):
        return DeliveryError(f"{where}: the group became supergroup {exc.new_chat_id}; "
                             "update the agent's address", code="chat_migrated")
    if isinstance(exc, Forbidden):
        return DeliveryError(f"the bot may not post in {where} ({exc.message}): add it to the "
                             "chat (an admin in groups) and let it send messages",
                             code="forbidden")
    if isinstance(exc, InvalidToken):
        return DeliveryError(f"Telegram refused the bot token ({exc.message})",
                             code="forbidden", retry_after=60.0)
    if isinstance(exc, BadRequest):
        text = exc.message.lower()
        code = "not_found" if "not found" in text else "rejected"
        return DeliveryError(f"Telegram refused the message for {where}: {exc.message}",
                             code=code)
    if isinstance(exc, NetworkError | httpx.HTTPError):
        return DeliveryError(f"cannot reach Telegram: {exc}", code="unreachable",
                             retry_after=RETRY_SECONDS)
    return DeliveryError(f"posting to {where} failed: {type(exc).__name__}: {exc}")


def _polling_problem(exc: BaseException) -> str:
    if isinstance(exc, Conflict):
        return ("getUpdates conflict: another process polls this bot token or a webhook is "
                f"set ({exc.message})")
    if isinstance(exc, InvalidToken | Forbidden):
        return f"Telegram refused the bot token: {exc}"
    return f"getUpdates failed: {type(exc).__name__}: {exc}"


def _why_down(exc: BaseException) -> str:
    """A health detail telling the operator what to fix."""
    if isinstance(exc, InvalidToken):
        return "Telegram refused the bot token (check token / token_env; @BotFather /mybots)"
    if isinstance(exc, asyncio.CancelledError):
        return "start cancelled"
    if isinstance(exc, NetworkError | httpx.HTTPError):
        return f"cannot reach Telegram: {exc}"
    return f"{type(exc).__name__}: {exc}"

"""Inbound Telegram updates: handed to the gateway, confirmed only once committed.

Every update (from a ``getUpdates`` batch or a webhook POST) goes through the
``Application``'s handlers: a message carrying a block, ``/protocol`` (``/protocol@bot``
in groups) through a ``CommandHandler``, then any other message. ``handle`` reports
whether the gateway committed it. A polled batch is processed one chat at a time in
order (chats side by side); a ``CommitWindow`` turns the commits into the update id the
offset may move past, so Telegram is told to forget an update (the next ``getUpdates``
offset) only after its state change is committed, and a crash brings it back instead of
losing it. The cursor store keeps that position across restarts and replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from telegram import Message, Update
from telegram.error import TelegramError
from telegram.ext import Application, ContextTypes, filters

from adapters.attachments import NotReadable, TextFile, read_text_files
from adapters.base import (
    Author,
    CommandRequest,
    CommandResult,
    CommitWindow,
    Cursors,
    Disposition,
    Envelope,
    GatewaySink,
    split_command_words,
)
from adapters.chunking import FENCE
from adapters.telegram.settings import TelegramSettings
from adapters.telegram.text import Entity, fenced

log = logging.getLogger("bpgw.adapters.telegram")

CURSOR = "updates"
"""The cursor-store channel holding the last committed update id of the bot."""
# Download attempts remembered per message at most (bounded; the oldest forgotten).
ATTEMPTS_MAX = 10_000

AnyApp = Application[Any, Any, Any, Any, Any, Any]
React = Callable[[Message, Disposition], None]
Answer = Callable[[Message, CommandResult], Awaitable[None]]


def native_id(chat_id: int, message_id: int) -> str:
    """A message's native id: ``<chat id>:<message id>`` (message ids repeat across chats)."""
    return f"{chat_id}:{message_id}"


def thread_of(message: Message) -> str | None:
    """The forum topic a message is in (None outside topics and in the General topic)."""
    if message.is_topic_message and message.message_thread_id:
        return str(message.message_thread_id)
    return None


def author_of(message: Message, me: int) -> Author:
    """Who wrote it: the chat it was sent on behalf of (anonymous admins, linked
    channels), else the user; ``is_self`` for the bot itself."""
    if message.sender_chat is not None:
        chat = message.sender_chat
        return Author(str(chat.id), chat.title or chat.username or str(chat.id))
    user = message.from_user
    if user is None:
        return Author("unknown")
    return Author(str(user.id), user.full_name, is_bot=user.is_bot, is_self=user.id == me)


class CarriesBlock(filters.MessageFilter):
    """Messages with a block (a fence, a ``pre`` entity) or a document: never a command,
    even when they start with ``/protocol@bot`` (how other bots reach a bot in groups)."""

    def filter(self, message: Message) -> bool:
        text = message.text or message.caption or ""
        entities = message.entities or message.caption_entities or ()
        return (FENCE in text or any(e.type == "pre" for e in entities)
                or message.document is not None)


class Inbound:
    """Feeds updates to the gateway (see the module docstring)."""

    def __init__(
        self,
        transport: str,
        settings: TelegramSettings,
        app: AnyApp,
        sink: GatewaySink,
        react: React,
        answer: Answer,
    ) -> None:
        self._transport = transport
        self._settings = settings
        self._app = app
        self._sink = sink
        self._cursors: Cursors = sink.cursors(transport)
        self._react = react
        self._answer = answer
        self._chats = frozenset(settings.chats)
        # update id -> committed, set by the handler that took the update.
        self._outcomes: dict[int, bool] = {}
        self._attempts: OrderedDict[str, int] = OrderedDict()
        self.handled = 0

    @property
    def me(self) -> int:
        """The bot's own user id."""
        return int(self._app.bot.id)

    def wanted(self, chat_id: int) -> bool:
        """Whether the ``chats`` allow-list covers a chat."""
        return not self._chats or chat_id in self._chats

    # -- one update ---------------------------------------------------------------------

    async def handle(self, update: Update) -> bool:
        """Run one update through the handlers; True once it may be confirmed."""
        uid = update.update_id
        self._outcomes.pop(uid, None)
        try:
            await self._app.process_update(update)
        finally:
            committed = self._outcomes.pop(uid, True)  # no handler took it: nothing to do
        self.handled += 1
        return committed

    def _taken(self, update: Update) -> Message | None:
        """The update's message if its chat is read (the update then counts as not yet
        committed until its handler says otherwise)."""
        message = update.message
        if message is None or not self.wanted(message.chat_id):
            return None
        self._outcomes[update.update_id] = False
        return message

    def _origin(self, message: Message) -> dict[str, Any]:
        """Transport, channel, thread and author of a message (envelope/command fields)."""
        return {"transport": self._transport, "channel": str(message.chat_id),
                "thread": thread_of(message), "author": author_of(message, self.me)}

    async def on_message(self, update: Update, _: ContextTypes.DEFAULT_TYPE) -> None:
        """A message (with or without a block): to the gateway pipeline."""
        message = self._taken(update)
        if message is None:
            return
        key = native_id(message.chat_id, message.message_id)
        try:
            text = await self.text_of(key, message)
        except NotReadable as exc:
            log.warning("message %s not read yet: %s", key,
                        exc, extra={"transport": self._transport, "native_id": key})
            return
        envelope = Envelope(**self._origin(message), text=text, native_id=key,
                            at=message.date.timestamp())
        disposition = await self._sink.on_envelope(envelope)
        self._outcomes[update.update_id] = disposition.committed
        if disposition.committed:
            self._attempts.pop(key, None)
            if not envelope.author.is_self:
                self._react(message, disposition)

    async def on_command(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """``/protocol <command> [args]`` (``/protocol@bot`` in groups): run, answer in HTML."""
        message = self._taken(update)
        if message is None:
            return
        name, args = split_command_words(context.args or ())
        result = await self._sink.on_command(
            CommandRequest(**self._origin(message), name=name, args=args))
        # The command ran: confirm it even if the answer cannot be posted (it is logged).
        self._outcomes[update.update_id] = True
        await self._answer(message, result)

    # -- message text ---------------------------------------------------------------------

    async def text_of(self, key: str, message: Message) -> str:
        """The text (or caption) with blocks fenced from their entities, followed by the
        text of a ``.txt`` document (a block sent as a file).

        A document that cannot be downloaded raises ``NotReadable`` (the update is
        fetched again) up to ``file_read_attempts`` times; then the message is read with
        a note instead, so one lost file never holds the bot's updates back.
        """
        text = message.text if message.text is not None else message.caption or ""
        raw = message.entities if message.text is not None else message.caption_entities
        entities = [Entity(str(e.type), e.offset, e.length) for e in raw or ()
                    if isinstance(e.offset, int) and isinstance(e.length, int)]
        parts = [fenced(text, entities)]
        document = message.document
        if document is not None:
            name = document.file_name or "document"
            file = TextFile(name, document.file_size, lambda: self._download(document.file_id))
            try:
                parts += await read_text_files(
                    [file], self._settings.attachment_max_bytes, (TelegramError, httpx.HTTPError,
                                                                  OSError))
            except NotReadable as exc:
                if self._attempt(key) < self._settings.file_read_attempts:
                    raise
                parts.append(f"(attachment {name} not read: {exc})")
        text = "\n".join(p for p in parts if p)
        # Lone surrogates (hostile JSON) cannot be stored: replaced, never a crash.
        return text.encode("utf-8", "replace").decode("utf-8")

    async def _download(self, file_id: str) -> bytes:
        file = await self._app.bot.get_file(file_id)
        return bytes(await file.download_as_bytearray())

    def _attempt(self, key: str) -> int:
        count = self._attempts.pop(key, 0) + 1
        self._attempts[key] = count
        while len(self._attempts) > ATTEMPTS_MAX:
            self._attempts.popitem(last=False)
        return count

    # -- polled batches -----------------------------------------------------------------

    async def start_offset(self) -> int | None:
        """The ``getUpdates`` offset to resume from: after the last committed update, or
        None (every update Telegram still holds) when nothing was committed yet."""
        cursor = await self._cursors.get(CURSOR)
        return int(cursor) + 1 if cursor is not None and cursor.isdigit() else None

    async def batch(self, updates: Sequence[Update]) -> int | None:
        """Process a ``getUpdates`` batch; the last update id that may be confirmed (the
        end of the committed prefix), or None when the first one was not committed."""
        window = CommitWindow()
        lanes: dict[int, list[Update]] = {}
        for update in updates:
            window.track(str(update.update_id))
            chat = update.effective_chat
            lanes.setdefault(chat.id if chat is not None else 0, []).append(update)
        confirmed: list[int] = []

        async def lane(items: list[Update]) -> None:
            for update in items:
                if not await self.handle(update):
                    return  # the rest of this chat waits: fetched again, in order
                upto = window.commit(str(update.update_id))
                if upto is not None:
                    confirmed.append(int(upto))
                    await self._advance(upto)

        await asyncio.gather(*(lane(items) for items in lanes.values()))
        return max(confirmed) if confirmed else None

    async def _advance(self, upto: str) -> None:
        try:
            await self._cursors.advance(CURSOR, upto)
        except Exception as exc:  # the state is committed; only the restart point lags
            log.warning("cannot record update %s as committed: %s", upto, exc,
                        extra={"transport": self._transport})

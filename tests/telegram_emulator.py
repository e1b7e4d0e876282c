"""A small Telegram Bot API emulator on 127.0.0.1 (aiohttp), for the real python-telegram-bot.

The methods the ``telegram`` transport uses (see the emulator facts in the spec): ``getMe``,
``setMyCommands``, ``deleteWebhook``/``setWebhook``, ``getUpdates`` (long-polls up to
``timeout``; an ``offset`` confirms, i.e. drops, every update below it; a webhook makes it
a 409 as on Telegram), ``sendMessage`` and ``sendDocument`` (HTML parse mode parsed into
text + entities with UTF-16 offsets and checked like Telegram: bad markup or over 4,096
UTF-16 code units is a 400), ``setMessageReaction``, ``getFile`` and file downloads, and
429s with ``retry_after`` on demand. Requests are form-encoded or multipart, every
non-string value JSON-encoded; answers ``{"ok": true, "result": ...}``.

People and bots post with ``post``: fenced blocks become ``pre`` entities and a leading
``/command`` a ``bot_command`` entity, as Telegram clients send them. A forum supergroup
``ops`` (topic ``TOPIC``), a plain group ``lounge`` and private chats; users ``gw`` (the
bot under test), ``peer`` and ``rogue`` (other bots), ``op`` and ``visitor`` (people).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from html.parser import HTMLParser
from typing import Any

from aiohttp import web

from emukit import Watched

TOKEN = "123456789:AAEmulatorTokenForBpgwTests_0123456"
TOPIC = 77
OPS = -1001000000001
LOUNGE = -1001000000002
USERS: dict[str, dict[str, Any]] = {
    "gw": {"id": 123456789, "is_bot": True, "first_name": "Gateway", "username": "bpgw_test_bot"},
    "peer": {"id": 2001, "is_bot": True, "first_name": "Peer", "username": "peer_bot"},
    "rogue": {"id": 2002, "is_bot": True, "first_name": "Rogue", "username": "rogue_bot"},
    "op": {"id": 3001, "is_bot": False, "first_name": "Olga", "username": "olga"},
    "visitor": {"id": 3002, "is_bot": False, "first_name": "Vic", "username": "vic"},
}
CHATS: dict[int, dict[str, Any]] = {
    OPS: {"id": OPS, "type": "supergroup", "title": "ops", "is_forum": True},
    LOUNGE: {"id": LOUNGE, "type": "supergroup", "title": "lounge"},
}
FORMATTING_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre",
                   "a", "tg-spoiler", "blockquote"}
_TAG_TYPES = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "code": "code",
              "pre": "pre", "u": "underline", "ins": "underline", "s": "strikethrough",
              "strike": "strikethrough", "del": "strikethrough", "a": "text_link",
              "tg-spoiler": "spoiler", "blockquote": "blockquote"}


def units(text: str) -> int:
    """Length in UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


class _Html(HTMLParser):
    """Telegram's HTML parse mode: the text and its entities, or ValueError."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text = ""
        self.open: list[tuple[str, int]] = []
        self.entities: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in FORMATTING_TAGS:
            raise ValueError(f"Unsupported start tag \"{tag}\"")
        self.open.append((tag, units(self.text)))

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1][0] != tag:
            raise ValueError(f"Unmatched end tag \"{tag}\"")
        _, start = self.open.pop()
        length = units(self.text) - start
        if length and not (tag == "code" and self.open and self.open[-1][0] == "pre"):
            self.entities.append({"type": _TAG_TYPES[tag], "offset": start, "length": length})

    def handle_data(self, data: str) -> None:
        self.text += data


def parse_html(markup: str) -> tuple[str, list[dict[str, Any]]]:
    """(text, entities) of an HTML-mode message; ValueError as Telegram's 400 says."""
    parser = _Html()
    parser.feed(markup)
    parser.close()
    if parser.open:
        raise ValueError(f"Can't find end tag corresponding to start tag \"{parser.open[-1][0]}\"")
    return parser.text, sorted(parser.entities, key=lambda e: e["offset"])


def client_entities(text: str) -> tuple[str, list[dict[str, Any]]]:
    """What a Telegram client sends for typed text: fences become ``pre`` entities (the
    fence lines dropped), a leading ``/command`` a ``bot_command`` entity."""
    out: list[str] = []
    entities: list[dict[str, Any]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().endswith("```")),
                       None)
            if end is not None:
                body = "\n".join(lines[i + 1 : end])
                start = units("\n".join(out) + ("\n" if out else ""))
                out.append(body)
                entities.append({"type": "pre", "offset": start, "length": units(body)})
                i = end + 1
                continue
        out.append(line)
        i += 1
    plain = "\n".join(out)
    if plain.startswith("/"):
        word = plain.split(maxsplit=1)[0]
        entities.insert(0, {"type": "bot_command", "offset": 0, "length": units(word)})
    return plain, entities


def as_fenced(text: str, entities: list[dict[str, Any]]) -> str:
    """A message as a reader sees it: ``pre`` entities back in fences."""
    data = text.encode("utf-16-le")
    out, pos = [], 0
    for e in entities:
        if e["type"] != "pre":
            continue
        start, end = e["offset"] * 2, (e["offset"] + e["length"]) * 2
        out.append(data[pos:start].decode("utf-16-le"))
        out.append("```\n" + data[start:end].decode("utf-16-le") + "\n```")
        pos = end
    out.append(data[pos:].decode("utf-16-le"))
    return "".join(out)


class TelegramEmulator(Watched):
    """The platform: drive it (``post``, ``rate_limit``, ``files_served``) and inspect it."""

    def __init__(self) -> None:
        super().__init__()
        self.can_read_all_group_messages = True
        self._ids = itertools.count(1)
        self.next_update_id = 500_001
        self.updates: list[dict[str, Any]] = []  # not yet confirmed, in order
        self.fetched: Counter[int] = Counter()  # update id -> times getUpdates returned it
        self.messages: dict[int, list[dict[str, Any]]] = {}
        self.files: dict[str, tuple[str, bytes]] = {}
        self.reactions: list[tuple[int, int, str]] = []
        self.commands: list[dict[str, Any]] = []
        self.webhook: dict[str, Any] | None = None
        self.requests: Counter[str] = Counter()
        self.limits: dict[int, list[float]] = {}
        self.limited_at: list[tuple[int, float]] = []
        self.files_served = asyncio.Event()
        self.files_served.set()  # clear: file downloads hang (the reader is stuck there)
        self.file_requests = 0
        self.polls_answered = asyncio.Event()
        self.polls_answered.set()
        # Set with polls_answered clear: a getUpdates confirming this update id (an offset
        # past it) hangs before Telegram reads the offset.
        self.hold_confirming: int | None = None
        self.polls_waiting = 0

    async def __aenter__(self) -> TelegramEmulator:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/bot{token}/{method}", self._method)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        await self.serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.files_served.set()
        self.polls_answered.set()
        await self.close_server()

    @property
    def api_base_url(self) -> str:
        return f"{self.url}/bot"

    @property
    def file_base_url(self) -> str:
        return f"{self.url}/file/bot"

    # -- driving ---------------------------------------------------------------------

    async def post(
        self,
        who: str,
        text: str = "",
        *,
        chat: int = OPS,
        thread: int | None = None,
        reply_to: int | None = None,
        document: tuple[str, str | None] | None = None,
        raw: bool = False,
    ) -> dict[str, Any]:
        """``who`` posts ``text`` (a caption with ``document``: (file name, content); content
        None: a file Telegram cannot serve) in ``chat``; ``raw`` keeps fences as typed (no
        entities). Returns the message."""
        plain, entities = (text, []) if raw else client_entities(text)
        message = self._message(USERS[who], chat, thread, reply_to)
        if document is not None:
            message["document"] = self._store_file(*document)
            key = "caption"
        else:
            key = "text"
        if plain:
            message[key] = plain
        if entities:
            message[f"{key}_entities" if key == "caption" else "entities"] = entities
        await self._add_update(message)
        return message

    def private_chat(self, who: str) -> int:
        """The private chat of ``who`` with the bot (its id is the user's)."""
        user = USERS[who]
        CHATS.setdefault(user["id"], {"id": user["id"], "type": "private",
                                      "first_name": user["first_name"]})
        return int(user["id"])

    def rate_limit(self, chat: int, *retry_after: float, after: int = 0) -> None:
        """The next sends into ``chat`` get a 429 each, with these ``retry_after``s (the
        first ``after`` sends still pass)."""
        self.limits[chat] = [0.0] * after + list(retry_after)

    def by_bot(self, chat: int) -> list[dict[str, Any]]:
        """The bot's own messages in ``chat``, oldest first."""
        return [m for m in self.messages.get(chat, []) if m["from"]["id"] == USERS["gw"]["id"]]

    def replies_to(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The bot's messages replying to ``message``."""
        return [m for m in self.by_bot(message["chat"]["id"])
                if m.get("reply_to_message", {}).get("message_id") == message["message_id"]]

    def reacted(self, message: dict[str, Any], emoji: str) -> bool:
        return (message["chat"]["id"], message["message_id"], emoji) in self.reactions

    # -- objects -----------------------------------------------------------------------

    def _message(self, user: dict[str, Any], chat: int, thread: int | None,
                 reply_to: int | None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "message_id": next(self._ids), "date": int(time.time()), "chat": CHATS[chat],
            "from": user,
        }
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        if reply_to is not None:
            original = next((m for m in self.messages.get(chat, [])
                             if m["message_id"] == reply_to), None)
            if original is not None:
                message["reply_to_message"] = {k: v for k, v in original.items()
                                               if k != "reply_to_message"}
        self.messages.setdefault(chat, []).append(message)
        return message

    def _store_file(self, name: str, content: str | bytes | None) -> dict[str, Any]:
        data = content.encode() if isinstance(content, str) else content or b""
        file_id = f"file{next(self._ids)}"
        if content is not None:
            self.files[file_id] = (name, data)
        return {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": name,
                "mime_type": "text/plain", "file_size": len(data)}

    async def _add_update(self, message: dict[str, Any]) -> None:
        self.updates.append({"update_id": self.next_update_id, "message": message})
        self.next_update_id += 1
        await self._changed_now()

    # -- the Bot API ---------------------------------------------------------------------

    async def _method(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != TOKEN:
            return _error(401, "Unauthorized")
        method = request.match_info["method"]
        self.requests[method] += 1
        form = await request.post()
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return _error(404, "Not Found")
        try:
            response: web.Response = await handler(form)
        except ValueError as exc:
            response = _error(400, f"Bad Request: {exc}")
        await self._changed_now()
        return response

    async def _m_getMe(self, form: Any) -> web.Response:
        return _ok({**USERS["gw"], "can_join_groups": True,
                    "can_read_all_group_messages": self.can_read_all_group_messages,
                    "supports_inline_queries": False})

    async def _m_setMyCommands(self, form: Any) -> web.Response:
        self.commands = json.loads(form["commands"])
        return _ok(True)

    async def _m_deleteWebhook(self, form: Any) -> web.Response:
        if _flag(form, "drop_pending_updates"):
            self.updates.clear()
        self.webhook = None
        return _ok(True)

    async def _m_setWebhook(self, form: Any) -> web.Response:
        self.webhook = {"url": form["url"], "secret_token": form.get("secret_token"),
                        "allowed_updates": json.loads(form.get("allowed_updates", "null"))}
        return _ok(True)

    async def _m_getUpdates(self, form: Any) -> web.Response:
        if not self.polls_answered.is_set():
            self.polls_waiting += 1
            await self._changed_now()
            await self.polls_answered.wait()
        if self.webhook is not None:
            return _error(409, "Conflict: can't use getUpdates method while webhook is active; "
                               "use deleteWebhook to delete the webhook first")
        offset = int(form.get("offset", 0) or 0)
        limit = int(form.get("limit", 100) or 100)
        timeout = float(form.get("timeout", 0) or 0)
        if offset:
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._changed:
            while not self.updates and (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    break
        batch = self.updates[:limit]
        for update in batch:
            self.fetched[update["update_id"]] += 1
        return _ok(batch)

    def _limited(self, chat: int) -> web.Response | None:
        waits = self.limits.get(chat)
        if not waits:
            return None
        wait = waits.pop(0)
        if not wait:
            return None
        self.limited_at.append((chat, time.time()))
        return web.json_response(
            {"ok": False, "error_code": 429,
             "description": f"Too Many Requests: retry after {wait:g}",
             "parameters": {"retry_after": wait}}, status=429)

    def _outgoing(self, form: Any) -> dict[str, Any]:
        chat = int(form["chat_id"])
        if chat not in CHATS:
            raise ValueError("chat not found")
        thread = int(form["message_thread_id"]) if form.get("message_thread_id") else None
        if thread is not None and not CHATS[chat].get("is_forum"):
            raise ValueError("message thread not found")
        reply = json.loads(form["reply_parameters"]) if form.get("reply_parameters") else None
        message = self._message(USERS["gw"], chat, thread,
                                reply["message_id"] if reply else None)
        message["sent_at"] = time.time()
        return message

    def _formatted(self, form: Any, field: str) -> tuple[str, list[dict[str, Any]]]:
        markup = form.get(field, "")
        if form.get("parse_mode") == "HTML":
            try:
                return parse_html(markup)
            except ValueError as exc:
                raise ValueError(f"can't parse entities: {exc}") from None
        return markup, []

    async def _m_sendMessage(self, form: Any) -> web.Response:
        if (limited := self._limited(int(form["chat_id"]))) is not None:
            return limited
        text, entities = self._formatted(form, "text")
        if not text.strip():
            raise ValueError("message text is empty")
        if units(text) > 4096:
            raise ValueError("message is too long")
        message = self._outgoing(form)
        message["text"], message["html"] = text, form["text"]
        if entities:
            message["entities"] = entities
        return _ok(message)

    async def _m_sendDocument(self, form: Any) -> web.Response:
        if (limited := self._limited(int(form["chat_id"]))) is not None:
            return limited
        upload = form["document"]
        caption, entities = self._formatted(form, "caption")
        if units(caption) > 1024:
            raise ValueError("message caption is too long")
        message = self._outgoing(form)
        message["document"] = self._store_file(upload.filename, upload.file.read())
        if caption:
            message["caption"] = caption
        if entities:
            message["caption_entities"] = entities
        return _ok(message)

    async def _m_setMessageReaction(self, form: Any) -> web.Response:
        chat, message_id = int(form["chat_id"]), int(form["message_id"])
        for reaction in json.loads(form.get("reaction", "[]")):
            self.reactions.append((chat, message_id, reaction["emoji"]))
        return _ok(True)

    async def _m_getFile(self, form: Any) -> web.Response:
        file_id = form["file_id"]
        if file_id not in self.files:
            raise ValueError("invalid file_id")
        name, data = self.files[file_id]
        return _ok({"file_id": file_id, "file_unique_id": f"u{file_id}", "file_size": len(data),
                    "file_path": f"documents/{file_id}_{name}"})

    async def _file(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != TOKEN:
            return web.Response(status=401)
        self.file_requests += 1
        await self._changed_now()
        await self.files_served.wait()
        file_id = request.match_info["path"].removeprefix("documents/").split("_", 1)[0]
        if file_id not in self.files:
            return web.Response(status=404)
        return web.Response(body=self.files[file_id][1])


def _flag(form: Any, name: str) -> bool:
    return str(form.get(name, "false")).lower() == "true"


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(code: int, description: str) -> web.Response:
    return web.json_response({"ok": False, "error_code": code, "description": description},
                             status=code)

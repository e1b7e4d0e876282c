"""A small Slack on 127.0.0.1 for the slack transport's tests.

The Web API under ``/api/<method>`` (arguments read from the query, a form or a JSON
body, as slack_sdk sends them): ``auth.test``, ``apps.connections.open``,
``chat.postMessage``, ``reactions.add``, ``conversations.history``,
``conversations.replies``, ``users.info``, file upload the way slack_sdk's
``files_upload_v2`` does it (``files.getUploadURLExternal``, a POST to the upload URL,
``files.completeUploadExternal``), file downloads with the bot token, and a
``response_url`` sink. And the other direction, as Slack does it: every message posted
(by people, other bots, or the gateway itself) is pushed to the app as an Events API
request signed with the signing secret (HTTP mode) or as a Socket Mode envelope, and
slash commands are POSTed signed, form-encoded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from emukit import Watched

BOT_TOKEN = "xoxb-test-bot-token-0001"
APP_TOKEN = "xapp-test-app-token-0001"
SIGNING_SECRET = "test-signing-secret-0001"
TEAM = "T0TEAM"
BOT_USER = "U0GATEWAY"
BOT_ID = "B0GATEWAY"
SCOPES = ("channels:history,groups:history,chat:write,reactions:write,files:read,"
          "files:write,users:read,commands")



@dataclass(frozen=True)
class Member:
    """A user or bot of the emulated workspace."""

    user_id: str
    name: str
    bot_id: str | None = None


class SlackEmulator(Watched):
    """The emulated workspace: channel ``general`` (C0GENERAL), person ``alice``, bots
    ``peer`` and ``rogue``, and the gateway's bot ``U0GATEWAY``/``B0GATEWAY``."""

    def __init__(self) -> None:
        super().__init__()
        self.members = {
            "alice": Member("U0ALICE", "alice"),
            "op": Member("U0OP", "op"),
            "peer": Member("U0PEER", "peerbot", "B0PEER"),
            "rogue": Member("U0ROGUE", "roguebot", "B0ROGUE"),
            "lotbot": Member("U0LOT", "Lotbot", "B0LOT"),
        }
        self.general = "C0GENERAL"
        self.messages: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.reactions: list[tuple[str, str, str]] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.responses: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.deliveries: list[tuple[int, dict[str, str]]] = []  # (status, headers)
        self.events_url: str | None = None
        self.deliver_events = True
        self.retry_delay = 0.05
        self.rate_limited: dict[str, float] = {}
        self._clock = itertools.count(1)
        self._last_ts = 0.0
        self._sockets: list[web.WebSocketResponse] = []
        self._acks: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http: aiohttp.ClientSession | None = None
        self.channels = {self.general, "C0OTHER"}
        self.refuse_after: int | None = None  # posts that succeed before one fails

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> SlackEmulator:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files/{file_id}", self._download)
        app.router.add_post("/response/{n}", self._response)
        app.router.add_get("/socket", self._socket)
        await self.serve(app)
        self._http = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for ws in list(self._sockets):
            await ws.close()
        if self._http is not None:
            await self._http.close()
        await self.close_server()

    @property
    def api_base_url(self) -> str:
        return f"{self.url}/api/"

    def uid(self, who: str) -> str:
        return self.members[who].user_id

    def _ts(self) -> str:
        """A new message's ``ts``: the clock, strictly increasing (as Slack's are)."""
        self._last_ts = max(time.time(), self._last_ts + 0.000001)
        return f"{self._last_ts:.6f}"

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- what tests read -------------------------------------------------------------

    def by_bot(self, channel: str | None = None) -> list[dict[str, Any]]:
        """The gateway's messages in ``channel`` (default general), oldest first."""
        return [m for m in self.messages[channel or self.general] if m.get("user") == BOT_USER]

    def replies_in(self, thread_ts: str, channel: str | None = None) -> list[dict[str, Any]]:
        """The gateway's messages in the thread ``thread_ts``."""
        return [m for m in self.by_bot(channel) if m.get("thread_ts") == thread_ts]

    def reacted(self, message: dict[str, Any], name: str) -> bool:
        return (message["channel"], message["ts"], name) in self.reactions

    def file_text(self, message: dict[str, Any]) -> list[tuple[str, str]]:
        """(name, content) of every file of ``message``."""
        return [(f["name"], self.files[f["id"]]["content"].decode()) for f in
                message.get("files", [])]

    def rate_limit(self, channel: str, retry_after: float) -> None:
        """chat.postMessage into ``channel`` answers 429 with this Retry-After."""
        self.rate_limited[channel] = retry_after

    # -- people and bots post; Slack pushes events -----------------------------------

    def add(self, who: str, text: str, *, channel: str | None = None,
            thread_ts: str | None = None, files: tuple[tuple[str, str], ...] = (),
            legacy_bot: bool = False) -> dict[str, Any]:
        """Store a message by ``who`` as Slack would (no event pushed)."""
        member = self.members[who]
        message: dict[str, Any] = {"type": "message", "ts": self._ts(), "text": text,
                                   "channel": channel or self.general, "team": TEAM}
        if legacy_bot and member.bot_id:
            message.update(subtype="bot_message", bot_id=member.bot_id, username=member.name)
        else:
            message["user"] = member.user_id
            if member.bot_id:
                message["bot_id"] = member.bot_id
                message["bot_profile"] = {"id": member.bot_id, "name": member.name}
        if files:
            message["files"] = [self._file(name, content.encode()) for name, content in files]
            message.setdefault("subtype", "file_share")
        return self._store(message, thread_ts)

    async def post(self, who: str, text: str, **kwargs: Any) -> dict[str, Any]:
        """``who`` posts; the app gets the event (awaited: the delivery and its retries)."""
        message = self.add(who, text, **kwargs)
        await self.deliver(message)
        return message

    def event_body(self, message: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
        return {
            "token": "legacy-verification-token", "team_id": TEAM, "api_app_id": "A0APP",
            "type": "event_callback", "event_id": event_id or f"Ev{uuid.uuid4().hex[:10]}",
            "event_time": int(float(message["ts"])),
            "event": {k: v for k, v in message.items() if k not in ("replies",)},
            "authorizations": [{"team_id": TEAM, "user_id": BOT_USER, "is_bot": True}],
        }

    async def deliver(self, message: dict[str, Any], *, body: dict[str, Any] | None = None,
                      retries: int = 3) -> int:
        """Push a message event as Slack does: retried (X-Slack-Retry-Num) on a non-2xx
        answer, up to ``retries`` times. The last status."""
        if not self.deliver_events:
            return 0
        payload = body or self.event_body(message)
        if self._sockets:
            return await self._socket_deliver("events_api", payload)
        raw = json.dumps(payload)
        status = 0
        for attempt in range(retries + 1):
            extra = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"} \
                if attempt else {}
            status, _ = await self.send_signed(raw, "application/json", extra)
            if 200 <= status < 300:
                break
            await asyncio.sleep(self.retry_delay)
        return status

    async def send_signed(self, body: str, content_type: str, extra: dict[str, str] | None = None,
                          *, secret: str = SIGNING_SECRET, age: float = 0.0) -> tuple[int, str]:
        """POST ``body`` to the app's events URL, signed (with ``secret``, ``age`` s old)."""
        assert self.events_url is not None and self._http is not None, "no events_url set"
        ts = str(int(time.time() - age))
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": SignatureVerifier(secret).generate_signature(
                timestamp=ts, body=body),
            **(extra or {}),
        }
        async with self._http.post(self.events_url, data=body.encode(), headers=headers) as resp:
            text = await resp.text()
            self.deliveries.append((resp.status, headers))
            return resp.status, text

    async def command(self, who: str, text: str, *, channel: str | None = None,
                      name: str = "/protocol") -> tuple[int, float, int]:
        """``who`` types ``/protocol text``: (status, seconds to the ack, response index)."""
        n = len(self.responses) + 1000 * next(self._clock)
        member = self.members[who]
        form = {
            "token": "legacy", "team_id": TEAM, "team_domain": "emu",
            "channel_id": channel or self.general, "channel_name": "general",
            "user_id": member.user_id, "user_name": member.name, "command": name,
            "text": text, "api_app_id": "A0APP", "response_url": f"{self.url}/response/{n}",
            "trigger_id": f"trig-{n}",
        }
        started = time.perf_counter()
        if self._sockets:
            status = await self._socket_deliver("slash_commands", form)
        else:
            status, _ = await self.send_signed(urlencode(form),
                                               "application/x-www-form-urlencoded")
        return status, time.perf_counter() - started, n

    async def response(self, n: int, timeout: float = 5.0) -> dict[str, Any]:  # noqa: ASYNC109
        """What the app POSTed to the response_url of command ``n``."""
        found = await self.wait_for(lambda: [r for r in self.responses if r["_n"] == n],
                                    timeout)
        return found[0]

    # -- Socket Mode -----------------------------------------------------------------

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_json({"type": "hello", "num_connections": 1,
                            "connection_info": {"app_id": "A0APP"}})
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                future = self._acks.pop(str(data.get("envelope_id")), None)
                if future is not None and not future.done():
                    future.set_result(None)
        finally:
            if ws in self._sockets:
                self._sockets.remove(ws)
        return ws

    async def _socket_deliver(self, kind: str, payload: dict[str, Any]) -> int:
        """Send an envelope; 200 once acknowledged, 0 when not within 3 s."""
        envelope_id = uuid.uuid4().hex
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks[envelope_id] = future
        await self._sockets[-1].send_json({
            "envelope_id": envelope_id, "type": kind, "payload": payload,
            "accepts_response_payload": kind != "events_api", "retry_attempt": 0,
            "retry_reason": ""})
        try:
            await asyncio.wait_for(future, 3.0)
            return 200
        except TimeoutError:
            return 0
        finally:
            self._acks.pop(envelope_id, None)

    def sockets(self) -> int:
        """Socket Mode connections open now."""
        return len(self._sockets)

    async def drop_sockets(self) -> None:
        """Close every Socket Mode connection (the client reconnects)."""
        for ws in list(self._sockets):
            await ws.close()

    # -- Web API ---------------------------------------------------------------------

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    args.update(body)
            else:
                args.update(dict(await request.post()))
        return args

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        self.calls.append(method)
        args = await self._args(request)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() or str(args.get("token", ""))
        wanted = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token != wanted:
            return _ok({"ok": False, "error": "invalid_auth"})
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return _ok({"ok": False, "error": "unknown_method"}, status=404)
        answer: web.StreamResponse = await handler(args)
        await self._changed_now()
        return answer

    async def _m_auth_test(self, args: dict[str, Any]) -> web.Response:
        return _ok({"ok": True, "url": "https://emu.slack.com/", "team": "Emu", "user": "bpgw",
                    "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID},
                   headers={"x-oauth-scopes": SCOPES})

    async def _m_apps_connections_open(self, args: dict[str, Any]) -> web.Response:
        return _ok({"ok": True, "url": self.url.replace("http://", "ws://") + "/socket"})

    async def _m_users_info(self, args: dict[str, Any]) -> web.Response:
        for member in self.members.values():
            if member.user_id == args.get("user"):
                return _ok({"ok": True, "user": {"id": member.user_id, "name": member.name,
                                                 "profile": {"display_name": member.name}}})
        return _ok({"ok": False, "error": "user_not_found"})

    async def _m_chat_postMessage(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel"))
        if channel not in self.channels:
            return _ok({"ok": False, "error": "channel_not_found"})
        if self.refuse_after is not None:
            self.refuse_after -= 1
            if self.refuse_after < 0:
                self.refuse_after = None
                return _ok({"ok": False, "error": "internal_error"}, status=500)
        if channel in self.rate_limited:
            retry = self.rate_limited[channel]
            return _ok({"ok": False, "error": "ratelimited"}, status=429,
                       headers={"Retry-After": str(int(retry))})
        message = {"type": "message", "ts": self._ts(), "text": str(args.get("text", "")),
                   "channel": channel, "user": BOT_USER, "bot_id": BOT_ID, "team": TEAM}
        self._store(message, args.get("thread_ts") or None)
        self._background(self.deliver(message))
        return _ok({"ok": True, "channel": channel, "ts": message["ts"], "message": message})

    async def _m_reactions_add(self, args: dict[str, Any]) -> web.Response:
        self.reactions.append((str(args.get("channel")), str(args.get("timestamp")),
                               str(args.get("name"))))
        return _ok({"ok": True})

    def _top(self, channel: str) -> list[dict[str, Any]]:
        return [m for m in self.messages[channel]
                if m.get("thread_ts") in (None, m["ts"]) or m.get("subtype") == "thread_broadcast"]

    async def _m_conversations_history(self, args: dict[str, Any]) -> web.Response:
        channel = str(args.get("channel"))
        oldest, latest = Decimal(str(args.get("oldest") or 0)), args.get("latest")
        inclusive = str(args.get("inclusive", "")).lower() in ("1", "true")
        found = [m for m in self._top(channel)
                 if (Decimal(m["ts"]) > oldest or (inclusive and Decimal(m["ts"]) == oldest))
                 and (latest is None or Decimal(m["ts"]) < Decimal(str(latest))
                      or (inclusive and Decimal(m["ts"]) == Decimal(str(latest))))]
        found.reverse()  # newest first, as Slack answers
        return _page(found, args)

    async def _m_conversations_replies(self, args: dict[str, Any]) -> web.Response:
        channel, parent = str(args.get("channel")), str(args.get("ts"))
        oldest = Decimal(str(args.get("oldest") or 0))
        thread = [m for m in self.messages[channel]
                  if m["ts"] == parent or m.get("thread_ts") == parent]
        if not thread:
            return _ok({"ok": False, "error": "thread_not_found"})
        return _page([thread[0], *[m for m in thread[1:] if Decimal(m["ts"]) > oldest]], args)

    async def _m_files_getUploadURLExternal(self, args: dict[str, Any]) -> web.Response:
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        self.files[file_id] = {"name": str(args.get("filename")), "content": b"",
                               "length": int(args.get("length", 0))}
        return _ok({"ok": True, "file_id": file_id,
                    "upload_url": f"{self.url}/upload/{file_id}"})

    async def _m_files_completeUploadExternal(self, args: dict[str, Any]) -> web.Response:
        items = json.loads(str(args.get("files", "[]")))
        channel = str(args.get("channel_id") or "")
        files = []
        for item in items:
            stored = self.files[item["id"]]
            if item.get("title"):
                stored["title"] = item["title"]
            files.append(self._file_object(item["id"]))
        message = {"type": "message", "subtype": "file_share", "ts": self._ts(),
                   "text": str(args.get("initial_comment") or ""), "channel": channel,
                   "user": BOT_USER, "bot_id": BOT_ID, "team": TEAM, "files": files}
        self._store(message, args.get("thread_ts") or None)
        self._background(self.deliver(message))
        shared = [{**f, "shares": {"public": {channel: [{"ts": message["ts"]}]}}} for f in files]
        return _ok({"ok": True, "files": shared})

    # -- files and responses ---------------------------------------------------------

    def _file(self, name: str, content: bytes) -> dict[str, Any]:
        file_id = f"F{uuid.uuid4().hex[:10].upper()}"
        self.files[file_id] = {"name": name, "content": content, "length": len(content)}
        return self._file_object(file_id)

    def _file_object(self, file_id: str) -> dict[str, Any]:
        stored = self.files[file_id]
        return {"id": file_id, "name": stored["name"], "title": stored.get("title",
                                                                           stored["name"]),
                "size": len(stored["content"]), "mimetype": "text/plain",
                "url_private": f"{self.url}/files/{file_id}",
                "url_private_download": f"{self.url}/files/{file_id}"}

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return web.Response(status=404)
        self.files[file_id]["content"] = await request.read()
        return web.Response(text=f"OK - {len(self.files[file_id]['content'])}")

    async def _download(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {BOT_TOKEN}":
            return web.Response(status=403)
        stored = self.files.get(request.match_info["file_id"])
        if stored is None:
            return web.Response(status=404)
        return web.Response(body=stored["content"], content_type="text/plain")

    async def _response(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.responses.append({**body, "_n": int(request.match_info["n"])})
        await self._changed_now()
        return web.Response(text="ok")

    def _store(self, message: dict[str, Any], thread_ts: Any) -> dict[str, Any]:
        channel = message["channel"]
        if thread_ts:
            message["thread_ts"] = str(thread_ts)
            for parent in self.messages[channel]:
                if parent["ts"] == str(thread_ts):
                    parent["thread_ts"] = parent["ts"]
                    parent["reply_count"] = int(parent.get("reply_count", 0)) + 1
                    parent["latest_reply"] = message["ts"]
        self.messages[channel].append(message)
        self._background(self._changed_now())
        return message


def _ok(body: dict[str, Any], status: int = 200,
        headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers=headers)


def _page(found: list[dict[str, Any]], args: dict[str, Any]) -> web.Response:
    start = int(args.get("cursor") or 0)
    limit = int(args.get("limit") or 100)
    chunk = found[start:start + limit]
    more = start + limit < len(found)
    return _ok({"ok": True, "messages": chunk, "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}})

"""A small Discord emulator on 127.0.0.1: REST API and gateway websocket (aiohttp).

Enough of Discord for the real discord.py client (see the emulator facts in the spec):
login (``/users/@me``, ``/oauth2/applications/@me``), the gateway (HELLO, IDENTIFY ->
READY + GUILD_CREATE, heartbeats, RESUME replaying what a dropped session missed, then
RESUMED), MESSAGE_CREATE for every post (the bot's own too, as Discord does), channel
history (``after``/``before``/``limit``, newest first like Discord), posting with files
(multipart) and replies, attachments served back, reactions, application command sync,
INTERACTION_CREATE with callbacks and follow-ups, and 429s on demand.

One guild with channels ``general`` and ``ops`` and a thread in ``general``; users: the
bot (``bot``), two other bots (``peer``, ``rogue``), an operator (``op``, role Ops) and a
visitor (``visitor``).
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

from emukit import Watched

TOKEN = "emulator-bot-token.0123456789"
DISCORD_EPOCH_MS = 1420070400000
JSON_HEADERS = {"Content-Type": "application/json"}  # exactly: discord.py insists
MESSAGE_CONTENT_INTENT = 1 << 15
APP_FLAG_MESSAGE_CONTENT = 1 << 18

_counter = itertools.count(1)


def snowflake() -> int:
    """A real-looking, increasing Discord id."""
    return ((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) | (next(_counter) & 0x3FFFFF)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={**JSON_HEADERS, **(headers or {})}
    )


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Session:
    """One gateway session: its sequence, the events it was sent (for RESUME), its socket."""

    id: str
    ws: web.WebSocketResponse | None
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False  # closed by the client (code 1000): not resumable

    async def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        self.seq += 1
        payload = {"op": 0, "t": kind, "s": self.seq, "d": data}
        self.events.append(payload)
        del self.events[:-2000]
        if self.ws is not None and not self.ws.closed:
            try:
                await self.ws.send_str(json.dumps(payload))
            except ConnectionError:
                self.ws = None


class DiscordEmulator(Watched):
    """The platform: drive it (``post``, ``interact``, ``drop_connections``) and inspect it."""

    def __init__(self, *, heartbeat_ms: int = 1000, message_content_flag: bool = True) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.app_flags = APP_FLAG_MESSAGE_CONTENT if message_content_flag else 0
        self.app_id = snowflake()
        self.guild_id = snowflake()
        self.ops_role = snowflake()
        self.channels = {"general": snowflake(), "ops": snowflake()}
        self.thread = snowflake()
        self.users: dict[str, dict[str, Any]] = {}
        for key, bot in (("bot", True), ("peer", True), ("rogue", True), ("op", False),
                         ("visitor", False)):
            self.users[key] = {
                "id": str(snowflake()), "username": key, "discriminator": "0",
                "global_name": key.title(), "avatar": None, "bot": bot,
            }
        self.messages: dict[int, list[dict[str, Any]]] = {}
        self.files: dict[str, bytes] = {}
        self.reactions: list[tuple[int, int, str]] = []
        self.interaction_answers: list[dict[str, Any]] = []
        self.synced: dict[str, list[dict[str, Any]]] = {}
        self.rate_limits: dict[int, list[float | None]] = {}
        self.refuse_resume = False
        self.sessions: dict[str, Session] = {}
        self.identifies = 0
        self.resumes = 0
        self.intents: list[int] = []
        self.requests: list[tuple[str, str]] = []
        super().__init__()

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> DiscordEmulator:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        r = app.router
        r.add_get("/gateway", self._gateway)
        r.add_get("/api/v10/users/@me", self._me)
        r.add_get("/api/v10/oauth2/applications/@me", self._application)
        r.add_get("/api/v10/gateway", self._gateway_url)
        r.add_put("/api/v10/applications/{app}/commands", self._sync)
        r.add_put("/api/v10/applications/{app}/guilds/{guild}/commands", self._sync)
        r.add_get("/api/v10/channels/{channel}", self._channel)
        r.add_get("/api/v10/channels/{channel}/messages", self._history)
        r.add_post("/api/v10/channels/{channel}/messages", self._create_message)
        r.add_get("/api/v10/channels/{channel}/messages/{message}", self._get_message)
        r.add_put(
            "/api/v10/channels/{channel}/messages/{message}/reactions/{emoji}/@me", self._react
        )
        r.add_post("/api/v10/interactions/{id}/{token}/callback", self._callback)
        r.add_post("/api/v10/webhooks/{app}/{token}", self._followup)
        r.add_get("/files/{name}", self._file)
        await self.serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in self.sessions.values():
            if session.ws is not None:
                await session.ws.close()
        await self.close_server()

    @property
    def api_base_url(self) -> str:
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/gateway"

    # -- objects -------------------------------------------------------------------

    def user(self, key: str) -> dict[str, Any]:
        return self.users[key]

    def uid(self, key: str) -> str:
        return str(self.users[key]["id"])

    def _member(self, key: str, with_user: bool = False) -> dict[str, Any]:
        member: dict[str, Any] = {
            "roles": [str(self.ops_role)] if key == "op" else [],
            "joined_at": _now_iso(), "deaf": False, "mute": False, "flags": 0,
        }
        if with_user:
            member["user"] = self.users[key]
        return member

    def _user_key(self, user_id: str) -> str:
        return next(k for k, u in self.users.items() if u["id"] == user_id)

    def _channel_obj(self, channel_id: int) -> dict[str, Any]:
        if channel_id == self.thread:
            return {
                "id": str(self.thread), "type": 11, "guild_id": str(self.guild_id),
                "parent_id": str(self.channels["general"]), "name": "a thread",
                "owner_id": self.uid("peer"), "message_count": 0, "member_count": 2,
                "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                    "archive_timestamp": _now_iso(), "locked": False},
            }
        name = next(n for n, c in self.channels.items() if c == channel_id)
        return {
            "id": str(channel_id), "type": 0, "guild_id": str(self.guild_id), "name": name,
            "position": 0, "permission_overwrites": [], "nsfw": False, "parent_id": None,
        }

    def _known_channel(self, channel_id: int) -> bool:
        return channel_id == self.thread or channel_id in self.channels.values()

    def _guild(self) -> dict[str, Any]:
        return {
            "id": str(self.guild_id), "name": "emulated guild", "owner_id": self.uid("op"),
            "unavailable": False, "member_count": len(self.users), "large": False,
            "features": [], "emojis": [], "stickers": [], "verification_level": 0,
            "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0,
            "premium_tier": 0, "preferred_locale": "en-US", "nsfw_level": 0,
            "roles": [
                {"id": str(self.guild_id), "name": "@everyone", "permissions": "1071698660929",
                 "position": 0, "color": 0, "hoist": False, "managed": False,
                 "mentionable": False, "flags": 0},
                {"id": str(self.ops_role), "name": "Ops", "permissions": "0", "position": 1,
                 "color": 0, "hoist": False, "managed": False, "mentionable": False,
                 "flags": 0},
            ],
            "channels": [self._channel_obj(c) for c in self.channels.values()],
            "threads": [self._channel_obj(self.thread)],
            "members": [self._member(k, with_user=True) for k in self.users],
            "voice_states": [], "presences": [], "stage_instances": [],
            "guild_scheduled_events": [], "joined_at": _now_iso(),
        }

    def _message(
        self, channel_id: int, author: str, content: str,
        attachments: list[dict[str, Any]], reference: dict[str, Any] | None,
        nonce: Any = None,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "id": str(snowflake()), "channel_id": str(channel_id),
            "guild_id": str(self.guild_id), "author": self.users[author],
            "member": self._member(author), "content": content, "timestamp": _now_iso(),
            "edited_timestamp": None, "tts": False, "mention_everyone": False,
            "mentions": [], "mention_roles": [], "attachments": attachments, "embeds": [],
            "pinned": False, "type": 19 if reference else 0, "flags": 0,
        }
        if reference:
            message["message_reference"] = reference
        if nonce is not None:
            message["nonce"] = nonce
        return message

    def _attachment(self, filename: str, data: bytes) -> dict[str, Any]:
        ident = snowflake()
        name = f"{ident}-{filename}"
        self.files[name] = data
        return {
            "id": str(ident), "filename": filename, "size": len(data),
            "url": f"{self.url}/files/{name}", "proxy_url": f"{self.url}/files/{name}",
            "content_type": "text/plain; charset=utf-8",
        }

    # -- driving -------------------------------------------------------------------

    async def post(
        self, author: str, content: str, *, channel: str = "general", thread: bool = False,
        files: tuple[tuple[str, str], ...] = (),
    ) -> dict[str, Any]:
        """``author`` posts ``content`` (with files) in a channel or its thread."""
        channel_id = self.thread if thread else self.channels[channel]
        attachments = [self._attachment(name, text.encode()) for name, text in files]
        message = self._message(channel_id, author, content, attachments, None)
        await self._store_and_dispatch(channel_id, message)
        return message

    async def _store_and_dispatch(self, channel_id: int, message: dict[str, Any]) -> None:
        async with self._changed:
            self.messages.setdefault(channel_id, []).append(message)
            self._changed.notify_all()
        await self.dispatch("MESSAGE_CREATE", message)

    async def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        """Send an event to every session (buffered for a dropped one to resume)."""
        for session in list(self.sessions.values()):
            if not session.ended:
                await session.dispatch(kind, data)

    async def interact(
        self, user: str, subcommand: str, options: dict[str, Any] | None = None,
        *, channel: str = "general",
    ) -> str:
        """``user`` runs ``/protocol <subcommand>``; returns the interaction id."""
        ident, token = snowflake(), f"itoken-{snowflake()}"
        channel_id = self.channels[channel]
        data = {
            "id": str(ident), "application_id": str(self.app_id), "type": 2, "token": token,
            "version": 1, "guild_id": str(self.guild_id), "channel_id": str(channel_id),
            "channel": self._channel_obj(channel_id), "member": self._member(user, True),
            "attachment_size_limit": 10_485_760, "locale": "en-US", "guild_locale": "en-US",
            "app_permissions": "1071698660929", "entitlements": [],
            "authorizing_integration_owners": {"0": str(self.guild_id)}, "context": 0,
            "data": {
                "id": str(snowflake()), "name": "protocol", "type": 1,
                "guild_id": str(self.guild_id),
                "options": [{
                    "name": subcommand, "type": 1,
                    "options": [
                        {"name": k, "type": 4 if isinstance(v, int) else 3, "value": v}
                        for k, v in (options or {}).items()
                    ],
                }],
            },
        }
        await self.dispatch("INTERACTION_CREATE", data)
        return token

    async def drop_connections(self, code: int = 4000) -> None:
        """Close every live gateway socket as a network failure would (resumable)."""
        for session in self.sessions.values():
            ws, session.ws = session.ws, None
            if ws is not None and not ws.closed:
                await ws.close(code=code, message=b"dropped by the emulator")

    def rate_limit(self, channel: int, *retry_after: float | None) -> None:
        """Answer the next posts into ``channel`` with 429, one per ``retry_after``
        (None: that post goes through)."""
        self.rate_limits.setdefault(channel, []).extend(retry_after)

    def by_bot(self, channel_id: int) -> list[dict[str, Any]]:
        """The bot's messages in a channel, oldest first."""
        return [m for m in self.messages.get(channel_id, [])
                if m["author"]["id"] == self.uid("bot")]

    # -- REST ----------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        self.requests.append((request.method, request.path))
        return request.headers.get("Authorization") == f"Bot {TOKEN}"

    def _unauthorized(self) -> web.Response:
        return _json({"message": "401: Unauthorized", "code": 0}, 401)

    async def _me(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return _json({**self.users["bot"], "verified": True, "flags": 0, "mfa_enabled": False})

    async def _application(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return _json({
            "id": str(self.app_id), "name": "bpgw-test", "description": "", "icon": None,
            "bot_public": False, "bot_require_code_grant": False, "verify_key": "00" * 32,
            "owner": self.users["op"], "flags": self.app_flags,
        })

    async def _gateway_url(self, request: web.Request) -> web.Response:
        return _json({"url": self.gateway_url})

    async def _sync(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        body = await request.json()
        answered = [
            {**c, "id": str(snowflake()), "application_id": str(self.app_id),
             "description": c.get("description", ""), "version": "1"}
            for c in body
        ]
        self.synced[request.match_info.get("guild", "global")] = answered
        await self._changed_now()
        return _json(answered)

    async def _channel(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        channel_id = int(request.match_info["channel"])
        if not self._known_channel(channel_id):
            return _json({"message": "Unknown Channel", "code": 10003}, 404)
        return _json(self._channel_obj(channel_id))

    async def _history(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        channel_id = int(request.match_info["channel"])
        limit = min(int(request.query.get("limit", 50)), 100)
        stored = self.messages.get(channel_id, [])
        if "after" in request.query:
            after = int(request.query["after"])
            page = [m for m in stored if int(m["id"]) > after][:limit]
        else:
            before = int(request.query.get("before", 1 << 63))
            page = [m for m in stored if int(m["id"]) < before][-limit:]
        return _json(list(reversed(page)))  # Discord answers newest first

    async def _get_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        stored = self.messages.get(int(request.match_info["channel"]), [])
        found = [m for m in stored if m["id"] == request.match_info["message"]]
        if not found:
            return _json({"message": "Unknown Message", "code": 10008}, 404)
        return _json(found[0])

    async def _create_message(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        channel_id = int(request.match_info["channel"])
        if not self._known_channel(channel_id):
            return _json({"message": "Unknown Channel", "code": 10003}, 404)
        waits = self.rate_limits.get(channel_id)
        retry_after = waits.pop(0) if waits else None
        if retry_after is not None:
            return _json(
                {"message": "You are being rate limited.", "retry_after": retry_after,
                 "global": False},
                429,
                {"Retry-After": str(retry_after), "Via": "1.1 google",
                 "X-RateLimit-Scope": "user"},
            )
        payload, files = await self._read_payload(request)
        content = payload.get("content") or ""
        if len(content) > 2000:
            return _json({"message": "Invalid Form Body", "code": 50035,
                          "errors": {"content": "Must be 2000 or fewer in length."}}, 400)
        reference = payload.get("message_reference")
        if reference:  # Discord answers with string ids
            reference = {"message_id": str(reference["message_id"]),
                         "channel_id": str(reference.get("channel_id") or channel_id),
                         "guild_id": str(self.guild_id)}
        attachments = [self._attachment(name, data) for name, data in files]
        message = self._message(channel_id, "bot", content, attachments, reference,
                                payload.get("nonce"))
        await self._store_and_dispatch(channel_id, message)
        return _json(message)

    async def _read_payload(
        self, request: web.Request
    ) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        if request.content_type != "multipart/form-data":
            return await request.json(), []
        payload: dict[str, Any] = {}
        files: list[tuple[str, bytes]] = []
        reader = await request.multipart()
        async for part in reader:
            if part.name == "payload_json":
                payload = json.loads(await part.text())
            else:
                files.append((part.filename or "file", bytes(await part.read())))
        return payload, files

    async def _react(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        async with self._changed:
            self.reactions.append((
                int(request.match_info["channel"]), int(request.match_info["message"]),
                request.match_info["emoji"],
            ))
            self._changed.notify_all()
        return web.Response(status=204)

    async def _callback(self, request: web.Request) -> web.Response:
        body = await request.json()
        async with self._changed:
            self.interaction_answers.append({"token": request.match_info["token"], **body})
            self._changed.notify_all()
        return _json({"interaction": {"id": request.match_info["id"], "type": 2}})

    async def _followup(self, request: web.Request) -> web.Response:
        payload, _ = await self._read_payload(request)
        async with self._changed:
            self.interaction_answers.append(
                {"token": request.match_info["token"], "type": "followup", "data": payload}
            )
            self._changed.notify_all()
        message = self._message(self.channels["general"], "bot", payload.get("content") or "",
                                [], None)
        message["embeds"] = payload.get("embeds", [])
        return _json(message)

    async def _file(self, request: web.Request) -> web.Response:
        data = self.files.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="text/plain")

    # -- gateway -------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}}))
        session: Session | None = None
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                break
            frame = json.loads(msg.data)
            op = frame.get("op")
            if op == 1:
                await ws.send_str(json.dumps({"op": 11}))
            elif op == 2:
                session = await self._identify(ws, frame["d"])
            elif op == 6:
                session = await self._resume(ws, frame["d"])
        if session is not None and session.ws is ws:
            session.ws = None
            if ws.close_code == 1000:
                session.ended = True  # the client closed it: not resumable
        await self._changed_now()
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> Session | None:
        if data.get("token") != TOKEN:
            await ws.close(code=4004, message=b"Authentication failed.")
            return None
        self.identifies += 1
        self.intents.append(int(data.get("intents", 0)))
        if self.intents[-1] & MESSAGE_CONTENT_INTENT and not self.app_flags:
            await ws.close(code=4014, message=b"Disallowed intent(s).")
            return None
        session = Session(id=f"session-{snowflake()}", ws=ws)
        self.sessions[session.id] = session
        await session.dispatch("READY", {
            "v": 10, "user": self.users["bot"], "guilds": [
                {"id": str(self.guild_id), "unavailable": True}],
            "session_id": session.id, "resume_gateway_url": self.gateway_url,
            "application": {"id": str(self.app_id), "flags": self.app_flags},
            "private_channels": [], "relationships": [],
        })
        await session.dispatch("GUILD_CREATE", self._guild())
        await self._changed_now()
        return session

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> Session | None:
        session = self.sessions.get(data.get("session_id", ""))
        if (session is None or session.ended or self.refuse_resume
                or data.get("token") != TOKEN):
            await ws.send_str(json.dumps({"op": 9, "d": False}))
            return None
        self.resumes += 1
        seq = int(data.get("seq") or 0)
        session.ws = ws
        for event in session.events:
            if event["s"] > seq:
                await ws.send_str(json.dumps(event))
        await session.dispatch("RESUMED", {})
        await self._changed_now()
        return session

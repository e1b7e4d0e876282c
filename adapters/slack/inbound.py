"""Inbound Slack messages: in order per channel, acknowledged only after commit, caught up.

Each channel has a lane: its messages (threads included) are handed to the gateway one at
a time, and the channel's catch-up cursor (the cursor store, shared by replicas) moves to
a message's ``ts`` only once the gateway committed it. When a message could not be
committed (state store down, another replica busy with it, a file that did not
download) the lane falls *behind*: the cursor stays, the Events API request is answered
503 (so Slack delivers it again) and the lane reads ``conversations.history`` and
``conversations.replies`` after the cursor, oldest first, before taking live messages
again. The same catch-up runs for every known channel at start and after a Socket Mode
reconnect. So nothing is lost and nothing is processed twice (the gateway's inbound
claims drop a message that arrives live, again as a Slack retry, and from history).
A lane goes away once its channel is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.attachments import NotReadable, TextFile, read_text_files
from adapters.base import Author, Cursors, Disposition, Envelope, GatewaySink
from adapters.delivery import settle
from adapters.slack.settings import SlackSettings
from adapters.slack.text import to_plain, user_ids

log = logging.getLogger("bpgw.adapters.slack")

PAGE = 200
# Messages older than the cursor scanned for threads with new replies, at most.
THREAD_SCAN_MAX = 1000
# After a failed catch-up, wait this long before trying again.
RETRY_SECONDS = 1.0
# Message subtypes that are messages someone wrote (others: joins, edits, deletions...).
READ_SUBTYPES = frozenset({None, "bot_message", "file_share", "thread_broadcast", "me_message"})
SLACK_ERRORS = (SlackApiError, aiohttp.ClientError, OSError, TimeoutError)
CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,30}$")
TS = re.compile(r"^\d{1,12}\.\d{1,9}$")
"""A Slack message ``ts`` (seconds.micros): ids that order as numbers."""

React = Callable[[str, str, Disposition], Awaitable[None]]
"""(channel, ts, disposition) -> add the reaction the disposition deserves."""


@dataclass(frozen=True)
class Me:
    """Who the bot is (from ``auth.test``): its messages are ours."""

    user_id: str
    bot_id: str
    team_id: str

    def wrote(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` was posted by this bot."""
        return bool(
            (self.user_id and message.get("user") == self.user_id)
            or (self.bot_id and message.get("bot_id") == self.bot_id)
        )


@dataclass
class Lane:
    """One channel's inbound state."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    behind: bool = False
    users: int = 0
    task: asyncio.Task[None] | None = None


def ts_key(ts: str) -> Decimal:
    """A Slack ``ts`` as a number (they compare as numbers, not strings)."""
    try:
        return Decimal(ts)
    except (InvalidOperation, ValueError):
        return Decimal(0)


class Names:
    """User id -> name for unlabelled mentions, looked up with ``users.info`` (bounded)."""

    def __init__(self, client: AsyncWebClient, limit: int) -> None:
        self._client = client
        self._limit = limit
        self._names: OrderedDict[str, str] = OrderedDict()

    async def of(self, ids: set[str]) -> dict[str, str]:
        """Names of ``ids`` (an id Slack cannot name is left out: shown as ``@U...``)."""
        found: dict[str, str] = {}
        for uid in sorted(ids)[:50]:
            name = self._names.get(uid)
            if name is None:
                try:
                    user = (await self._client.users_info(user=uid)).get("user") or {}
                except SlackApiError as exc:  # no such user: shown as @U..., remembered
                    log.info("users.info %s refused: %s", uid, exc)
                    user = {}
                except SLACK_ERRORS as exc:  # Slack unreachable: try again next time
                    log.info("users.info %s failed: %s", uid, exc)
                    continue
                profile = user.get("profile") or {}
                name = str(profile.get("display_name") or user.get("name") or uid)
                if self._limit == 0:
                    continue
                self._names[uid] = name
                while len(self._names) > self._limit:
                    self._names.popitem(last=False)
            found[uid] = name
        return found


@dataclass(frozen=True)
class Wiring:
    """What one transport's inbound side works with."""

    transport: str
    settings: SlackSettings
    client: AsyncWebClient
    # For file downloads (with the bot token, to Slack's file hosts only).
    http: aiohttp.ClientSession
    bot_token: str
    me: Me
    sink: GatewaySink
    react: React


class Inbound:
    """Feeds one Slack workspace's messages to the gateway (see the module docstring)."""

    def __init__(self, wiring: Wiring) -> None:
        self._w = wiring
        self._transport = wiring.transport
        self._settings = wiring.settings
        self._cursors: Cursors = wiring.sink.cursors(wiring.transport)
        self._names = Names(wiring.client, wiring.settings.name_cache_max)
        self._lanes: dict[str, Lane] = {}
        self._closing = False
        self._starting: asyncio.Task[None] | None = None
        self._file_hosts = {urlsplit(wiring.settings.api_base_url).hostname or ""}
        self.caught_up = 0  # messages read from history
        self.processed = 0

    def wanted(self, channel: str) -> bool:
        """Whether the allow-list covers ``channel``."""
        return not self._settings.channels or channel in self._settings.channels

    # -- live ------------------------------------------------------------------------

    async def live(self, event: Mapping[str, Any]) -> bool:
        """A message event (Events API or Socket Mode); False when it was not committed
        (answer so that Slack delivers it again)."""
        channel = str(event.get("channel") or "")
        if self._closing:
            return False
        if event.get("subtype") not in READ_SUBTYPES or not self.wanted(channel):
            return True  # not a message for the gateway: nothing to keep
        if not CHANNEL_ID.match(channel) or not TS.match(str(event.get("ts") or "")):
            log.warning("message event without a channel id or ts ignored",
                        extra={"transport": self._transport})
            return True  # nothing Slack would deliver differently next time
        async with self._lane(channel) as lane, lane.lock:
            if lane.behind and not await self._catch_up(channel, lane):
                return False
            if await self._process(channel, event):
                return True
            lane.behind = True
            self._ensure_catch_up(channel, lane)
            return False

    # -- catch-up --------------------------------------------------------------------

    def catch_up_all(self) -> None:
        """Read what was missed in every channel with a cursor (and start tracking the
        listed channels that have none), in the background, retrying while the state
        store cannot be read."""
        if self._starting is None or self._starting.done():
            self._starting = asyncio.create_task(self._catch_up_all())

    async def _catch_up_all(self) -> None:
        while not self._closing:
            try:
                known = await self._cursors.all()
                now = f"{time.time():.6f}"
                for channel in self._settings.channels:
                    if channel not in known:
                        await self._cursors.advance(channel, now)
            except OverflowError:
                log.warning("catch-up cursors are full: some channels are read live only",
                            extra={"transport": self._transport})
            except Exception as exc:  # the state store is down
                log.warning("cannot read catch-up cursors: %s", exc,
                            extra={"transport": self._transport})
                await asyncio.sleep(RETRY_SECONDS)
                continue
            for channel in known:
                if self.wanted(channel):
                    async with self._lane(channel) as lane:
                        lane.behind = True
                        self._ensure_catch_up(channel, lane)
            return

    def _ensure_catch_up(self, channel: str, lane: Lane) -> None:
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(self._catch_up_loop(channel),
                                            name=f"slack-{self._transport}-{channel}")

    async def _catch_up_loop(self, channel: str) -> None:
        async with self._lane(channel) as lane:
            while not self._closing and lane.behind:
                async with lane.lock:
                    if not lane.behind or await self._catch_up(channel, lane):
                        return
                await asyncio.sleep(RETRY_SECONDS)

    async def _catch_up(self, channel: str, lane: Lane) -> bool:
        """Process the channel's messages after its cursor, oldest first (lane locked).
        True once the present is reached (the lane is live again)."""
        budget = self._settings.catch_up_max_messages
        try:  # the state store or Slack may be unreachable: try again later
            cursor = await self._cursors.get(channel)
            missed = [] if cursor is None or budget == 0 else await self._missed(
                channel, cursor, budget)
        except Exception as exc:
            log.warning("cannot catch up channel %s: %s", channel, exc,
                        extra={"transport": self._transport})
            return False
        for message in missed:
            if self._closing or not await self._process(channel, message):
                return False
            self.caught_up += 1
        if budget and len(missed) >= budget:
            log.warning("channel %s: catch_up_max_messages (%d) or more missed; older ones "
                        "may be skipped", channel, budget, extra={"transport": self._transport})
        lane.behind = False
        return True

    async def _missed(self, channel: str, cursor: str, budget: int) -> list[dict[str, Any]]:
        """Messages and thread replies after ``cursor``, oldest first: the most recent
        ``budget`` of them."""
        after = ts_key(cursor)
        found: dict[str, dict[str, Any]] = {}
        parents: list[str] = []

        def note(message: dict[str, Any]) -> None:
            ts = str(message.get("ts") or "")
            if ts_key(ts) > after:
                found[ts] = message
            if int(message.get("reply_count") or 0) and ts_key(
                    str(message.get("latest_reply") or "0")) > after:
                parents.append(ts)

        async for message in self._pages("conversations_history", budget, channel=channel,
                                         oldest=cursor):
            note(message)
        lookback = after - Decimal(str(self._settings.thread_lookback_seconds))
        if lookback < after:
            async for message in self._pages("conversations_history", THREAD_SCAN_MAX,
                                             channel=channel, oldest=str(lookback),
                                             latest=cursor, inclusive=True):
                note(message)
        for parent in dict.fromkeys(parents):
            async for reply in self._pages("conversations_replies", budget, channel=channel,
                                           ts=parent, oldest=cursor):
                if str(reply.get("ts")) != parent and ts_key(str(reply.get("ts"))) > after:
                    found[str(reply["ts"])] = reply
        # The most recent ``budget`` of them (history pages come newest first).
        return sorted(found.values(), key=lambda m: ts_key(str(m.get("ts"))))[-budget:]

    async def _pages(self, method: str, most: int, **args: Any) -> AsyncIterator[
            dict[str, Any]]:
        """The messages of a paged history call, up to ``most``."""
        call = getattr(self._w.client, method)
        seen = 0
        cursor: str | None = None
        while seen < most:
            page = await call(limit=min(PAGE, most - seen), cursor=cursor, **args)
            messages = page.get("messages") or []
            for message in messages:
                if isinstance(message, dict):
                    seen += 1
                    yield message
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not messages or not cursor or not page.get("has_more", True):
                return

    # -- one message -----------------------------------------------------------------

    async def _process(self, channel: str, message: Mapping[str, Any]) -> bool:
        """Hand one message to the gateway; True when it was committed."""
        ts = str(message.get("ts") or "")
        if not TS.match(ts) or message.get("subtype") not in READ_SUBTYPES:
            return True
        own = self._w.me.wrote(message)
        try:
            text = await self.text_of(message)
        except NotReadable as exc:
            log.warning("message %s not read: %s", ts, exc,
                        extra={"transport": self._transport, "native_id": ts})
            return False
        thread = str(message.get("thread_ts") or "") or None
        profile = message.get("bot_profile") or message.get("user_profile") or {}
        author_id = str(message.get("user") or message.get("bot_id") or "unknown")

        async def committed(disposition: Disposition) -> None:
            await self._cursors.advance(channel, ts)
            if not own:
                await self._w.react(channel, ts, disposition)

        envelope = Envelope(
            transport=self._transport,
            channel=channel,
            thread=thread if thread != ts else None,
            author=Author(
                id=author_id,
                display_name=str(message.get("username") or profile.get("name")
                                 or profile.get("display_name") or author_id),
                is_bot=bool(message.get("bot_id")) or message.get("subtype") == "bot_message",
                is_self=own,
            ),
            text=text,
            native_id=ts,
            at=float(ts_key(ts)),
            on_commit=committed,
        )
        self.processed += 1
        disposition = await self._w.sink.on_envelope(envelope)
        return disposition.committed

    async def text_of(self, message: Mapping[str, Any]) -> str:
        """What the author wrote (``text.to_plain``) followed by the message's ``.txt``
        files (blocks sent as files), read as ``adapters/attachments.py`` says."""
        raw = str(message.get("text") or "")
        plain = to_plain(raw, await self._names.of(user_ids(raw)))
        files: list[TextFile] = []
        notes: list[str] = []
        listed = message.get("files")
        for item in (listed if isinstance(listed, list) else [])[
                : self._settings.attachments_per_message]:
            if not isinstance(item, dict):
                continue
            name = str(item.get("name") or item.get("title") or "file")
            url = str(item.get("url_private_download") or item.get("url_private") or "")
            if not self._may_download(url):
                notes.append(f"(file {name} not read: its URL is not on Slack)")
                continue
            size = item.get("size")
            files.append(TextFile(name, size if isinstance(size, int) else None,
                                  self._reader(url)))
        texts = await read_text_files(files, self._settings.attachment_max_bytes,
                                      (aiohttp.ClientError, OSError, TimeoutError))
        return "\n".join(p for p in [plain, *texts, *notes] if p)

    def _may_download(self, url: str) -> bool:
        """Only Slack's file hosts get the bot token (or the configured API host)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        return parts.scheme in ("https", "http") and (
            host in self._file_hosts or host == "slack.com" or host.endswith(".slack.com")
            or host.endswith(".slack-gov.com"))

    def _reader(self, url: str) -> Callable[[], Awaitable[bytes]]:
        async def read() -> bytes:
            limit = self._settings.attachment_max_bytes
            async with self._w.http.get(
                url, headers={"Authorization": f"Bearer {self._w.bot_token}"},
                timeout=aiohttp.ClientTimeout(total=self._settings.request_timeout_seconds),
            ) as resp:
                resp.raise_for_status()
                return await resp.content.read(limit)
        return read

    # -- lanes -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lane(self, channel: str) -> AsyncIterator[Lane]:
        lane = self._lanes.setdefault(channel, Lane())
        lane.users += 1
        try:
            yield lane
        finally:
            lane.users -= 1
            idle = lane.users == 0 and not lane.behind and (
                lane.task is None or lane.task.done() or lane.task is asyncio.current_task())
            if idle and self._lanes.get(channel) is lane:
                del self._lanes[channel]  # reclaimed

    def lanes(self) -> int:
        """Channels with a message in hand or a catch-up pending."""
        return len(self._lanes)

    async def close(self, grace: float) -> None:
        """Stop taking messages; let catch-ups finish the message in hand (up to
        ``grace`` seconds), then cancel. What was not committed is caught up next time."""
        self._closing = True
        await settle([self._starting, *(lane.task for lane in self._lanes.values())], grace)
        self._lanes.clear()

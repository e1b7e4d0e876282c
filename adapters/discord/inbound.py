"""Inbound Discord messages: in order per channel, acknowledged only after commit, caught up.

Every Discord channel (a thread is one too) gets a lane: a bounded queue and one worker
that hands its messages to the gateway one at a time, in order. The channel's catch-up
cursor (the cursor store, shared by replicas) moves to a message only once the gateway
committed it. A lane falls *behind* when its queue overflows, when the gateway could not
commit a message (state store down, another replica busy with it), or when a new gateway
session starts (restart, reconnect that could not resume): live messages for it are then
left alone and the worker reads the channel's history after the cursor instead, oldest
first, until it reaches the present. So nothing is lost and nothing is processed twice
(the gateway's inbound claims drop a message that shows up both live and in history).
A lane and its worker go away once the channel is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import discord

from adapters.attachments import NotReadable, TextFile, read_text_files
from adapters.base import Author, Cursors, Disposition, Envelope, GatewaySink
from adapters.delivery import settle
from adapters.discord.settings import DiscordSettings

log = logging.getLogger("bpgw.adapters.discord")

HISTORY_PAGE = 100
# After an uncommitted message, wait this long before reading the history again.
RETRY_SECONDS = 1.0
# At most this many channel -> (parent, thread) lookups are remembered.
WHERE_CACHE_MAX = 10_000

Where = tuple[str, str | None]
"""(channel id, thread id or None) of a Discord channel, as addresses name them."""
React = Callable[[discord.Message, Disposition], Awaitable[None]]


@dataclass
class Lane:
    """The messages of one Discord channel waiting to be processed, in order."""

    channel_id: int
    queue: asyncio.Queue[discord.Message]
    behind: bool = False
    task: asyncio.Task[None] | None = None
    # Messages handed to the gateway through this lane (for stats and tests).
    processed: int = field(default=0)


class Inbound:
    """Feeds one client's messages to the gateway (see the module docstring)."""

    def __init__(
        self,
        transport: str,
        settings: DiscordSettings,
        client: discord.Client,
        sink: GatewaySink,
        react: React,
    ) -> None:
        self._transport = transport
        self._settings = settings
        self._client = client
        self._sink = sink
        self._cursors: Cursors = sink.cursors(transport)
        self._react = react
        self._lanes: dict[int, Lane] = {}
        self._where: dict[int, Where] = {}
        self._closing = False
        self._catching_up: asyncio.Task[None] | None = None
        self.caught_up = 0  # messages read from history

    # -- which messages ----------------------------------------------------------------

    def wanted(self, guild_id: int | None, channel_id: int, parent_id: int | None) -> bool:
        """Whether the allow-lists cover a channel (direct messages are not read)."""
        s = self._settings
        if guild_id is None or (s.guilds and guild_id not in s.guilds):
            return False
        return not s.channels or channel_id in s.channels or parent_id in s.channels

    async def where(self, channel_id: int) -> Where:
        """The address parts of a channel: a thread is ``(parent, thread)``."""
        found = self._where.get(channel_id)
        if found is not None:
            return found
        channel = self._client.get_channel(channel_id)
        if channel is None:
            with contextlib.suppress(discord.HTTPException, aiohttp.ClientError):
                channel = await self._client.fetch_channel(channel_id)
        if isinstance(channel, discord.Thread) and channel.parent_id:
            found = (str(channel.parent_id), str(channel_id))
        else:
            found = (str(channel_id), None)
        if len(self._where) >= WHERE_CACHE_MAX:
            self._where.pop(next(iter(self._where)))
        self._where[channel_id] = found
        return found

    # -- live and catch-up -----------------------------------------------------------

    def offer(self, message: discord.Message) -> None:
        """A live message: queue it on its channel's lane (unless the lane is behind)."""
        if self._closing:
            return
        lane = self._lane(message.channel.id)
        if lane.behind:
            return  # the history read brings it
        try:
            lane.queue.put_nowait(message)
        except asyncio.QueueFull:
            log.warning(
                "more than %d messages waiting in channel %s: catching up from history",
                self._settings.channel_queue_max, lane.channel_id,
                extra={"transport": self._transport, "channel": str(lane.channel_id)},
            )
            self._fall_behind(lane)
        self._ensure_worker(lane)

    async def catch_up_all(self) -> None:
        """After a new session: every channel with a cursor reads its history since then,
        and every readable channel without one starts being tracked from now (so what is
        posted there while the gateway is down is caught up too). While the state store
        cannot be read, this is retried in the background."""
        if not await self._catch_up_once() and (
            self._catching_up is None or self._catching_up.done()
        ):
            self._catching_up = asyncio.create_task(self._catch_up_retry())

    async def _catch_up_retry(self) -> None:
        while not self._closing:
            await asyncio.sleep(RETRY_SECONDS)
            if await self._catch_up_once():
                return

    async def _catch_up_once(self) -> bool:
        try:
            known = await self._cursors.all()
            await self._track_new_channels(known)
        except Exception as exc:  # the state store is down
            log.warning("cannot read catch-up cursors: %s", exc,
                        extra={"transport": self._transport})
            return False
        for channel in known:
            if channel.isdigit():
                lane = self._lane(int(channel))
                self._fall_behind(lane)
                self._ensure_worker(lane)
        return True

    async def _track_new_channels(self, known: dict[str, str]) -> None:
        """A cursor at "now" for every allowed text channel and thread that has none."""
        now = str(discord.utils.time_snowflake(discord.utils.utcnow()))
        for guild in self._client.guilds:
            for channel in [*guild.text_channels, *guild.threads]:
                key = str(channel.id)
                if key in known or not self.wanted(guild.id, channel.id,
                                                   getattr(channel, "parent_id", None)):
                    continue
                try:
                    await self._cursors.advance(key, now)
                except OverflowError:
                    log.warning("catch-up cursors are full: channel %s is read live only", key,
                                extra={"transport": self._transport})
                    return

    def _lane(self, channel_id: int) -> Lane:
        lane = self._lanes.get(channel_id)
        if lane is None:
            lane = Lane(channel_id, asyncio.Queue(self._settings.channel_queue_max))
            self._lanes[channel_id] = lane
        return lane

    @staticmethod
    def _fall_behind(lane: Lane) -> None:
        lane.behind = True
        while not lane.queue.empty():
            lane.queue.get_nowait()

    def _ensure_worker(self, lane: Lane) -> None:
        if lane.task is None or lane.task.done():
            lane.task = asyncio.create_task(
                self._work(lane), name=f"discord-{self._transport}-{lane.channel_id}"
            )

    async def _work(self, lane: Lane) -> None:
        try:
            while not self._closing:
                if lane.behind:
                    if not await self._read_history(lane):
                        await asyncio.sleep(RETRY_SECONDS)
                    continue
                if lane.queue.empty():
                    break
                message = lane.queue.get_nowait()
                if not await self._process(message):
                    self._fall_behind(lane)
                    await asyncio.sleep(RETRY_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("channel worker failed", extra={"transport": self._transport})
        finally:
            if self._lanes.get(lane.channel_id) is lane and lane.queue.empty() and not lane.behind:
                del self._lanes[lane.channel_id]  # idle: reclaimed

    async def _read_history(self, lane: Lane) -> bool:
        """Process the channel's history after its cursor, oldest first, up to now.

        True once the present is reached (the lane is live again); False when a message
        could not be committed or the history could not be read (try again later).
        """
        key = str(lane.channel_id)
        budget = self._settings.catch_up_max_messages
        try:
            cursor = await self._cursors.get(key)
        except Exception as exc:
            log.warning("cannot read the cursor of %s: %s", key, exc,
                        extra={"transport": self._transport})
            return False
        if cursor is None or not cursor.isdigit() or budget == 0:
            lane.behind = False  # nothing committed there yet: start from now
            return True
        # The cached channel when there is one: its messages carry guild and members.
        cached = self._client.get_channel(lane.channel_id)
        channel: discord.abc.Messageable = (
            cached if isinstance(cached, discord.abc.Messageable)
            else self._client.get_partial_messageable(lane.channel_id)
        )
        after = discord.Object(int(cursor))
        while budget > 0:
            try:
                page = [
                    m async for m in channel.history(
                        limit=min(HISTORY_PAGE, budget), after=after, oldest_first=True
                    )
                ]
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("cannot read the history of %s: %s", key, exc,
                            extra={"transport": self._transport})
                return False
            if not page:
                break
            for message in page:
                if self._closing or not await self._process(message):
                    return False
                self.caught_up += 1
                after = discord.Object(message.id)
            budget -= len(page)
        lane.behind = False  # no await since the last (empty) page: nothing slips through
        if budget <= 0:
            log.warning(
                "channel %s: more than catch_up_max_messages (%d) missed; older ones skipped",
                key, self._settings.catch_up_max_messages, extra={"transport": self._transport},
            )
        return True

    # -- one message -----------------------------------------------------------------

    async def _process(self, message: discord.Message) -> bool:
        """Hand one message to the gateway; True when it was committed."""
        channel_id = message.channel.id
        channel, thread = await self.where(channel_id)
        me = self._client.user
        own = me is not None and message.author.id == me.id
        try:
            text = await self.text_of(message)
        except NotReadable as exc:
            log.warning("message %s not read: %s", message.id, exc,
                        extra={"transport": self._transport, "native_id": str(message.id)})
            return False

        async def committed(disposition: Disposition) -> None:
            await self._cursors.advance(str(channel_id), str(message.id))
            if not own:
                await self._react(message, disposition)

        envelope = Envelope(
            transport=self._transport,
            channel=channel,
            thread=thread,
            author=Author(
                id=str(message.author.id),
                display_name=message.author.display_name,
                is_bot=message.author.bot,
                is_self=own,
                roles=roles_of(message.author),
            ),
            text=text,
            native_id=str(message.id),
            at=message.created_at.timestamp(),
            on_commit=committed,
        )
        disposition = await self._sink.on_envelope(envelope)
        return disposition.committed

    async def text_of(self, message: discord.Message) -> str:
        """The message text followed by its ``.txt`` attachments (blocks sent as files),
        read as ``adapters/attachments.py`` says."""
        files = [TextFile(a.filename, a.size, a.read)
                 for a in message.attachments[: self._settings.attachments_per_message]]
        texts = await read_text_files(files, self._settings.attachment_max_bytes,
                                      (discord.HTTPException, aiohttp.ClientError, OSError))
        return "\n".join(p for p in [message.content, *texts] if p)

    # -- shutdown ----------------------------------------------------------------------

    async def close(self, grace: float) -> None:
        """Stop taking messages; let each lane finish the one in hand (up to ``grace``
        seconds), then cancel. What was not committed is caught up next time."""
        self._closing = True
        if self._catching_up is not None:
            self._catching_up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._catching_up
        await settle([lane.task for lane in self._lanes.values()], grace)
        self._lanes.clear()

    def lanes(self) -> int:
        """Channels with messages waiting or a catch-up running."""
        return len(self._lanes)


def roles_of(user: discord.User | discord.Member) -> tuple[str, ...]:
    """A member's role ids and names (without @everyone), for ``role:`` permissions."""
    if not isinstance(user, discord.Member) or getattr(user, "guild", None) is None:
        return ()  # a user outside a guild, or a message from history without its member
    roles = [r for r in user.roles if not r.is_default()]
    return tuple([str(r.id) for r in roles] + [r.name for r in roles])

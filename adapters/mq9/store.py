"""The mq9 service's storage on JetStream: mailboxes, delayed messages, groups, agents.

No state lives in the process. A mailbox is a stream of its own, so JetStream allocates
msg_id (the stream sequence minus one) atomically however many service instances append
at once; its TTL, creation time and description are the stream's metadata. A message's
lane and key are its subject, so one lane reads in FIFO order with a subject filter and
key compaction is a purge of older messages on the key's subjects. Delayed messages wait
in a shared stream; group offsets are a KV bucket updated by compare-and-set; agent
registrations are a stream with one message per agent.
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import json
import math
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client, ServerVersion
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from adapters.mq9.connection import ReplyInbox
from adapters.mq9.names import LANE_BY_TOKEN, Lane, Names
from adapters.mq9.settings import ServiceSettings

# Internal headers; a sender's headers with these prefixes (or NATS's own) are dropped.
DUE_HEADER = "Mq9-Internal-Due"
SENT_HEADER = "Mq9-Internal-Sent"
RESERVED_HEADER_PREFIXES = ("nats-", "mq9-internal-")
_STREAM_IN_USE = 10058
_API_TIMEOUT = 5.0
_LIST_PAGE = 256
_CAS_ATTEMPTS = 200
_LANES_KEPT = 65_536
_ENTRIES_KEPT = 16_384
# Stream metadata came with nats-server 2.10, per-message TTLs (Nats-TTL) and batched
# direct gets with 2.11. An older server takes the streams but drops what it does not
# know: every mailbox would look missing (and be created again over another instance's).
MIN_NATS_SERVER = (2, 11)


class StorageError(Exception):
    """JetStream refused or did not answer; the request gets an error reply."""


class MailboxMissing(StorageError):
    """The mailbox's stream is gone (expired and swept, or never created)."""


class LimitReached(StorageError):
    """A configured bound (messages, bytes, mailboxes, agents, delayed) is reached."""


class UnsupportedServer(Exception):
    """The NATS server lacks what the service's storage needs (too old a nats-server)."""


def server_problem(version: ServerVersion) -> str | None:
    """Why a nats-server of ``version`` cannot hold the service's storage, or None."""
    try:
        found = (version.major, version.minor, version.patch)
    except ValueError:  # not semantic versioning: no nats-server release
        found = None
    if found is not None and found[:2] >= MIN_NATS_SERVER:
        return None
    name = "of unknown version" if found is None else ".".join(map(str, found))
    need = ".".join(map(str, MIN_NATS_SERVER))
    return (f"nats-server {name} is too old for the mq9 service: it needs {need} or newer "
            "(stream metadata, per-message TTL, batched direct get)")


def describe(exc: BaseException) -> str:
    """``exc`` for a log line: its class and its text (many of nats-py's and
    asyncio's errors have none, which would leave the line saying nothing)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class MailboxMeta:
    """What CREATE fixed about a mailbox; never changes while the mailbox lives."""

    address: str
    created: float
    ttl: int
    nonce: str

    @property
    def expires_at(self) -> float | None:
        """Unix time the mailbox expires, None when it never does (ttl 0)."""
        return None if self.ttl == 0 else self.created + self.ttl

    def expired(self, now: float) -> bool:
        """Whether the mailbox has expired at ``now``."""
        expires = self.expires_at
        return expires is not None and now >= expires

    @classmethod
    def from_stream(cls, address: str, metadata: Mapping[str, str] | None) -> MailboxMeta | None:
        """The mailbox described by a stream's metadata; None for a stream that isn't one."""
        meta = metadata or {}
        try:
            return cls(address, float(meta["mq9.created"]), int(meta["mq9.ttl"]),
                       meta["mq9.nonce"])
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class Stored:
    """One stored message as read back from a mailbox stream."""

    seq: int
    lane: Lane
    headers: dict[str, str]
    data: bytes
    time: int

    @property
    def msg_id(self) -> int:
        """The broker's msg_id: the storage offset, first message 0."""
        return self.seq - 1

    def user_headers(self) -> dict[str, str]:
        """The headers the sender set (NATS's and the service's own left out)."""
        return {k: v for k, v in self.headers.items()
                if not k.lower().startswith(RESERVED_HEADER_PREFIXES)}


def unix_seconds(stamp: str) -> int:
    """Whole Unix seconds of a JetStream RFC 3339 time stamp (nanosecond precision)."""
    try:
        return _whole_seconds(stamp[:19])
    except ValueError:
        return int(time.time())


@functools.lru_cache(maxsize=64)
def _whole_seconds(stamp: str) -> int:
    # Cached: the messages of one FETCH were mostly stored within a few seconds, and
    # strptime costs more than the rest of reading a message back.
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def rfc3339(unix: float) -> str:
    """A Unix time as the RFC 3339 text JetStream's direct get takes for start_time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(0.0, unix)))


def _pending(eob: Msg) -> int:
    """Messages matching after a batch, from its end-of-batch (unknown counts as many)."""
    try:
        return int((eob.headers or {}).get("Nats-Num-Pending", "1"))
    except ValueError:
        return 1


def _is_full(exc: APIError) -> bool:
    text = (exc.description or "").lower()
    return "maximum" in text or "resource limits" in text or "storage" in text


class BatchReader(ReplyInbox):
    """Batched JetStream direct gets (one request, many replies) and one-answer requests
    (JetStream publishes) on the service's shared reply inbox."""

    async def read(self, stream: str, request: dict[str, Any]) -> list[Msg]:
        """The messages one batched direct get answers (empty when none match)."""
        return (await self.read_counted(stream, request))[0]

    async def read_counted(self, stream: str, request: dict[str, Any]) -> tuple[list[Msg], int]:
        """The messages one batched direct get answers, and how many more match after
        them (the end-of-batch's ``Nats-Num-Pending``; 0 when none match at all)."""
        token, reply_to = await self._reply_to()
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._queues[token] = queue
        out: list[Msg] = []
        single = "batch" not in request  # a plain direct get answers one message, no EOB
        try:
            await self._nc.publish(f"$JS.API.DIRECT.GET.{stream}",
                                   json.dumps(request).encode(), reply=reply_to)
            async with asyncio.timeout(_API_TIMEOUT):
                while True:
                    msg = await queue.get()
                    status = (msg.headers or {}).get("Status")
                    if status is None:
                        out.append(msg)
                        if single:
                            return out, 0
                        continue
                    if status == "204":
                        return out, _pending(msg)
                    if status == "404":
                        return out, 0
                    if status == "503":
                        raise MailboxMissing(stream)
                    raise StorageError(f"direct get on {stream}: status {status}")
        except TimeoutError as exc:
            raise StorageError(f"direct get on {stream} timed out") from exc
        finally:
            del self._queues[token]


class Storage:
    """Every piece of the service's state, on one NATS connection's JetStream."""

    def __init__(self, nc: Client, settings: ServiceSettings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=_API_TIMEOUT)
        self.settings = settings
        self.names = Names(settings.namespace)
        self.reader = BatchReader(nc)
        self._groups: KeyValue | None = None
        # Cache of CREATE's immutable facts, so SEND needs one round trip; a cached
        # mailbox can only disappear by expiring, which the cache entry knows.
        self._meta: OrderedDict[str, MailboxMeta] = OrderedDict()
        # Hints that spare an ACK two of its three round trips, keyed by the mailbox's
        # nonce (a mailbox created again is another one). The lane each message this
        # instance served was stored in (a stored message never changes lane), and each
        # group's last offsets entry seen with its revision (the compare-and-set proves
        # it current, else it is read again). A miss only costs the round trip.
        self._lanes: dict[tuple[str, int], Lane] = {}
        self._entries: dict[tuple[str, str], tuple[int, dict[Lane, int]]] = {}

    # ----- setup

    async def setup(self) -> None:
        """Create (or adopt) the shared streams and bucket; safe for instances racing.
        ``UnsupportedServer`` (before anything is created) when the server is too old."""
        problem = server_problem(self.nc.connected_server_version)
        if problem is not None:
            raise UnsupportedServer(problem)
        s, n = self.settings, self.names
        storage = api.StorageType(s.storage)
        await self._ensure_stream(api.StreamConfig(
            name=n.delayed_stream, subjects=[f"{s.namespace}.delayed.*"], storage=storage,
            num_replicas=s.replicas, retention=api.RetentionPolicy.WORK_QUEUE,
            discard=api.DiscardPolicy.NEW, max_msgs=s.max_delayed_messages,
            max_msg_size=self.max_message_bytes))
        await self._ensure_stream(api.StreamConfig(
            name=n.agents_stream, subjects=[n.agents_filter], storage=storage,
            num_replicas=s.replicas, discard=api.DiscardPolicy.NEW, max_msgs=s.max_agents,
            max_msgs_per_subject=1, max_msg_size=s.max_agent_bytes * 2 + 4096,
            allow_direct=True))
        self._groups = await self.js.create_key_value(api.KeyValueConfig(
            bucket=n.groups_bucket, history=1, max_bytes=s.max_groups_bytes,
            storage=storage, replicas=s.replicas, direct=True))
        await self.reader.subscribe()

    async def _ensure_stream(self, config: api.StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:
                raise
            await self.js.update_stream(config)

    async def close(self) -> None:
        """Release the reply inbox."""
        await self.reader.stop()

    @property
    def max_message_bytes(self) -> int:
        """Largest stored message: payload plus the sender's and the service's headers."""
        return self.settings.max_payload_bytes + 8192

    # ----- mailboxes

    async def create_mailbox(self, address: str, ttl: int, desc: str) -> bool:
        """Create ``address``; False when a live mailbox of that name exists."""
        for _ in range(2):
            meta = MailboxMeta(address, time.time(), ttl, secrets.token_hex(8))
            metadata = {"mq9.created": repr(meta.created), "mq9.ttl": str(ttl),
                        "mq9.nonce": meta.nonce, "mq9.desc": desc}
            s = self.settings
            config = api.StreamConfig(
                name=self.names.box_stream(address),
                subjects=[self.names.box_subjects(address)],
                storage=api.StorageType(s.storage), num_replicas=s.replicas,
                discard=api.DiscardPolicy.NEW, max_msgs=s.max_messages_per_mailbox,
                max_bytes=s.max_mailbox_bytes, max_msg_size=self.max_message_bytes,
                allow_direct=True, allow_msg_ttl=True, duplicate_window=120.0,
                metadata=metadata)
            try:
                # The nonce makes every CREATE's config unique, so of two racing CREATEs
                # exactly one succeeds and the other sees "already in use".
                await self.js.add_stream(config)
            except BadRequestError as exc:
                if exc.err_code != _STREAM_IN_USE:
                    raise StorageError(exc.description or str(exc)) from exc
                existing = await self.mailbox(address, use_cache=False)
                if existing is not None:
                    return False
                await self.delete_mailbox(address)  # expired, not yet swept
                continue
            except APIError as exc:
                raise StorageError(exc.description or str(exc)) from exc
            self._remember(meta)
            return True
        return False

    def _remember(self, meta: MailboxMeta) -> None:
        self._meta[meta.address] = meta
        self._meta.move_to_end(meta.address)
        while len(self._meta) > self.settings.max_mailboxes:
            self._meta.popitem(last=False)

    async def mailbox(self, address: str, *, use_cache: bool = True) -> MailboxMeta | None:
        """The live mailbox ``address``, or None (never created, deleted or expired)."""
        now = time.time()
        cached = self._meta.get(address) if use_cache else None
        if cached is not None and not cached.expired(now):
            return cached
        self._meta.pop(address, None)
        try:
            info = await self.js.stream_info(self.names.box_stream(address))
        except NotFoundError:
            return None
        except APIError as exc:
            raise StorageError(exc.description or str(exc)) from exc
        meta = MailboxMeta.from_stream(address, info.config.metadata)
        if meta is None or meta.expired(now):
            return None
        self._remember(meta)
        return meta

    async def count_mailboxes(self) -> int:
        """How many mailbox streams exist (expired ones not yet swept included)."""
        reply = await self._api("STREAM.NAMES", {"offset": 0, "subject": self.names.box_filter})
        return int(reply.get("total", 0))

    async def mailboxes(self) -> AsyncIterator[tuple[str, MailboxMeta | None]]:
        """Every mailbox stream's (stream name, mailbox), page by page."""
        offset = 0
        while True:
            reply = await self._api("STREAM.LIST",
                                    {"offset": offset, "subject": self.names.box_filter})
            streams = reply.get("streams") or []
            for info in streams:
                config = info.get("config", {})
                name = str(config.get("name", ""))
                prefix = f"{self.settings.namespace}_box_"
                address = name.removeprefix(prefix).replace("_", ".")
                yield name, MailboxMeta.from_stream(address, config.get("metadata"))
            offset += len(streams)
            if not streams or offset >= int(reply.get("total", 0)):
                return

    async def sweep(self) -> int:
        """Delete every expired mailbox; returns how many went."""
        now, gone = time.time(), 0
        expired = [meta async for _, meta in self.mailboxes()
                   if meta is not None and meta.expired(now)]
        for meta in expired:
            current = await self._stream_meta(meta.address)
            if current is not None and current.nonce == meta.nonce:  # not re-created since
                await self.delete_mailbox(meta.address)
                gone += 1
        return gone

    async def _stream_meta(self, address: str) -> MailboxMeta | None:
        try:
            info = await self.js.stream_info(self.names.box_stream(address))
        except NotFoundError:
            return None
        return MailboxMeta.from_stream(address, info.config.metadata)

    async def delete_mailbox(self, address: str) -> None:
        """Remove a mailbox with its delayed messages and its groups' offsets."""
        self._meta.pop(address, None)
        try:
            await self.js.delete_stream(self.names.box_stream(address))
        except NotFoundError:
            pass
        await self.js.purge_stream(self.names.delayed_stream,
                                   subject=self.names.delayed_subject(address))
        await self.js.purge_stream(f"KV_{self.names.groups_bucket}",
                                   subject=self.names.group_prefix_subject(address))

    async def _api(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            msg = await self.nc.request(f"$JS.API.{verb}", json.dumps(request).encode(),
                                        timeout=_API_TIMEOUT)
        except nats.errors.Error as exc:
            raise StorageError(f"{verb}: {exc}") from exc
        reply: dict[str, Any] = json.loads(msg.data)
        if "error" in reply:
            raise StorageError(f"{verb}: {reply['error'].get('description', reply['error'])}")
        return reply

    # ----- messages

    async def append(self, meta: MailboxMeta, payload: bytes, headers: dict[str, str],
                     lane: Lane, key: str | None, expires_at: float | None,
                     dedupe_id: str | None = None) -> int:
        """Store a message; returns its msg_id. A keyed message replaces older ones."""
        address = meta.address
        mailbox_end = meta.expires_at
        ends = [t for t in (expires_at, mailbox_end) if t is not None]
        stored = dict(headers)
        if ends:
            # Nats-TTL makes the server drop the message itself, at the earlier of its own
            # expiry and its mailbox's.
            stored["Nats-TTL"] = str(max(1, math.ceil(min(ends) - time.time())))
        if dedupe_id is not None:
            stored["Nats-Msg-Id"] = dedupe_id
        stream = self.names.box_stream(address)
        stored["Nats-Expected-Stream"] = stream  # as js.publish(stream=...) sends it
        try:
            seq = await self._publish(self.names.message_subject(address, lane, key),
                                      payload, stored)
        except NoStreamResponseError as exc:
            raise MailboxMissing(address) from exc
        except APIError as exc:
            if _is_full(exc):
                raise LimitReached(f"mailbox {address} is full") from exc
            raise StorageError(exc.description or str(exc)) from exc
        except TimeoutError as exc:  # nats.errors.TimeoutError is one too
            raise StorageError("JetStream did not acknowledge the message") from exc
        if key is not None:
            # Everything older on this key, in any lane, goes: only the latest is kept.
            await self.js.purge_stream(stream, seq=seq,
                                       subject=self.names.key_filter(address, key))
        return seq - 1

    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> int:
        """Store a message as ``js.publish`` does (the same errors); its stream sequence."""
        msg = await self.reader.request(subject, payload, headers, _API_TIMEOUT)
        if (msg.headers or {}).get("Status") == "503":  # no stream listens (no responders)
            raise NoStreamResponseError
        reply = json.loads(msg.data)
        if "error" in reply:
            raise APIError.from_error(reply["error"])
        return int(reply["seq"])

    async def read(self, address: str, subject: str, *, start_seq: int = 1,
                   start_time: float | None = None, limit: int,
                   max_bytes: int | None = None) -> list[Stored]:
        """Up to ``limit`` messages on ``subject`` from ``start_seq`` (or a time), in order."""
        request: dict[str, Any] = {"next_by_subj": subject, "batch": limit}
        if start_time is not None:
            request["start_time"] = rfc3339(start_time)
        else:
            request["seq"] = max(1, start_seq)
        if max_bytes is not None:
            request["max_bytes"] = max_bytes
        msgs = await self.reader.read(self.names.box_stream(address), request)
        return [self._stored(m) for m in msgs]

    async def read_rest(self, address: str, start_seq: int, *, limit: int,
                        max_bytes: int) -> list[Stored] | None:
        """Every message of the mailbox from ``start_seq`` on, in order, when they are at
        most ``limit`` and fit in ``max_bytes``; None when more are stored."""
        msgs, pending = await self.reader.read_counted(
            self.names.box_stream(address),
            {"next_by_subj": self.names.box_subjects(address), "batch": limit,
             "seq": max(1, start_seq), "max_bytes": max_bytes})
        return None if pending else [self._stored(m) for m in msgs]

    @staticmethod
    def _stored(msg: Msg) -> Stored:
        headers = dict(msg.headers or {})  # nats-py's headers: str names, str values
        subject_tokens = headers.get("Nats-Subject", "").split(".")
        lane = LANE_BY_TOKEN.get(subject_tokens[-2] if len(subject_tokens) > 1 else "",
                                 Lane.NORMAL)
        return Stored(seq=int(headers.get("Nats-Sequence", "0")), lane=lane,
                      headers=headers, data=msg.data,
                      time=unix_seconds(headers.get("Nats-Time-Stamp", "")))

    def served(self, meta: MailboxMeta, messages: list[Stored]) -> None:
        """Remember the lanes of ``messages`` (of mailbox ``meta``), just read for a FETCH."""
        lanes = self._lanes
        for m in messages:
            lanes[meta.nonce, m.seq] = m.lane
        _bound(lanes, _LANES_KEPT)

    async def lane(self, meta: MailboxMeta, seq: int) -> Lane | None:
        """The lane of the message stored at ``seq``; None when it is gone (and this
        instance did not serve it)."""
        lane = self._lanes.get((meta.nonce, seq))
        if lane is not None:
            return lane
        stored = await self.get(meta.address, seq)
        return None if stored is None else stored.lane

    async def get(self, address: str, seq: int) -> Stored | None:
        """The message stored at ``seq``, None when it is gone."""
        msgs = await self.reader.read(self.names.box_stream(address),
                                      {"seq": seq, "next_by_subj": self.names.box_subjects(
                                          address), "batch": 1})
        return self._stored(msgs[0]) if msgs and self._stored(msgs[0]).seq == seq else None

    async def last_seq(self, address: str) -> int:
        """The sequence of the last message ever stored (0 when none)."""
        try:
            info = await self.js.stream_info(self.names.box_stream(address))
        except NotFoundError as exc:
            raise MailboxMissing(address) from exc
        return int(info.state.last_seq)

    async def delete_message(self, address: str, seq: int) -> bool:
        """Delete one message; False when there is none at ``seq``."""
        try:
            return bool(await self.js.delete_msg(self.names.box_stream(address), seq))
        except NotFoundError:
            return False
        except APIError as exc:
            # 10057: the delete failed because there is no such message (gone, deleted,
            # or past the end of the stream: "no message found", "stream store EOF").
            if exc.code == 404 or exc.err_code == 10057 or "not found" in (
                    exc.description or ""):
                return False
            raise StorageError(exc.description or str(exc)) from exc

    # ----- delayed messages

    async def delay(self, address: str, payload: bytes, headers: dict[str, str],
                    due: float, sent: float) -> None:
        """Keep a message out of sight until ``due``; the delayer moves it then."""
        stored = dict(headers)
        stored[DUE_HEADER] = repr(due)
        stored[SENT_HEADER] = repr(sent)
        try:
            await self.js.publish(self.names.delayed_subject(address), payload,
                                  headers=stored, stream=self.names.delayed_stream)
        except APIError as exc:
            if _is_full(exc):
                raise LimitReached("too many delayed messages") from exc
            raise StorageError(exc.description or str(exc)) from exc

    async def delayed_consumer(self) -> Any:
        """The pull subscription every instance shares to move due messages."""
        config = api.ConsumerConfig(
            ack_wait=30.0, max_ack_pending=self.settings.max_delayed_messages,
            deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.EXPLICIT)
        return await self.js.pull_subscribe(
            f"{self.settings.namespace}.delayed.*", durable=self.names.delayer_consumer,
            stream=self.names.delayed_stream, config=config)

    # ----- consumer groups

    @property
    def groups(self) -> KeyValue:
        """The offsets bucket (after ``setup``)."""
        if self._groups is None:
            raise RuntimeError("storage not set up")
        return self._groups

    async def offsets(self, meta: MailboxMeta, group: str) -> dict[Lane, int]:
        """Next msg_id per lane the group has acknowledged up to (absent: none yet)."""
        known = (meta.nonce, self.names.group_key(meta.address, group))
        entry = await self._entry(known)
        return {} if entry is None else dict(entry[1])

    async def _entry(self, known: tuple[str, str]) -> tuple[int, dict[Lane, int]] | None:
        """The group offsets entry ``known`` as stored now (revision, offsets), remembered;
        None when there is none."""
        try:
            entry = await self.groups.get(known[1])
        except KeyNotFoundError:
            self._entries.pop(known, None)
            return None
        found = (int(entry.revision or 0), _decode_offsets(entry.value))
        self._remember_entry(known, found)
        return found

    def _remember_entry(self, known: tuple[str, str], entry: tuple[int, dict[Lane, int]]
                        ) -> None:
        self._entries.pop(known, None)
        self._entries[known] = entry
        _bound(self._entries, _ENTRIES_KEPT)

    async def advance(self, meta: MailboxMeta, group: str, lanes: tuple[Lane, ...],
                      next_id: int) -> None:
        """Move the group's offset of ``lanes`` to at least ``next_id`` (compare-and-set,
        retried with a little jitter while other ACKs of the same group win).

        The first attempt sets from the entry last seen here, without reading it: when
        another ACK (of any instance) changed it since, the set fails and the entry is
        read. Offsets only grow, so an entry seen here that already covers ``next_id``
        still does; it is read anyway, to answer from what is stored."""
        key = self.names.group_key(meta.address, group)
        known = (meta.nonce, key)
        seen = self._entries.get(known)
        conflicts = 0
        for _ in range(_CAS_ATTEMPTS):
            fresh = seen is None or all(seen[1].get(lane, -1) >= next_id for lane in lanes)
            if fresh:
                try:
                    seen = await self._entry(known)
                except APIError:
                    continue  # a read racing a concurrent first write: read again
            revision, current = seen if seen is not None else (None, {})
            if all(current.get(lane, -1) >= next_id for lane in lanes):
                return
            current = dict(current)
            for lane in lanes:
                current[lane] = max(current.get(lane, 0), next_id)
            value = json.dumps({lane.value: n for lane, n in current.items()}).encode()
            try:
                if revision is None:
                    revision = await self.groups.create(key, value)
                else:
                    revision = await self.groups.update(key, value, last=revision)
                self._remember_entry(known, (int(revision), current))
                return
            except APIError as exc:
                # 10071: wrong last sequence, another ACK won (KeyWrongLastSequenceError)
                if not isinstance(exc, KeyWrongLastSequenceError) and exc.err_code != 10071:
                    if _is_full(exc):
                        raise LimitReached("too many consumer groups") from exc
                    raise StorageError(exc.description or str(exc)) from exc
            seen = None
            if fresh:  # a real race (not just an old entry): back off a little
                conflicts += 1
                await asyncio.sleep(random.uniform(0, 0.002 * min(conflicts, 10)))
        raise StorageError("group offset update kept conflicting")

    # ----- agents

    async def register(self, name: str, record: dict[str, Any]) -> None:
        """Store (or replace) one agent's registration."""
        try:
            await self.js.publish(self.names.agent_subject(name),
                                  json.dumps(record).encode(),
                                  stream=self.names.agents_stream)
        except APIError as exc:
            if _is_full(exc):
                raise LimitReached("agent registry is full") from exc
            raise StorageError(exc.description or str(exc)) from exc

    async def unregister(self, name: str) -> None:
        """Forget one agent (no-op when unknown)."""
        await self.js.purge_stream(self.names.agents_stream,
                                   subject=self.names.agent_subject(name))

    async def agent(self, name: str) -> tuple[dict[str, Any], int] | None:
        """One agent's registration and its stream sequence, None when unknown."""
        msgs = await self.reader.read(self.names.agents_stream,
                                      {"last_by_subj": self.names.agent_subject(name)})
        if not msgs:
            return None
        record: dict[str, Any] = json.loads(msgs[0].data)
        return record, int((msgs[0].headers or {}).get("Nats-Sequence", "0"))

    async def replace_agent(self, name: str, record: dict[str, Any], last_seq: int) -> bool:
        """Write ``record`` if the registration is still the one at ``last_seq``."""
        try:
            await self.js.publish(
                self.names.agent_subject(name), json.dumps(record).encode(),
                stream=self.names.agents_stream,
                headers={"Nats-Expected-Last-Subject-Sequence": str(last_seq)})
        except APIError as exc:
            if exc.err_code == 10071:
                return False
            raise StorageError(exc.description or str(exc)) from exc
        return True

    async def agents(self) -> list[dict[str, Any]]:
        """Every registration (the registry is bounded by ``max_agents``)."""
        out: list[dict[str, Any]] = []
        seq = 1
        while True:
            msgs = await self.reader.read(self.names.agents_stream,
                                          {"seq": seq, "next_by_subj": self.names.agents_filter,
                                           "batch": 500})
            for msg in msgs:
                out.append(json.loads(msg.data))
            if len(msgs) < 500:
                return out
            seq = int((msgs[-1].headers or {}).get("Nats-Sequence", "0")) + 1


def _bound(table: dict[Any, Any], most: int) -> None:
    """Drop the oldest entries of ``table`` beyond ``most``."""
    while len(table) > most:
        del table[next(iter(table))]


def _decode_offsets(raw: bytes | None) -> dict[Lane, int]:
    try:
        data = json.loads(raw or b"{}")
        return {Lane(k): int(v) for k, v in data.items()}
    except (ValueError, TypeError, AttributeError):
        return {}

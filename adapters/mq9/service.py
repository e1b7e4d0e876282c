"""The mq9-compatible mailbox service: answers ``$mq9.AI.*`` requests from JetStream state.

Start it with :func:`start_service` (or ``bpgw mq9 serve --nats URL``). Instances share
requests through a NATS queue group and keep nothing in memory that matters, so any
number can run and a restart loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from adapters.mq9.connection import connect
from adapters.mq9.names import (
    API_PREFIX,
    LANES,
    Lane,
    address_problem,
    generate_address,
    split_address_and_id,
)
from adapters.mq9.settings import ServiceSettings
from adapters.mq9.store import (
    DUE_HEADER,
    RESERVED_HEADER_PREFIXES,
    SENT_HEADER,
    LimitReached,
    MailboxMeta,
    MailboxMissing,
    Storage,
    StorageError,
    Stored,
    describe,
)
from adapters.mq9.wire import (
    MAX_DISCOVER_LIMIT,
    QUERY_LIMIT,
    SEMANTIC_DISABLED,
    AckRequest,
    AgentNameRequest,
    BadRequest,
    CreateRequest,
    DiscoverRequest,
    FetchRequest,
    QueryRequest,
    ReportRequest,
    messages_reply,
    parse,
    reply,
)

log = logging.getLogger("bpgw.mq9")

_MAX_HEADER_BYTES = 2048
_SCAN_BATCH = 256
STOP_DRAIN_SECONDS = 5.0
"""How long stop() waits for the server to stop routing requests here and for the
requests it routed before to be taken."""

Handler = Callable[[str, Msg], Awaitable[bytes | None]]


def _missing(address: str) -> str:
    return f"mailbox {address} does not exist"


class Mq9Service:
    """One service instance on one NATS connection."""

    def __init__(self, nc: Client, settings: ServiceSettings) -> None:
        self.nc = nc
        self.settings = settings
        self.storage = Storage(nc, settings)
        self._slots = asyncio.Semaphore(settings.max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        # nats-py turns a cancellation into ConnectionClosedError when the connection is
        # closing, so the loops also watch this flag instead of trusting CancelledError.
        self._stopping = False
        self._sub: Any = None
        # Mailboxes whose last FETCH found a long backlog: read lane by lane (a hint only,
        # bounded like the mailboxes).
        self._deep: dict[str, None] = {}
        self._exact: dict[str, Handler] = {
            "MAILBOX.CREATE": self._create,
            "AGENT.REGISTER": self._register,
            "AGENT.UNREGISTER": self._unregister,
            "AGENT.REPORT": self._report,
            "AGENT.DISCOVER": self._discover,
        }
        self._per_mailbox: dict[str, Handler] = {
            "MSG.SEND.": self._send,
            "MSG.FETCH.": self._fetch,
            "MSG.ACK.": self._ack,
            "MSG.QUERY.": self._query,
            "MSG.DELETE.": self._delete,
        }

    @property
    def reply_budget(self) -> int:
        """Largest reply body the NATS server accepts."""
        return int(self.nc.max_payload) - 1024

    async def start(self) -> None:
        """Set up storage, subscribe ``$mq9.AI.>`` in the queue group, start the loops."""
        self.settings.check_nats_max_payload(int(self.nc.max_payload))
        await self.storage.setup()
        self._sub = await self.nc.subscribe(API_PREFIX + ">", queue=self.settings.queue_group,
                                            cb=self._on_request)
        # The SUB sits in the client's write buffer until flushed: without the round trip a
        # request sent right after start() (from another connection) finds no responder.
        await self.nc.flush()
        self._stopping = False
        self._loops = [asyncio.create_task(self._delayer()),
                       asyncio.create_task(self._sweeper())]
        log.info("mq9 service listening", extra={"outcome": "started"})

    async def stop(self) -> None:
        """Stop taking requests, finish the ones in flight, stop the loops. Safe twice."""
        self._stopping = True
        if self._sub is not None:
            # Drained, not just unsubscribed: the UNSUB and a round trip make the server
            # stop routing requests here, and the ones it routed before are taken, not
            # dropped (their clients would wait out their timeouts for nothing).
            # (Not connected: the server dropped the subscription with the connection.)
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(STOP_DRAIN_SECONDS):
                    if self.nc.is_connected:
                        await self._sub.drain()
                    else:
                        await self._sub.unsubscribe()
            self._sub = None
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.storage.close()

    # ----- dispatch

    async def _on_request(self, msg: Msg) -> None:
        # Waiting for a slot here holds back the subscription, so a flood queues in the
        # client's bounded pending buffer instead of growing tasks without limit.
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    def _route(self, subject: str) -> tuple[Handler, str] | None:
        rest = subject[len(API_PREFIX):]
        handler = self._exact.get(rest)
        if handler is not None:
            return handler, ""
        for prefix, handler in self._per_mailbox.items():
            if rest.startswith(prefix) and len(rest) > len(prefix):
                return handler, rest[len(prefix):]
        return None

    async def _handle(self, msg: Msg) -> None:
        route = self._route(msg.subject)
        if route is None:
            return  # the broker leaves unknown subjects unanswered
        handler, arg = route
        try:
            body = await handler(arg, msg)
        except BadRequest as exc:
            body = reply(str(exc))
        except LimitReached as exc:
            body = reply(str(exc))
        except (StorageError, nats.errors.Error) as exc:
            log.warning("mq9 storage error: %s", describe(exc),
                        extra={"reason": str(exc), "outcome": "error"})
            body = reply(f"service unavailable: {exc}")
        except Exception as exc:  # never let one request take the service down
            log.exception("mq9 request failed", extra={"reason": str(exc)})
            body = reply(f"internal error: {type(exc).__name__}")
        if body is not None and msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(body)

    async def _live(self, address: str) -> MailboxMeta | None:
        return None if address_problem(address) else await self.storage.mailbox(address)

    # ----- mailboxes and messages

    async def _create(self, _: str, msg: Msg) -> bytes:
        req = parse(CreateRequest, msg.data, empty_ok=True)
        s = self.settings
        address = req.name or generate_address()
        problem = address_problem(address)
        if problem:
            raise BadRequest(f"invalid mail_address: {address!r} {problem}")
        if len(req.desc) > s.max_desc_length:
            raise BadRequest(f"desc longer than {s.max_desc_length} characters")
        if await self.storage.count_mailboxes() >= s.max_mailboxes:
            raise LimitReached(f"too many mailboxes (limit {s.max_mailboxes})")
        if not await self.storage.create_mailbox(address, req.ttl, req.desc):
            return reply(f"mailbox {address} already exists")
        return reply(mail_address=address)

    def _headers(self, msg: Msg) -> dict[str, str]:
        headers = {str(k): str(v) for k, v in (msg.headers or {}).items()
                   if not str(k).lower().startswith(RESERVED_HEADER_PREFIXES)}
        if sum(len(k) + len(v) + 4 for k, v in headers.items()) > _MAX_HEADER_BYTES:
            raise BadRequest(f"headers too large (limit {_MAX_HEADER_BYTES} bytes)")
        return headers

    def _seconds(self, headers: dict[str, str], name: str, cap: int | None) -> int:
        raw = headers.get(name)
        if raw is None:
            return 0
        try:
            value = int(raw.strip())
        except ValueError:
            raise BadRequest(f"invalid {name}: {raw!r} (whole seconds expected)") from None
        if value < 0 or (cap is not None and value > cap):
            limit = f"0..{cap}" if cap is not None else ">= 0"
            raise BadRequest(f"invalid {name}: {raw!r} (must be {limit})")
        return value

    async def _send(self, address: str, msg: Msg) -> bytes:
        s = self.settings
        meta = await self._live(address)
        if meta is None:
            return reply(_missing(address))
        if len(msg.data) > s.max_payload_bytes:
            raise BadRequest(
                f"payload too large: {len(msg.data)} bytes (limit {s.max_payload_bytes})")
        headers = self._headers(msg)
        key = headers.get("mq9-key") or None
        if key is not None and len(key) > s.max_name_length:
            raise BadRequest(f"mq9-key longer than {s.max_name_length} characters")
        tags = [t.strip() for t in headers.get("mq9-tags", "").split(",") if t.strip()]
        if len(tags) > s.max_tags or any(len(t) > s.max_tag_length for t in tags):
            raise BadRequest(
                f"mq9-tags: at most {s.max_tags} tags of {s.max_tag_length} characters")
        delay = self._seconds(headers, "mq9-delay", s.max_delay_seconds)
        ttl = self._seconds(headers, "mq9-ttl", None)
        now = time.time()
        if delay > 0:
            await self.storage.delay(address, msg.data, headers, now + delay, now)
            return reply(msg_id=-1)
        lane = Lane.parse(headers.get("mq9-priority"))
        try:
            msg_id = await self.storage.append(meta, msg.data, headers, lane, key,
                                               now + ttl if ttl else None)
        except MailboxMissing:
            return reply(_missing(address))
        return reply(msg_id=msg_id)

    async def _deliver_start(self, address: str, req: FetchRequest) -> int:
        """First stream sequence a read from ``req.deliver`` covers."""
        if req.deliver == "earliest":
            return 1
        if req.deliver == "from_id":
            if req.from_id is None:
                raise BadRequest("invalid request: from_id is required for deliver from_id")
            return req.from_id + 1
        last = await self.storage.last_seq(address)
        if req.deliver == "latest":
            return max(1, last)  # the broker includes the last stored message
        if req.from_time is None:
            raise BadRequest("invalid request: from_time is required for deliver from_time")
        first = await self.storage.read(address, self.storage.names.box_subjects(address),
                                        start_time=req.from_time, limit=1)
        return first[0].seq if first else last + 1

    async def _offsets(self, meta: MailboxMeta, req: FetchRequest) -> dict[Lane, int]:
        """The group's acknowledged offsets that a FETCH starts from (none: ``deliver``)."""
        if req.group_name is None or req.force_deliver:
            return {}
        return await self.storage.offsets(meta, req.group_name)

    async def _collect(self, address: str, req: FetchRequest, limit: int,
                       offsets: dict[Lane, int]) -> list[Stored]:
        """Up to ``limit`` messages past ``offsets`` (lanes without one: from ``deliver``),
        the most urgent lane first."""
        start = None if len(offsets) == len(LANES) else await self._deliver_start(address, req)
        firsts = {lane: offsets[lane] + 1 if lane in offsets else start or 1 for lane in LANES}
        if address not in self._deep:
            # A short backlog is read in one go from the earliest lane's start and sorted
            # into lanes here: one read instead of one per lane.
            rest = await self.storage.read_rest(address, min(firsts.values()), limit=limit,
                                                max_bytes=self.reply_budget)
            if rest is not None:
                return [m for lane in LANES for m in rest
                        if m.lane is lane and m.seq >= firsts[lane]][:limit]
            self._deep[address] = None
            while len(self._deep) > self.settings.max_mailboxes:
                self._deep.pop(next(iter(self._deep)))
        out: list[Stored] = []
        for lane in LANES:
            if len(out) >= limit:
                break
            out += await self.storage.read(
                address, self.storage.names.lane_filter(address, lane),
                start_seq=firsts[lane], limit=limit - len(out), max_bytes=self.reply_budget)
        if len(out) < limit:
            self._deep.pop(address, None)  # the backlog is short again
        return out

    async def _fetch(self, address: str, msg: Msg) -> bytes:
        s = self.settings
        req = parse(FetchRequest, msg.data)
        if req.group_name is not None and len(req.group_name) > s.max_name_length:
            raise BadRequest(f"group_name longer than {s.max_name_length} characters")
        meta = await self._live(address)
        if meta is None:
            return reply(_missing(address))
        limit = min(max(1, req.config.num_msgs), s.max_fetch_messages)
        try:
            # FETCH never moves offsets, so one read of them serves the whole long wait.
            offsets = await self._offsets(meta, req)
            found = await self._collect(address, req, limit, offsets)
            wait_ms = min(max(0, req.config.max_wait_ms), s.max_wait_ms)
            if not found and wait_ms > 0:
                found = await self._wait_and_collect(address, req, limit, offsets,
                                                     wait_ms / 1000)
        except MailboxMissing:
            return reply(_missing(address))
        if req.group_name is not None:
            self.storage.served(meta, found)  # the ACK that follows knows their lanes
        return messages_reply(found, s.payload_encoding, self.reply_budget)

    async def _wait_and_collect(self, address: str, req: FetchRequest, limit: int,
                                offsets: dict[Lane, int], wait: float) -> list[Stored]:
        """Long wait: watch the mailbox's subjects, read again whenever something lands."""
        arrived = asyncio.Event()

        async def on_store(_: Msg) -> None:
            arrived.set()

        sub = await self.nc.subscribe(self.storage.names.box_subjects(address), cb=on_store)
        deadline = time.monotonic() + wait
        try:
            while True:
                # Read after subscribing, so a message stored in between is not missed.
                found = await self._collect(address, req, limit, offsets)
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return found
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), left)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _ack(self, address: str, msg: Msg) -> bytes:
        req = parse(AckRequest, msg.data)
        if len(req.group_name) > self.settings.max_name_length:
            raise BadRequest(
                f"group_name longer than {self.settings.max_name_length} characters")
        meta = await self._live(address)
        if meta is None:
            return reply(f"mailbox not found: {address}")
        # Unlike the broker (which moves all three lanes), only the acked message's lane
        # and the more urgent ones move: every message of those lanes with a smaller id
        # was necessarily served before it. Less urgent lanes keep their offsets, so a
        # never-fetched normal message is never skipped. An id whose lane is unknown
        # (gone, and not served here) moves only the critical lane (at worst a
        # redelivery, never a loss).
        lane = await self.storage.lane(meta, req.msg_id + 1) or Lane.CRITICAL
        lanes = LANES[: LANES.index(lane) + 1]
        await self.storage.advance(meta, req.group_name, lanes, req.msg_id + 1)
        return reply()

    async def _query(self, address: str, msg: Msg) -> bytes:
        req = parse(QueryRequest, msg.data, empty_ok=True)
        limit = req.limit if req.limit is not None and req.limit > 0 else QUERY_LIMIT
        limit = min(limit, QUERY_LIMIT)
        if await self._live(address) is None:
            return messages_reply([], self.settings.payload_encoding, self.reply_budget)
        names = self.storage.names
        try:
            if req.key:
                found = await self.storage.read(address, names.key_filter(address, req.key),
                                                limit=limit, max_bytes=self.reply_budget)
            elif req.tags:
                found = await self._scan_tags(address, set(req.tags), limit)
            elif req.since is not None:
                found = await self.storage.read(address, names.box_subjects(address),
                                                start_time=req.since, limit=limit,
                                                max_bytes=self.reply_budget)
            else:
                found = await self.storage.read(address, names.box_subjects(address),
                                                limit=limit, max_bytes=self.reply_budget)
        except MailboxMissing:
            found = []
        return messages_reply(found, self.settings.payload_encoding, self.reply_budget)

    async def _scan_tags(self, address: str, wanted: set[str], limit: int) -> list[Stored]:
        """Messages carrying any of ``wanted`` tags, in msg_id order (bounded scan: a
        mailbox holds at most max_messages_per_mailbox)."""
        out: list[Stored] = []
        seq = 1
        while len(out) < limit:
            batch = await self.storage.read(address, self.storage.names.box_subjects(address),
                                            start_seq=seq, limit=_SCAN_BATCH)
            for one in batch:
                tags = {t.strip() for t in one.headers.get("mq9-tags", "").split(",")}
                if tags & wanted:
                    out.append(one)
                    if len(out) >= limit:
                        break
            if len(batch) < _SCAN_BATCH:
                break
            seq = batch[-1].seq + 1
        return out

    async def _delete(self, rest: str, msg: Msg) -> bytes:
        address, raw_id = split_address_and_id(rest)
        if not raw_id.isdigit() or not raw_id.isascii():
            return reply(f"invalid msg_id: {raw_id}")
        if await self._live(address) is None:
            return reply(_missing(address))
        if not await self.storage.delete_message(address, int(raw_id) + 1):
            return reply("message not found")
        return reply(deleted=True)

    # ----- agents

    async def _register(self, _: str, msg: Msg) -> bytes:
        if not msg.data.strip():
            return reply("payload must not be empty")
        if len(msg.data) > self.settings.max_agent_bytes:
            raise BadRequest(
                f"agent card too large: {len(msg.data)} bytes "
                f"(limit {self.settings.max_agent_bytes})")
        try:
            card = json.loads(msg.data)
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("invalid request: body is not JSON") from None
        if not isinstance(card, dict):
            raise BadRequest("invalid request: body must be a JSON object")
        name = card.get("name")
        if not isinstance(name, str) or not name:
            return reply("agent name must not be empty")
        self._check_agent_name(name)
        await self.storage.register(name, {"card": card, "registered_at": int(time.time())})
        return reply()

    def _check_agent_name(self, name: str) -> None:
        if len(name) > self.settings.max_name_length:
            raise BadRequest(f"agent name longer than {self.settings.max_name_length} "
                             "characters")

    async def _unregister(self, _: str, msg: Msg) -> bytes:
        req = parse(AgentNameRequest, msg.data)
        if not req.name:
            return reply("agent name must not be empty")
        self._check_agent_name(req.name)
        await self.storage.unregister(req.name)
        return reply()

    async def _report(self, _: str, msg: Msg) -> bytes:
        req = parse(ReportRequest, msg.data)
        if not req.name:
            return reply("agent name must not be empty")
        self._check_agent_name(req.name)
        info = json.dumps(req.report_info)
        if len(info) > self.settings.max_agent_bytes:
            raise BadRequest(f"report_info too large (limit {self.settings.max_agent_bytes})")
        for _attempt in range(5):
            found = await self.storage.agent(req.name)
            if found is None:
                return reply()  # as the broker: reporting for an unknown agent changes nothing
            record, seq = found
            record["report_info"] = req.report_info
            record["reported_at"] = int(time.time())
            if await self.storage.replace_agent(req.name, record, seq):
                return reply()
        raise StorageError("agent record kept changing")

    async def _discover(self, _: str, msg: Msg) -> bytes:
        req = parse(DiscoverRequest, msg.data, empty_ok=True)
        if req.semantic:
            return reply(SEMANTIC_DISABLED)
        limit = min(req.limit, MAX_DISCOVER_LIMIT) if req.limit > 0 else 20
        page = max(1, req.page)
        words = (req.text or "").lower().split()
        matches = []
        for record in await self.storage.agents():
            card = record.get("card", {})
            text = json.dumps(card, ensure_ascii=False).lower()
            if all(word in text for word in words):
                shown = dict(card)
                if "report_info" in record:
                    shown["report_info"] = record["report_info"]
                matches.append(shown)
        matches.sort(key=lambda card: str(card.get("name", "")))
        return reply(agents=matches[(page - 1) * limit: page * limit])

    # ----- background loops

    async def _delayer(self) -> None:
        """Move delayed messages into their mailboxes when due (shared by all instances)."""
        psub = None
        while not self._stopping:
            try:
                if psub is None:
                    psub = await self.storage.delayed_consumer()
                msgs = await psub.fetch(batch=64, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("mq9 delayer: %s", describe(exc), extra={"outcome": "retry"})
                psub = None
                await asyncio.sleep(1.0)
                continue
            for one in msgs:
                await self._move_due(one)

    async def _move_due(self, msg: Msg) -> None:
        headers = dict(msg.headers or {})
        try:
            due = float(headers.pop(DUE_HEADER))
            sent = float(headers.pop(SENT_HEADER))
        except (KeyError, ValueError):
            await msg.ack()  # not ours: nothing can be done with it
            return
        now = time.time()
        if due > now:
            await msg.nak(delay=due - now)
            return
        address = msg.subject.rpartition(".")[2].replace("_", ".")
        headers = {k: v for k, v in headers.items()
                   if not k.lower().startswith(RESERVED_HEADER_PREFIXES)}
        try:
            meta = await self.storage.mailbox(address)
            ttl = self._seconds(headers, "mq9-ttl", None)
            expires = sent + ttl if ttl else None
            if meta is not None and (expires is None or expires > now):
                lane = Lane.parse(headers.get("mq9-priority"))
                # The delayed message's own sequence dedupes a move repeated after a crash.
                await self.storage.append(meta, msg.data, headers, lane,
                                          headers.get("mq9-key") or None, expires,
                                          dedupe_id=f"delayed-{msg.metadata.sequence.stream}")
        except (LimitReached, StorageError) as exc:
            log.warning("mq9 delayed message not moved yet: %s", describe(exc),
                        extra={"outcome": "retry"})
            await msg.nak(delay=5.0)
            return
        except BadRequest:
            pass  # checked at SEND; a stored message can't get here
        await msg.ack()

    async def _sweeper(self) -> None:
        """Delete expired mailboxes now and then (every instance; deletes are idempotent)."""
        while not self._stopping:
            await asyncio.sleep(self.settings.sweep_interval_seconds)
            try:
                gone = await self.storage.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("mq9 sweep failed: %s", describe(exc), extra={"outcome": "retry"})
                continue
            if gone:
                log.info("mq9 swept %d expired mailboxes", gone, extra={"outcome": "swept"})


async def start_service(nats_url: str, settings: ServiceSettings | None = None,
                        **connect_options: Any) -> Mq9Service:
    """Connect to ``nats_url`` and start a service instance; ``await service.stop()`` and
    ``await service.nc.close()`` (or :func:`stop_service`) end it."""
    nc = await connect(nats_url, max_reconnect_attempts=-1, **connect_options)
    service = Mq9Service(nc, settings or ServiceSettings())
    try:
        await service.start()
    except BaseException:
        await nc.close()
        raise
    return service


async def stop_service(service: Mq9Service) -> None:
    """Stop ``service`` and close its NATS connection."""
    await service.stop()
    await service.nc.close()

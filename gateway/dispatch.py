"""The outbox dispatcher: journal -> per-destination delivery, retries, dead letters.

One replica at a time dispatches (a lease in Redis, taken over within ``lease_seconds``
of its holder dying). It reads the journal through a consumer group without its pending
list (NOACK: Redis would record, and write to the append-only file, an XCLAIM per entry
read): an entry is deleted once dispatched, so every entry still in the journal up to the
group's last read id was read and not finished, and is replayed by the next holder (or by
itself after a restart) before it reads new ones. Each destination
(``transport:channel``, or an agent's inbox) is delivered in journal order: while a
destination has a retry queue, new messages for it join the queue behind the failed one,
so order per conversation holds. A delivery that fails is retried with exponential
backoff and jitter (honouring a platform's ``retry_after``); after ``max_attempts`` it is
dead-lettered: kept, counted, listable and re-sendable (``bpgw outbox``), and the sender
is told.

Once-only delivery per (message, destination): inbox transports refuse a journal id they
have already taken (adapters/http/inbox.py); for other transports the dispatcher checks
the idempotency key ``done`` before re-sending a replayed entry and records the native ids
after sending. Design and the remaining windows: docs/gateway.md ("Outbox").
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from adapters.base import Adapter, DeliveryError, Receipt
from adapters.delivery import through_cancel
from gateway.config import OutboxSection
from gateway.metrics import Metrics
from gateway.outbox import Item, Outbox, items_of
from state.connection import Lane, blocking_client
from state.leases import Lease

log = logging.getLogger("bpgw.gateway.dispatch")

GROUP = "dispatch"
BLOCK_MS = 1000
"""How long one journal read waits for a new entry (bounds lease and stop latency)."""
HOUSEKEEPING_SECONDS = 1.0
"""How often the blocked-destination view and the re-queued destinations are re-read."""
WAKE_BATCH = 1000
"""Destinations re-queued by ``bpgw outbox retry`` picked up per housekeeping run."""
RECLAIM_BATCH = 100
"""Idle destinations looked at per step of a reclaim run."""
DONE_TTL_SECONDS = 7 * 86400
# On stop, sends in progress get at most this long (and at most their send timeout) to
# finish and be recorded; the lease is kept meanwhile (renewed every third of its life).
STOP_GRACE_SECONDS = 10.0

_Writes = list[tuple[Any, ...]]
"""Commands recording what was sent, run with the entries' acknowledgement."""


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id_after(entry_id: str) -> str:
    """The smallest stream id after ``entry_id``."""
    ms, seq = _id_key(entry_id)
    return f"{ms}-{seq + 1}" if seq < 2**64 - 1 else f"{ms + 1}-0"


# KEYS journal. ARGV a dispatched batch's first id, last id, and the id after the last.
# A batch is consecutive journal entries (one read, and nothing is added between two ids
# already given), so what is left of [first, last] is the batch. When no entry lies
# before it (the usual case: one dispatcher, batches finished in order) one XTRIM MINID
# removes it, instead of XDEL finding each id (~3.9k Valkey instructions an id); else
# (a replica that lost the lease is still finishing an older batch, which must stay to be
# replayed should it die) its entries are deleted one by one as before.
_ACK = """
local s = KEYS[1]
if #redis.call('XRANGE', s, '-', '(' .. ARGV[1], 'COUNT', 1) == 0 then
  return redis.call('XTRIM', s, 'MINID', ARGV[3])
end
local gone = 0
for _, e in ipairs(redis.call('XRANGE', s, ARGV[1], ARGV[2])) do
  gone = gone + redis.call('XDEL', s, e[1])
end
return gone
"""


class Dispatcher:
    """Delivers the journal of one namespace through the enabled adapters."""

    def __init__(
        self,
        outbox: Outbox,
        adapters: Mapping[str, Adapter],
        settings: OutboxSection,
        *,
        on_dead_letter: Callable[[Item], Awaitable[None]],
        replica: str | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._outbox = outbox
        self._redis = outbox.redis
        self._keys = outbox.keys
        # New journal entries are awaited in Redis (BLOCK) on a connection of its own,
        # whose read timeout is the block time plus a margin, not the command timeout.
        self._journal_reader = blocking_client(self._redis, BLOCK_MS / 1000, 1)
        # Each batch's records and acknowledgement go on a connection of its own too.
        self._acks = Lane(self._redis.connection_pool)
        self._ack_script = self._redis.register_script(_ACK)
        self._adapters = adapters
        self._s = settings
        self._on_dead = on_dead_letter
        self._metrics = metrics
        self.replica = replica or uuid.uuid4().hex[:12]
        self._lease = Lease(self._redis, outbox.keys.namespace, "outbox", self.replica,
                            settings.lease_seconds)
        self._epoch = 0
        self._holding = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._reclaimer: asyncio.Task[None] | None = None
        self._reclaimed = 0.0
        self._locks: dict[str, _DestLock] = {}
        self._backlog: set[str] = set()
        self._next_send: dict[str, float] = {}
        self._done_id = (0, 0)
        self._progress = asyncio.Condition()
        self._housekept = 0.0
        self.last_error: str | None = None

    @property
    def holding(self) -> bool:
        """True while this replica holds the dispatch lease."""
        return self._holding

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Create the consumer group if needed and start dispatching in the background."""
        await self._ensure_group()
        self._stopping = False
        # Take the lease now when it is free, so ``holding`` is true from the start.
        if await self._try_hold():
            await self._take_over()
        self._task = asyncio.create_task(self._run(), name="bpgw-outbox-dispatch")

    async def stop(self) -> None:
        """Stop dispatching and give the lease back, so another replica takes over at once.

        Sends in progress finish and are recorded first (for a bounded time, while the
        lease is still kept): a post that reached its platform but was not recorded
        would be posted again by the next dispatcher.
        """
        self._stopping = True
        for group in ((self._task, *self._workers.values()), (self._keepalive, self._reclaimer)):
            tasks = [t for t in group if t]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._task = self._keepalive = self._reclaimer = None
        self._workers.clear()
        await self._journal_reader.aclose()
        await self._acks.aclose()
        if self._holding:
            self._holding = False
            try:
                await self._lease.release(self._epoch)
            except Exception as exc:  # Redis gone: the lease expires by itself
                log.warning("could not release the dispatch lease: %s", exc)

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109 - a plain bound
        """Wait until every journal entry written so far has been dispatched here.

        Dispatched means delivered, queued for a retry or dead-lettered. False when that
        did not happen within ``timeout`` (another replica dispatches, or Redis is down).
        """
        if not self._holding:
            return False  # another replica dispatches: nothing to wait for here
        try:
            info = await self._redis.xinfo_stream(self._keys.journal)
        except ResponseError:
            return True  # no journal yet
        except RedisError:
            return False  # the store is unreachable: nothing can be dispatched now
        target = _id_key(str(info["last-generated-id"]))
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self._done_id >= target)
        except TimeoutError:
            return False
        return True

    async def _ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self._keys.journal, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        pause = 0.1
        while not self._stopping:
            try:
                if not self._holding:
                    if not await self._try_hold():
                        await self._housekeeping(force=True)
                        await asyncio.sleep(HOUSEKEEPING_SECONDS)
                        continue
                    await self._take_over()
                resp: Any = await self._journal_reader.xreadgroup(
                    GROUP, self.replica, {self._keys.journal: ">"},
                    count=self._s.batch, block=BLOCK_MS, noack=True,
                )
                if resp:
                    await self._dispatch(resp[0][1], replay=False)
                await self._housekeeping()
                pause = 0.1
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis outage: report, back off, start over
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("outbox dispatch failed, retrying: %s", self.last_error)
                self._holding = False
                if "NOGROUP" in str(exc):
                    try:
                        await self._ensure_group()
                    except Exception:
                        log.debug("group not created yet", exc_info=True)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    async def _try_hold(self) -> bool:
        if self._holding and self._epoch:
            return await self._lease.renew(self._epoch)
        self._epoch = await self._lease.acquire()
        return bool(self._epoch)

    async def _keep_lease(self) -> None:
        """Renew the lease every third of its life; on losing it stop dispatching."""
        while self._holding and not self._stopping:
            await asyncio.sleep(self._s.lease_seconds / 3)
            try:
                if not await self._try_hold():
                    log.warning("lost the outbox dispatch lease to another replica")
                    self._holding = False
            except Exception as exc:
                log.warning("could not renew the dispatch lease: %s", exc)

    async def _take_over(self) -> None:
        """Became the dispatcher: replay what was read and not finished (by a dead
        holder, or by this replica before a restart): the journal's entries up to the
        group's last read id."""
        self._holding = True
        if self._keepalive is None or self._keepalive.done():
            self._keepalive = asyncio.create_task(self._keep_lease())
        log.info("this replica dispatches the outbox", extra={"reason": self.replica})
        journal = self._keys.journal
        try:
            groups: Any = await self._redis.xinfo_groups(journal)
        except ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise
            groups = []  # no journal: nothing read (the next read creates the group)
        end = next((str(g["last-delivered-id"]) for g in groups if str(g["name"]) == GROUP),
                   "0-0")
        start = "-"
        while True:
            entries: Any = await self._redis.xrange(journal, start, end, count=self._s.batch)
            if not entries:
                break
            await self._dispatch(entries, replay=True)
            start = "(" + str(entries[-1][0])
        await self._outbox.take_over_stats()
        await self._resume([str(d) for d in await self._redis.smembers(self._keys.dests)])

    async def _resume(self, dests: Sequence[str]) -> None:
        """Start a retry worker for each of ``dests`` that has a queue (one pipeline)."""
        fresh = [d for d in dests if d not in self._backlog]
        for i in range(0, len(fresh), 1000):
            chunk = fresh[i:i + 1000]
            async with self._redis.pipeline(transaction=False) as pipe:
                for dest in chunk:
                    pipe.llen(self._keys.queue(dest))
                lengths = await pipe.execute()
            for dest, n in zip(chunk, lengths, strict=True):
                if n:
                    self._backlog.add(dest)
                    self._ensure_worker(dest)

    async def _housekeeping(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._housekept < HOUSEKEEPING_SECONDS:
            return
        self._housekept = now
        raw = await self._redis.hgetall(self._keys.blocked)
        self._outbox.blocked = {str(k): str(v) for k, v in raw.items()}
        # The in-process tables keep only destinations being worked on.
        self._next_send = {d: t for d, t in self._next_send.items() if t > now}
        for dest in [d for d, task in self._workers.items() if task.done()]:
            del self._workers[dest]
        if not self._holding:
            return
        # Dead letters re-queued by `bpgw outbox retry` (another process) name their
        # destination in `wake`: only those are looked at, not every destination.
        woken: Any = await self._redis.spop(self._keys.wake, WAKE_BATCH)
        if woken:
            await self._resume([str(d) for d in woken])
        idle = self._s.idle_destination_seconds
        if now - self._reclaimed >= min(60.0, idle / 4) and (
                self._reclaimer is None or self._reclaimer.done()):
            self._reclaimed = now
            self._reclaimer = asyncio.create_task(self._reclaim(), name="bpgw-outbox-reclaim")

    async def _reclaim(self) -> None:
        """Forget destinations idle for ``idle_destination_seconds`` with nothing queued or
        dead-lettered (their registry entry, dead-letter counter, empty stream), a batch at
        a time, beside the dispatching: the registry and the stats hash stay as small as
        the destinations recently in trouble, whatever names hostile input brings."""
        try:
            while self._holding and not self._stopping:
                cutoff = time.time() - self._s.idle_destination_seconds
                idle = await self._outbox.idle(cutoff, RECLAIM_BATCH)
                for dest in idle:
                    async with self._lock(dest):  # no delivery to it meanwhile
                        await self._outbox.forget_idle(dest, cutoff)
                if len(idle) < RECLAIM_BATCH:
                    return
        except RedisError as exc:  # the next run tries again
            log.warning("could not forget idle destinations: %s", exc)

    # -- dispatching a batch -----------------------------------------------------------

    async def _dispatch(self, entries: Sequence[Any], *, replay: bool) -> None:
        groups: dict[str, list[Item]] = {}
        ids: list[str] = []
        for entry_id, fields in entries:
            eid = str(entry_id)
            ids.append(eid)
            if not fields or "m" not in fields:
                continue  # deleted under us (already dispatched): nothing to do
            try:
                items = items_of(eid, fields["m"], self._adapters)
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                log.error("unreadable journal entry %s skipped: %s", eid, exc)
                continue
            for item in items:
                groups.setdefault(item.dest, []).append(item)
        await self._finishing(self._deliver_batch(groups, ids, replay))

    async def _finishing(self, job: Awaitable[None]) -> None:
        """Run ``job`` (sends and the records of what they sent) to its end even when
        the dispatcher is stopped meanwhile, within the stop grace."""
        await through_cancel(
            job, grace=min(STOP_GRACE_SECONDS, self._s.send_timeout_seconds), cancel_late=True)

    async def _deliver_batch(self, groups: Mapping[str, list[Item]], ids: Sequence[str],
                             replay: bool) -> None:
        """Deliver journal entries ``ids`` (their items by destination), record what was
        sent and acknowledge the entries."""
        writes: _Writes = []
        await asyncio.gather(
            *(self._to_dest(dest, items, replay, writes) for dest, items in groups.items())
        )
        journal = self._keys.journal
        # (A replayed entry may be pending from a version that read with a pending list.)
        ack = [("XACK", journal, GROUP, *ids)] if replay else []
        args = (ids[0], ids[-1], _id_after(ids[-1]))
        replies = await self._acks.pipelined(
            [*writes, *ack, ("EVALSHA", self._ack_script.sha, 1, journal, *args)],
            raise_on_error=False)
        if isinstance(replies[-1], NoScriptError):  # the server lost it: load and run it
            replies[-1] = await self._ack_script(keys=[journal], args=args)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        async with self._progress:
            self._done_id = max(self._done_id, _id_key(ids[-1]))
            self._progress.notify_all()

    @asynccontextmanager
    async def _lock(self, dest: str) -> AsyncIterator[None]:
        """Hold ``dest``'s lock (one delivery pass per destination at a time). It lives
        while someone holds or waits for it, so the table stays as small as the
        destinations being worked on."""
        entry = self._locks.get(dest)
        if entry is None:
            entry = self._locks[dest] = _DestLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[dest]

    async def _to_dest(self, dest: str, items: list[Item], replay: bool, writes: _Writes
                       ) -> None:
        async with self._lock(dest):
            if dest in self._backlog:
                await self._enqueue_retry(dest, items)
                return
            done = await self._sent_before(dest, items) if replay else [None] * len(items)
            start = 0
            while start < len(items):
                sent, failed, later = await self._deliver_in_order(
                    dest, items[start:], done[start:], writes
                )
                if failed is None:
                    return
                at = start + sent
                if failed.attempts >= self._s.max_attempts:
                    await self._bury(dest, failed)
                    # What went out beside the failed one (another conversation) is done.
                    done = [*done[:at + 1], *(later.get(i - at - 1, done[i])
                                              for i in range(at + 1, len(items)))]
                    start = at + 1
                    continue
                rest = [item for i, item in enumerate(items[at + 1:]) if i not in later]
                await self._enqueue_retry(dest, [failed, *rest])
                return

    async def _deliver_in_order(
        self, dest: str, items: Sequence[Item], done: Sequence[Receipt | None], writes: _Writes
    ) -> tuple[int, Item | None, dict[int, Receipt]]:
        """Deliver ``items`` in order until one fails (``done``: receipts of those sent
        before a crash); how many went through, the failed one with its attempt counted
        (None when all went through), and the receipts of items after it that went out
        all the same (a transport that sends conversations side by side), by their
        position after the failed one; those are recorded too."""
        sent = 0
        while sent < len(items):
            receipt = done[sent]
            if receipt is not None:
                self._record(dest, items[sent], receipt, writes)
                sent += 1
                continue
            end = sent
            while end < len(items) and done[end] is None:
                end += 1
            run = items[sent:end]
            outcomes = await self._send_run(run)
            for i, (item, outcome) in enumerate(zip(run, outcomes, strict=False)):
                if not isinstance(outcome, Receipt):
                    later: dict[int, Receipt] = {}
                    for j, after in enumerate(outcomes[i + 1:]):
                        if isinstance(after, Receipt):
                            self._record(dest, run[i + 1 + j], after, writes)
                            later[j] = after
                    return sent, self._failed(item, outcome), later
                self._record(dest, item, outcome, writes)
                sent += 1
        return sent, None, {}

    async def _send_run(self, items: Sequence[Item]) -> list[Receipt | Exception]:
        """Send ``items`` (one destination) in order until one fails; their outcomes, at
        least one. A transport with batched sends gets them in one call, unless a rate
        limit paces the destination; any other, one by one."""
        adapter = self._adapters.get(items[0].out.address.transport)
        if adapter is None or not adapter.capabilities.batched_sends or self._s.rate_per_second:
            out: list[Receipt | Exception] = []
            for item in items:
                out.append(await self._attempt(item))
                if not isinstance(out[-1], Receipt):
                    break
            return out
        try:
            results = await asyncio.wait_for(
                adapter.send_batch([item.out for item in items]), self._s.send_timeout_seconds
            )
        except TimeoutError:
            return [DeliveryError(f"no answer within {self._s.send_timeout_seconds:g}s")]
        except Exception as exc:  # an adapter bug must not stop the outbox
            log.exception("adapter raised while sending", extra=_extra(items[0]))
            return [exc]
        return list(results) or [DeliveryError(f"{adapter.name} sent nothing")]

    async def _sent_before(self, dest: str, items: Sequence[Item]) -> list[Receipt | None]:
        """Per item, the receipt of a delivery made before a crash (its idempotency key),
        else None: one MGET for all of them. Inbox transports keep their own record."""
        found: list[Receipt | None] = [None] * len(items)
        checked = [
            i for i, item in enumerate(items)
            if (a := self._adapters.get(item.out.address.transport)) is not None
            and not a.capabilities.fresh_native_ids
        ]
        if not checked:
            return found
        raws = await self._redis.mget([self._keys.done(dest, items[i].entry_id) for i in checked])
        for i, sent in zip(checked, raws, strict=True):
            if sent is not None:  # delivered before a crash: never twice
                found[i] = Receipt(tuple(str(sent).split(",")) if sent else ())
        return found

    async def _attempt(self, item: Item) -> Receipt | Exception:
        """Send one item now (after the destination's pacing); the receipt or the error."""
        adapter = self._adapters.get(item.out.address.transport)
        if adapter is None:
            return DeliveryError(f"transport {item.out.address.transport} is not enabled here")
        await self._pace(item.dest)
        try:
            receipt = await asyncio.wait_for(adapter.send(item.out), self._s.send_timeout_seconds)
        except DeliveryError as exc:
            return exc
        except TimeoutError:
            return DeliveryError(f"no answer within {self._s.send_timeout_seconds:g}s")
        except Exception as exc:  # an adapter bug must not stop the outbox
            log.exception("adapter raised while sending", extra=_extra(item))
            return exc
        if self._metrics is not None:
            # The journal entry id is the commit time (Redis' clock, in milliseconds).
            committed = _id_key(item.entry_id)[0] / 1000
            self._metrics.sent(item.out.address.transport, str(item.out.kind), committed)
        return receipt

    async def _pace(self, dest: str) -> None:
        if self._s.rate_per_second <= 0:
            return
        now = time.monotonic()
        at = max(now, self._next_send.get(dest, 0.0))
        self._next_send[dest] = at + 1.0 / self._s.rate_per_second
        if at > now:
            await asyncio.sleep(at - now)

    def _failed(self, item: Item, exc: Exception) -> Item:
        now = time.time()
        attempts = item.attempts + 1
        hint = exc.retry_after if isinstance(exc, DeliveryError) else None
        code = exc.code if isinstance(exc, DeliveryError) else "delivery_failed"
        delay = self._delay(attempts, hint)
        if self._metrics is not None and attempts < self._s.max_attempts:
            self._metrics.retried(item.dest)
        log.warning("delivery to %s failed (attempt %d): %s", item.dest, attempts, exc,
                    extra=_extra(item))
        return replace(item, attempts=attempts, error=str(exc) or type(exc).__name__,
                       code=code, next_at=now + delay,
                       first_failed_at=item.first_failed_at or now)

    def _delay(self, attempts: int, retry_after: float | None) -> float:
        """Exponential backoff with full jitter, never sooner than the platform asked."""
        cap = min(self._s.backoff_max_seconds,
                  self._s.backoff_base_seconds * 2 ** min(attempts - 1, 30))
        delay = random.uniform(cap / 2, cap)
        return max(delay, retry_after or 0.0)

    def _record(self, dest: str, item: Item, receipt: Receipt, writes: _Writes) -> None:
        adapter = self._adapters.get(item.out.address.transport)
        if adapter is None or adapter.capabilities.fresh_native_ids:
            return  # inbox transports keep their own once-only record
        transport = item.out.address.transport
        ttl = int(self._outbox.echo_ttl_seconds)
        if adapter.capabilities.echoes_own_posts:
            writes += [("SET", self._keys.echo(transport, n), "1", "EX", ttl)
                       for n in receipt.native_ids]
        writes.append(("SET", self._keys.done(dest, item.entry_id),
                       ",".join(receipt.native_ids), "EX", DONE_TTL_SECONDS))

    async def _enqueue_retry(self, dest: str, items: list[Item]) -> None:
        """Queue items behind the destination's failed head (bounded: overflow is buried)."""
        queue = self._keys.queue(dest)
        room = max(0, self._s.queue_max - int(await self._redis.llen(queue)))
        keep, over = items[:room], items[room:]
        if keep:
            head = keep[0]
            async with self._redis.pipeline(transaction=False) as pipe:
                self._outbox.touch(pipe, dest)
                pipe.rpush(queue, *(i.to_json() for i in keep))
                if head.error:
                    pipe.hset(self._keys.blocked, dest, _why(head))
                await pipe.execute()
            self._backlog.add(dest)
            self._ensure_worker(dest)
        for item in over:
            await self._bury(dest, replace(
                item, code="queue_full",
                error=f"retry queue of {dest} is full ({self._s.queue_max} waiting)"))

    async def _bury(self, dest: str, item: Item) -> None:
        """Dead-letter one item: kept (bounded per destination), counted, sender told."""
        await self._redis.xadd(self._keys.dead(dest), {"m": item.to_json(), "at": time.time()},
                               maxlen=self._s.dead_letter_max, approximate=False)
        await self._outbox.count_dead(dest, self._s.stats_destinations)
        if self._metrics is not None:
            self._metrics.dead_lettered(dest)
        log.error("dead-lettered after %d attempt(s): %s", item.attempts, item.error,
                  extra=_extra(item))
        try:
            await self._on_dead(item)
        except Exception:
            log.exception("could not tell the sender about a dead letter", extra=_extra(item))

    # -- retry queues ------------------------------------------------------------------

    def _ensure_worker(self, dest: str) -> None:
        task = self._workers.get(dest)
        if task is None or task.done():
            self._workers[dest] = asyncio.create_task(self._drain_queue(dest))

    async def _drain_queue(self, dest: str) -> None:
        """Retry ``dest``'s queue from its head until it is empty (or the lease is lost).

        Once the head goes through, the items behind it follow in the same pass (up to
        ``batch``, one trim for all of them), so a destination that recovers catches up
        at the speed of its sends, not of one Redis round trip pair per item.
        """
        queue = self._keys.queue(dest)
        while self._holding and not self._stopping:
            try:
                async with self._lock(dest):
                    raws = await self._redis.lrange(queue, 0, self._s.batch - 1)
                    if not raws:
                        self._backlog.discard(dest)
                        async with self._redis.pipeline(transaction=False) as pipe:
                            pipe.hdel(self._keys.blocked, dest)
                            pipe.zadd(self._keys.seen, {dest: time.time()})
                            await pipe.execute()
                        return
                items = [Item.from_json(raw) for raw in raws]
                wait = items[0].next_at - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                # Items behind the head that failed on their own wait for their backoff.
                now, ready = time.time(), items[:1]
                for item in items[1:]:
                    if item.next_at > now:
                        break
                    ready.append(item)
                await self._finishing(self._retry_pass(dest, queue, ready))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis outage: wait and try again
                log.warning("retry queue of %s: %s", dest, exc)
                await asyncio.sleep(1.0)

    async def _retry_pass(self, dest: str, queue: str, ready: list[Item]) -> None:
        """Send the head items ``ready`` of ``dest``'s queue in order, then trim what went
        through (or was dead-lettered) and note why the head is still blocked."""
        writes: _Writes = []
        done = await self._sent_before(dest, ready)
        # Items behind the head that go out beside a failed one (``later``) stay queued
        # and recorded: the next pass finds their record and does not send them again.
        sent, failed, _later = await self._deliver_in_order(dest, ready, done, writes)
        buried = failed is not None and failed.attempts >= self._s.max_attempts
        if buried:
            assert failed is not None
            await self._bury(dest, failed)
        async with self._redis.pipeline(transaction=False) as pipe:
            for command in writes:
                pipe.execute_command(*command)
            if sent + buried:
                pipe.ltrim(queue, sent + buried, -1)
            if failed is not None and not buried:
                pipe.lset(queue, 0, failed.to_json())
                pipe.hset(self._keys.blocked, dest, _why(failed))
            await pipe.execute()


@dataclass
class _DestLock:
    """One destination's lock and how many hold or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _why(item: Item) -> str:
    """A blocked destination's reason as senders see it: ``code<TAB>detail``."""
    return f"{item.code or 'delivery_failed'}\t{item.error}"


def _extra(item: Item) -> dict[str, Any]:
    return {
        "request_id": item.out.request_id,
        "trace_id": item.out.trace_id,
        "transport": item.out.address.transport,
        "channel": item.out.address.channel,
        "recipient": item.out.recipient,
    }

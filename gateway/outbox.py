"""The durable outbox: every outbound message is journaled in Redis, then delivered.

A message accepted into state and the messages it causes are one commit: the pipeline
hands the journal entry (text, ids, deliveries) to the state script, which appends it to
the journal stream ``P ob:j`` in the same atomic step (``state/lua/common.lua``).
Gateway-originated messages (notices, command replies, timeout and cancel RESPONSEs) are
appended with ``enqueue``. The ``Dispatcher`` (gateway/dispatch.py) delivers them per
destination with retries and dead letters. Layout and guarantees: docs/gateway.md
("Outbox") and docs/state.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring as _json_str
from typing import Any

import redis.asyncio as aioredis

from adapters.base import (
    Adapter,
    Address,
    Outbound,
    OutboundKind,
    json_text,
    remembered_json,
)
from gateway.frozen import shared_address
from state.frozen import maker
from state.keys import tagged_key

log = logging.getLogger("bpgw.gateway.outbox")

_to_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# json.loads for the entries written here (text, never a byte order mark to refuse): the
# decoder without that function's checks (a journal entry is read per message).
_from_json = json.JSONDecoder().decode

STATS_MAX_DESTINATIONS = 1000
"""Destinations ``Outbox.stats`` reads at most (status, health and metrics stay bounded)."""
LIST_CHUNK = 100
"""Destinations (or dead letters) read or removed per round trip when listing or taking."""
DEAD_TOTAL = "dead"
"""Field of the stats hash counting every dead letter ever (exact, whatever the detail)."""

# KEYS stats, dests, seen. ARGV destination, now, per-destination counters kept at most.
# Counts one dead letter: in the total always, in the destination's own counter when it
# has one or there is room for it (so the hash holds at most that many + the total).
_COUNT_DEAD = """
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], '""" + DEAD_TOTAL + """', 1)
local field = 'dead:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], field) == 1 or
    redis.call('HLEN', KEYS[1]) <= tonumber(ARGV[3]) then
  redis.call('HINCRBY', KEYS[1], field, 1)
end
"""

# KEYS stats, dests, seen, blocked. ARGV destination, cutoff. Forgets a destination whose
# last activity is still before the cutoff (nothing touched it since it was found idle).
_FORGET = """
local at = redis.call('ZSCORE', KEYS[3], ARGV[1])
if at and tonumber(at) > tonumber(ARGV[2]) then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[1], 'dead:' .. ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""

# KEYS a dead-letter stream. Deletes it when it is empty (XDEL leaves an empty stream).
_DROP_EMPTY = """
if redis.call('XLEN', KEYS[1]) == 0 then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS stats. A stats hash written before the total was kept: the total is the sum of the
# per-destination counters (then all of them; from now on at most the bound).
_TAKE_OVER_TOTAL = """
if redis.call('HEXISTS', KEYS[1], '""" + DEAD_TOTAL + """') == 1 then return 0 end
local flat, total = redis.call('HGETALL', KEYS[1]), 0
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, 5) == 'dead:' then total = total + tonumber(flat[i + 1]) end
end
redis.call('HSET', KEYS[1], '""" + DEAD_TOTAL + """', total)
return total
"""

Delivery = tuple[str, str, str, str, str]
"""One destination of a journal entry: transport, channel, thread, recipient, reply_to."""


def destination(transport: str, key: str) -> str:
    """The queue name of one destination: ``transport:key`` (key from ``Adapter.destination``)."""
    return f"{transport}:{key}"


class OutboxKeys:
    """Key names of the outbox of one namespace (see docs/state.md, "Outbox keys")."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        p = "{" + namespace + "}:ob:"
        self.journal = p + "j"  # stream, same slot as the conversations
        self.dests = p + "dests"  # set of destinations with a retry queue or dead letters
        self.seen = p + "seen"  # zset destination (of dests) -> its last activity
        self.wake = p + "wake"  # set of destinations re-queued by `bpgw outbox retry`
        self.blocked = p + "blocked"  # hash destination -> why it is not being delivered
        self.stats = p + "stats"  # hash: dead (the total), dead:<dest> (bounded) counters

    # Per-destination keys carry a hash tag of their own (state/keys.py), so a Redis
    # Cluster spreads them over its shards.
    def queue(self, dest: str) -> str:
        """List of deliveries waiting for a retry to ``dest`` (oldest first)."""
        return tagged_key(self.namespace, "ob:q", dest)

    def dead(self, dest: str) -> str:
        """Stream of dead letters of ``dest``."""
        return tagged_key(self.namespace, "ob:dl", dest)

    def echo(self, transport: str, native_id: str) -> str:
        """Marker of one native id the gateway posted on ``transport`` (with a TTL)."""
        return tagged_key(self.namespace, "ob:echo", transport) + ":" + native_id

    def done(self, dest: str, entry_id: str) -> str:
        """Idempotency key of one (message, destination): its native ids once sent."""
        return tagged_key(self.namespace, "ob:done", dest) + ":" + entry_id


def _address(a: Address | None) -> list[str] | None:
    return None if a is None else [a.transport, a.channel, a.thread or ""]


PLACES_CACHED = 4096
"""Destinations and senders' places whose JSON ``_place_json`` remembers at most."""
PLACE_CACHED_MAX_CHARS = 512
"""The longest such JSON remembered (so all of them together hold at most 4 M chars)."""
_places: dict[tuple[str, ...], str] = {}


def _json_strings(values: tuple[str, ...]) -> str:
    """A JSON array of strings."""
    return "[" + ",".join([_json_str(v) for v in values]) + "]"


_place_json = remembered_json(_json_strings, _places, entries=PLACES_CACHED,
                              max_chars=PLACE_CACHED_MAX_CHARS)
"""A delivery's or a sender's place as a JSON array of strings, remembered: a gateway's
messages go to and come from few places, each written in every journal entry."""


def journal_entry(
    text: str,
    kind: OutboundKind,
    deliveries: Sequence[Delivery],
    *,
    request_id: str | None = None,
    trace_id: str | None = None,
    sender_at: Address | None = None,
) -> str:
    """One journal entry as JSON: what to send and where.

    ``sender_at`` is where to tell the sender when a delivery is dead-lettered (None for
    the gateway's own notices, so a failed notice never causes another).
    """
    # Written out by hand (one per accepted message; each string through the json
    # module's own encoder): what _to_json makes of the same dict, at a third of the cost.
    sender = None if sender_at is None else (
        sender_at.transport, sender_at.channel, sender_at.thread or "")
    raw = (
        f'{{"k":{_json_str(str(kind))},"t":{json_text(text)},'
        f'"r":{_json_str(request_id or "")},"tr":{_json_str(trace_id or "")},'
        f'"d":[{",".join([_place_json(d) for d in deliveries])}],'
        f'"s":{"null" if sender is None else _place_json(sender)}}}'
    )
    _journaled.put(raw, {"k": str(kind), "t": text, "r": request_id or "",
                         "tr": trace_id or "", "d": deliveries, "s": sender})
    return raw


JOURNALED_MAX = 2048
"""Entries ``journal_entry`` remembers decoded (``_journaled``) at most."""
JOURNALED_MAX_CHARS = 4 << 20
"""Characters of JSON those entries hold at most together; a longer entry is not kept."""


class _Journaled:
    """The entries journal_entry wrote lately, by their JSON, each with what decoding
    that JSON gives (tuples where it gives lists): the dispatcher, usually this
    process's, reads each one back soon after and takes it from here instead of decoding
    it again (a JSON decode of the whole text per message). Bounded in entries and in
    characters, oldest out first, as another replica may dispatch them all (then none is
    taken); an entry not found here (written by another replica or before a restart,
    placed by the apply script, or too long to keep) is decoded as before."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, raw: object) -> bool:
        return raw in self._entries

    def put(self, raw: str, decoded: dict[str, Any]) -> None:
        if len(raw) > JOURNALED_MAX_CHARS:
            return
        entries = self._entries
        while entries and (len(entries) >= JOURNALED_MAX
                           or self._chars + len(raw) > JOURNALED_MAX_CHARS):
            self._chars -= len(entries.popitem(last=False)[0])
        entries[raw] = decoded
        self._chars += len(raw)

    def take(self, raw: str) -> dict[str, Any] | None:
        decoded = self._entries.pop(raw, None)
        if decoded is not None:
            self._chars -= len(raw)
        return decoded


_journaled = _Journaled()


@dataclass(frozen=True)
class Item:
    """One (message, destination) pair on its way out."""

    entry_id: str
    dest: str
    out: Outbound
    sender_at: Address | None
    attempts: int = 0
    next_at: float = 0.0
    error: str = ""
    first_failed_at: float = 0.0
    code: str = ""

    def to_json(self) -> str:
        """Stored form in a retry queue or a dead-letter stream."""
        o = self.out
        return _to_json(
            {
                "e": self.entry_id,
                "dest": self.dest,
                "a": self.attempts,
                "n": self.next_at,
                "err": self.error,
                "c": self.code,
                "f": self.first_failed_at,
                "o": [
                    o.address.transport,
                    o.address.channel,
                    o.address.thread or "",
                    o.recipient or "",
                    o.reply_to or "",
                    str(o.kind),
                    o.text,
                    o.request_id or "",
                    o.trace_id or "",
                    o.id or "",
                ],
                "s": _address(self.sender_at),
            }
        )

    @staticmethod
    def from_json(raw: str | bytes) -> Item:
        """Inverse of ``to_json``."""
        d = json.loads(raw)
        o = d["o"]
        s = d.get("s")
        return Item(
            entry_id=d["e"],
            dest=d["dest"],
            out=Outbound(
                Address(o[0], o[1], o[2] or None),
                o[6],
                OutboundKind(o[5]),
                recipient=o[3] or None,
                reply_to=o[4] or None,
                request_id=o[7] or None,
                trace_id=o[8] or None,
                id=o[9] or None,
            ),
            sender_at=None if not s else Address(s[0], s[1], s[2] or None),
            attempts=int(d.get("a", 0)),
            next_at=float(d.get("n", 0.0)),
            error=str(d.get("err", "")),
            code=str(d.get("c", "")),
            first_failed_at=float(d.get("f", 0.0)),
        )


# The kinds by value: a dict lookup instead of the enum's call per journal entry.
_KINDS: dict[str, OutboundKind] = {kind.value: kind for kind in OutboundKind}

_make_outbound = maker(Outbound)
_make_item = maker(Item)


def items_of(entry_id: str, raw: str, adapters: Mapping[str, Adapter]) -> list[Item]:
    """The deliveries of one journal entry, each with its destination queue name."""
    e = _journaled.take(raw) or _from_json(raw)
    kind = _KINDS.get(e["k"]) or OutboundKind(e["k"])  # (an unknown kind raises as before)
    s = e.get("s")
    sender_at = None if not s else shared_address(s[0], s[1], s[2])
    out: list[Item] = []
    for transport, channel, thread, recipient, reply_to in e["d"]:
        o: Outbound = _make_outbound(
            address=shared_address(transport, channel, thread),
            text=e["t"],
            kind=kind,
            recipient=recipient or None,
            reply_to=reply_to or None,
            request_id=e["r"] or None,
            trace_id=e["tr"] or None,
            id=entry_id,
        )
        adapter = adapters.get(transport)
        key = adapter.destination(o) if adapter is not None else channel
        out.append(_make_item(entry_id=entry_id, dest=destination(transport, key), out=o,
                              sender_at=sender_at))
    return out


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered delivery, as listed by ``bpgw outbox list``."""

    id: str
    dest: str
    item: Item
    at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        o = self.item.out
        return {
            "id": self.id,
            "destination": self.dest,
            "address": str(o.address),
            "recipient": o.recipient,
            "kind": str(o.kind),
            "request_id": o.request_id,
            "trace_id": o.trace_id,
            "attempts": self.item.attempts,
            "code": self.item.code,
            "error": self.item.error,
            "at": self.at,
            "text": o.text,
        }


# KEYS marker (sorted set), journal. ARGV member, then the journal entries.
_ENQUEUE_ONCE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
for i = 2, #ARGV do redis.call('XADD', KEYS[2], '*', 'm', ARGV[i]) end
return 1
"""


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Outbox:
    """What the rest of the gateway sees of the outbox: enqueue, echoes, stats, dead letters.

    Works without a running dispatcher (the ``bpgw outbox`` CLI uses it on its own).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        namespace: str,
        adapters: Mapping[str, Adapter] | None = None,
        *,
        echo_ttl_seconds: float = 3600.0,
    ) -> None:
        self.redis = redis
        self.keys = OutboxKeys(namespace)
        self._adapters: Mapping[str, Adapter] = adapters or {}
        self.echo_ttl_seconds = echo_ttl_seconds
        self._enqueue_once = redis.register_script(_ENQUEUE_ONCE)
        # Destinations known to be blocked (full inbox, failing), refreshed from Redis by
        # the dispatcher loop of every replica: what a sender is warned about.
        self.blocked: dict[str, str] = {}
        self._count_dead = redis.register_script(_COUNT_DEAD)
        self._forget = redis.register_script(_FORGET)
        self._drop_empty = redis.register_script(_DROP_EMPTY)
        self._take_over_total = redis.register_script(_TAKE_OVER_TOTAL)

    def adapter(self, transport: str) -> Adapter | None:
        """The adapter of that transport name, if it is enabled."""
        return self._adapters.get(transport)

    def destination_of(self, address: Address, recipient: str | None) -> str:
        """The destination queue a message to ``address`` (for ``recipient``) goes through."""
        adapter = self._adapters.get(address.transport)
        out = Outbound(address, "", recipient=recipient)
        key = adapter.destination(out) if adapter is not None else address.channel
        return destination(address.transport, key)

    # -- writing -----------------------------------------------------------------------

    async def enqueue(self, entries: Iterable[str]) -> None:
        """Append gateway-originated journal entries (one round trip for all of them)."""
        batch = list(entries)
        if not batch:
            return
        if len(batch) == 1:
            await self.redis.xadd(self.keys.journal, {"m": batch[0]})
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry in batch:
                pipe.xadd(self.keys.journal, {"m": entry})
            await pipe.execute()

    async def enqueue_once(self, entries: Sequence[str], marker: str, member: str) -> bool:
        """Append ``entries`` only if ``member`` is still in the sorted set ``marker``,
        removing it in the same atomic step; False when someone else already did.

        Both keys share the namespace's slot. This makes journaling what a claim owes
        (a timed-out conversation's notices) happen exactly once across replicas and
        restarts.
        """
        done = await self._enqueue_once(keys=[marker, self.keys.journal], args=[member, *entries])
        return bool(done)

    # -- destinations with queues or dead letters ----------------------------------------

    def touch(self, pipe: Any, dest: str) -> None:
        """Add to ``pipe``: ``dest`` has a queue or dead letters, and was active now."""
        pipe.sadd(self.keys.dests, dest)
        pipe.zadd(self.keys.seen, {dest: time.time()})

    async def count_dead(self, dest: str, detail_max: int) -> None:
        """Count one dead letter of ``dest``: in the total, and in the destination's own
        counter while at most ``detail_max`` destinations have one."""
        k = self.keys
        await self._count_dead(keys=[k.stats, k.dests, k.seen],
                               args=[dest, time.time(), detail_max])

    async def idle(self, older_than: float, limit: int) -> list[str]:
        """Up to ``limit`` destinations not active since ``older_than`` (epoch seconds)."""
        return [_text(d) for d in await self.redis.zrangebyscore(
            self.keys.seen, "-inf", older_than, start=0, num=limit)]

    async def forget_idle(self, dest: str, older_than: float) -> bool:
        """Forget ``dest`` (its registry entry, counter, blocked reason, empty dead-letter
        stream) when nothing is queued or dead-lettered for it and it was not active since
        ``older_than``; else only note it as active now. True when forgotten.

        The caller makes sure nothing is delivered to ``dest`` meanwhile (the dispatcher
        holds its lock); ``retry`` queues before it marks the destination, so a re-sent
        dead letter is either seen here or marks the destination again after."""
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.llen(k.queue(dest))
            pipe.xlen(k.dead(dest))
            queued, dead = await pipe.execute()
        if queued or dead:
            await self.redis.zadd(k.seen, {dest: time.time()})
            return False
        if not await self._forget(keys=[k.stats, k.dests, k.seen, k.blocked],
                                  args=[dest, older_than]):
            return False
        await self._drop_empty(keys=[k.dead(dest)])
        return True

    async def take_over_stats(self) -> None:
        """Note every registered destination as active now and keep the dead-letter total,
        for a namespace an earlier version wrote (idempotent; O(destinations) the first time)."""
        await self._take_over_total(keys=[self.keys.stats])
        dests = [_text(d) for d in await self.redis.smembers(self.keys.dests)]
        if dests:
            now = time.time()
            await self.redis.zadd(self.keys.seen, dict.fromkeys(dests, now), nx=True)

    # -- echoes ------------------------------------------------------------------------

    async def is_echo(self, transport: str, native_id: str | None) -> bool:
        """True when ``native_id`` on ``transport`` is a message the gateway sent.

        Shared by every replica (markers in Redis with a TTL); transports that never see
        the gateway's posts skip the round trip.
        """
        if native_id is None or not self.echo_possible(transport, native_id):
            return False
        return bool(await self.redis.exists(self.keys.echo(transport, native_id)))

    def echo_possible(self, transport: str, native_id: str | None) -> bool:
        """False when ``native_id`` on ``transport`` can not be a message the gateway sent,
        so ``is_echo`` has nothing to look up (no id, fresh ids, a transport that never
        shows the gateway its own posts)."""
        if native_id is None:
            return False
        adapter = self._adapters.get(transport)
        return adapter is None or (not adapter.capabilities.fresh_native_ids
                                   and adapter.capabilities.echoes_own_posts)

    # -- stats and dead letters ----------------------------------------------------------

    async def stats(self, max_destinations: int = STATS_MAX_DESTINATIONS) -> dict[str, Any]:
        """Depth and dead letters, for status, health and metrics.

        ``journal`` entries not yet dispatched; ``queued`` deliveries awaiting a retry
        per destination; ``dead_letters`` kept per destination; ``dead_lettered_total``
        every dead letter ever (exact), ``dead_lettered`` the same per destination, for
        at most ``[outbox] stats_destinations`` destinations (the first ones, until an
        idle one is forgotten); ``blocked`` destinations with the reason;
        ``destinations`` how many have a queue or dead letters. At most
        ``max_destinations`` of them are read (bounded work however many there are).
        """
        k = self.keys
        dests: set[str] = set()
        async for d in self.redis.sscan_iter(k.dests, count=min(max_destinations, 1000)):
            dests.add(_text(d))
            if len(dests) >= max_destinations:
                break
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.scard(k.dests)
            pipe.xlen(k.journal)
            pipe.hgetall(k.stats)
            pipe.hgetall(k.blocked)
            for d in dests:
                pipe.llen(k.queue(d))
                pipe.xlen(k.dead(d))
            raw = await pipe.execute()
        total, journal, counters, blocked = int(raw[0]), int(raw[1]), raw[2], raw[3]
        queued: dict[str, int] = {}
        dead: dict[str, int] = {}
        for i, d in enumerate(dests):
            q, dl = int(raw[4 + 2 * i]), int(raw[5 + 2 * i])
            if q:
                queued[d] = q
            if dl:
                dead[d] = dl
        ever = {
            _text(name)[5:]: int(n)
            for name, n in counters.items()
            if _text(name).startswith("dead:")
        }
        # A hash from before the total was kept: its counters were all there was.
        ever_total = counters.get(DEAD_TOTAL, counters.get(DEAD_TOTAL.encode()))
        return {
            "journal": journal,
            "destinations": total,
            "queued": queued,
            "dead_letters": dead,
            "dead_lettered": ever,
            "dead_lettered_total": sum(ever.values()) if ever_total is None else int(ever_total),
            "blocked": {_text(a): _text(b) for a, b in blocked.items()},
        }

    async def dead_letters(self, dest: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Dead letters, oldest first, of one destination or of all (up to ``limit``)."""
        dests = [dest] if dest else sorted(_text(d) for d in await self.redis.smembers(
            self.keys.dests))
        found: list[DeadLetter] = []
        for i in range(0, len(dests), LIST_CHUNK):  # a round trip per chunk of destinations
            chunk = dests[i:i + LIST_CHUNK]
            async with self.redis.pipeline(transaction=False) as pipe:
                for d in chunk:
                    pipe.xrange(self.keys.dead(d), count=limit - len(found))
                streams: list[Any] = await pipe.execute()
            for d, rows in zip(chunk, streams, strict=True):
                for sid, fields in rows:
                    item = Item.from_json(fields["m"])
                    found.append(DeadLetter(_text(sid), d, item, float(fields.get("at", 0.0))))
                if len(found) >= limit:
                    return found[:limit]
        return found

    async def _take(self, ids: Sequence[str], dest: str | None) -> list[DeadLetter]:
        """Remove the dead letters ``ids`` (all when empty) and return them."""
        letters = await self.dead_letters(dest, limit=100_000)
        wanted = set(ids)
        chosen = [dl for dl in letters if not wanted or dl.id in wanted]
        for i in range(0, len(chosen), LIST_CHUNK):
            async with self.redis.pipeline(transaction=False) as pipe:
                for dl in chosen[i:i + LIST_CHUNK]:
                    pipe.xdel(self.keys.dead(dl.dest), dl.id)
                await pipe.execute()
        return chosen

    async def retry(self, ids: Sequence[str], dest: str | None = None) -> int:
        """Put dead letters back on their destination's retry queue; returns how many.

        ``ids`` empty means every dead letter (of ``dest`` when given). A re-sent message
        gets a fresh inbox id: it was not delivered, so the once-only check must not stop it.
        """
        taken = await self._take(ids, dest)
        for dl in taken:
            item = dl.item
            fresh = Item(
                item.entry_id,
                item.dest,
                Outbound(
                    item.out.address,
                    item.out.text,
                    item.out.kind,
                    recipient=item.out.recipient,
                    reply_to=item.out.reply_to,
                    request_id=item.out.request_id,
                    trace_id=item.out.trace_id,
                ),
                item.sender_at,
            )
            # Queued before it is marked: a destination forgotten meanwhile as idle is
            # marked again after (see forget_idle).
            await self.redis.rpush(self.keys.queue(dl.dest), fresh.to_json())
            async with self.redis.pipeline(transaction=False) as pipe:
                self.touch(pipe, dl.dest)
                pipe.sadd(self.keys.wake, dl.dest)
                await pipe.execute()
        if taken:
            log.info("re-queued %d dead letter(s)", len(taken))
        return len(taken)

    async def drop(self, ids: Sequence[str], dest: str | None = None) -> int:
        """Discard dead letters for good; returns how many (``ids`` empty: all)."""
        taken = await self._take(ids, dest)
        if taken:
            log.info("discarded %d dead letter(s)", len(taken))
        return len(taken)

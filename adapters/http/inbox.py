"""Agents' inboxes in Redis: durable, shared by every replica, acknowledged explicitly.

One inbox = one stream of the messages not yet acknowledged, plus a small hash:

* ``in``: bytes ever added (each entry is the one field ``<running total>: <body>``;
  entries written before it are ``o: <running total>, b: <body>``), ``ack``: that
  total at the last acknowledged entry, so ``in - ack`` is the bytes waiting, with no
  per-entry bookkeeping on acknowledgement;
* ``lj``: the last outbox journal id taken, so a replayed delivery is recognised and
  not stored twice (journal ids increase per inbox, as the outbox delivers in order);
* ``out`` / ``oo``: the last message handed to a reader and its running total (so
  acknowledging it, the usual case, needs no read of the entry);
* ``bt``: the batches handed out and not acknowledged, oldest first: each one's last id
  and until when it is invisible to other polls (the visibility timeout);
* ``last``: the newest entry's id (where a long-poll blocks from);
* ``n``: the messages waiting (an inbox written before it is counted once with XLEN).

A poll returns the oldest messages not in flight; ``ack=<id>`` removes every message up
to and including ``id`` (XTRIM MINID), as long as ``id`` is within the oldest batch not
acknowledged: acknowledging a later batch while an earlier one is out (its answer may
never have reached the reader) removes nothing, and once the oldest batch's visibility
timeout passes every unacknowledged message comes back (at least once, never lost). Each
step is one Lua script on the inbox's own hash-tagged slot. Long-polls block in Redis
(XREAD BLOCK on the stream), on connections of their own.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring as _json_str
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from adapters.base import json_text
from protocol.names import name_key
from state.batching import ScriptBatcher
from state.connection import blocking_client

ACK_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")
"""The form of a message id (a Redis stream id: ASCII digits, as the scripts read it)."""
PUT_BATCH_BYTES = 1 << 20
"""Message bytes one delivery script call carries at most (a batch is split beyond it)."""

# Whether stream id a (digits "-" digits: Redis's, or a checked ACK_ID) comes after b.
# Two of one length with the "-" at one place compare as text (digit strings of one
# length order as their numbers), which costs a fifth of converting them to numbers.
_NEWER = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms or 0), tonumber(seq or 0)
end
local function newer(a, b)
  if #a == #b and string.find(a, '-', 1, true) == string.find(b, '-', 1, true) then
    return a > b
  end
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am > bm or (am == bm and as > bs)
end
"""

# KEYS stream, meta. ARGV max count, max bytes, then (journal id, body) per message.
# An entry is one field, the running total of bytes added (with this body's) as its name
# and the body as its value: two arguments fewer to store and replicate, and two strings
# fewer to read back, than fields o and b (which entries written before it have).
# Returns one string per message handled, in one flat list (each item is a reply to
# convert, and a table per message more): the new entry's id when stored, 'dup:' and the
# journal id when that id was already taken, 'full:' and why when the inbox is full
# (which stops there: later messages must not overtake it). An id holds no ':'.
_DELIVER = _NEWER + """
local s, m = KEYS[1], KEYS[2]
local maxn, maxb = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = redis.call('HMGET', m, 'in', 'ack', 'lj', 'n')
local total, acked, lj = tonumber(st[1] or 0), tonumber(st[2] or 0), st[3] or '0-0'
local n = tonumber(st[4] or redis.call('XLEN', s))
local out, last = {}, nil
-- The dash of lj, kept with it: a batch's journal ids are usually of one length with the
-- dash at one place, so each is compared as text after one look for its own dash (newer()
-- looks for both).
local ljd = string.find(lj, '-', 1, true)
for i = 3, #ARGV, 2 do
  local jid, body = ARGV[i], ARGV[i + 1]
  local size = #body
  local jd, fresh = false, true
  if jid ~= '' then
    jd = string.find(jid, '-', 1, true)
    if jd and #jid == #lj and jd == ljd then fresh = jid > lj else fresh = newer(jid, lj) end
  end
  if not fresh then
    out[#out + 1] = 'dup:' .. jid
  elseif n + 1 > maxn then
    out[#out + 1] = 'full:it holds ' .. n .. ' messages (inbox_max ' .. maxn .. ')'
    break
  elseif total - acked + size > maxb then
    out[#out + 1] = 'full:it holds ' .. (total - acked) .. ' bytes (inbox_max_bytes ' ..
        maxb .. ')'
    break
  else
    total = total + size
    last = redis.call('XADD', s, '*', total, body)
    n = n + 1
    if jid ~= '' then lj, ljd = jid, jd end
    out[#out + 1] = last
  end
end
if last then redis.call('HSET', m, 'in', total, 'lj', lj, 'last', last, 'n', n) end
return out
"""

# KEYS stream, meta. ARGV now, visibility seconds, count, ack id ("" = none).
# Returns {entries, id to block after, seconds the in-flight messages stay invisible};
# entries flat: id, body (false when the entry has none) of each, no table per entry
# (each is a reply to convert, with the entry's fields, which the reader does not need).
# The batches handed out and not acknowledged are kept oldest first in ``bt`` (end id and
# deadline of each, at most MAX_BATCHES): an ack may only trim within the oldest one, so
# acknowledging a later batch never removes an earlier one whose answer was lost; when the
# oldest's deadline passes, everything not acknowledged is handed out again.
# Commands: HMGET of the meta, XTRIM with an ack (and an XRANGE of the acknowledged entry
# unless it is the last one handed out), XRANGE of what to hand out (skipped when nothing
# came after the messages in flight), one HSET of whatever changed.
_POLL = _NEWER + """
local MAX_BATCHES = 64
local s, m = KEYS[1], KEYS[2]
local now, vis, count, ack = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local st = redis.call('HMGET', m, 'out', 'until', 'last', 'oo', 'n', 'bt')
local out, last = st[1], st[3] or '0-0'
local set = {}
local function offset(fields)
  if #fields == 2 then return fields[1] end  -- as _DELIVER writes an entry
  for i = 1, #fields, 2 do if fields[i] == 'o' then return fields[i + 1] end end
  return 0
end
local batches = {}
if st[6] then
  for e, u in string.gmatch(st[6], '([^,;]+),([^;]+)') do
    batches[#batches + 1] = {e, tonumber(u)}
  end
elseif out and tonumber(st[2] or 0) > now then
  batches[1] = {out, tonumber(st[2])}  -- written before batches were kept
end
if ack ~= '' and (#batches == 0 or not newer(ack, batches[1][1])) then
  local off = false
  if ack == out then off = st[4] end
  if not off then
    local r = redis.call('XRANGE', s, ack, ack)
    if #r == 1 then off = offset(r[1][2]) end
  end
  if off then
    local ms, seq = string.match(ack, '^(%d+)-(%d+)$')
    local gone = redis.call('XTRIM', s, 'MINID', ms .. '-' .. (tonumber(seq) + 1))
    set[#set + 1] = 'ack'
    set[#set + 1] = off
    if st[5] then
      set[#set + 1] = 'n'
      set[#set + 1] = math.max(0, tonumber(st[5]) - gone)
    end
    if #batches > 0 and batches[1][1] == ack then table.remove(batches, 1) end
  end
end
local inflight = #batches > 0 and batches[1][2] > now
if not inflight then batches = {} end  -- the oldest's deadline passed: all come back
local rows = {}
local full = #batches >= MAX_BATCHES  -- too many unacknowledged: wait for the oldest
if count > 0 and not full and not (inflight and out == last) then
  rows = redis.call('XRANGE', s, inflight and ('(' .. out) or '-', '+', 'COUNT', count)
end
if #rows > 0 then
  local row = rows[#rows]
  batches[#batches + 1] = {row[1], now + vis}
  set[#set + 1] = 'out'
  set[#set + 1] = row[1]
  set[#set + 1] = 'oo'
  set[#set + 1] = offset(row[2])
end
local bt = {}
for i, b in ipairs(batches) do bt[i] = b[1] .. ',' .. b[2] end
bt = table.concat(bt, ';')
if bt ~= (st[6] or '') then
  set[#set + 1] = 'bt'
  set[#set + 1] = bt
end
if #set > 0 then redis.call('HSET', m, unpack(set)) end
if #rows > 0 then
  local flat = {}
  for i = 1, #rows do  -- (numeric: ipairs calls a C function per item)
    local row = rows[i]
    local f = row[2]
    local b = #f == 2 and f[2]  -- as _DELIVER writes an entry: total, body
    if not b then
      b = false
      for k = 1, #f, 2 do if f[k] == 'b' then b = f[k + 1] end end
    end
    flat[2 * i - 1] = row[1]
    flat[2 * i] = b
  end
  return {flat, '', '0'}
end
-- as text: Redis would truncate a Lua number reply to an integer
if inflight then return {rows, full and last or out, tostring(batches[1][2] - now)} end
return {rows, last, '0'}
"""


def _json_opt(value: str | None) -> str:
    return "null" if value is None else _json_str(value)


@functools.lru_cache(maxsize=1)
def _json_time(at: float) -> str:
    """``at`` as a JSON number: a batch of messages stored together shares one time, so
    its shortest repr (a few microseconds) is worked out once."""
    return repr(float(at))


def inbox_body(
    text: str,
    kind: str,
    *,
    request_id: str | None = None,
    trace_id: str | None = None,
    reply_to: str | None = None,
    thread: str | None = None,
    at: float | None = None,
) -> str:
    """Stored form of one message: the JSON object the inbox endpoint returns for it,
    without its ``id`` (Redis assigns that). Written out by hand (each string through
    the json module's own encoder, as ``ensure_ascii=False`` writes it): a poll hands
    the stored text on as it is, instead of decoding and encoding every message again."""
    return (
        f'{{"text":{json_text(text)},"kind":{_json_str(kind)},'
        f'"request_id":{_json_opt(request_id)},"trace_id":{_json_opt(trace_id)},'
        f'"reply_to":{_json_opt(reply_to)},"thread":{_json_opt(thread)},'
        f'"at":{_json_time(time.time() if at is None else at)}}}'
    )


def entry_json(entry_id: str, body: str) -> str:
    """One stored message as the inbox endpoint returns it: a JSON object with its id."""
    if body.startswith("{"):
        return f'{{"id":{_json_str(entry_id)},{body[1:]}'
    # Stored before bodies were objects: [text, kind, request_id, trace_id, reply_to,
    # thread, at].
    text, kind, request_id, trace_id, reply_to, thread, at = json.loads(body)
    return entry_json(entry_id, inbox_body(
        text, kind, request_id=request_id, trace_id=trace_id, reply_to=reply_to,
        thread=thread, at=at,
    ))


def entry_bytes(entry_id: bytes, body: bytes) -> bytes:
    """``entry_json`` in UTF-8, of an entry as Redis returns it (bytes, not decoded): a
    poll hands each stored body on as those bytes (decoding it and encoding the answer
    again gave the same bytes, at two passes over every message's text)."""
    if type(body) is bytes and body.startswith(b"{"):
        # A stream id, [0-9]+-[0-9]+ (bytes' isdigit is ASCII digits, False when empty),
        # told by bytes methods: a regular expression's match costs more than the rest.
        ms, _, seq = entry_id.partition(b"-")
        if ms.isdigit() and seq.isdigit():
            return b'{"id":"' + entry_id + b'",' + body[1:]  # (an id's JSON is itself quoted)
    return entry_json(_text(entry_id), _body(body)).encode()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


INBOX_KEYS_CACHED = 4096
"""Inboxes whose key names ``_inbox_keys`` remembers (the most recently used)."""


@functools.lru_cache(maxsize=INBOX_KEYS_CACHED)
def _inbox_keys(namespace: str, owner: str) -> tuple[str, str]:
    """(stream, meta) key names of ``owner``'s inbox in ``namespace``. Remembered: every
    delivery batch and every poll names them, and the SHA-1 and its hex digits cost
    several times the look-up."""
    # A hash tag per inbox (hashed: a name may hold "{"), so a cluster spreads them;
    # of the name's canonical key, so every spelling of a name is one inbox.
    tag = hashlib.sha1(name_key(owner).encode()).hexdigest()[:16]
    base = f"{namespace}:in:{{{tag}}}"
    return base + ":s", base + ":m"


class Inboxes:
    """Every agent's inbox of one namespace, in Redis."""

    def __init__(
        self,
        redis: aioredis.Redis,
        namespace: str,
        *,
        max_count: int,
        max_bytes: int,
        visibility_seconds: float,
        max_waiters: int,
        max_wait_seconds: float,
    ) -> None:
        self._redis = redis
        self._namespace = namespace
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.visibility_seconds = visibility_seconds
        self._deliver = ScriptBatcher(redis, redis.register_script(_DELIVER))
        # (Replies undecoded: a poll answers with the stored bodies as they are, entry_bytes.)
        self._poll = ScriptBatcher(redis, redis.register_script(_POLL), decode=False)
        # Long-polls (at most ``max_wait_seconds`` each) block on connections of their
        # own, so they never starve the pool the rest of the gateway uses and are not cut
        # by its command timeout; at most ``max_waiters`` wait at once.
        self._max_wait = max_wait_seconds
        self._blocking = blocking_client(redis, max_wait_seconds, max_waiters)
        # Each blocking read, and the future its long-poll waits on: set when the read
        # ends, or by ``wake_all`` (a cancelled read may not end at once, see there).
        self._waiting: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        self._woken = False  # wake_all was called: no long-poll waits any more

    def _keys(self, owner: str) -> list[str]:
        return list(_inbox_keys(self._namespace, owner))

    async def exists(self, owner: str) -> bool:
        """Whether anything was ever delivered to ``owner``'s inbox."""
        return bool(await self._redis.exists(self._keys(owner)[1]))

    async def put_many(
        self, owner: str, messages: Sequence[tuple[str, str | None]]
    ) -> list[tuple[str, str]]:
        """Store messages (``inbox_body`` each, with its outbox journal id) in order, one
        script call per ``PUT_BATCH_BYTES`` of them.

        Per message ``("ok", inbox id)``, ``("dup", journal id)`` (already stored), or
        ``("full", why)``, which ends the list: nothing after it is stored, so order holds.
        """
        out: list[tuple[str, str]] = []
        args: list[Any] = []
        size = 0
        for i, (body, journal_id) in enumerate(messages):
            data = body.encode()  # sent as these bytes: encoded once, not again to send
            args += [journal_id or "", data]
            size += len(data)
            if size >= PUT_BATCH_BYTES or i == len(messages) - 1:
                replies = await self._deliver(
                    keys=self._keys(owner), args=[self.max_count, self.max_bytes, *args]
                )
                for raw in replies:  # the entry's id, or status:value, per message
                    reply = _text(raw)
                    if ":" not in reply:
                        out.append(("ok", reply))
                        continue
                    status, _, value = reply.partition(":")
                    if status == "full":
                        out.append(("full", f"inbox of {owner} is full: {value}; the "
                                    "agent is not reading or acknowledging it"))
                        return out
                    out.append((status, value))
                args, size = [], 0
        return out

    async def take(
        self,
        owner: str,
        limit: int,
        wait_seconds: float,
        *,
        ack: str | None = None,
        give_up: Callable[[], bool] = lambda: False,
    ) -> list[bytes]:
        """Acknowledge up to ``ack``, then return up to ``limit`` messages not in flight
        (``entry_bytes`` each: JSON in UTF-8), waiting up to ``wait_seconds`` (in Redis)
        for a first one.

        After a wait, nothing is taken once ``give_up()`` is true (the reader went away),
        so its messages stay visible to the next poll."""
        keys = self._keys(owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while True:
            rows, after, invisible = await self._poll(
                keys=keys,
                args=[round(time.time(), 3), self.visibility_seconds, limit, ack or ""],
            )
            ack = None
            if rows:
                return [entry_bytes(rows[i], rows[i + 1]) for i in range(0, len(rows), 2)]
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            if float(invisible) > 0:
                remaining = min(remaining, float(invisible) + 0.01)
            woke = await self._wait(keys[0], _text(after), remaining)
            if give_up() or self._woken or (not woke and deadline - loop.time() <= 0):
                return []

    async def _wait(self, stream: str, after: str, seconds: float) -> bool:
        """Block in Redis until ``stream`` has an entry after ``after``; False on timeout
        or once ``wake_all`` was called."""
        if self._woken:
            return False
        seconds = min(seconds, self._max_wait)  # the blocking connections' read bound
        task = asyncio.ensure_future(self._read(stream, after, max(1, int(seconds * 1000))))
        woken = asyncio.get_running_loop().create_future()
        task.add_done_callback(functools.partial(_read_ended, woken))
        self._waiting[task] = woken
        try:
            await woken
        finally:
            del self._waiting[task]
            if not task.done():
                task.cancel()  # woken, or this poll was cancelled: the read is not needed
        if not task.done() or task.cancelled():
            return False  # woken by a stop (the read's cancellation may still be on its way)
        try:
            return bool(task.result())
        except RedisError:
            return False

    async def _read(self, stream: str, after: str, block_ms: int) -> Any:
        # A coroutine of its own: redis-py's xread makes its command's coroutine when
        # called, which a task cancelled before it starts (a stop) would leave never
        # awaited, with a RuntimeWarning.
        return await self._blocking.xread({stream: after}, count=1, block=block_ms)

    def wake_all(self) -> None:
        """End every waiting long-poll now, and let none wait from now on (stopping).

        The polls' futures are set here, not left to their reads' cancellation: a read
        cancelled while redis-py opens its connection can swallow the cancellation and
        go on blocking (seen about once in a hundred stops), and its poll would then
        wait for the read's block to end. Such a read ends when ``close`` closes the
        connections."""
        self._woken = True
        for task, woken in list(self._waiting.items()):
            task.cancel()
            if not woken.done():
                woken.set_result(None)

    async def close(self) -> None:
        """Close the long-poll connections."""
        self.wake_all()
        await self._blocking.aclose()


def _read_ended(woken: asyncio.Future[None], task: asyncio.Task[Any]) -> None:
    """Wake the read's long-poll, if still waiting; retrieve an error of a read whose
    poll is gone, so none is logged as never retrieved (its poll ended empty)."""
    if not task.cancelled():
        task.exception()
    if not woken.done():
        woken.set_result(None)


def _body(raw: Any) -> str:
    if not isinstance(raw, str | bytes):  # the script's false: no body field
        raise ValueError("inbox entry without a body")
    return _text(raw)

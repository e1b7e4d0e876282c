"""The conversation store: state machine, history, deadlines and queries in Redis.

Every transition runs as one Lua script (one EVALSHA round trip), so a step is
atomic across gateway replicas: Redis runs a script to the end before serving any
other command, which gives us compare-and-set on the record plus all its indices
without WATCH/MULTI retries. Key layout and trade-offs: docs/state.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial
from json import encoder
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from protocol import fingerprint
from protocol.models import (
    Broadcast,
    Clarify,
    Handoff,
    Message,
    MessageBase,
    MessageType,
    Priority,
    Request,
    Response,
)
from protocol.names import name_key
from state.batching import ScriptBatcher
from state.frozen import maker
from state.records import (
    ACTIVE,
    TERMINAL,
    ApplyResult,
    Budget,
    Conversation,
    ConvStatus,
    Event,
    Origin,
    Outcome,
)
from state.settings import StateSettings

log = logging.getLogger(f"bpgw.{__name__}")

FINGERPRINT_CHARS = 16
"""Hex characters of the message fingerprint kept per event (64 bits)."""
EXCERPT_CHARS = 60
"""Characters of message text kept in each history event."""
TASK_CHARS = 120
"""Characters of the task kept as the conversation's summary."""
APPLY_IN_FLIGHT = 1
"""Batches of applies on their way to Redis at a time (state/batching.py): the server runs
them one after the other anyway, and what arrives meanwhile makes the next batch larger,
which costs the server less Lua per message (its per-batch index writes shared by more
messages)."""
LUA_DIR = Path(__file__).parent / "lua"
"""Folder of the store's Lua scripts (common.lua holds the helpers every script shares)."""
# Fixed display order of the active statuses (oldest-first listings merge these).
_ACTIVE_ORDER = (ConvStatus.OPEN, ConvStatus.CLARIFYING, ConvStatus.HANDED_OFF)
_TERMINAL_ORDER = tuple(s for s in ConvStatus if s in TERMINAL)
MERGED_WINDOW = 10_000
"""A listing of several statuses may reach at most this far (offset + limit)."""
AGENT_SCAN_MAX = 10_000
"""An agent listing filtered by status looks at most at the agent's this many newest."""
LIST_FILTERS: dict[str, tuple[ConvStatus, ...]] = {
    "all": tuple(ConvStatus),
    "active": _ACTIVE_ORDER,
    "finished": _TERMINAL_ORDER,
    **{str(s): (s,) for s in ConvStatus},
}
"""The ``status`` filters ``list`` takes: ``all``, ``active``, ``finished`` or one status."""


def list_statuses(status: str | None) -> tuple[ConvStatus, ...]:
    """The statuses a ``status`` filter (any case) stands for (None or "" = all);
    ValueError if unknown."""
    if not status:
        return LIST_FILTERS["all"]
    found = LIST_FILTERS.get(status.strip().lower())
    if found is None:
        raise ValueError(f"unknown status {status!r}; use one of: {', '.join(LIST_FILTERS)}")
    return found
_Convs = list[Conversation]
_Orphans = list[tuple[str, list[Event]]]
_Results = list[ApplyResult]
_Call = tuple[list[str], list[str | int | float]]
_to_json = json.JSONEncoder(ensure_ascii=False).encode
"""JSON with text as UTF-8 (one encoder made once: json.dumps with options builds one a call)."""
_json_str = encoder.encode_basestring
"""One string as JSON, text as UTF-8 (what _to_json writes for a string)."""
_OPENS = frozenset(("REQUEST", "BROADCAST"))
"""The message types that open a conversation (apply.lua writes a new record for them)."""


def _cjson_num(value: float) -> str | None:
    """``value`` as the scripts' cjson writes a number (14 significant digits), or None
    when that is not plain digits (an exponent, inf, nan: left to the script)."""
    if type(value) is int:  # (a depth) all its digits, as 14 hold it: str is cheaper
        return str(value) if -10**14 < value < 10**14 else None
    out = f"{value:.14g}"
    return None if "e" in out or "n" in out else out
_STATUSES: dict[str | bytes, ConvStatus] = {
    **{s.value: s for s in ConvStatus}, **{s.value.encode(): s for s in ConvStatus}}
_OUTCOMES: dict[str | bytes, Outcome] = {
    **{o.value: o for o in Outcome}, **{o.value.encode(): o for o in Outcome}}
# Read once: ``Outcome.X`` in a function goes through EnumType's __getattr__ hook (several
# hundred instructions a read), and every message's result is told apart by these.
_APPLIED, _LOOP = Outcome.APPLIED, Outcome.LOOP
_make_result = maker(ApplyResult)
"""An ``ApplyResult`` (one per message) without its frozen ``__init__`` (state.frozen)."""


@lru_cache(maxsize=16)
def _guard_json(limit: int, window: float, cooldown: float, keys: int) -> str:
    """apply.lua's loop guard argument over ``keys`` budget keys (a gateway sends the same
    one with every message)."""
    return _to_json([limit, window, cooldown, keys])


_WORDS: dict[str, str] = {
    w: _json_str(w) for w in (*(t.value for t in MessageType), *(p.value for p in Priority))}
"""The JSON of every message type and priority (each message has one of each)."""
PAIRS_CACHED = 4096
"""(sender, recipient) pairs, and origin places, whose JSON ``_call`` remembers (each
remembered entry holds at most some kilobytes: names are at most NAME_MAX_LEN
characters, an origin's fields at most ORIGIN_MAX_BYTES, ``Origin.problem``)."""


@lru_cache(maxsize=PAIRS_CACHED)
def _pair_json(sender: str, to: str) -> tuple[str, str, str, str, str, str]:
    """JSON of (sender, recipient, their name keys, and the name keys as apply.lua's
    record holds them: "" when the key is the name's ASCII lower case). A gateway's
    messages go between few pairs of agents, so their names are encoded once."""
    fk, tk = name_key(sender), name_key(to)
    t_fk, t_tk = _json_str(fk), _json_str(tk)
    return (_json_str(sender), _json_str(to), t_fk, t_tk,
            '""' if sender.isascii() and fk == sender.lower() else t_fk,
            '""' if to.isascii() and tk == to.lower() else t_tk)


@lru_cache(maxsize=PAIRS_CACHED)
def _place_json(transport: str, channel: str, thread: str) -> tuple[str, str, str]:
    """JSON of an origin's transport, channel and thread (few places send messages)."""
    return _json_str(transport), _json_str(channel), _json_str(thread)


def _clip(text: str | None, limit: int) -> str:
    return _cut(" ".join((text or "").split()), limit)


def _cut(text: str, limit: int) -> str:
    """``text`` (white space already collapsed) cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _log_extra(request_id: str, trace_id: str | None, outcome: Outcome, typ: str
               ) -> dict[str, str | None]:
    return {"request_id": request_id, "trace_id": trace_id, "outcome": str(outcome),
            "message_type": typ}


def _message_text(msg: MessageBase, fields: dict[str, Any]) -> tuple[str, str, str]:
    """(task summary, history excerpt, priority) of one message, whose instance dict is
    ``fields`` (the hot case reads them without pydantic's attribute hook, see
    _message_call)."""
    if isinstance(msg, Request | Handoff):
        task = fields["task"]  # white space collapsed once for summary and excerpt:
        # the usual task (printable ASCII, so its only white space is " ", never two
        # together nor at either end) is its own collapse; three C scans, not a split
        # into words and a join
        if not (task.isascii() and task.isprintable() and "  " not in task
                and task[:1] != " " != task[-1:]):
            task = " ".join(task.split())
        # (the type field, a StrEnum, not isinstance: a failed isinstance asks the model's
        # __class__ through the hook, then the metaclass's ABC check)
        if fields["type"] == "HANDOFF" and fields["reason"]:
            excerpt = _clip(f"{fields['task']} ({fields['reason']})", EXCERPT_CHARS)
        else:
            excerpt = _cut(task, EXCERPT_CHARS)
        return _cut(task, TASK_CHARS), excerpt, str(fields["priority"])
    if isinstance(msg, Broadcast):
        urgency = str(msg.urgency) if msg.urgency else "normal"
        return _clip(msg.message, TASK_CHARS), _clip(msg.message, EXCERPT_CHARS), urgency
    if isinstance(msg, Clarify):
        return "", _clip(msg.question, EXCERPT_CHARS), ""
    if isinstance(msg, Response):
        status = str(msg.status) if msg.status else ""
        return "", _clip(msg.result or status, EXCERPT_CHARS), ""
    return "", "", ""


def decode_conversation(request_id: str, blob: str | bytes, *, with_history: bool = True
                        ) -> Conversation:
    """Build a Conversation from its stored form (header line, then one line per event)."""
    text = _text(blob)
    if with_history:
        # One json.loads for the header and every event: the lines are JSON arrays with
        # no raw newline inside (JSON escapes it), so joining them with commas is exact.
        rows = json.loads("[" + text.rstrip("\n").replace("\n", ",") + "]")
        h = rows[0]
        # Stored compactly (common.lua): an event's transport '' is the conversation's,
        # the first event's native id '' is the conversation's, and with header field 20
        # its time is in seconds since created (rounded back to the stored milliseconds).
        since = float(h[9]) if len(h) > 19 and h[19] == 1 else None
        history = tuple(_event(e, h[12], h[15] if i == 1 else None, since)
                        for i, e in enumerate(rows) if i)
    else:
        h = json.loads(text[:text.index("\n")])
        history = ()
    return Conversation(
        request_id=request_id,
        trace_id=h[0] or None,
        kind=h[1],
        requester=h[2],
        assignee=h[3],
        status=_STATUSES[h[4]],
        depth_current=int(h[5]),
        depth_max=int(h[6]),
        priority=h[7],
        task=h[8],
        created_at=float(h[9]),
        updated_at=float(h[10]),
        deadline=float(h[11]) or None,
        origin=Origin(transport=h[12], channel=h[13], thread=h[14] or None,
                      native_id=h[15] or None),
        history=history,
    )


def _event(e: list[Any], transport: str = "", native_id: str | None = None,
           since: float | None = None) -> Event:
    at = float(e[8]) if since is None else round(since + float(e[8]), 3)
    return Event(type=e[0], sender=e[1], to=e[2], depth_current=int(e[3]),
                 depth_max=int(e[4]), status=e[5], transport=e[6] or transport,
                 native_id=e[7] or native_id or None, at=at, excerpt=e[9])


def decode_event(line: str) -> Event:
    """Build an Event from one stored history line."""
    return _event(json.loads(line))


class Keys:
    """Key names of one namespace; all share the hash tag ``{namespace}``."""

    def __init__(self, namespace: str) -> None:
        self.prefix = "{" + namespace + "}:"
        self.due = self.prefix + "due"
        self.load = self.prefix + "ld"
        self.orphans = self.prefix + "orph"
        # Timed-out conversations whose notices are not journaled yet (score: claim time).
        self.notify = self.prefix + "notify"

    def conv(self, request_id: str) -> str:
        """The record of one conversation."""
        return f"{self.prefix}c:{request_id}"

    def orphan(self, request_id: str) -> str:
        """The orphan RESPONSEs kept for an unknown RequestId."""
        return f"{self.prefix}o:{request_id}"

    def status(self, status: str) -> str:
        """The index of conversations in one status."""
        return f"{self.prefix}s:{status}"

    def budget(self, name: str) -> str:
        """One loop-guard budget (same slot as the records: the apply script charges it)."""
        return f"{self.prefix}lg:{name}"

    def party(self, agent: str) -> str:
        """The index of every conversation one agent is a party to (by canonical key)."""
        return f"{self.prefix}p:{name_key(agent)}"


STORE_SCRIPTS = ("apply", "claim", "purge", "load", "canonical")
"""The store's scripts in LUA_DIR (lease.lua and cursor.lua there are read by their own
modules and take no helpers)."""


def _read_scripts() -> dict[str, str]:
    common = (LUA_DIR / "common.lua").read_text()
    return {name: common + "\n" + (LUA_DIR / f"{name}.lua").read_text()
            for name in STORE_SCRIPTS}


# Read once, with the code that calls them: a process never pairs this module with the
# scripts of another version (files replaced under a running process by an upgrade).
_SCRIPTS = _read_scripts()


def load_script(name: str) -> str:
    """Source of one store script: the shared helpers followed by its body."""
    return _SCRIPTS[name]


class ConversationStore:
    """Conversation state of one namespace in one Redis (or Valkey) database."""

    def __init__(self, redis: aioredis.Redis, settings: StateSettings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace)
        t = settings.timeout_for
        # Messages go through the batcher: concurrent applies become one call of the
        # batch script (one atomic step writing the indices they share once). Its head:
        # the prefix, and the timeouts and retention every message shares.
        head = [self.keys.prefix, json.dumps([t("REQUEST"), t("HANDOFF"), t("CLARIFY"),
                                              t("BROADCAST"), settings.retention_seconds])]
        self._open_timeouts = {"REQUEST": t("REQUEST"), "BROADCAST": t("BROADCAST")}
        self._apply_one = ScriptBatcher(redis, redis.register_script(load_script("apply")),
                                        merged_head=head, max_in_flight=APPLY_IN_FLIGHT)
        self._claim = redis.register_script(load_script("claim"))
        self._purge = redis.register_script(load_script("purge"))
        self._load = redis.register_script(load_script("load"))
        self._canonical = redis.register_script(load_script("canonical"))

    # -- transitions ---------------------------------------------------------------

    async def apply(self, msg: Message, origin: Origin, *, now: float | None = None,
                    fingerprint: str | None = None, journal: str = "",
                    budget: Budget | None = None) -> ApplyResult:
        """Apply one protocol message to its conversation in one round trip.

        ``fingerprint`` is ``protocol.fingerprint(msg)`` when the caller has it already.
        ``journal`` is an outbox journal entry (JSON, see ``gateway.outbox``) appended to
        the journal stream ``P ob:j`` in the same atomic step when the message is accepted
        (applied, or kept as an orphan), so state and outbound messages commit together.
        ``budget`` is checked first (after the duplicate check) and charged unless the
        message is a duplicate; a full budget refuses it with outcome ``loop``. An origin
        with a field over its bound (``Origin.problem``) is refused with outcome
        ``too_long`` and nothing is written.
        """
        problem = origin.problem()
        if problem is not None:
            return self._too_long(msg, problem)
        fields = msg.__dict__  # (no attribute hook per field: see _message_call)
        keys, args = self._message_call(msg, fields, origin, now, fingerprint, journal)
        if budget is not None:
            keys += [self.keys.budget(n) for n in budget.names]
            args[2] = _guard_json(budget.limit, budget.window, budget.cooldown,
                                  len(budget.names))
        return self._result(fields["request_id"], fields["trace_id"], str(fields["type"]),
                            await self._apply_one(keys=keys, args=args))

    async def apply_many(self, msgs: Sequence[Message], origin: Origin, *,
                         now: float | None = None) -> _Results:
        """Apply several messages in order (bulk loads): a batch of them per round trip,
        each batch one atomic step.
        """
        problem = origin.problem()
        if problem is not None:
            return [self._too_long(m, problem) for m in msgs]
        raws = await self._apply_one.many([self._message_call(m, m.__dict__, origin, now)
                                           for m in msgs])
        for raw in raws:
            if isinstance(raw, Exception):
                raise raw
        return [self._result(m.request_id, m.trace_id, str(m.type), raw)
                for m, raw in zip(msgs, raws, strict=True)]

    async def cancel(self, request_id: str, *, by: str, reason: str,
                     now: float | None = None) -> ApplyResult:
        """Cancel a conversation as an operator (from any non-terminal state)."""
        return await self.close(request_id, status=ConvStatus.CANCELLED, by=by, reason=reason,
                                now=now)

    async def close(self, request_id: str, *, status: ConvStatus, by: str, reason: str,
                    now: float | None = None, journal: str = "") -> ApplyResult:
        """End an active conversation in a terminal ``status`` on the gateway's own account.

        The history records ``by`` and ``reason`` (event CANCEL for cancelled, else CLOSE);
        ``journal`` as in ``apply``.
        """
        if status not in TERMINAL:
            raise ValueError(f"close needs a terminal status, not {status}")
        keys, args = self._call(
            "CLOSE", request_id, by, "", 0, 0, str(status), "", "",
            _clip(reason, EXCERPT_CHARS), "", Origin(transport="gateway", channel=""), None, now,
            journal,
        )
        return self._result(request_id, None, "CLOSE",
                            await self._apply_one(keys=keys, args=args))

    def _message_call(self, msg: Message, fields: dict[str, Any], origin: Origin,
                      now: float | None, fp: str | None = None, journal: str = "") -> _Call:
        # The values straight from the instance dict ``fields`` (msg.__dict__, read once by
        # the caller), as render does: a model's attribute goes through pydantic's
        # __getattr__ hook (a few hundred instructions each, __dict__ too).
        task, excerpt, priority = _message_text(msg, fields)
        status = fields.get("status")  # (a RESPONSE's: no other type has the field)
        depth = fields["depth"].__dict__
        return self._call(
            str(fields["type"]), fields["request_id"], fields["sender"], fields["to"],
            depth["current"], depth["max"], str(status) if status else "", priority, task,
            excerpt, (fp or fingerprint(msg))[:FINGERPRINT_CHARS], origin, fields["trace_id"],
            now, journal,
        )

    def _call(self, typ: str, request_id: str, sender: str, to: str, depth: int,
              max_depth: int, status: str, priority: str, task: str, excerpt: str,
              fp: str, origin: Origin, trace_id: str | None, now: float | None,
              journal: str) -> _Call:
        """One message's KEYS and ARGV in apply.lua's batch (the batcher adds the prefix):
        its conversation key; one JSON array (order documented there), its journal entry,
        no loop guard ("") and, for a message that opens a conversation, the record it
        writes (see below)."""
        at = time.time() if now is None else now
        # The array written out by hand, each string through the json module's own
        # encoder (what _to_json makes of the list, at about half the cost: once per
        # message; the record below reuses the strings). The numbers are ints, whose repr
        # is their JSON, and the time to the millisecond: ".3f" writes the digits
        # round(at, 3) stands for, without making that float and then the shortest repr
        # of it (two conversions each way).
        q = _json_str
        t_typ, t_prio = _WORDS.get(typ) or q(typ), _WORDS.get(priority) or q(priority)
        t_task, t_fp, t_nat, t_trace = (
            q(task), q(fp), q(origin.native_id or ""), q(trace_id or ""))
        t_exc = t_task if excerpt is task else q(excerpt)  # (a short task is both)
        t_from, t_to, t_fk, t_tk, k17, k18 = _pair_json(sender, to)
        t_tr, t_ch, t_th = _place_json(origin.transport, origin.channel, origin.thread or "")
        t_at = f"{at:.3f}"
        record = ""
        if typ in _OPENS:
            # The record apply.lua's encode (common.lua) writes for a new conversation,
            # byte for byte, so the script stores it instead of encoding one: the header,
            # then the first event (its transport and native id "" as the header's, its
            # time 0 since created); no parties beyond the requester and the assignee
            # ({}); a name key equal to the name's ASCII lower case as "". Left to the
            # script ("") when a number is not plain digits. The time is the double the
            # script reads from the fields' millisecond digits.
            created_at = float(t_at)
            # (Under 1e10 seconds the time has at most 14 significant digits, all that
            # cjson writes: %.14g of it is its own digits, trailing zeros and a bare point
            # dropped, without formatting the float.)
            nums = (_cjson_num(int(depth)), _cjson_num(int(max_depth)),
                    t_at.rstrip("0").rstrip(".") if -1e10 < at < 1e10
                    else _cjson_num(created_at),
                    _cjson_num(created_at + self._open_timeouts[typ]))
            if None not in nums:
                dc, dm, created, deadline = nums
                st = '"done"' if typ == "BROADCAST" else '"open"'
                record = (
                    f"[{t_trace},{t_typ},{t_from},{t_to},{st},{dc},{dm},{t_prio},{t_task},"
                    f"{created},{created},{deadline},{t_tr},{t_ch},{t_th},{t_nat},{k17},{k18},"
                    f'{{}},1]\n[{t_typ},{t_from},{t_to},{dc},{dm},{st},"","",0,{t_exc},{t_fp}]\n'
                )
                # cjson escapes / and DEL, which the json module writes as they are (no
                # other text of the record holds them).
                if "/" in record or "\x7f" in record:
                    record = record.replace("/", "\\/").replace("\x7f", "\\u007f")
        head, mid = f"[{t_typ},{q(request_id)},{t_from},{t_to},", f"{t_fp},{t_at},{t_fk},{t_tk},"
        if record:  # the script reads fields 5-6, 11-12 and 17-19 only to encode a record
            # (field 11 is then the time's text, the new conversation's index scores)
            fields = f'{head}false,false,{mid}"{t_at}",false,{t_tr},{t_ch},{t_th},{t_nat}]'
        else:
            fields = (f"{head}{int(depth)},{int(max_depth)},{mid}{q(status)},{t_prio},{t_tr},"
                      f"{t_ch},{t_th},{t_nat},{t_task},{t_exc},{t_trace}]")
        args: list[str | int | float] = [fields, journal, "", record]
        return [self.keys.conv(request_id)], args

    def _too_long(self, msg: Message, problem: str) -> ApplyResult:
        typ = str(msg.type)
        log.info("conversation %s: %s refused: %s", msg.request_id, typ, problem,
                 extra=_log_extra(msg.request_id, msg.trace_id, Outcome.TOO_LONG, typ))
        return ApplyResult(Outcome.TOO_LONG, f"{problem}; nothing was stored", None)

    def _result(self, request_id: str, trace_id: str | None, typ: str, raw: Any
                ) -> ApplyResult:
        if isinstance(raw, str | bytes):  # apply.lua's reply when a conversation opened:
            raw = ("applied", "", None, raw)  # its new record alone
        outcome = _OUTCOMES[raw[0]]
        blob = raw[3]
        conv = partial(decode_conversation, request_id, blob) if blob else None
        previous = _STATUSES[raw[2]] if raw[2] else None
        if outcome is _LOOP:
            result = ApplyResult(outcome, "", None, None, retry_after=int(raw[5]) / 1000,
                                 tripped=bool(raw[4]))
        else:
            result = _make_result(outcome=outcome, reason=_text(raw[1]), source=conv,
                                  previous_status=previous)
        if outcome is _APPLIED:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("conversation %s: %s applied", request_id, typ,
                          extra=_log_extra(request_id, trace_id, outcome, typ))
        else:
            log.info("conversation %s: %s %s: %s", request_id, typ, outcome, result.reason,
                     extra=_log_extra(request_id, trace_id, outcome, typ))
        return result

    async def claim_due(self, *, now: float | None = None, limit: int = 1000
                        ) -> list[Conversation]:
        """Mark every conversation past its deadline timed out and return them.

        Atomic: with several replicas on one Redis, each due conversation is
        claimed by exactly one caller. Costs O(due · log n).
        """
        at = round(time.time() if now is None else now, 3)
        raw = await self._claim(args=[self.keys.prefix, repr(at), limit, "no reply from "])
        pairs = [(_text(raw[i]), raw[i + 1]) for i in range(0, len(raw), 2)]
        claimed = [decode_conversation(rid, blob) for rid, blob in pairs]
        for conv in claimed:
            log.info("conversation %s timed out waiting on %s", conv.request_id,
                     conv.history[-1].to if conv.history else conv.assignee,
                     extra={"request_id": conv.request_id, "trace_id": conv.trace_id})
        return claimed

    async def owed_notices(self, *, older_than: float, now: float | None = None,
                           limit: int = 1000) -> list[Conversation]:
        """Conversations claimed as timed out more than ``older_than`` seconds ago whose
        notices were never journaled (the claiming replica died in between).

        Marks of conversations purged meanwhile are dropped.
        """
        cutoff = (time.time() if now is None else now) - older_than
        ids = [_text(i) for i in await self.redis.zrangebyscore(
            self.keys.notify, "-inf", repr(cutoff), start=0, num=limit)]
        if not ids:
            return []
        blobs = await self.redis.mget([self.keys.conv(i) for i in ids])
        gone = [i for i, blob in zip(ids, blobs, strict=True) if blob is None]
        if gone:
            await self.redis.zrem(self.keys.notify, *gone)
        return [decode_conversation(i, blob) for i, blob in zip(ids, blobs, strict=True)
                if blob is not None]

    async def purge_expired(self, *, now: float | None = None, limit: int = 1000) -> int:
        """Remove up to ``limit`` terminal conversations older than the retention."""
        cutoff = (time.time() if now is None else now) - self.settings.retention_seconds
        removed = await self._purge(
            args=[self.keys.prefix, repr(cutoff), limit, *_TERMINAL_ORDER]
        )
        return int(removed)

    # -- queries -------------------------------------------------------------------

    async def get(self, request_id: str, *, with_history: bool = True) -> Conversation | None:
        """One conversation, with its whole history unless told otherwise."""
        blob = await self.redis.get(self.keys.conv(request_id))
        if blob is None:
            return None
        return decode_conversation(request_id, blob, with_history=with_history)

    async def deadlines(self, request_ids: Sequence[str]) -> list[float | None]:
        """The deadline of each conversation (None when none runs), one ZMSCORE."""
        if not request_ids:
            return []
        scores = await self.redis.zmscore(self.keys.due, list(request_ids))
        return [None if s is None else float(s) for s in scores]

    async def counts(self) -> dict[str, int]:
        """Conversations by status, plus live ``broadcast`` records and kept ``orphan`` ids.

        ZCARDs of the indices in one MULTI (a consistent snapshot); broadcasts are the
        members of ``due`` that are not active conversations.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            for st in ConvStatus:
                pipe.zcard(self.keys.status(st))
            pipe.zcard(self.keys.due)
            pipe.zcard(self.keys.orphans)
            *by_status, due, orphans = [int(n) for n in await pipe.execute()]
        counts = {str(st): n for st, n in zip(ConvStatus, by_status, strict=True)}
        active = sum(counts[str(st)] for st in ACTIVE)
        return counts | {"broadcast": max(0, due - active), "orphan": orphans}

    async def oldest_open(self, limit: int = 10) -> list[Conversation]:
        """The ``limit`` oldest active conversations (open, clarifying, handed off)."""
        return await self._active_page(0, limit)

    async def load_by_agent(self, limit: int = 50) -> dict[str, int]:
        """Active conversations each agent owes a reply on, busiest first, by name key
        (``protocol.names.name_key``: ``mantis`` for Mantis)."""
        raw = await self._load(args=[self.keys.prefix, limit])
        return {_text(raw[i]): int(raw[i + 1]) for i in range(0, len(raw), 2)}

    async def list(self, *, status: str | None = None, agent: str | None = None,
                   offset: int = 0, limit: int = 50) -> _Convs:
        """A page of conversations (without history); see ``LIST_FILTERS``.

        ``status``: None or ``all`` = every status (active ones oldest first, then
        finished ones most recently finished first), ``active`` / ``finished`` = those
        groups in the same order, or one status. ``agent``: only conversations that agent
        is a party to (requester, addressee, any assignee, by canonical name), newest
        first; with a status too, among its ``AGENT_SCAN_MAX`` newest. Raises
        ``ValueError`` for an unknown status and for a merged page (``all``, ``active``,
        ``finished``) reaching past ``MERGED_WINDOW``.
        """
        statuses = list_statuses(status)
        if agent is not None:
            return await self._agent_page(agent, statuses, offset, limit)
        if len(statuses) == 1:
            st = statuses[0]
            key = self.keys.status(st)
            end = offset + limit - 1
            ids = await (self.redis.zrange(key, offset, end) if st in ACTIVE
                         else self.redis.zrevrange(key, offset, end))
            return await self._fetch(_text(i) for i in ids)
        if offset + limit > MERGED_WINDOW:
            raise ValueError(
                f"offset + limit may reach {MERGED_WINDOW} at most when listing several "
                "statuses; filter by one status (or an agent) to page further")
        active = [s for s in _ACTIVE_ORDER if s in statuses]
        finished = [s for s in _TERMINAL_ORDER if s in statuses]
        found = await self._merged_page(active, offset, limit, newest=False)
        if len(found) < limit and finished:
            # The finished part starts after the active ones: its offset is what is left.
            skipped = 0 if found else max(0, offset - await self._count(active))
            found += await self._merged_page(finished, skipped, limit - len(found), newest=True)
        return found

    async def _count(self, statuses: Sequence[ConvStatus]) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            for st in statuses:
                pipe.zcard(self.keys.status(st))
            return sum(int(n) for n in await pipe.execute())

    async def canonical_agent_indices(self) -> int:
        """Take over the load of an earlier layout, and move load counters kept under a
        name's spelling (``Mantis``, from records written before the names' keys were
        kept) to the name's key (``mantis``); how many names moved.

        Idempotent and O(agents owing replies); the gateway runs it once at start. The
        earlier layouts (an index per agent, see ``take_over_indices`` in common.lua) are
        turned into counters first.
        """
        names = [_text(n) for n in await self._canonical(args=[self.keys.prefix])]
        moves = [(n, key) for n in names if (key := name_key(n)) != n]
        if moves:
            await self._canonical(args=[self.keys.prefix, *(x for m in moves for x in m)])
        return len(moves)

    async def orphans(self, limit: int = 50) -> _Orphans:
        """The most recent orphan RESPONSEs (for unknown RequestIds), newest first."""
        ids = [_text(i) for i in await self.redis.zrevrange(self.keys.orphans, 0, limit - 1)]
        if not ids:
            return []
        blobs = await self.redis.mget([self.keys.orphan(i) for i in ids])
        return [(rid, [decode_event(line) for line in _text(blob).splitlines()])
                for rid, blob in zip(ids, blobs, strict=True) if blob]

    async def _active_page(self, offset: int, limit: int) -> _Convs:
        return await self._merged_page(_ACTIVE_ORDER, offset, limit, newest=False)

    async def _merged_page(self, statuses: Sequence[ConvStatus], offset: int, limit: int, *,
                           newest: bool) -> _Convs:
        # Each status index is ordered by time (created for active ones, finished for the
        # rest); merge their heads: O(offset + limit) per index, hence MERGED_WINDOW.
        if not statuses or limit <= 0:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for st in statuses:
                zrange = pipe.zrevrange if newest else pipe.zrange
                zrange(self.keys.status(st), 0, offset + limit - 1, withscores=True)
            heads: Sequence[Sequence[tuple[Any, float]]] = await pipe.execute()
        merged = sorted(((score, _text(rid)) for head in heads for rid, score in head),
                        reverse=newest)
        return await self._fetch(rid for _, rid in merged[offset:offset + limit])

    async def _agent_page(self, agent: str, statuses: Sequence[ConvStatus], offset: int,
                          limit: int) -> _Convs:
        key = self.keys.party(agent)
        if len(statuses) == len(ConvStatus):
            return await self._fetch(_text(i) for i in await self.redis.zrevrange(
                key, offset, offset + limit - 1))
        # A status filter walks this agent's newest conversations only, at most
        # AGENT_SCAN_MAX of them, so one request costs a bounded amount of work.
        wanted = set(statuses)
        found: _Convs = []
        start, chunk = 0, 500
        while len(found) < offset + limit and start < AGENT_SCAN_MAX:
            ids = [_text(i) for i in await self.redis.zrevrange(key, start, start + chunk - 1)]
            if not ids:
                break
            found += [c for c in await self._fetch(ids) if c.status in wanted]
            start += chunk
        return found[offset:offset + limit]

    async def _fetch(self, ids: Iterable[str]) -> _Convs:
        wanted = list(ids)
        if not wanted:
            return []
        blobs = await self.redis.mget([self.keys.conv(i) for i in wanted])
        return [decode_conversation(rid, blob, with_history=False)
                for rid, blob in zip(wanted, blobs, strict=True) if blob]

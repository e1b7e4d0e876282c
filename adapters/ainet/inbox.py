"""Inbound: turn new workspace files into complete, checked arrivals, exactly once.

Each poll: the ``Scanner`` names new or changed files; a file whose recorded size and
mtime still match the ``IngestLedger`` is skipped unread; the rest are read (bounded),
hashed and parsed. A file is handed out as an ``Arrival`` when it parses and is stable
(the same size and mtime on two looks, or untouched for ``settle_seconds``); a file
that stays unparseable for ``grace_seconds`` is handed out with its error (so the
bridge can answer it) and is never deleted. Files the bridge wrote itself are never
handed out: they are recorded when written (``note_written``) and anything whose FROM
is our own agent id is recorded and skipped.

Arrivals are recorded in the ledger only by ``ack`` (after the gateway committed them);
``release`` puts one back for another try. Until then it is not handed out again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.ainet.discovery import Candidate, Scanner
from adapters.ainet.fsio import read_bounded
from adapters.ainet.ledger import IngestLedger, IngestRecord
from adapters.ainet.message import DEFAULT_MAX_BYTES, AinetMessage, MessageError, parse
from adapters.ainet.names import check_agent_id
from adapters.ainet.workspace import Written, digest_of


@dataclass(frozen=True)
class Arrival:
    """One complete inbound file: its record, and the message or why it is malformed."""

    record: IngestRecord
    message: AinetMessage | None
    error: MessageError | None

    @property
    def rel(self) -> str:
        """The file's path relative to the workspace (``/``-separated)."""
        return self.record.path


@dataclass
class _Look:
    candidate: Candidate
    first_seen: float
    sig: tuple[int, int] | None = None  # (size, mtime_ns) at the previous read
    known: IngestRecord | None = None  # what was last recorded for this path


class Inbox:
    """Discovery + completeness + exactly-once bookkeeping for one agent's workspace."""

    def __init__(self, scanner: Scanner, agent_id: str, ledger: IngestLedger, *,
                 grace_seconds: float = 30.0, settle_seconds: float = 1.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_pending: int = 10_000) -> None:
        self.scanner = scanner
        self.agent_id = check_agent_id(agent_id)
        self.ledger = ledger
        self.grace_seconds = grace_seconds
        self.settle_seconds = settle_seconds
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self._pending: dict[str, _Look] = {}
        self._in_flight: dict[str, Arrival] = {}
        # Candidates found by a poll whose record lookup failed (Redis down): next poll.
        self._unlooked: list[Candidate] = []

    @property
    def pending(self) -> int:
        """Files seen but not complete yet (half-written or half-synced)."""
        return len(self._pending)

    async def poll(self) -> list[Arrival]:
        """One pass: new complete files as arrivals (each handed out once until acked)."""
        room = self.max_pending - len(self._pending)
        fresh = self._unlooked + (await asyncio.to_thread(self.scanner.poll) if room > 0 else [])
        self._unlooked = []
        now = time.time()
        try:
            records = await self.ledger.lookup([c.rel for c in fresh])
        except Exception:
            # The scanner hands a change out once: keep the candidates for the next poll.
            self._unlooked = fresh[:self.max_pending]
            raise
        for cand, rec in zip(fresh, records, strict=True):
            if rec is not None and rec.matches_stat(cand.size, cand.mtime_ns):
                self.scanner.note_handled(cand.rel, cand.size, cand.mtime_ns)
                continue
            look = self._pending.setdefault(cand.rel, _Look(cand, now))
            look.candidate = cand
            look.known = rec or look.known
        if not self._pending:
            return []
        reads = await asyncio.to_thread(self._read_all, list(self._pending.values()))
        arrivals: list[Arrival] = []
        skipped: list[IngestRecord] = []
        for look, data, sig in reads:
            ready = self._judge(look, data, sig, now, skipped)
            if ready is not None:
                arrivals.append(ready)
        for arrival in arrivals:
            self._in_flight[arrival.rel] = arrival
        if skipped:
            try:
                await self._remember(skipped)
            except Exception:
                self.release(arrivals)  # (Redis down) handed out at a later poll instead
                raise
        return arrivals

    def _read_all(self, looks: list[_Look]) -> list[tuple[_Look, bytes | None, tuple[int, int]]]:
        out = []
        for look in looks:
            data = read_bounded(look.candidate.path, self.max_bytes)
            try:
                st = look.candidate.path.stat(follow_symlinks=False)
                sig = (st.st_size, st.st_mtime_ns)
            except OSError:
                sig = (-1, -1)
            out.append((look, data, sig))
        return out

    def _judge(self, look: _Look, data: bytes | None, sig: tuple[int, int], now: float,
               skipped: list[IngestRecord]) -> Arrival | None:
        rel = look.candidate.rel
        if rel in self._in_flight:  # changed while the gateway has it: look again after
            return None
        if data is None:  # gone, or not a regular file any more
            del self._pending[rel]
            return None
        record = IngestRecord(rel, digest_of(data), sig[0], sig[1])
        if look.known is not None and look.known.digest == record.digest:
            del self._pending[rel]  # touched but unchanged: refresh the stat, don't re-ingest
            skipped.append(record)
            return None
        result = parse(data, max_bytes=self.max_bytes)
        if isinstance(result, AinetMessage) and result.is_from(self.agent_id):
            del self._pending[rel]
            skipped.append(record)
            return None
        stable = look.sig == sig or sig[1] / 1e9 < now - self.settle_seconds
        look.sig = sig
        if isinstance(result, AinetMessage) and stable:
            del self._pending[rel]
            return Arrival(record, result, None)
        if isinstance(result, MessageError) and now - look.first_seen >= self.grace_seconds:
            del self._pending[rel]
            return Arrival(record, None, result)
        return None

    async def _remember(self, records: Sequence[IngestRecord]) -> None:
        await self.ledger.record(records)
        for rec in records:
            self.scanner.note_handled(rec.path, rec.size, rec.mtime_ns)

    async def ack(self, arrivals: Sequence[Arrival]) -> None:
        """The gateway committed these: record them so no restart hands them out again."""
        await self._remember([a.record for a in arrivals])
        for arrival in arrivals:
            self._in_flight.pop(arrival.rel, None)
            look = self._pending.get(arrival.rel)
            if look is not None:
                look.known = arrival.record

    def release(self, arrivals: Sequence[Arrival]) -> None:
        """The gateway could not take these now: look at them again at the next poll."""
        now = time.time()
        for arrival in arrivals:
            self._in_flight.pop(arrival.rel, None)
            rec = arrival.record
            cand = Candidate(rec.path, self.scanner.root / rec.path, rec.size, rec.mtime_ns)
            self._pending[rec.path] = _Look(cand, now, (rec.size, rec.mtime_ns))

    async def note_written(self, written: Sequence[Written]) -> None:
        """Record files the bridge wrote, so they are never ingested."""
        await self._remember([IngestRecord(w.rel, w.digest, w.size, w.mtime_ns)
                              for w in written])


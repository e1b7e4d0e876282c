"""Inbound: hand complete workspace files to the gateway as envelopes.

A file addressed to the bridge (or to BROADCAST/TASK) whose Content holds a bot-protocol
block is that message; a plain one is mapped (``mapping``) to the message that opens or
continues its conversation. One conversation folder's files go in turn order, in rounds
(the next file of each conversation), several conversations in one batch
(``ingest_concurrency``) handed to the gateway's ``on_envelopes``. A file is marked
ingested only after the gateway committed its envelope (``on_commit``), all of a poll in
one call; an uncommitted one is released for the next poll, with the later turns of its
conversation. A file that can't be taken gets an error
reply where its writer looks (the next turn, or its session response file); it is never
deleted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from adapters.ainet.fsio import read_bounded
from adapters.ainet.inbox import Arrival, Inbox
from adapters.ainet.mapping import (
    ConvView,
    Refusal,
    Settled,
    follow_up,
    is_join,
    opening,
    status_of,
)
from adapters.ainet.message import AinetMessage
from adapters.ainet.names import UnsafeNameError, canonical, check_agent_id, check_request_id
from adapters.ainet.outbound import Plan, Writer, from_bridge
from adapters.ainet.records import BridgeRecords
from adapters.ainet.settings import AinetSettings
from adapters.ainet.workspace import (
    LayoutError,
    SessionState,
    SlotKind,
    Workspace,
    Written,
    turn_number,
)
from adapters.base import Author, Disposition, Envelope, GatewaySink
from protocol import Message, name_key, parse, render
from protocol.ids import slug

log = logging.getLogger("bpgw.adapters.ainet")

_TURN = re.compile(r"tasks/task-([^/]+)/conversation/[^/]+")
_FROM = re.compile(r"^\s*FROM\s*[:：]\s*(.+?)\s*$", re.MULTILINE)


def native_id(rel: str, digest: str) -> str:
    """A file's native id: its workspace path and content hash (a rewrite is a new one)."""
    return f"{rel}@{digest[:32]}"


def task_of(rel: str) -> str | None:
    """``X`` for a turn file ``tasks/task-X/conversation/...``; None for other paths."""
    match = _TURN.fullmatch(rel)
    return match.group(1) if match else None


def _order(arrival: Arrival) -> tuple[int, str]:
    return turn_number(arrival.rel.rpartition("/")[2]) or 0, arrival.rel


def _group(rel: str) -> str:
    """Files of one conversation folder are handled in order; others independently."""
    task = task_of(rel)
    return f"task:{task}" if task is not None else rel


class Ingest:
    """Turns the inbox's arrivals into envelopes for one ``ainet`` transport."""

    def __init__(self, transport: str, settings: AinetSettings, writer: Writer, inbox: Inbox,
                 records: BridgeRecords, sink: GatewaySink, names: Mapping[str, str],
                 note_written: Callable[[list[Written]], None]) -> None:
        self.transport = transport
        self.settings = settings
        self.writer = writer
        self.workspace: Workspace = writer.workspace
        self.inbox = inbox
        self.records = records
        self.sink = sink
        self.note_written = note_written
        self._names = names
        # Files finished in the current batch, marked ingested together (after commit).
        self._acks: list[Arrival] = []
        # Task folder -> RequestId for the current batch (fetched in one call).
        self._links: dict[str, str | None] = {}
        # Task folder -> RequestId of the folders the bridge opened (for one batch), and
        # the folder links made while building a batch (stored in one call).
        self._opened: dict[str, str | None] = {}
        self._new_links: list[tuple[str, str]] = []

    def protocol_name(self, agent_id: str) -> str:
        """The bot-protocol name of an AINET agent (``agents`` option, else its id)."""
        return self._names.get(canonical(agent_id), agent_id)

    async def run(self, arrivals: list[Arrival]) -> None:
        """Hand ``arrivals`` to the gateway: one conversation's files in order, several
        conversations at once; then mark the finished ones."""
        groups: dict[str, list[Arrival]] = {}
        for arrival in arrivals:
            groups.setdefault(_group(arrival.rel), []).append(arrival)
        tasks = sorted({t for a in arrivals if (t := task_of(a.rel)) is not None})
        try:
            self._links = dict(zip(tasks, await self.records.folders(tasks), strict=True))
        except Exception:
            self.inbox.release(arrivals)  # (Redis down) all of them again at the next poll
            raise
        queues = [sorted(items, key=_order, reverse=True) for items in groups.values()]
        size = self.settings.ingest_concurrency
        try:
            while queues:
                # A round: the next file of every conversation, in batches of ``size``.
                heads = [queue.pop() for queue in queues]
                going: list[list[Arrival]] = []
                for start in range(0, len(heads), size):
                    taken = await self._ingest_batch(heads[start:start + size])
                    for queue, ok in zip(queues[start:start + size], taken, strict=True):
                        if not ok and queue:  # the rest waits for it (turns stay in order)
                            self.inbox.release(queue)
                            queue.clear()
                        if queue:
                            going.append(queue)
                queues = going
        finally:
            self._links, self._opened = {}, {}
            await self.flush_acks()

    def _done(self, arrival: Arrival) -> None:
        """``arrival`` is committed (or needs nothing): mark it at the end of this batch."""
        self._acks.append(arrival)

    async def flush_acks(self) -> None:
        """Record the batch's finished files in the ingest record (one Redis call per 500).

        Marked only after commit; if this fails, they stay in flight here and are
        recorded at the next flush (a restart before that reads them again, and the
        gateway recognises them as processed)."""
        if self._acks:
            batch, self._acks = self._acks, []
            try:
                await self.inbox.ack(batch)
            except Exception:
                self._acks = batch + self._acks
                raise

    async def _ingest_batch(self, batch: list[Arrival]) -> list[bool]:
        """Build the envelopes of ``batch`` (files of distinct conversations) and hand
        them to the gateway in one call; for each file, whether it is taken (committed,
        or needing nothing) rather than released for the next poll."""
        need = [t for a in batch if (t := task_of(a.rel)) is not None
                and self._links.get(t) is None]
        self._opened = await asyncio.to_thread(_opened_all, self.workspace, need) if need else {}
        envelopes: list[Envelope | BaseException | None] = list(await asyncio.gather(
            *(self._envelope(arrival) for arrival in batch), return_exceptions=True))
        links, self._new_links = self._new_links, []
        handing = [e for e in envelopes if isinstance(e, Envelope)]
        found: Iterator[Disposition] = iter([])
        try:
            if links:
                await self.records.link(links)
            if handing:  # files of different conversations (some of one agent): no order
                found = iter(await self.sink.on_envelopes(handing, ordered=False))
        except Exception as exc:  # (Redis down) none of them is taken
            envelopes = [exc if isinstance(e, Envelope) else e for e in envelopes]
        taken = []
        for arrival, envelope in zip(batch, envelopes, strict=True):
            result = next(found) if isinstance(envelope, Envelope) else envelope
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # (a cancel)
                log.warning("ainet transport %s: %s not ingested yet: %s", self.transport,
                            arrival.rel, result, exc_info=not isinstance(result, OSError))
                ok = False
            else:
                ok = result is None or result.committed
            if not ok:
                self.inbox.release([arrival])
            taken.append(ok)
        return taken

    # -- one file -----------------------------------------------------------------------

    def _for_me(self, msg: AinetMessage) -> bool:
        return msg.to in ("BROADCAST", "TASK") or canonical(msg.to) == canonical(
            self.workspace.agent_id)

    async def _envelope(self, arrival: Arrival) -> Envelope | None:
        """The envelope ``arrival`` becomes; None when it needs none (done with here)."""
        msg = arrival.message
        if msg is None:
            await self._reply_error(arrival, None, f"it is not an AINET message ({arrival.error})")
            self._done(arrival)
            return None
        if not self._for_me(msg):
            self._done(arrival)  # between other agents: not the bridge's business
            return None
        sender = self.protocol_name(msg.sender)
        await self.records.note_peers([(sender, msg.sender)])
        if "#" in msg.sender:
            await self._reply_error(arrival, msg, "agent ids containing '#' can't be given an "
                                    "address in the gateway; use another id")
            self._done(arrival)
            return None
        if is_join(msg) and task_of(arrival.rel) is None:
            self._done(arrival)  # presence only (docs/ainet.md)
            return None
        text = msg.content
        if not parse(text).found_block:
            built = await self._plain(arrival, msg, sender)
            if isinstance(built, Refusal | Settled):
                if isinstance(built, Refusal):
                    await self._reply_error(arrival, msg, built.reason)
                self._done(arrival)
                return None
            text = render(built)
        answered = arrival.rel.endswith("_response.txt") and task_of(arrival.rel) is None

        async def committed(_: Disposition) -> None:
            self._done(arrival)
            if answered:
                # The requester read the reply: session/status.txt DONE -> IDLE.
                await asyncio.to_thread(self.writer.settle_session, SessionState.IDLE)

        return Envelope(
            transport=self.transport, channel=msg.sender,
            author=Author(msg.sender, sender, is_bot=True), text=text,
            native_id=native_id(arrival.rel, arrival.record.digest), on_commit=committed)

    def _fresh_ids(self, arrival: Arrival, sender: str) -> tuple[str, str]:
        """RequestId and TraceId for a conversation a plain file opens: derived from the
        file, so reading it again after a crash builds the very same message."""
        seed = hashlib.sha256(f"{arrival.rel}\n{arrival.record.digest}".encode()).hexdigest()
        return f"{slug(sender)}-{seed[:12]}", seed[12:44]

    async def _plain(self, arrival: Arrival, msg: AinetMessage, sender: str
                     ) -> Message | Refusal | Settled:
        request_id, trace_id = self._fresh_ids(arrival, sender)
        task = task_of(arrival.rel)
        if task is not None:
            linked = self._links.get(task) or self._opened.get(task)
            conv = None if linked is None else await self._conversation(linked)
        else:
            conv = await self._session_conversation(arrival.rel, msg, sender)
        if conv is not None:
            built = follow_up(msg, sender, conv, fresh_id=request_id)
        else:
            built = opening(msg, sender, self.settings.default_recipient,
                            request_id=request_id, trace_id=trace_id)
        if (not isinstance(built, Refusal | Settled) and task is not None
                and (conv is None or built.request_id != conv.request_id)):
            self._new_links.append((task, built.request_id))  # (stored before it is handed on)
            self._links[task] = built.request_id
        return built

    async def _conversation(self, request_id: str) -> ConvView | None:
        try:
            check_request_id(request_id)
        except UnsafeNameError:
            return None
        found = await self.sink.conversation(request_id)
        return None if found is None else ConvView.from_dict(found)

    async def _session_conversation(self, rel: str, msg: AinetMessage, sender: str
                                    ) -> ConvView | None:
        """The conversation a session file from ``sender`` answers: the one in the
        bridge's own request/response slot to it that waits on it, or (for a response
        file) the bridge's broadcast."""
        writer = self.writer
        kinds = [SlotKind.REQUEST, SlotKind.RESPONSE]
        if rel.endswith("_response.txt"):
            kinds.append(SlotKind.BROADCAST)
        for kind in kinds:
            to = "BROADCAST" if kind is SlotKind.BROADCAST else msg.sender
            own = await asyncio.to_thread(writer.own_slot, to, kind)
            blocks = parse(own.content).messages if own is not None else []
            if not blocks:
                continue
            conv = await self._conversation(blocks[0].request_id)
            if conv is None:
                continue
            if kind is SlotKind.BROADCAST or (not conv.closed and _owes(conv, sender)):
                return conv
        return None

    async def _reply_error(self, arrival: Arrival, msg: AinetMessage | None, reason: str) -> None:
        """Answer a file the gateway can't take, in the same conversation or session."""
        writer = self.writer
        sender = msg.sender if msg is not None else await asyncio.to_thread(
            _guess_sender, self.workspace.root / arrival.rel, self.settings.max_message_bytes)
        content = (f"bpgw could not take {arrival.rel}: {reason}.\n"
                   "The file is kept as it is; write a corrected message as a new file.")
        task = task_of(arrival.rel)
        reply = from_bridge(self.workspace.agent_id, sender or "BROADCAST", content,
                            status_of(None))
        plans = [Plan((reply,), slot=SlotKind.RESPONSE, session_state=SessionState.DONE)]
        if task is not None:
            plans.insert(0, Plan((reply,), task=task))
        for plan in plans:
            try:
                self.note_written((await asyncio.to_thread(writer.write, plan)).written)
                break
            except (UnsafeNameError, LayoutError) as exc:
                log.warning("ainet transport %s: error reply for %s not written here: %s",
                            self.transport, arrival.rel, exc)
        log.info("ainet transport %s: refused %s: %s", self.transport, arrival.rel, reason)


def _owes(conv: ConvView, sender: str) -> bool:
    owner = conv.requester if conv.status == "clarifying" else conv.assignee
    return name_key(owner) == name_key(sender)


def _opened_by_bridge(workspace: Workspace, task: str) -> str | None:
    """The RequestId in ``tasks/task-<task>/config.json`` when the bridge opened it."""
    try:
        raw = read_bounded(workspace.task_folder(task) / "config.json", 64 * 1024)
        config = json.loads(raw or b"null")
    except (UnsafeNameError, ValueError, RecursionError):  # any agent may write it
        return None
    if isinstance(config, dict) and config.get("created_by") == "bpgw":
        found = config.get("request_id")
        return found if isinstance(found, str) else None
    return None


def _opened_all(workspace: Workspace, tasks: list[str]) -> dict[str, str | None]:
    """``_opened_by_bridge`` of each task folder (one worker-thread hop for a batch)."""
    return {task: _opened_by_bridge(workspace, task) for task in tasks}


def _guess_sender(path: Path, limit: int) -> str | None:
    """The FROM of a file that is not a valid message, when it names a valid agent id."""
    data = read_bounded(path, limit) or b""
    match = _FROM.search(data[:4096].decode("utf-8", "replace"))
    if match is None:
        return None
    try:
        return check_agent_id(match.group(1))
    except UnsafeNameError:
        return None

"""Transport kind ``ainet``: the gateway as one participant of a shared AINET folder.

``start`` prepares the workspace, posts the join BROADCAST and runs one loop: apply
watch hints, record the files the bridge wrote, poll the inbox, hand each complete file
to the gateway (one conversation's files in order, conversations concurrently), move
spooled session files into freed slots, wait ``poll_interval_seconds`` (or less, when a
watch event arrives). A file is marked ingested (``Inbox.ack``, once per batch) only
after the envelope's ``on_commit`` hook ran, so a restart neither misses nor repeats one;
an uncommitted one is released and tried again at the next poll.

``send`` writes each outbound message as the next turn of its conversation folder and,
for an AINET agent (or a BROADCAST), as its ``session/`` file too (see ``outbound``);
what each outbox message became is recorded (``records``) so a repeated delivery writes
nothing twice. Concurrent sends are delivered in batches (those queued while one batch is
written form the next): one Redis round trip looks up their placements, one worker-thread
hop writes their files in queue order, one round trip records them. See docs/ainet.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from adapters.ainet.discovery import Scanner
from adapters.ainet.fsio import TEMP_PREFIX, TEMP_SUFFIX
from adapters.ainet.identity import load_or_create_agent_id
from adapters.ainet.inbox import Inbox
from adapters.ainet.ingest import Ingest, native_id, task_of
from adapters.ainet.ledger import RedisIngestLedger
from adapters.ainet.mapping import closes, slot_kind, status_of
from adapters.ainet.message import AinetMessage, AinetStatus
from adapters.ainet.message import render as render_file
from adapters.ainet.names import UnsafeNameError, canonical, check_agent_id, check_request_id
from adapters.ainet.outbound import Outcome, Plan, Writer, from_bridge
from adapters.ainet.records import BridgeRecords
from adapters.ainet.settings import AinetSettings
from adapters.ainet.watch import Watcher
from adapters.ainet.workspace import (
    LayoutError,
    SessionState,
    SlotKind,
    Workspace,
    Written,
)
from adapters.base import (
    Adapter,
    Address,
    Capabilities,
    ConfigError,
    DeliveryError,
    GatewaySink,
    HealthState,
    Outbound,
    OutboundKind,
    OwnedName,
    Probe,
    Receipt,
)
from adapters.delivery import through_cancel
from adapters.options import load_options
from protocol import Message, MessageBase, parse

log = logging.getLogger("bpgw.adapters.ainet")

# Room left in a file for the header lines around the content.
_HEADER_ROOM = 1024
# The session copy of a message adds its TYPE line.
_TYPE_LINE_ROOM = 32
# How long a cancelled send waits for files already being written to be recorded.
_RECORD_GRACE_SECONDS = 5.0
# Most sends written in one worker-thread hop (and recorded in one round trip).
_BATCH_MAX = 64
JOIN_TEXT = "AI Agent {id} has joined AINET(AI-Net) collaboration network."


def _peer(channel: str) -> str | None:
    """The AINET agent id an address names, or None (a mirror channel)."""
    try:
        return check_agent_id(channel)
    except UnsafeNameError:
        return None


class AinetAdapter(Adapter):
    """One AINET workspace as a transport (``[transports.NAME] kind = "ainet"``)."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings = s = load_options(AinetSettings, name, options)
        self.capabilities = Capabilities(
            max_message_length=max(1024, s.max_message_bytes // 4 - _HEADER_ROOM),
            # The inbox never hands out a file the bridge wrote (FROM is its id, or the
            # content hash is the one it recorded): no echo markers, no echo look-ups.
            echoes_own_posts=False,
        )
        self._names: dict[str, str] = {canonical(i): n for i, n in s.agents.items()}
        self._redis: Any = None
        self._namespace = ""
        self._sink: GatewaySink | None = None
        self.agent_id: str | None = None
        self._workspace: Workspace | None = None
        self._writer: Writer | None = None
        self._inbox: Inbox | None = None
        self._records: BridgeRecords | None = None
        self._watcher: Watcher | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._hints: list[str] = []
        self._written: list[Written] = []
        self._spooled = 0
        self._ingest: Ingest | None = None
        self._broadcast_lock = asyncio.Lock()
        self._jobs: list[_Job] = []
        self._drainer: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def use_redis(self, redis: Any, namespace: str) -> None:
        """The ingest record, conversation folders and deliveries live in ``redis``."""
        self._redis = redis
        self._namespace = namespace

    @property
    def workspace(self) -> Workspace:
        """The workspace (after ``start``)."""
        if self._workspace is None:
            raise RuntimeError(f"ainet transport {self.name} is not running")
        return self._workspace

    @property
    def location(self) -> str:
        """Where agents find this transport: the workspace folder and the bridge's id."""
        return f"AINET workspace {self.workspace.root} (as {self.agent_id})"

    async def start(self, sink: GatewaySink) -> None:
        """Prepare the workspace, join, and begin watching/polling it."""
        if self._loop_task is not None:
            raise RuntimeError(f"ainet transport {self.name} is already running")
        if self._redis is None:
            raise RuntimeError(f"ainet transport {self.name} needs Redis (use_redis) first")
        s = self.settings
        root = s.workspace.expanduser().absolute()
        if s.create_workspace:
            await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
        if not root.is_dir():
            self.set_health(HealthState.DOWN, f"workspace {root} is not a folder")
            raise ConfigError(f"transports.{self.name}.workspace: {root} is not a folder; "
                              "mount or create it, or set create_workspace = true")
        agent_id = s.agent_id
        if agent_id is None:
            agent_id = await asyncio.to_thread(load_or_create_agent_id,
                                               s.state_dir / "agent-id", s.agent_name)
        self.agent_id = agent_id
        ws = Workspace(root, agent_id, state_dir=s.state_dir, max_turns=s.max_turns,
                       max_spool=s.max_spool_per_slot, max_message_bytes=s.max_message_bytes)
        ws.task_hint = _request_id_in
        await asyncio.to_thread(ws.prepare)
        self._workspace, self._writer, self._sink = ws, Writer(ws), sink
        scanner = Scanner(ws.root, hot_seconds=s.hot_seconds,
                          cold_per_poll=s.cold_checks_per_poll, max_items=s.max_tracked_items)
        ledger = RedisIngestLedger(self._redis, self._namespace, self.name,
                                   max_entries=s.ingest_record_max)
        self._inbox = Inbox(scanner, agent_id, ledger, grace_seconds=s.grace_period_seconds,
                            settle_seconds=s.settle_seconds, max_bytes=s.max_message_bytes,
                            max_pending=s.max_pending_files)
        self._records = BridgeRecords(self._redis, self._namespace, self.name,
                                      conversations_max=s.conversation_record_max,
                                      deliveries_max=s.delivery_record_max)
        self._ingest = Ingest(self.name, s, self._writer, self._inbox, self._records, sink,
                              self._names, self._written.extend)
        self._written += await asyncio.to_thread(self._join)
        if s.discovery == "watch":
            self._watcher = Watcher(ws.root, self._on_paths)
            self._watcher.start()
        self._stopping = False
        self._loop_task = asyncio.create_task(self._run(), name=f"ainet:{self.name}")
        self._set_up()
        log.info("ainet transport %s: %s in %s", self.name, self.agent_id, ws.root)

    def _join(self) -> list[Written]:
        """Post the join BROADCAST, unless the bridge's own broadcast is still in its slot
        (it joined before under the same stable id, or announced something since)."""
        ws = self.workspace
        if ws.own_slot("BROADCAST", SlotKind.BROADCAST) is not None:
            return []
        join = from_bridge(ws.agent_id, "BROADCAST", JOIN_TEXT.format(id=ws.agent_id),
                           AinetStatus.PENDING, type_line=True)
        assert self._writer is not None
        outcome = self._writer.write(Plan((join,), slot=SlotKind.BROADCAST,
                                          session_state=SessionState.PENDING))
        return outcome.written

    async def stop(self) -> None:
        """Stop watching and polling; safe to call twice."""
        task, self._loop_task = self._loop_task, None
        if task is not None:
            # The flag as well as the cancel: on 3.11 a library's wait_for (redis-py's
            # socket writes) now and then drops a cancel; the loop then ends after its poll.
            self._stopping = True
            self._wake.set()
            task.cancel()
            await asyncio.wait([task])  # (a cancel of the caller itself still propagates)
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        if self._drainer is not None:  # sends being written finish (they can't be stopped)
            await asyncio.wait([self._drainer], timeout=_RECORD_GRACE_SECONDS)
        if self._inbox is not None and self._written:
            with contextlib.suppress(Exception):  # only saves a re-read after restart
                await self._inbox.note_written(self._flush_written())
        if self._workspace is not None:
            self._workspace.close()
        self._writer = self._ingest = None  # sends now fail; the workspace stays readable
        self.set_health(HealthState.DOWN, "stopped")

    def owned_names(self) -> Sequence[OwnedName]:
        """Each listed AINET agent: identity and address ``<transport>:<agent id>``."""
        return [OwnedName(name, f"{self.name}:{agent_id}", Address(self.name, agent_id),
                          f"transports.{self.name}.agents.{agent_id}")
                for agent_id, name in self.settings.agents.items()]

    def _set_up(self) -> None:
        mode = "watching" if self._watcher is not None and self._watcher.active else "polling"
        pending = self._inbox.pending if self._inbox is not None else 0
        extra = "".join((f"; {pending} incomplete file(s)" if pending else "",
                         f"; {self._spooled} session file(s) spooled" if self._spooled else ""))
        self.set_health(HealthState.UP,
                        f"{mode} {self.workspace.root} as {self.agent_id}{extra}")

    async def probe(self) -> Sequence[Probe]:
        """The workspace and the state folder are writable (a probe file written and
        removed in each); change events are available in watch mode."""
        s = self.settings
        root = s.workspace.expanduser()
        found = [
            await asyncio.to_thread(_probe_folder, f"transport {self.name}: workspace", root,
                                    s.create_workspace),
            await asyncio.to_thread(_probe_folder, f"transport {self.name}: state folder",
                                    s.state_dir, True),
        ]
        if s.discovery == "watch":
            try:
                import watchfiles  # noqa: F401
                found.append(Probe(f"transport {self.name}: change events", True,
                                   "watchfiles (inotify) plus polling"))
            except ImportError:
                found.append(Probe(f"transport {self.name}: change events", False,
                                   "watchfiles is not installed; the folder would be polled",
                                   "pip install 'bpgw[ainet]', or set discovery = \"poll\""))
        return found

    # -- the loop ----------------------------------------------------------------------

    def _on_paths(self, paths: Iterable[str]) -> None:
        """Watcher callback (on the loop): remember the hint and poll soon."""
        if len(self._hints) < self.settings.max_pending_files:
            self._hints.extend(paths)
        self._wake.set()

    def _flush_written(self) -> list[Written]:
        batch = list(self._written)
        self._written.clear()  # (the same list: Ingest appends to it)
        return batch

    async def _run(self) -> None:
        interval = self.settings.poll_interval_seconds
        while not self._stopping:
            try:
                await self.poll_once()
                self._set_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a Redis or disk outage: report it and keep trying
                log.warning("ainet transport %s: poll failed: %s", self.name, exc)
                self.set_health(HealthState.DEGRADED, f"poll failed: {exc}")
            # Not wait_for: on 3.11 it drops a cancel that lands in the same loop turn as
            # the wake-up, and the loop would outlive stop() polling forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()

    async def poll_once(self) -> int:
        """One pass: ingest complete new files, move spooled ones; returns files ingested."""
        inbox, writer, ingest = self._inbox, self._writer, self._ingest
        if inbox is None or writer is None or ingest is None:
            raise RuntimeError(f"ainet transport {self.name} is not running")
        if self._hints:
            hints, self._hints = self._hints, []
            inbox.scanner.mark_dirty(hints)
        if self._written:
            await inbox.note_written(self._flush_written())
        await ingest.flush_acks()  # (left from a batch whose flush failed)
        arrivals = await inbox.poll()
        if arrivals:
            await ingest.run(arrivals)
        placed, self._spooled = await asyncio.to_thread(_pump, writer)
        self._written += placed
        return len(arrivals)

    # -- outbound ----------------------------------------------------------------------

    async def send(self, message: Outbound) -> Receipt:
        """Write ``message`` into the workspace (see the module docstring)."""
        writer, records = self._writer, self._records
        if writer is None or records is None:
            raise DeliveryError(f"ainet transport {self.name} is not running", retry_after=1.0)
        proto = _protocol_message(message)
        try:
            if proto is not None and proto.is_broadcast:
                if await records.is_peer(proto.sender):
                    return Receipt(())  # it was written in this folder: its agents saw it
                async with self._broadcast_lock:
                    return await self._deliver(message, proto, None)
            peer = _peer(message.address.channel)
            if peer is None and message.recipient is not None:
                # Meant for one agent, but the address names no AINET agent id: config error.
                raise DeliveryError(f"{message.address} does not name an AINET agent id "
                                    "(<device>/<name>)", code="bad_address")
            return await self._deliver(message, proto, peer)
        except RedisError as exc:  # the delivery record is unreachable: try again later
            raise DeliveryError(f"the bridge's records are unreachable: {exc}",
                                retry_after=1.0) from None

    async def _deliver(self, message: Outbound, proto: Message | None, peer: str | None
                       ) -> Receipt:
        """Queue the delivery for the next batch and wait for its receipt."""
        job = _Job(message, proto, peer, asyncio.get_running_loop().create_future())
        self._jobs.append(job)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=f"ainet-send:{self.name}")
        # A thread can't be stopped: the files may be written already. Wait for them to be
        # recorded before giving up (a stopping outbox cancels its sends), or the delivery
        # repeated after a restart writes the same turn a second time.
        return await through_cancel(job.done, grace=_RECORD_GRACE_SECONDS)

    async def _drain(self) -> None:
        """Deliver queued sends a batch at a time (the sends queued while a batch is being
        written form the next): one Redis round trip for their placements, one worker
        thread hop for their files, one round trip to record them."""
        while self._jobs:
            batch, self._jobs = self._jobs[:_BATCH_MAX], self._jobs[_BATCH_MAX:]
            error: Exception
            try:
                await self._deliver_batch(batch)
                continue
            except RedisError as exc:  # the records are unreachable: try again later
                error = DeliveryError(f"the bridge's records are unreachable: {exc}",
                                      retry_after=1.0)
            except Exception as exc:  # (every failure is the jobs', never the drainer's)
                error = exc
            for job in batch:
                if not job.done.done():
                    job.done.set_exception(error)

    async def _deliver_batch(self, batch: Sequence[_Job]) -> None:
        writer, records = self._writer, self._records
        if writer is None or records is None:
            raise DeliveryError(f"ainet transport {self.name} is not running", retry_after=1.0)
        keyed = [(job, _request_id(job), _delivery_keys(job)) for job in batch]
        found = await records.placements([(rid, list(keys.values())) for _, rid, keys in keyed])
        work: list[tuple[_Job, Plan, dict[str, str], dict[str, str | None]]] = []
        for (job, request_id, keys), (linked, seen) in zip(keyed, found, strict=True):
            done = dict(zip(keys, seen, strict=True))
            try:
                plan = self._plan(job, writer, request_id, keys, linked, done)
            except DeliveryError as exc:
                job.done.set_exception(exc)
                continue
            work.append((job, plan, keys, done))
        results = await asyncio.to_thread(_write_plans, writer, [w[1] for w in work])
        marks: list[tuple[str, str]] = []
        written: list[tuple[_Job, Outcome, dict[str, str | None]]] = []
        for (job, plan, keys, done), result in zip(work, results, strict=True):
            if isinstance(result, BaseException):
                job.done.set_exception(_write_error(result, job.message))
                continue
            self._written += result.written
            marks += _marks(plan, keys, result)
            written.append((job, result, done))
        await records.mark_delivered(marks)
        for job, outcome, done in written:
            log.debug("ainet transport %s: wrote %s", self.name,
                      [w.rel for w in (*outcome.turns, *outcome.session)],
                      extra={"request_id": job.message.request_id,
                             "trace_id": job.message.trace_id})
            if not job.done.done():
                job.done.set_result(_receipt(outcome, done))

    def _plan(self, job: _Job, writer: Writer, request_id: str | None, keys: dict[str, str],
              linked: str | None, done: Mapping[str, str | None]) -> Plan:
        """The files ``job`` becomes, minus what an earlier try of it wrote already
        (``keys`` loses the delivery keys with nothing to write). Raises ``DeliveryError``
        (``too_large``) for a block no file can hold."""
        message, proto, peer = job.message, job.proto, job.peer
        broadcast = proto is not None and proto.is_broadcast
        to = "BROADCAST" if broadcast else peer or _peer(proto.to if proto else "") or "BROADCAST"
        task, reply_session = _placement(message, request_id, linked)
        slot: SlotKind | None = None
        if broadcast or peer is not None:
            slot = SlotKind.RESPONSE if proto is None else slot_kind(proto)
        if reply_session and slot is None:
            slot = SlotKind.RESPONSE
        if task is None:
            keys.pop("turn", None)
        if slot is None:
            keys.pop("slot", None)
        if done.get("turn") is not None:
            task = None
        if done.get("slot") is not None:
            slot = None
        status = status_of(proto)
        chunks = self.split_text(message.text)
        plan = Plan(
            tuple(from_bridge(writer.workspace.agent_id, to, chunk, status) for chunk in chunks),
            task=task,
            task_config=_task_config(request_id, message, proto),
            task_is_default=task == request_id,
            final=closes(proto),
            slot=slot,
            session_state=None if slot is None else (
                SessionState.DONE if slot is SlotKind.RESPONSE else SessionState.PENDING),
        )
        limit = self.settings.max_message_bytes - _TYPE_LINE_ROOM
        fits = (limit - _HEADER_ROOM) // 4  # content this short always fits (UTF-8: 4 B/char)
        if any(len(m.content) > fits
               and len(render_file(m).encode("utf-8", "surrogatepass")) > limit
               for m in plan.messages):
            # One block longer than a file may be: it never fits, and nothing is written.
            raise DeliveryError(f"can't write to {message.address}: a block of it is over "
                                f"max_message_bytes ({self.settings.max_message_bytes})",
                                code="too_large")
        return plan


@dataclass
class _Job:
    """One queued send: the message, what it is, and where its receipt goes."""

    message: Outbound
    proto: Message | None
    peer: str | None
    done: asyncio.Future[Receipt]


def _request_id(job: _Job) -> str | None:
    return job.message.request_id or (job.proto.request_id if job.proto else None)


def _delivery_keys(job: _Job) -> dict[str, str]:
    """The delivery record keys of ``job``: its turn, and its session slot per agent."""
    message, proto = job.message, job.proto
    if message.id is None:
        return {}
    broadcast = proto is not None and proto.is_broadcast
    to = "BROADCAST" if broadcast else canonical(
        job.peer or _peer(proto.to if proto else "") or "BROADCAST")
    return {"turn": f"{message.id}:turn", "slot": f"{message.id}:slot:{to}"}


def _write_plans(writer: Writer, plans: Sequence[Plan]) -> list[Outcome | Exception]:
    """Write each plan in turn (in a worker thread); a failure is that plan's alone."""
    results: list[Outcome | Exception] = []
    for plan in plans:
        try:
            results.append(writer.write(plan))
        except (LayoutError, UnsafeNameError, UnicodeError, OSError) as exc:
            results.append(exc)
    return results


def _write_error(exc: BaseException, message: Outbound) -> DeliveryError:
    """The ``DeliveryError`` a failed write of ``message`` is reported as."""
    if isinstance(exc, LayoutError):
        return DeliveryError(str(exc), retry_after=5.0, code="inbox_full")
    if isinstance(exc, UnsafeNameError):
        return DeliveryError(f"can't write to {message.address}: {exc}", code="bad_address")
    if isinstance(exc, UnicodeError):  # (lone surrogates can't be written as UTF-8)
        return DeliveryError(f"the text can't be written as UTF-8: {exc}")
    return DeliveryError(f"workspace write failed: {exc}", retry_after=1.0)


def _marks(plan: Plan, keys: Mapping[str, str], outcome: Outcome) -> list[tuple[str, str]]:
    """What to record for each delivery key: the native ids written ("spooled": the
    session file waits in the spool)."""
    turns = " ".join(native_id(w.rel, w.digest) for w in outcome.turns)
    session = " ".join(native_id(w.rel, w.digest) for w in outcome.session)
    marks = []
    if "turn" in keys and plan.task is not None:
        marks.append((keys["turn"], turns))
    if "slot" in keys and plan.slot is not None:
        marks.append((keys["slot"], session or "spooled"))
    return marks


def _receipt(outcome: Outcome, done: Mapping[str, str | None]) -> Receipt:
    """The message's native ids are its conversation turns (one per chunk); the session
    file is a second copy for single-exchange agents, named only when there is no turn."""
    turns = [native_id(w.rel, w.digest) for w in outcome.turns]
    session = [native_id(w.rel, w.digest) for w in outcome.session]
    turns = turns or (done.get("turn") or "").split()
    session = [i for i in session or (done.get("slot") or "").split() if i != "spooled"]
    return Receipt(tuple(turns or session))


def _placement(message: Outbound, request_id: str | None, linked: str | None
               ) -> tuple[str | None, bool]:
    """The conversation folder key for ``message`` (None: no turn), and whether it answers
    a session file (so it goes to the session response slot). ``linked``: the folder its
    conversation lives in when that is not ``task-<RequestId>``."""
    rel = (message.reply_to or "").rpartition("@")[0]
    if message.kind is OutboundKind.NOTICE and rel:
        return task_of(rel), task_of(rel) is None
    if request_id is None:
        return None, message.kind is OutboundKind.NOTICE
    try:
        return check_request_id(linked or request_id), False
    except UnsafeNameError:
        return None, True


def _protocol_message(message: Outbound) -> Message | None:
    if message.kind is not OutboundKind.PROTOCOL:
        return None
    if isinstance(message.message, MessageBase):
        return message.message  # type: ignore[return-value]
    found = parse(message.text).messages
    return found[0] if found else None


def _request_id_in(msg: AinetMessage) -> str | None:
    """The RequestId of the bot-protocol block a message of the bridge carries (its
    conversation folder is ``task-<RequestId>`` unless recorded otherwise)."""
    found = parse(msg.content).messages
    return found[0].request_id if found else None


def _task_config(request_id: str | None, message: Outbound, proto: Message | None
                 ) -> dict[str, Any]:
    config: dict[str, Any] = {"request_id": request_id, "trace_id": message.trace_id,
                              "created_by": "bpgw"}
    if proto is not None:
        config["participants"] = [proto.sender, proto.to]
        config["type"] = str(proto.type)
    return config


def _pump(writer: Writer) -> tuple[list[Written], int]:
    placed = writer.pump()
    return placed, writer.workspace.spooled()


def _probe_folder(check: str, folder: Path, create: bool) -> Probe:
    """Write and remove a probe file in ``folder``; when it is missing and ``create`` (start
    creates it), in the nearest existing folder above it instead. Creates nothing."""
    target, note = folder, "is writable"
    if create and not folder.exists():
        target = next((p for p in folder.absolute().parents if p.exists()), Path("/"))
        note = f"will be created in {target}, which is writable"
    try:
        if not target.is_dir():
            return Probe(check, False, f"{folder} is not a folder",
                         "mount or create it (or set create_workspace = true)")
        probe = target / f"{TEMP_PREFIX}probe-{secrets.token_hex(4)}{TEMP_SUFFIX}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        return Probe(check, False, f"{target}: {exc.strerror or exc}",
                     "give the gateway's user write access to it")
    return Probe(check, True, f"{folder} {note}")

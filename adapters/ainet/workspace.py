"""The AINET workspace layout and everything the bridge writes into it (blocking calls).

::

    <workspace>/
      session/status.txt                       IDLE -> PENDING -> DONE -> IDLE
      session/<from>_to_<to>_<kind>.txt        single-exchange files (one per pair and kind)
      tasks/task-<RequestId>/config.json
      tasks/task-<RequestId>/conversation/NNN-<agent>.txt   one file per turn, never rewritten
      tasks/task-<RequestId>/{input,output}/
      tasks/task-<RequestId>/status.txt        PENDING / DONE

Conversation turns are created at the next free number with an exclusive create, so
racing writers never overwrite each other. AINET's rule alone (scan, create N+1-<me>)
lets two writers take the same *number* under different names; the bridge's own writers
(threads, processes) also hold a local lock per conversation (one of ``LOCK_STRIPES``
lock files under ``state_dir``) while they pick the number, so they never share one.

A single-exchange (session) file has one name per pair, so a second request to the same
agent would overwrite the first: the bridge never does that. It writes the file when the
name is free, replaces only its *own* earlier file once the peer has answered it, and
otherwise keeps the new one in a local spool (``state_dir/spool``, ordered, bounded)
until the slot frees (``pump_spool``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from adapters.ainet.fsio import (
    create_exclusive,
    create_first_free,
    ensure_folder,
    ensure_subfolders,
    inside,
    read_bounded,
    write_atomic,
)
from adapters.ainet.message import AinetMessage, parse, render
from adapters.ainet.names import check_agent_id, check_request_id, file_part

SESSION = "session"
TASKS = "tasks"
CONVERSATION = "conversation"
STATUS_FILE = "status.txt"
CONFIG_FILE = "config.json"
TURN_NAME = re.compile(r"(\d{1,9})-.+\.txt")
DEFAULT_MAX_TURNS = 99_999
LOCK_STRIPES = 64
VERIFIED_MAX = 4096
# Spool file tails: plain, or carrying the message's conversation folder key.
SPOOL_PLAIN = "spooled.txt"
SPOOL_TASK = "task-"
# Rescan the folder after this many taken names in a row (a crowd of racing writers).
_RESCAN_AFTER = 16


class SessionState(StrEnum):
    """The global ``session/status.txt`` machine."""

    IDLE = "IDLE"
    PENDING = "PENDING"
    DONE = "DONE"


NEXT_STATE = {SessionState.IDLE: SessionState.PENDING, SessionState.PENDING: SessionState.DONE,
              SessionState.DONE: SessionState.IDLE}


class SlotKind(StrEnum):
    """The kind part of a single-exchange file name."""

    REQUEST = "request"
    RESPONSE = "response"
    BROADCAST = "broadcast"


class LayoutError(RuntimeError):
    """The workspace refused a write (full conversation, full spool, bad state)."""


@dataclass(frozen=True)
class Written:
    """A file the bridge wrote: where (relative, ``/``-separated), its content hash, stat."""

    rel: str
    digest: str
    size: int
    mtime_ns: int


def digest_of(data: bytes) -> str:
    """The content hash the ingest record uses (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


def turn_number(name: str) -> int | None:
    """The number of a conversation file name ``NNN-<agent>.txt``; None for other names."""
    match = TURN_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def highest_turn(folder: Path, limit: int) -> int:
    """The highest turn number in ``folder`` up to ``limit`` (0 when empty)."""
    best = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            number = turn_number(entry.name)
            if number is not None and best < number <= limit:
                best = number
    return best


def _slot_file(sender_part: str, to: str, kind: SlotKind) -> str:
    target = to if to in ("BROADCAST", "TASK") else file_part(to)
    return f"{sender_part}_to_{target}_{kind.value}.txt"


def _turn_names(folder: Path, tail: str, limit: int) -> Iterator[str]:
    """Candidate names ``NNN-tail`` from the next free number on, rescanning in a crowd."""
    number = highest_turn(folder, limit) + 1
    taken = 0
    while number <= limit:
        yield f"{number:03d}-{tail}"
        number += 1
        taken += 1
        if taken % _RESCAN_AFTER == 0:
            number = max(number, highest_turn(folder, limit) + 1)


class Workspace:
    """One AINET workspace as seen by one agent (the bridge's ``agent_id``)."""

    def __init__(self, root: Path, agent_id: str, *, state_dir: Path,
                 max_turns: int = DEFAULT_MAX_TURNS, max_spool: int = 100,
                 max_message_bytes: int = 256 * 1024) -> None:
        self.root = root.resolve()
        # Resolved like the root: folders are checked against their real path.
        state_dir = state_dir.expanduser().resolve()
        self.agent_id = check_agent_id(agent_id)
        self.me = file_part(self.agent_id)
        self.session = self.root / SESSION
        self.tasks = self.root / TASKS
        # Local (not synced) bridge state: the session spool and the turn locks.
        self.spool_dir = state_dir / "spool"
        self.lock_dir = state_dir / "locks"
        # Which conversation folder an occupied session slot's message is also in: told
        # by ``task_hint`` (the bridge reads the RequestId in the message), else by a
        # marker file in ``slot_dir`` written when the folder is another one.
        self.slot_dir = state_dir / "slots"
        self.task_hint: Callable[[AinetMessage], str | None] = lambda _msg: None
        self._slot_markers = self.slot_dir.is_dir()
        # flock excludes other processes; threads of this one share the descriptor, so
        # a thread lock per stripe excludes them.
        self._thread_locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._lock_fds: dict[int, int] = {}
        # Conversation folders already created and checked link-free (bounded), and the
        # path of each recent RequestId's task folder (bounded; only checked names).
        self._verified: set[Path] = set()
        self._task_folders: dict[str, Path] = {}
        self._root_prefix = os.path.join(self.root, "")
        self.max_turns = max_turns
        self.max_spool = max_spool
        self.max_message_bytes = max_message_bytes

    def prepare(self) -> None:
        """Create ``session/`` (with ``status.txt`` = IDLE unless present) and ``tasks/``."""
        for folder in (self.session, self.tasks, self.spool_dir, self.lock_dir):
            ensure_folder(folder)
        create_exclusive(self.session / STATUS_FILE, SessionState.IDLE.value.encode())

    def _written(self, path: Path | str, data: bytes, stat: os.stat_result) -> Written:
        # (``path`` was built from the root: its tail is the relative path)
        rel = str(path)[len(self._root_prefix):].replace(os.sep, "/")
        return Written(rel, digest_of(data), stat.st_size, stat.st_mtime_ns)

    def _encode(self, msg: AinetMessage) -> bytes:
        if not msg.is_from(self.agent_id):
            raise LayoutError(f"the bridge writes only as {self.agent_id}, not {msg.sender}")
        data = render(msg).encode("utf-8")
        if len(data) > self.max_message_bytes:
            raise LayoutError(f"message is {len(data)} bytes, over {self.max_message_bytes}")
        return data

    # -- session/status.txt ---------------------------------------------------------------

    def session_state(self) -> SessionState | None:
        """The current global state, or None when the file is missing or holds junk."""
        data = read_bounded(self.session / STATUS_FILE, 64)
        try:
            return SessionState((data or b"").decode("ascii").strip().upper())
        except (UnicodeDecodeError, ValueError):
            return None

    def advance_session(self, target: SessionState) -> list[SessionState]:
        """Move ``status.txt`` to ``target`` along IDLE -> PENDING -> DONE -> IDLE.

        Returns the states written, one atomic write each, so an agent watching the file
        only ever sees legal steps: DONE -> PENDING is written as IDLE, PENDING. A move
        that would claim DONE on the way (PENDING -> IDLE: someone's request is still
        open) writes nothing. An unreadable file is reset straight to ``target``.
        """
        current = self.session_state()
        path: list[SessionState] = []
        while current is not target:
            current = target if current is None else NEXT_STATE[current]
            if current is SessionState.DONE and target is not SessionState.DONE:
                return []
            path.append(current)
        for state in path:
            write_atomic(self.session / STATUS_FILE, state.value.encode())
        return path

    # -- session single-exchange files ----------------------------------------------------

    def slot_name(self, msg: AinetMessage, kind: SlotKind) -> str:
        """``<from>_to_<to>_<kind>.txt`` by AINET's naming rule (``/`` -> ``-``)."""
        return _slot_file(file_part(msg.sender), msg.to, kind)

    def own_slot(self, to: str, kind: SlotKind) -> AinetMessage | None:
        """The bridge's own message in its ``<me>_to_<to>_<kind>.txt`` slot, if any."""
        path = inside(self.session, _slot_file(self.me, to, kind))
        found = parse(read_bounded(path, self.max_message_bytes) or b"",
                      max_bytes=self.max_message_bytes)
        return found if isinstance(found, AinetMessage) and found.is_from(self.agent_id) else None

    def spooled(self) -> int:
        """Session files waiting in the spool for their slot to free."""
        if not self.spool_dir.is_dir():
            return 0
        return sum(len(os.listdir(self.spool_dir / slot)) for slot in os.listdir(self.spool_dir))

    def post_session(self, msg: AinetMessage, kind: SlotKind, *,
                     task: str | None = None) -> Written | None:
        """Write ``msg`` as its single-exchange file, or spool it (None) when the slot is busy.

        ``task`` names the conversation folder (``tasks/task-<task>/``) holding the same
        message: an answer there frees the slot too. Raises ``LayoutError`` when that
        slot's spool is full (the caller reports it).
        """
        data = self._encode(msg)
        name = self.slot_name(msg, kind)
        spool = inside(self.spool_dir, name)
        if task is not None and task == self.task_hint(msg):
            task = None  # the message itself tells its folder
        if task is not None:
            check_request_id(task)
        if not (spool.is_dir() and any(os.scandir(spool))):
            placed = self._place(name, data, task)
            if placed is not None:
                return placed
        ensure_folder(spool)
        if len(os.listdir(spool)) >= self.max_spool:
            raise LayoutError(f"session slot {name} has {self.max_spool} messages waiting")
        tail = SPOOL_PLAIN if task is None else f"{SPOOL_TASK}{task}.txt"
        if create_first_free(spool, data, _turn_names(spool, tail, 10**9)) is None:
            raise LayoutError(f"session slot {name}: spool numbering exhausted")
        return None

    def pump_spool(self) -> list[Written]:
        """Move every spooled message whose slot has freed into place, oldest first."""
        placed: list[Written] = []
        if not self.spool_dir.is_dir():
            return placed
        for slot in sorted(os.listdir(self.spool_dir)):
            folder = self.spool_dir / slot
            waiting = sorted(os.listdir(folder), key=lambda n: turn_number(n) or 0)
            for name in waiting:
                data = read_bounded(folder / name, self.max_message_bytes) or b""
                tail = name.partition("-")[2]
                task = tail[len(SPOOL_TASK):-4] if tail.startswith(SPOOL_TASK) else None
                done = self._place(slot, data, task)
                if done is None:
                    break
                (folder / name).unlink()
                placed.append(done)
        return placed

    def _place(self, name: str, data: bytes, task: str | None) -> Written | None:
        """Put ``data`` in slot ``name`` if it is free or holds our own answered file."""
        path = inside(self.session, name)
        if (created := create_exclusive(path, data)) is not None:
            self._note_slot_task(name, task)
            return self._written(path, data, created)
        if not self._slot_consumed(path):
            return None
        self._note_slot_task(name, task)
        return self._written(path, data, write_atomic(path, data))

    def _note_slot_task(self, name: str, task: str | None) -> None:
        """Remember (locally) which conversation folder the slot's message is also in,
        when ``task_hint`` can't tell it from the message itself."""
        if task is None:
            if self._slot_markers:
                inside(self.slot_dir, name).unlink(missing_ok=True)
            return
        marker = inside(self.slot_dir, name)
        if not self._slot_markers:
            ensure_folder(self.slot_dir)
            self._slot_markers = True
        write_atomic(marker, task.encode())

    def _answered_in_task(self, name: str, occupant: AinetMessage, peer: str | None,
                          since: int) -> bool:
        """True when the slot's conversation folder is DONE or has a newer turn from the
        addressed agent (anyone's, for a broadcast)."""
        raw = read_bounded(inside(self.slot_dir, name), 256) if self._slot_markers else None
        task = raw.decode("utf-8", "replace") if raw else self.task_hint(occupant)
        if not task:
            return False
        try:
            folder = self.task_folder(task)
        except ValueError:
            return False
        if (read_bounded(folder / STATUS_FILE, 16) or b"").strip() == b"DONE":
            return True
        try:
            entries = os.scandir(folder / CONVERSATION)
        except OSError:
            return False
        with entries:
            for entry in entries:
                number = turn_number(entry.name)
                author = entry.name.partition("-")[2][:-4]
                if (number is not None and author != self.me
                        and (peer is None or author == peer)
                        and entry.stat(follow_symlinks=False).st_mtime_ns > since):
                    return True
        return False

    def _slot_consumed(self, path: Path) -> bool:
        """True when ``path`` is our own message and the exchange has moved on since.

        Moved on: the addressed agent wrote a file to us after it (for a broadcast, anyone
        did), or a turn in the message's conversation folder after it (or that folder is
        DONE), or ``status.txt`` went back to IDLE after it (the requester read the reply).
        """
        occupant = parse(read_bounded(path, self.max_message_bytes) or b"",
                         max_bytes=self.max_message_bytes)
        if not isinstance(occupant, AinetMessage) or not occupant.is_from(self.agent_id):
            return False
        since = path.stat(follow_symlinks=False).st_mtime_ns
        status = self.session / STATUS_FILE
        if (self.session_state() is SessionState.IDLE
                and status.stat(follow_symlinks=False).st_mtime_ns > since):
            return True
        peer = None if occupant.to in ("BROADCAST", "TASK") else file_part(occupant.to)
        if self._answered_in_task(path.name, occupant, peer, since):
            return True
        suffix = f"_to_{self.me}_"
        with os.scandir(self.session) as entries:
            for entry in entries:
                sender, found, _ = entry.name.partition(suffix)
                if (found and (peer is None or sender == peer)
                        and entry.stat(follow_symlinks=False).st_mtime_ns > since):
                    return True
        return False

    # -- multi-turn conversations ---------------------------------------------------------

    def task_folder(self, request_id: str) -> Path:
        """``tasks/task-<RequestId>``, refusing a RequestId that is unsafe as a name."""
        folder = self._task_folders.get(request_id)
        if folder is None:
            folder = inside(self.tasks, "task-" + check_request_id(request_id))
            if len(self._task_folders) >= VERIFIED_MAX:
                self._task_folders.clear()
            self._task_folders[request_id] = folder
        return folder

    def open_task(self, request_id: str, config: Mapping[str, Any]) -> Path:
        """Create the task folder, its sub-folders, ``config.json`` and ``status.txt``.

        Existing files (another agent opened the task first) are kept as they are.
        """
        folder = self.task_folder(request_id)
        ensure_folder(folder)
        ensure_subfolders(folder, (CONVERSATION, "input", "output"))
        self._note_verified(folder / CONVERSATION)
        body = json.dumps(dict(config), ensure_ascii=False, indent=2, sort_keys=True)
        create_exclusive(folder / CONFIG_FILE, body.encode("utf-8"))
        create_exclusive(folder / STATUS_FILE, b"PENDING")
        return folder

    def add_turn(self, request_id: str, msg: AinetMessage) -> Written:
        """Write ``msg`` as the next free ``NNN-<agent>.txt`` of the conversation."""
        data = self._encode(msg)
        folder = self.task_folder(request_id) / CONVERSATION
        if folder not in self._verified:
            ensure_folder(folder)
            self._note_verified(folder)
        with self._turn_lock(folder):
            created = create_first_free(folder, data, _turn_names(folder, f"{self.me}.txt",
                                                                  self.max_turns))
        if created is None:
            raise LayoutError(f"conversation {request_id} has no free number up to "
                              f"{self.max_turns}")
        return self._written(os.path.join(folder, created[0]), data, created[1])

    def _note_verified(self, folder: Path) -> None:
        """``folder`` exists and was checked link-free (bounded memory)."""
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()
        self._verified.add(folder)

    @contextmanager
    def _turn_lock(self, folder: Path) -> Iterator[None]:
        """Hold the stripe's thread lock and its ``flock`` (other bridge processes)."""
        stripe = zlib.crc32(str(folder).encode()) % LOCK_STRIPES
        with self._thread_locks[stripe]:
            fd = self._lock_fds.get(stripe)
            if fd is None:
                fd = os.open(self.lock_dir / f"turn-{stripe:02d}.lock",
                             os.O_RDWR | os.O_CREAT, 0o600)
                self._lock_fds[stripe] = fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Release the lock files (safe twice)."""
        while self._lock_fds:
            os.close(self._lock_fds.popitem()[1])

    def set_task_status(self, request_id: str, status: str) -> None:
        """Write ``status.txt`` of a task (``PENDING`` or ``DONE``), atomically."""
        if status not in ("PENDING", "DONE"):
            raise LayoutError(f"task status {status!r} is not PENDING or DONE")
        write_atomic(self.task_folder(request_id) / STATUS_FILE, status.encode())

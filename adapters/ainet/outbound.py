"""What one outbound delivery writes into the workspace (blocking: run off the loop).

A ``Plan`` says which files one message becomes: the next turn of its conversation
folder (``tasks/task-<key>/conversation/``, opening the folder with ``config.json`` and
``status.txt`` first), and/or its single-exchange ``session/`` file, plus the status
changes that go with them. ``Writer.write`` carries it out and returns what was written;
a session file whose slot is busy is spooled (never overwritten, never dropped) and
written later by ``Writer.pump``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from adapters.ainet.message import AinetMessage, AinetStatus, AinetType
from adapters.ainet.workspace import SessionState, SlotKind, Workspace, Written

OPENED_MAX = 4096


def from_bridge(agent_id: str, to: str, content: str, status: AinetStatus, *,
                type_line: bool = False) -> AinetMessage:
    """A message from the bridge, timed now; turn files carry no TYPE line (v0.3
    examples; session files get it when posted)."""
    kind = {"BROADCAST": AinetType.BROADCAST, "TASK": AinetType.TASK}.get(to, AinetType.PRIVATE)
    return AinetMessage(agent_id, to, kind, datetime.now().replace(microsecond=0), content,
                        status, type_line=type_line)


@dataclass(frozen=True)
class Plan:
    """The files one delivery becomes (``messages``: one per chunk of the text)."""

    messages: tuple[AinetMessage, ...]
    # Conversation folder key (``tasks/task-<task>/``); None: no conversation turn.
    task: str | None = None
    task_config: Mapping[str, Any] = field(default_factory=dict)
    # The task folder is ``task-<RequestId of the message>``: the session file needs no
    # note of it (the RequestId in the message says it).
    task_is_default: bool = False
    # The message ends its conversation: the task's status.txt becomes DONE.
    final: bool = False
    # The single-exchange file kind; None: no session file.
    slot: SlotKind | None = None
    # Where session/status.txt moves after the session file.
    session_state: SessionState | None = None


@dataclass
class Outcome:
    """What a plan wrote: turns and session files (``spooled``: session files waiting)."""

    turns: list[Written] = field(default_factory=list)
    session: list[Written] = field(default_factory=list)
    spooled: int = 0

    @property
    def written(self) -> list[Written]:
        """Every file written."""
        return self.turns + self.session


class Writer:
    """Carries out plans on one workspace; safe to call from several threads."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self._opened: set[str] = set()
        # session/ slots and status.txt are read-modify-write: one writer at a time.
        self._session_lock = threading.Lock()

    def write(self, plan: Plan) -> Outcome:
        """Write the plan's files; raises ``LayoutError``/``UnsafeNameError``/``OSError``."""
        ws = self.workspace
        out = Outcome()
        if plan.task is not None:
            if plan.task not in self._opened:
                ws.open_task(plan.task, plan.task_config)
                if len(self._opened) >= OPENED_MAX:
                    self._opened.clear()
                self._opened.add(plan.task)
            for msg in plan.messages:
                out.turns.append(ws.add_turn(plan.task, msg))
            if plan.final:
                ws.set_task_status(plan.task, "DONE")
        if plan.slot is not None:
            with self._session_lock:
                for msg in plan.messages:
                    # Single-exchange files carry the TYPE line (the v0.3 message format).
                    placed = ws.post_session(replace(msg, type_line=True), plan.slot,
                                             task=None if plan.task_is_default else plan.task)
                    if placed is None:
                        out.spooled += 1
                    else:
                        out.session.append(placed)
                if plan.session_state is not None:
                    ws.advance_session(plan.session_state)
        return out

    def pump(self) -> list[Written]:
        """Move spooled session files whose slot has freed into place."""
        with self._session_lock:
            return self.workspace.pump_spool()

    def settle_session(self, state: SessionState) -> None:
        """Move ``session/status.txt`` towards ``state`` (legal steps only)."""
        with self._session_lock:
            self.workspace.advance_session(state)

    def own_slot(self, to: str, kind: SlotKind) -> AinetMessage | None:
        """The bridge's own message in ``session/<me>_to_<to>_<kind>.txt``, if there is one."""
        return self.workspace.own_slot(to, kind)

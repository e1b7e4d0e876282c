"""The AINET participant of ``bpgw demo``: a plain AINET agent that only reads and writes
files in the embedded workspace, by the AINET v0.3 rules (no gateway code involved).

It joins (its BROADCAST in ``session/``), then waits for a message addressed to it in a
conversation folder ``tasks/task-<id>/conversation/``, and answers with the next free
turn number (created exclusively, never overwriting) and 【Status】DONE.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from protocol import Message, MessageType, build_request

AUDITOR_ID = "Device-demo0001/Auditor"
AUDITOR = "Auditor"
_TURN = re.compile(r"(\d+)-(.+)\.txt")
_FIELD = re.compile(r"^(FROM|TO): (.*)$", re.MULTILINE)


def with_auditor(config: GatewayConfig, transport: str) -> GatewayConfig:
    """``config`` with the demo's AINET agent listed on ``transport`` as @Auditor."""
    transports = dict(config.transports)
    options = dict(transports[transport])
    options["agents"] = {**options.get("agents", {}), AUDITOR_ID: AUDITOR}
    transports[transport] = options
    return config.model_copy(update={"transports": transports})


def _converted(agent_id: str) -> str:
    return agent_id.replace("/", "-")


def _message(sender: str, to: str, content: str, status: str, type_line: str = "") -> str:
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return (f"=== Message ===\nFROM: {sender}\nTO: {to}\n{type_line}TIME: {now}\n"
            f"【Content】\n{content}\n【Status】{status}\n")


class FileAgent:
    """A plain AINET agent working directly on the workspace folder."""

    def __init__(self, workspace: Path, agent_id: str = AUDITOR_ID) -> None:
        self.root = workspace
        self.id = agent_id
        self._seen: set[Path] = set()

    def join(self) -> None:
        """Announce itself: ``session/<me>_to_BROADCAST_broadcast.txt``."""
        session = self.root / "session"
        session.mkdir(parents=True, exist_ok=True)
        content = f"AI Agent {self.id} has joined AINET(AI-Net) collaboration network."
        (session / f"{_converted(self.id)}_to_BROADCAST_broadcast.txt").write_text(
            _message(self.id, "BROADCAST", content, "PENDING", "TYPE: BROADCAST\n"), "utf-8")

    def _incoming(self) -> tuple[Path, str] | None:
        """The first unseen conversation turn addressed to this agent, with its sender."""
        for path in sorted(self.root.glob("tasks/task-*/conversation/*.txt")):
            if path in self._seen or not _TURN.fullmatch(path.name):
                continue
            fields = dict(_FIELD.findall(path.read_text(encoding="utf-8")))
            if fields.get("TO") == self.id and fields.get("FROM") != self.id:
                self._seen.add(path)
                return path, fields["FROM"]
        return None

    def _answer(self, turn: Path, to: str, content: str) -> Path:
        """Create the next free turn after the highest number (never overwrite)."""
        numbers = [int(m.group(1)) for n in os.listdir(turn.parent) if (m := _TURN.fullmatch(n))]
        number = max(numbers, default=0) + 1
        while True:
            path = turn.parent / f"{number:03d}-{_converted(self.id)}.txt"
            try:
                with open(path, "x", encoding="utf-8") as handle:
                    handle.write(_message(self.id, to, content, "DONE"))
                return path
            except FileExistsError:
                number += 1

    async def answer_next(self, content: str, wait_seconds: float = 10.0) -> Path:
        """Wait for the next turn addressed to this agent and answer it; the answer's path."""
        deadline = time.monotonic() + wait_seconds
        while (found := await asyncio.to_thread(self._incoming)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.id} got no message in {wait_seconds}s")
            await asyncio.sleep(0.05)
        return await asyncio.to_thread(self._answer, found[0], found[1], content)


def workspace_of(adapter: Any) -> Path:
    """The workspace folder of a running ``ainet`` transport."""
    return Path(adapter.workspace.root)


async def consult(asker: Any, parent: Message, auditor: FileAgent,
                  say: Callable[[str], None]) -> Message:
    """``asker`` (an HTTP demo agent) asks @Auditor, who answers through AINET files only,
    in a conversation of its own on the same trace; returns the Auditor's RESPONSE."""
    question = build_request(sender=asker.name, to=AUDITOR, trace_id=parent.trace_id,
                             task="Confirm /var usage on build-01 from the audit log")
    await asker.post(question)
    say(f"{asker.name:>11} -> {AUDITOR:<11} REQUEST  (an AINET agent: the gateway writes a file)")
    turn = await auditor.answer_next("/var is at 91% in the 02:00 audit log.")
    say(f"{AUDITOR:>11} -> {asker.name:<11} answered in {turn.parent.parent.name}/{turn.name}")
    answer: Message = await asker.receive(MessageType.RESPONSE)
    return answer

"""A plain AINET agent written from the v0.3 seed's rules alone (no bridge code).

It plays the other side of the shared folder in tests: it joins, writes session files
and conversation turns with ``open(..., "x")`` at the next free number, and reads
messages with its own small parser.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

FIELD = re.compile(r"^(FROM|TO|TYPE|TIME): (.*)$", re.MULTILINE)


def conv(agent_id: str) -> str:
    """AINET's file-name rule: ``/`` becomes ``-``."""
    return agent_id.replace("/", "-")


def read_message(path: Path) -> dict[str, str]:
    """FROM/TO/TYPE/TIME, Content and Status of one message file."""
    text = path.read_text(encoding="utf-8")
    fields = dict(FIELD.findall(text.split("【Content】")[0]))
    content, _, status = text.split("【Content】\n", 1)[1].rpartition("\n【Status】")
    fields["Content"] = content
    fields["Status"] = status.strip()
    return fields


class PlainAgent:
    """One AINET participant working directly on the workspace folder."""

    def __init__(self, root: Path, agent_id: str) -> None:
        self.root = root
        self.id = agent_id
        self.session = root / "session"

    def text(self, to: str, content: str, *, kind: str | None, status: str = "PENDING") -> str:
        now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        type_line = f"TYPE: {kind}\n" if kind else ""
        return (f"=== Message ===\nFROM: {self.id}\nTO: {to}\n{type_line}TIME: {now}\n"
                f"【Content】\n{content}\n【Status】{status}\n")

    def set_status(self, value: str) -> None:
        (self.session / "status.txt").write_text(value)

    def status(self) -> str:
        return (self.session / "status.txt").read_text().strip()

    def join(self) -> Path:
        self.session.mkdir(parents=True, exist_ok=True)
        if not (self.session / "status.txt").exists():
            self.set_status("IDLE")
        text = self.text("BROADCAST", f"AI Agent {self.id} has joined AINET(AI-Net) "
                         "collaboration network.", kind="BROADCAST")
        path = self.session / f"{conv(self.id)}_to_BROADCAST_broadcast.txt"
        path.write_text(text, encoding="utf-8")
        self.set_status("PENDING")
        return path

    def request(self, to: str, content: str) -> Path:
        path = self.session / f"{conv(self.id)}_to_{conv(to)}_request.txt"
        path.write_text(self.text(to, content, kind="PRIVATE"), encoding="utf-8")
        self.set_status("PENDING")
        return path

    def respond(self, to: str, content: str) -> Path:
        path = self.session / f"{conv(self.id)}_to_{conv(to)}_response.txt"
        path.write_text(self.text(to, content, kind="PRIVATE", status="DONE"), encoding="utf-8")
        self.set_status("DONE")
        return path

    def inbox(self) -> list[dict[str, str]]:
        """Every session message addressed to this agent or to BROADCAST (not its own)."""
        found = []
        for path in sorted(self.session.glob("*.txt")):
            if path.name == "status.txt" or path.name.startswith(conv(self.id) + "_to_"):
                continue
            if f"_to_{conv(self.id)}_" in path.name or "_to_BROADCAST_" in path.name:
                found.append(read_message(path))
        return found

    def next_turn(self, task: str, to: str, content: str, status: str = "PENDING") -> Path:
        """Scan conversation/ for the highest N, create N+1 exclusively, never overwrite."""
        folder = self.root / "tasks" / f"task-{task}" / "conversation"
        folder.mkdir(parents=True, exist_ok=True)
        numbers = [int(m.group(1)) for n in os.listdir(folder)
                   if (m := re.match(r"(\d+)-", n))]
        number = max(numbers, default=0) + 1
        while True:
            path = folder / f"{number:03d}-{conv(self.id)}.txt"
            try:
                with open(path, "x", encoding="utf-8") as handle:
                    handle.write(self.text(to, content, kind=None, status=status))
                return path
            except FileExistsError:
                number += 1

    def conversation(self, task: str) -> list[tuple[str, dict[str, str]]]:
        folder = self.root / "tasks" / f"task-{task}" / "conversation"
        names = sorted((n for n in os.listdir(folder) if re.match(r"\d+-.*\.txt$", n)),
                       key=lambda n: int(n.split("-", 1)[0]))
        return [(n, read_message(folder / n)) for n in names]

"""Agents on the deployed v0.1 JavaScript library must read what the gateway writes.

The v0.1 reader is strict in ways our parser is not: it takes the first fenced block only
when the block holds no backtick at all, needs the header exactly as
``[TYPE → @name]`` (upper-case type, the ``→`` arrow), treats only ``Letters: value``
lines as fields (a key with ``-``, ``_`` or a digit becomes part of the previous value),
knows the statuses done/partial/failed, and needs From and RequestId. This test reads our
output under those rules (a small reader written for this test, not the library) and
checks the spec's promise: the same from, requestId, task/result/question/message, depth
and status, for every type.
"""

from __future__ import annotations

import re

import pytest

from protocol import (
    Depth,
    Message,
    build_broadcast,
    build_clarify,
    build_handoff,
    build_request,
    build_response,
    render,
)

_BLOCK = re.compile(r"```([^`]+)```", re.S)
_HEADER = re.compile(r"^\[(REQUEST|RESPONSE|CLARIFY|HANDOFF|BROADCAST) → @(\S+)\]$")
_FIELD = re.compile(r"^([A-Za-z]+):\s*(.*)$")
_V01_STATUSES = {"done", "partial", "failed"}


def read_v01(text: str) -> dict[str, object] | None:
    """The fields a v0.1 agent gets out of ``text`` (None: it would not see a message)."""
    block = _BLOCK.search(text)
    if block is None:
        return None
    lines = block.group(1).strip().split("\n")
    header = _HEADER.match(lines[0])
    if header is None:
        return None
    out: dict[str, object] = {"type": header.group(1), "to": header.group(2)}
    key: str | None = None
    value: list[str] = []
    fields: dict[str, str] = {}
    for line in [*lines[1:], None]:
        match = _FIELD.match(line) if line is not None else None
        if line is None or match:
            if key is not None:
                fields[key] = "\n".join(value).strip()
            if match:
                key, value = match.group(1).lower(), [match.group(2)]
        elif key is not None:
            value.append(line)
    for name in ("from", "task", "result", "question", "message", "status"):
        if name in fields:
            out[name] = fields[name]
    out["requestId"] = fields.get("requestid")
    depth = re.fullmatch(r"(\d+)/(\d+)", fields.get("depth", ""))
    out["depth"] = (int(depth.group(1)), int(depth.group(2))) if depth else None
    if out.get("status") not in _V01_STATUSES:
        out.pop("status", None)
    return out if out.get("from") and out["requestId"] else None


MESSAGES: list[Message] = [
    build_request(
        sender="Lotbot",
        to="Mantis",
        task="Check disk usage on build-01",
        context="nightly audit",
        priority="high",
    ),
    build_response(
        sender="Mantis",
        to="Lotbot",
        request_id="lotbot-8f2d4e",
        status="done",
        result="42% used",
        depth=Depth(current=2, max=5),
        trace_id="t-1",
    ),
    build_response(
        sender="Mantis",
        to="Lotbot",
        request_id="lotbot-8f2d4e",
        status="partial",
        result="half of it",
        depth="2/5",
    ),
    build_response(
        sender="Mantis",
        to="Lotbot",
        request_id="lotbot-8f2d4e",
        status="failed",
        result="no access",
        next_action="retry as root",
        depth="2/5",
    ),
    build_clarify(
        sender="Mantis",
        to="Lotbot",
        request_id="lotbot-8f2d4e",
        question="Which host?",
        depth="2/5",
    ),
    build_handoff(
        sender="Mantis",
        to="SecurityBot",
        request_id="lotbot-8f2d4e",
        task="Audit auth.log",
        reason="security",
        depth="3/5",
    ),
    build_broadcast(sender="SystemMonitor", message="DB maintenance at 02:00", urgency="high"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"{m.type}-{getattr(m, 'status', '')}")
def test_v01_reader_gets_the_same_core_fields(msg: Message) -> None:
    seen = read_v01(render(msg))
    assert seen is not None, render(msg)
    assert seen["type"] == msg.type.value and seen["to"] == msg.to
    assert seen["from"] == msg.sender and seen["requestId"] == msg.request_id
    assert seen["depth"] == (msg.depth.current, msg.depth.max)
    for name in ("task", "result", "question", "message"):
        assert seen.get(name) == getattr(msg, name, None)
    status = getattr(msg, "status", None)
    assert seen.get("status") == (None if status is None else str(status))


def test_v01_reader_sees_our_multi_line_values_with_their_indentation() -> None:
    msg = build_request(sender="Lotbot", to="Mantis", task="line one\nline two")
    seen = read_v01(render(msg))
    assert seen is not None
    # v0.1 keeps the two-space continuation indent; the first line is intact.
    assert seen["task"] == "line one\n  line two"

"""`render` and `render_body`: a message in its canonical wire form (wire-format.md section 4).

Order: header, From, RequestId, the type's own fields in table order, Depth, Priority
(REQUEST and HANDOFF), TraceId, Protocol-Version (only when not 0.1), meta fields in their
original order, KeyId, Signature. Continuation lines are indented by two spaces (empty
lines stay empty) and fences inside values are escaped, so no value can add a field or
close the block.
"""

from __future__ import annotations

from enum import Enum

from protocol.fields import ATTRIBUTES, BODY_FIELDS, PRIORITY_TYPES, WIRE_KEYS
from protocol.models import DEFAULT_VERSION, Message, MessageBase
from protocol.text import escape_fences


def render_field(key: str, value: str) -> str:
    """One ``Key: value`` line (plus continuation lines) with fences escaped."""
    value = escape_fences(value)
    if "\n" in value:
        value = "\n".join(f"  {line}" if line else line for line in value.split("\n")).removeprefix(
            "  "
        )
    return f"{key}: {value}"


def _text(value: object) -> str:
    return value.value if isinstance(value, Enum) else str(value)


def render_body(msg: Message | MessageBase, *, signature: bool = True) -> str:
    """The canonical lines of ``msg`` without the fences (and without Signature if asked)."""
    type_name = getattr(msg, "type").value  # noqa: B009 - every concrete message has a type
    lines = [
        f"[{type_name} → @{escape_fences(msg.to)}]",
        render_field("From", msg.sender),
        render_field("RequestId", msg.request_id),
    ]
    for name in BODY_FIELDS[type_name]:
        value = getattr(msg, ATTRIBUTES[name])
        if value is not None:
            lines.append(render_field(WIRE_KEYS[name], _text(value)))
    lines.append(f"Depth: {msg.depth}")
    if type_name in PRIORITY_TYPES:
        lines.append(f"Priority: {_text(getattr(msg, 'priority'))}")  # noqa: B009
    if msg.trace_id is not None:
        lines.append(render_field("TraceId", msg.trace_id))
    if msg.version != DEFAULT_VERSION:
        lines.append(render_field("Protocol-Version", msg.version))
    lines.extend(render_field(key, value) for key, value in msg.meta)
    if msg.key_id is not None:
        lines.append(render_field("KeyId", msg.key_id))
    if signature and msg.signature is not None:
        lines.append(render_field("Signature", msg.signature))
    return "\n".join(lines)


def render(msg: Message | MessageBase) -> str:
    """``msg`` as a fenced block, ready to post in a chat message."""
    return f"```\n{render_body(msg)}\n```"

"""`render` and `render_body`: a message in its canonical wire form (wire-format.md section 4).

Order: header, From, RequestId, the type's own fields in table order, Depth, Priority
(REQUEST and HANDOFF), TraceId, Protocol-Version (only when not 0.1), meta fields in their
original order, KeyId, Signature. Continuation lines are indented by two spaces (empty
lines stay empty) and fences inside values are escaped, so no value can add a field or
close the block. Any other line boundary in a value (CR, VT, FF, FS, GS, RS, NEL, U+2028,
U+2029) is written as LF and so as a continuation line too: every common line splitter
sees the same fields.
"""

from __future__ import annotations

from typing import Any

from protocol.fields import ATTRIBUTES, BODY_FIELDS, PRIORITY_TYPES, WIRE_KEYS
from protocol.models import DEFAULT_VERSION, Message, MessageBase
from protocol.text import escape_fences, normalize_newlines


def render_field(key: str, value: str) -> str:
    """One ``Key: value`` line (plus continuation lines) with fences escaped."""
    # The usual value (a name, an id, a one-line task) in one C scan: a printable text
    # holds no line break of any kind, so there is nothing to normalise or indent.
    if value.isprintable() and "`" not in value:
        return f"{key}: {value}"
    value = normalize_newlines(value)  # (values from the models are normalised already)
    if "`" in value or "\n" in value:  # (two memchr scans; most values have neither)
        value = escape_fences(value)
        if "\n" in value:
            value = "\n".join(
                f"  {line}" if line else line for line in value.split("\n")
            ).removeprefix("  ")
    return f"{key}: {value}"


# Per type: (model attribute, wire key) of its own fields, in output order.
_BODY: dict[str, tuple[tuple[str, str], ...]] = {
    type_name: tuple((ATTRIBUTES[name], WIRE_KEYS[name]) for name in names)
    for type_name, names in BODY_FIELDS.items()
}


def render_body(
    msg: Message | MessageBase, *, signature: bool = True, key_id: bool = True
) -> str:
    """The canonical lines of ``msg`` without the fences (and without Signature, or
    KeyId, if asked)."""
    # The field values straight from the instance dict; str() of a StrEnum is its value.
    return render_fields(msg.__dict__, signature=signature, key_id=key_id)


def render_fields(fields: dict[str, Any], *, signature: bool = True, key_id: bool = True
                  ) -> str:
    """`render_body` of the message whose instance dict is ``fields`` (for a caller that
    has it already: each read of a model's ``__dict__`` goes through pydantic's
    attribute hook)."""
    type_name = str(fields["type"])
    lines = [
        f"[{type_name} → @{escape_fences(fields['to'])}]",
        render_field("From", fields["sender"]),
        render_field("RequestId", fields["request_id"]),
    ]
    for attribute, key in _BODY[type_name]:
        value = fields[attribute]
        if value is not None:
            lines.append(render_field(key, str(value)))
    depth = fields["depth"].__dict__
    lines.append(f"Depth: {depth['current']}/{depth['max']}")
    if type_name in PRIORITY_TYPES:
        lines.append(f"Priority: {fields['priority']!s}")
    if fields["trace_id"] is not None:
        lines.append(render_field("TraceId", fields["trace_id"]))
    if fields["version"] != DEFAULT_VERSION:
        lines.append(render_field("Protocol-Version", fields["version"]))
    if fields["meta"]:
        lines.extend([render_field(key, value) for key, value in fields["meta"]])
    if key_id and fields["key_id"] is not None:
        lines.append(render_field("KeyId", fields["key_id"]))
    if signature and fields["signature"] is not None:
        lines.append(render_field("Signature", fields["signature"]))
    return "\n".join(lines)


def render(msg: Message | MessageBase) -> str:
    """``msg`` as a fenced block, ready to post in a chat message."""
    return fence(render_body(msg))


def fence(body: str) -> str:
    """A rendered body (``render_body``) as a fenced block: ``render`` of its message."""
    return f"```\n{body}\n```"

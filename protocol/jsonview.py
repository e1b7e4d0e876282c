"""The JSON form of messages used by ``bpgw parse --json`` (wire-format.md section 6)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from protocol.fields import ATTRIBUTES, BODY_FIELDS, PRIORITY_TYPES
from protocol.models import DEFAULT_VERSION, Message, MessageBase
from protocol.parser import ParseResult

_OPTIONAL_COMMON = ("trace_id", "key_id", "signature")


def message_to_dict(msg: Message | MessageBase) -> dict[str, Any]:
    """``type``, ``to`` (no ``@``), ``from``, ``request_id``, ``depth``, the present fields.

    Priority is always given on REQUEST and HANDOFF; ``version`` only when it is not the
    default 0.1 (as on the wire). ``meta`` maps original keys to values; a key given more
    than once maps to a list of its values in order.
    """
    type_name: str = getattr(msg, "type").value  # noqa: B009
    out: dict[str, Any] = {
        "type": type_name,
        "to": msg.to,
        "from": msg.sender,
        "request_id": msg.request_id,
        "depth": {"current": msg.depth.current, "max": msg.depth.max},
    }
    for name in (*BODY_FIELDS[type_name], *_OPTIONAL_COMMON):
        value = getattr(msg, ATTRIBUTES[name])
        if value is not None:
            out[name] = value.value if isinstance(value, Enum) else value
    if type_name in PRIORITY_TYPES:
        out["priority"] = getattr(msg, "priority").value  # noqa: B009
    if msg.version != DEFAULT_VERSION:
        out["version"] = msg.version
    meta: dict[str, Any] = {}
    for key, value in msg.meta:
        if key not in meta:
            meta[key] = value
        elif isinstance(meta[key], list):
            meta[key].append(value)
        else:
            meta[key] = [meta[key], value]
    out["meta"] = meta
    return out


def result_to_dict(result: ParseResult) -> dict[str, Any]:
    """``{"messages": [...], "errors": [...]}`` for a parse result."""
    return {
        "messages": [message_to_dict(msg) for msg in result.messages],
        "errors": [error.to_dict() for error in result.errors],
    }


def exit_status(result: ParseResult) -> int:
    """0 when a message parsed and nothing failed, 1 when no protocol block, 2 on any error."""
    if result.errors:
        return 2
    return 0 if result.messages else 1

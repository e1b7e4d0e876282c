"""The field table of wire-format.md section 2: wire keys, input aliases and output order.

Field names here are the spec's canonical names (``from``, ``request_id``, ...). Message
types are plain upper-case strings so that this module does not depend on the models.
"""

from __future__ import annotations

import re

# A whole key (meta keys given to a builder must have this shape).
KEY_SHAPE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*+")

WIRE_KEYS: dict[str, str] = {
    "from": "From",
    "request_id": "RequestId",
    "task": "Task",
    "context": "Context",
    "question": "Question",
    "status": "Status",
    "result": "Result",
    "next_action": "NextAction",
    "reason": "Reason",
    "callback": "Callback",
    "message": "Message",
    "subject": "Subject",
    "urgency": "Urgency",
    "priority": "Priority",
    "depth": "Depth",
    "trace_id": "TraceId",
    "version": "Protocol-Version",
    "key_id": "KeyId",
    "signature": "Signature",
}
"""Canonical name -> the key written on output."""

# The type's own fields (plus Context, which any type may carry) in table order: the
# order a message body is rendered in, between RequestId and Depth.
BODY_FIELDS: dict[str, tuple[str, ...]] = {
    "REQUEST": ("task", "context", "callback"),
    "RESPONSE": ("context", "status", "result", "next_action"),
    "CLARIFY": ("context", "question"),
    "HANDOFF": ("task", "context", "reason", "callback"),
    "BROADCAST": ("context", "message", "subject", "urgency"),
}

COMMON_FIELDS = ("from", "request_id", "depth", "trace_id", "version", "key_id", "signature")

# Types that always carry (and render) a Priority.
PRIORITY_TYPES = frozenset({"REQUEST", "HANDOFF"})

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "REQUEST": ("from", "request_id", "task"),
    "RESPONSE": ("from", "request_id"),
    "CLARIFY": ("from", "request_id", "question"),
    "HANDOFF": ("from", "request_id", "task"),
    "BROADCAST": ("from", "request_id", "message"),
}

# Input-only spellings. ``OriginalRequestId`` stands for RequestId only when RequestId is
# absent; next to a RequestId it is an ordinary (meta) field.
WEAK_ALIASES: dict[str, str] = {"originalrequestid": "request_id"}
_TYPE_ALIASES: dict[str, dict[str, str]] = {
    "RESPONSE": {"body": "result"},
    "BROADCAST": {"body": "message"},
}

# Canonical field -> Python attribute of the model.
ATTRIBUTES: dict[str, str] = {name: name for name in WIRE_KEYS}
ATTRIBUTES["from"] = "sender"

# Fields whose value is free text (may span lines); the others are single tokens.
TEXT_FIELDS = frozenset(
    {
        "task",
        "context",
        "question",
        "result",
        "next_action",
        "reason",
        "callback",
        "message",
        "subject",
    }
)


def normalize_key(key: str) -> str:
    """The matching form of a key: lower case with ``-`` and ``_`` removed."""
    return key.lower().replace("-", "").replace("_", "")


def _field_keys(type_name: str) -> dict[str, str]:
    names = (*COMMON_FIELDS, *BODY_FIELDS[type_name])
    if type_name in PRIORITY_TYPES:
        names = (*names, "priority")
    keys = {normalize_key(WIRE_KEYS[name]): name for name in names}
    keys["version"] = "version"
    keys.update(_TYPE_ALIASES.get(type_name, {}))
    keys.update(WEAK_ALIASES)
    return keys


FIELD_KEYS: dict[str, dict[str, str]] = {name: _field_keys(name) for name in BODY_FIELDS}
"""Message type -> {normalised input key: canonical name} of the fields that type reads."""

"""`fingerprint`: a transport-independent identity of a message (idempotency, relay dedupe).

It is the SHA-256 (hex) of the type, RequestId, From, Depth and a SHA-256 of the canonical
rendering without KeyId and Signature. So the same message seen on two transports, or
signed again (by any key), has one fingerprint; any change to a field gives another.
"""

from __future__ import annotations

import hashlib
from typing import Any

from protocol.models import Message, MessageBase
from protocol.render import fence, render_body, render_fields


def fingerprint(msg: Message | MessageBase) -> str:
    """64 hex digits identifying ``msg`` independently of transport and signature."""
    return _of_unsigned(msg.__dict__, render_body(msg, signature=False, key_id=False))


def fingerprint_and_render(msg: Message | MessageBase) -> tuple[str, str]:
    """``(fingerprint(msg), render(msg))``; an unsigned message is rendered once for both
    (the hot path: most messages carry neither KeyId nor Signature)."""
    fields = msg.__dict__
    unsigned = render_fields(fields, signature=False, key_id=False)
    if fields["key_id"] is None and fields["signature"] is None:
        return _of_unsigned(fields, unsigned), fence(unsigned)
    return _of_unsigned(fields, unsigned), fence(render_fields(fields))


def _of_unsigned(fields: dict[str, Any], unsigned: str) -> str:
    """The fingerprint of the message whose fields (its instance dict: no pydantic
    attribute hook per field) are ``fields``, from its rendering without KeyId and
    Signature."""
    content = hashlib.sha256(unsigned.encode("utf-8", "surrogatepass")).hexdigest()
    depth = fields["depth"].__dict__  # (str() of a StrEnum is its value)
    identity = (
        f"{fields['type']!s}\n{fields['request_id']}\n{fields['sender']}\n"
        f"{depth['current']}/{depth['max']}\n{content}"
    )
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()

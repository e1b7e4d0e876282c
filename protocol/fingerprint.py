"""`fingerprint`: a transport-independent identity of a message (idempotency, relay dedupe).

It is the SHA-256 (hex) of the type, RequestId, From, Depth and a SHA-256 of the canonical
rendering without KeyId and Signature. So the same message seen on two transports, or
signed again (by any key), has one fingerprint; any change to a field gives another.
"""

from __future__ import annotations

import hashlib

from protocol.models import Message, MessageBase
from protocol.render import render_body


def fingerprint(msg: Message | MessageBase) -> str:
    """64 hex digits identifying ``msg`` independently of transport and signature."""
    unsigned = msg.model_copy(update={"key_id": None, "signature": None})
    content = hashlib.sha256(
        render_body(unsigned, signature=False).encode("utf-8", "surrogatepass")
    ).hexdigest()
    identity = "\n".join(
        (getattr(msg, "type").value, msg.request_id, msg.sender, str(msg.depth), content)  # noqa: B009
    )
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()

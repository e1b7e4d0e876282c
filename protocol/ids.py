"""Fresh identifiers: RequestId (``{sender-slug}-{random hex}``) and TraceId."""

from __future__ import annotations

import secrets
from functools import lru_cache

SLUG_MAX_LEN = 32
_FALLBACK_SLUG = "agent"


# The gateway asks for the slug of every message's sender (RequestId ownership): cached,
# as names repeat, and bounded, as they come from outside.
@lru_cache(maxsize=4096)
def slug(name: str) -> str:
    """``name`` as lower-case ASCII letters, digits and ``-`` (``agent`` when none are left)."""
    chars = [c if c.isascii() and c.isalnum() else "-" for c in name.lower()]
    parts = [part for part in "".join(chars).split("-") if part]
    text = "-".join(parts)[:SLUG_MAX_LEN].strip("-")
    return text or _FALLBACK_SLUG


def new_request_id(sender: str) -> str:
    """A new RequestId for a conversation opened by ``sender``, e.g. ``lotbot-8f2d4e1a9c3b``.

    Twelve hex digits (48 random bits) keep collisions unlikely across millions of
    conversations of one sender.
    """
    return f"{slug(sender)}-{secrets.token_hex(6)}"


def new_trace_id() -> str:
    """A new TraceId: 32 random hex digits (the W3C trace-context size)."""
    return secrets.token_hex(16)

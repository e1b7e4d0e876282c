"""Immutable objects shared on the hot path: ``shared_address`` hands out one ``Address``
per place (the objects every message makes are made by ``state.frozen.maker``)."""

from __future__ import annotations

from functools import lru_cache

from adapters.base import Address


@lru_cache(maxsize=4096)
def shared_address(transport: str, channel: str, thread: str | None) -> Address:
    """``Address(transport, channel, thread or None)``, one shared object per place
    (bounded: places come from outside)."""
    return Address(transport, channel, thread or None)

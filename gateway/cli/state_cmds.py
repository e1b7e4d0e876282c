"""Sub-commands of `bpgw` (placeholder until its issue lands)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add this module's sub-commands to the `bpgw` parser."""
    del sub

"""Configuration of the conversation store: where Redis is, key namespace, timeouts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "REQUEST": 1800.0,
    "HANDOFF": 1800.0,
    "CLARIFY": 600.0,
    "BROADCAST": 300.0,
}
"""Seconds a conversation may wait after a message of each type before it times out."""


def _default_timeouts() -> Mapping[str, float]:
    return dict(DEFAULT_TIMEOUTS)


@dataclass(frozen=True)
class StateSettings:
    """Everything the state layer needs from the gateway configuration.

    ``redis_url`` is ``"embedded"`` (a private Valkey with append-only persistence
    under ``data_dir/valkey``) or a ``redis://host:port/db`` URL. Every key carries
    ``namespace`` inside a hash tag, so one namespace lives in one cluster slot.
    """

    redis_url: str = "embedded"
    namespace: str = "bpgw"
    data_dir: Path = Path(".bpgw")
    timeouts: Mapping[str, float] = field(default_factory=_default_timeouts)
    retention_seconds: float = 7 * 86400
    sweep_interval_seconds: float = 5.0
    purge_interval_seconds: float = 3600.0
    sweep_batch: int = 1000
    command_timeout_seconds: float = 2.5
    """Read timeout of one command: a frozen server is answered as unavailable after it."""

    def timeout_for(self, message_type: str) -> float:
        """The timeout of one message type, falling back to the default table."""
        value = self.timeouts.get(message_type)
        return float(DEFAULT_TIMEOUTS[message_type] if value is None else value)

"""Options of one ``[transports.NAME] kind = "ainet"`` transport (pydantic, safe defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.ainet.names import UnsafeNameError, canonical, check_agent_id, check_component
from protocol.names import check_name


class AinetSettings(BaseModel):
    """Where the workspace is, who the bridge is in it, and how it looks for new files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The shared AINET folder (the sync service's local copy).
    workspace: Path
    # Create the workspace folder when it is missing (off by default: an unmounted sync
    # folder must not silently become an empty local one).
    create_workspace: bool = False
    # A fixed agent id; when unset one is generated once and kept in ``id_file``.
    agent_id: str | None = None
    # The name part of a generated id (``Device-<host+4>/<agent_name>``).
    agent_name: str = "bpgw"
    # Local bridge state (generated id, session spool, turn locks); never the workspace.
    state_dir: Path = Path(".bpgw/ainet")
    # The agent a plain AINET PRIVATE (or TASK) message goes to when its content does not
    # start with @Name. Unset: such a message gets an error reply naming the fix.
    default_recipient: str | None = None
    # AINET agent ids this transport speaks for, each with its bot-protocol name ("" = the
    # id itself): identity ``<transport>:<id>`` is that agent's from the start, whatever
    # the identity policy, and its address is ``<transport>:<id>``.
    agents: dict[str, str] = Field(default_factory=dict)
    # "watch": inotify events plus polling as a safety net; "poll": polling only.
    discovery: Literal["watch", "poll"] = "watch"
    poll_interval_seconds: float = Field(default=1.0, ge=0.01, le=3600, allow_inf_nan=False)
    # How long a half-written or unparseable file is retried before it gets an error reply.
    grace_period_seconds: float = Field(default=30.0, ge=0, le=86400, allow_inf_nan=False)
    # A parseable file untouched this long counts as complete without a second look.
    settle_seconds: float = Field(default=1.0, ge=0, le=3600, allow_inf_nan=False)
    # Bounds.
    max_message_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_pending_files: int = Field(default=10_000, ge=1, le=1_000_000)
    max_tracked_items: int = Field(default=100_000, ge=10, le=10_000_000)
    max_spool_per_slot: int = Field(default=100, ge=1, le=100_000)
    max_turns: int = Field(default=99_999, ge=1, le=999_999_999)
    ingest_record_max: int = Field(default=200_000, ge=100, le=100_000_000)
    # Polling cost control: items quiet this long are checked in a rotation, this many
    # per poll, so a poll's cost does not grow with old conversations.
    hot_seconds: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False)
    cold_checks_per_poll: int = Field(default=64, ge=1, le=100_000)
    # Conversations whose AINET folder is remembered (task folder <-> RequestId), and
    # delivered messages remembered so a re-sent delivery writes nothing twice.
    conversation_record_max: int = Field(default=100_000, ge=100, le=10_000_000)
    delivery_record_max: int = Field(default=200_000, ge=100, le=10_000_000)
    # Inbound files handed to the gateway at once (different conversations only).
    ingest_concurrency: int = Field(default=32, ge=1, le=1024)

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_agent_id(value)
        except UnsafeNameError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("agent_name")
    @classmethod
    def _agent_name(cls, value: str) -> str:
        try:
            return check_component(value, "agent_name", max_bytes=64)
        except UnsafeNameError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("default_recipient")
    @classmethod
    def _recipient(cls, value: str | None) -> str | None:
        return None if value is None else check_name(value.removeprefix("@"))

    @field_validator("agents")
    @classmethod
    def _agents(cls, value: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        seen: set[str] = set()
        for agent_id, name in value.items():
            try:
                key = check_agent_id(agent_id)
            except UnsafeNameError as exc:
                raise ValueError(str(exc)) from None
            if "#" in key:
                raise ValueError(f"agent id {key!r}: '#' can't appear in an address")
            if canonical(key) in seen:
                raise ValueError(f"agent id {key!r} is listed twice")
            seen.add(canonical(key))
            out[key] = check_name(name) if name else key
        return out

"""Options of the mq9 service: every stored or queued thing has a bound here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.mq9.names import address_problem, check_namespace

# A text payload can grow six-fold in a JSON reply (a control byte becomes \u00XX); the
# rest of a reply (msg_id, header, ...) is kept within this many bytes per message.
JSON_EXPANSION = 6
REPLY_OVERHEAD_BYTES = 16 * 1024


class ServiceSettings(BaseModel):
    """Validated options of one service instance (all instances of a deployment share them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(
        "mq9", description="prefix of every stream, KV bucket and storage subject")
    queue_group: str = Field(
        "mq9", min_length=1, max_length=64,
        description="NATS queue group: instances in one group share the requests")
    payload_encoding: Literal["text", "base64"] = Field(
        "text", description="payload in FETCH/QUERY replies: UTF-8 text (broker) or base64")
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(1, ge=1, le=5, description="JetStream replicas of every stream")
    max_payload_bytes: int = Field(128 * 1024, ge=1, description="largest SEND payload")
    max_mailboxes: int = Field(10_000, ge=1)
    max_messages_per_mailbox: int = Field(10_000, ge=1)
    max_mailbox_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_delayed_messages: int = Field(100_000, ge=1)
    max_delay_seconds: int = Field(7 * 86400, ge=1)
    max_agents: int = Field(10_000, ge=1)
    max_agent_bytes: int = Field(16 * 1024, ge=64, description="largest REGISTER body")
    max_groups_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="bytes of all consumer-group offsets")
    max_fetch_messages: int = Field(1000, ge=1, description="cap of FETCH num_msgs")
    max_wait_ms: int = Field(30_000, ge=0, description="cap of FETCH max_wait_ms")
    max_name_length: int = Field(
        256, ge=1, le=1024, description="longest mq9-key, group or agent name")
    max_tags: int = Field(16, ge=1)
    max_tag_length: int = Field(64, ge=1)
    max_desc_length: int = Field(1024, ge=0)
    sweep_interval_seconds: float = Field(
        10.0, gt=0, description="how often expired mailboxes are deleted")
    max_inflight: int = Field(256, ge=1, description="requests handled at once")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return check_namespace(value)

    def check_nats_max_payload(self, nats_max_payload: int) -> None:
        """Refuse settings whose largest reply could exceed the server's max_payload."""
        need = self.max_payload_bytes * JSON_EXPANSION + REPLY_OVERHEAD_BYTES
        if need > nats_max_payload:
            raise ValueError(
                f"max_payload_bytes={self.max_payload_bytes} needs a NATS max_payload of at "
                f"least {need} bytes (the server allows {nats_max_payload}); lower it or "
                "raise the server's max_payload"
            )


class BridgeSettings(BaseModel):
    """Options of one ``mq9`` transport (the bridge; see docs/mq9.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nats_url: str = Field(
        "embedded", pattern=r"^(embedded|((nats|tls|ws|wss)://[^,\s]+)(,(nats|tls|ws|wss)://[^,\s]+)*)$",
        description="NATS server(s), comma-separated, or 'embedded' (a private nats-server)")
    data_dir: Path = Field(
        Path(".bpgw/nats"), description="folder of the embedded nats-server's data")
    serve: bool | None = Field(
        None, description="run the mq9 service in the gateway (default: only when embedded)")
    agent_name: str = Field(
        "bpgw", min_length=1, max_length=256, description="the name the gateway registers")
    mailbox: str = Field("bpgw.gateway", description="the gateway's mail_address")
    mailbox_ttl_seconds: int = Field(
        0, ge=0, description="TTL of the mailbox when the bridge creates it (0: never expires)")
    description: str = Field(
        "bpgw gateway: send protocol blocks (REQUEST, RESPONSE, ...) here with header "
        "mq9-reply-to set to your own mailbox", max_length=1024,
        description="the registration's payload (what DISCOVER searches)")
    group: str = Field("bpgw", min_length=1, max_length=256, description="consumer group")
    payload_encoding: Literal["text", "base64"] = Field(
        "text", description="how the broker returns FETCH payloads: text (broker) or base64")
    fetch_batch: int = Field(100, ge=1, le=1000, description="num_msgs per FETCH")
    fetch_wait_ms: int = Field(1000, ge=0, le=30_000, description="FETCH max_wait_ms")
    request_timeout_seconds: float = Field(5.0, gt=0, le=120, allow_inf_nan=False)
    heartbeat_seconds: float = Field(30.0, gt=0, le=86_400, allow_inf_nan=False)
    retry_seconds: float = Field(
        1.0, gt=0, le=300, allow_inf_nan=False,
        description="pause before retrying after NATS or the gateway's store failed")
    discover_cache_seconds: float = Field(60.0, ge=0, le=86_400, allow_inf_nan=False)
    discover_max_pages: int = Field(5, ge=1, le=100)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: Path | None = Field(None, description="NATS .creds file (JWT + NKey seed)")
    nkeys_seed: Path | None = Field(None, description="NKey seed file")
    tls_ca_file: Path | None = Field(None, description="CA certificate for tls:// servers")

    @field_validator("mailbox")
    @classmethod
    def _mailbox(cls, value: str) -> str:
        problem = address_problem(value)
        if problem:
            raise ValueError(f"invalid mail_address {value!r}: {problem}")
        return value

    @property
    def embedded(self) -> bool:
        """True when the gateway runs its own nats-server."""
        return self.nats_url == "embedded"

    @property
    def serves(self) -> bool:
        """True when the gateway runs the mq9 service itself."""
        return self.embedded if self.serve is None else self.serve

    @property
    def servers(self) -> list[str]:
        """The configured NATS server URLs (not for ``embedded``)."""
        return self.nats_url.split(",")

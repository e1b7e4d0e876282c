"""Options of the mq9 service: every stored or queued thing has a bound here."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.mq9.names import check_namespace

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

"""Options of the ``http`` transport, validated with pydantic (``adapters.options``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@:-]+$")]
Token = Annotated[str, Field(min_length=8)]


class HttpSettings(BaseModel):
    """Options of one ``http`` transport (see docs/http-api.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8780, ge=0, le=65535)
    tokens: dict[Name, Token] = Field(default_factory=dict)
    operator_tokens: dict[Name, Token] = Field(default_factory=dict)
    max_body_bytes: int = Field(default=262_144, ge=64, le=64 * 1024 * 1024)
    inbox_max: int = Field(default=10_000, ge=1, le=10_000_000)
    inbox_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024**3)
    inbox_visibility_seconds: float = Field(default=30.0, gt=0, le=86400, allow_inf_nan=False)
    long_poll_max_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    long_poll_max_waiters: int = Field(default=256, ge=1, le=100_000)
    # Slow and incomplete requests: a connection that has not sent a complete request
    # head (or sits idle between requests) this long is closed; a request body must
    # arrive whole within body_timeout_seconds (else 408 and the connection closes).
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    # Connections held at once; at the cap the longest-idle one makes room for a new one.
    max_connections: int = Field(default=1000, ge=8, le=1_000_000)
    # Bearer token for GET /metrics (docs/observability.md); operator tokens work too.
    # Unset: open on a loopback-only server, operator tokens only otherwise.
    metrics_token: Token | None = None

    @field_validator("tokens", "operator_tokens")
    @classmethod
    def _one_caller_per_token(cls, mapping: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """A token must name exactly one caller, or identity would be ambiguous."""
        seen = {token: f"agent {who}" for who, token in info.data.get("tokens", {}).items()}
        for who, token in mapping.items():
            if token in seen:
                raise ValueError(
                    f"{who} reuses the token of {seen[token]}; every agent and operator "
                    "needs a token of its own"
                )
            seen[token] = who
        return mapping

    @field_validator("metrics_token")
    @classmethod
    def _own_metrics_token(cls, token: str | None, info: ValidationInfo) -> str | None:
        """An agent's token must not unlock the metrics by accident."""
        if token is not None and token in info.data.get("tokens", {}).values():
            raise ValueError("reuses an agent's token; give the metrics a token of their own")
        return token

"""Options of the ``http`` transport, validated with pydantic.

``load_options`` turns any pydantic validation failure into a ``ConfigError`` that
names the offending key as ``transports.<name>.<key>``; the memory transport reuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from adapters.base import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@:-]+$")]
Token = Annotated[str, Field(min_length=8)]


def describe_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line per problem, each naming its key under ``prefix`` (``a.b.c: reason``)."""
    problems = []
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in (prefix, *error["loc"]))
        reason = error["msg"]
        if error["type"] == "value_error":
            reason = str(error.get("ctx", {}).get("error", reason))
        problems.append(f"{key}: {reason}")
    return "; ".join(problems)


def load_options(model: type[ModelT], name: str, options: Mapping[str, Any] | None) -> ModelT:
    """Validate a transport's ``options`` mapping; raise ``ConfigError`` naming the key."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"transports.{name}")) from None


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

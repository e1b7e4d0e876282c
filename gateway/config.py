"""Gateway configuration: TOML validated by pydantic, with environment overrides.

Every key has a safe default, so ``GatewayConfig()`` is the embedded-defaults setup.
Secrets stay out of files: any string value ``"env:NAME"`` is read from the environment
variable ``NAME``, and ``BPGW_SECTION__KEY=value`` overrides ``[section] key``
(for example ``BPGW_STATE__REDIS_URL=redis://127.0.0.1:6379``; a list as JSON or
comma-separated: ``BPGW_PERMISSIONS__OPERATORS=http:admin,http:ops``).
A bad config fails fast with ``invalid configuration:``, the dotted key and the reason.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from adapters.base import Address
from adapters.base import ConfigError as ConfigError  # one class, one prefix, for every config
from adapters.options import TransportOptions, describe_validation_error, field_type
from protocol.names import check_name, name_key
from state.settings import StateSettings

ENV_PREFIX = "BPGW_"
RETIRED_POLICY_KEYS = frozenset({"dedupe_window_seconds", "loop_guard_max_entries"})
"""``[policy]`` keys older versions had; accepted and ignored."""

log = logging.getLogger("bpgw.gateway.config")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentityPolicy(StrEnum):
    """How senders that no ``[agents.X]`` entry declares are treated."""

    PIN = "pin"  # reject undeclared names
    TOFU = "tofu"  # bind the first identity seen for a name (trust on first use)
    OPEN = "open"  # accept any identity for undeclared names


class GatewaySection(_Section):
    """``[gateway]``: the gateway's own identity and files."""

    name: str = "bpgw"
    data_dir: Path = Path(".bpgw")
    log_level: str = "INFO"
    # auto: text on a terminal, JSON otherwise (docs/observability.md).
    log_format: str = Field(default="auto", pattern="^(auto|json|text)$")
    command_prefix: str = "/protocol"
    command_timeout_seconds: float = Field(default=2.5, gt=0, le=30)
    # Destinations (an agent's inbox, a channel) that get series of their own in
    # /metrics; the others are counted under destination="other".
    metrics_max_destinations: int = Field(default=50, ge=1, le=10_000)
    # Modules imported at start that register extra transport kinds (third-party adapters).
    adapter_modules: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)


class StateSection(_Section):
    """``[state]``: where conversations live and how long they may wait."""

    redis_url: str = "embedded"
    namespace: str = Field(default="bpgw", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    retention_days: float = Field(default=7.0, gt=0)
    sweep_interval_seconds: float = Field(default=5.0, gt=0)
    purge_interval_seconds: float = Field(default=3600.0, gt=0)
    sweep_batch: int = Field(default=1000, ge=1, le=100_000)
    command_timeout_seconds: float = Field(default=2.5, gt=0, le=60, allow_inf_nan=False)
    timeouts: dict[str, float] = Field(
        default_factory=lambda: {
            "request": 1800.0,
            "handoff": 1800.0,
            "clarify": 600.0,
            "broadcast": 300.0,
        }
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value == "embedded":
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss", "unix") or not value.partition("://")[2]:
            raise ValueError(
                "must be 'embedded' or a URL such as redis://host:6379/0 (schemes redis://, "
                "rediss://, unix://)"
            )
        try:
            _ = parts.port  # not a number, or out of range
        except ValueError as exc:
            raise ValueError(f"bad port: {exc}") from None
        # redis-py silently reads database 0 for a path that is not a number.
        db = parts.path.strip("/")
        if parts.scheme != "unix" and db and not db.isdigit():
            raise ValueError(f"the database after the port must be a number, not {db!r}")
        return value

    @field_validator("timeouts")
    @classmethod
    def _timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        known = {"request", "handoff", "clarify", "broadcast"}
        for key, seconds in value.items():
            if key.lower() not in known:
                raise ValueError(f"unknown message type {key!r} (known: {sorted(known)})")
            if seconds <= 0:
                raise ValueError(f"{key} timeout must be positive")
        return {k.lower(): float(v) for k, v in value.items()}


class PolicySection(_Section):
    """``[policy]``: enforcement and loop prevention."""

    undeclared_agents: IdentityPolicy = IdentityPolicy.TOFU
    max_names_per_identity: int = Field(default=8, ge=1, le=10_000)
    learned_name_idle_days: float = Field(default=30.0, gt=0)
    broadcast_max_targets: int = Field(default=1000, ge=1, le=100_000)
    close_on_depth_violation: bool = True
    pair_budget_messages: int = Field(default=20, ge=1)
    pair_budget_window_seconds: float = Field(default=60.0, gt=0)
    pair_cooldown_seconds: float = Field(default=60.0, ge=0)
    max_block_bytes: int = Field(default=65536, ge=256, le=16 * 1024 * 1024)
    max_blocks_per_message: int = Field(default=10, ge=1, le=1000)

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        """Drop the keys of the per-process loop guards (with a warning), so older files
        still load: duplicates are now recognised by the conversation records for their
        whole retention, and the budget keys in Redis expire by themselves."""
        if isinstance(data, dict):
            for key in RETIRED_POLICY_KEYS.intersection(data):
                log.warning("[policy] %s is no longer used and is ignored", key)
            data = {k: v for k, v in data.items() if k not in RETIRED_POLICY_KEYS}
        return data


class ReplicasSection(_Section):
    """``[replicas]``: several gateways sharing one Redis (docs/deployment.md)."""

    # A single-connection transport's lease lasts this long unrenewed: another replica
    # takes the transport over within about this plus a fifth of it after its holder dies.
    lease_seconds: float = Field(default=10.0, ge=1, le=120)
    # How long a processed inbound native message is remembered, so a redelivery or a
    # second replica seeing it does not process it again.
    inbound_dedupe_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)


class OutboxSection(_Section):
    """``[outbox]``: durable delivery of everything the gateway sends (docs/gateway.md)."""

    # Attempts per (message, destination) before it is dead-lettered.
    max_attempts: int = Field(default=8, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=3600)
    backoff_max_seconds: float = Field(default=300.0, gt=0, le=86400)
    # One adapter send may take this long before it counts as a failed attempt.
    send_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    # Deliveries waiting for a retry per destination; beyond it they are dead-lettered.
    queue_max: int = Field(default=10_000, ge=1, le=10_000_000)
    # Dead letters kept per destination (the oldest go first beyond it; all are counted).
    dead_letter_max: int = Field(default=10_000, ge=1, le=10_000_000)
    # Sends per second per destination (0 = no limit); a platform's retry-after always holds.
    rate_per_second: float = Field(default=0.0, ge=0, le=100_000)
    # The replica dispatching the outbox holds a lease this long (renewed at a third).
    lease_seconds: float = Field(default=15.0, ge=1, le=600)
    # Journal entries dispatched per read.
    batch: int = Field(default=256, ge=1, le=10_000)
    # How long the gateway recognises its own posts when a platform shows them back.
    echo_ttl_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)
    # /healthz fails (outbox stalled) when the oldest undelivered message is older.
    stall_seconds: float = Field(default=60.0, gt=0, le=86400)
    # Destinations with a dead-letter counter of their own (the total counts them all).
    stats_destinations: int = Field(default=1000, ge=1, le=100_000)
    # A destination with nothing queued or dead-lettered is forgotten after this long idle.
    idle_destination_seconds: float = Field(default=86400.0, gt=0, le=30 * 86400)


class PermissionsSection(_Section):
    """``[permissions]``: who may run operator commands.

    Entries are identities (``transport:author-id``), roles (``role:transport:role``)
    or ``*`` for everyone. A transport's operator credential (an HTTP operator token)
    makes its holder an operator too, unless ``operator_credentials`` is false.
    """

    read: list[str] = Field(default_factory=lambda: ["*"])
    operators: list[str] = Field(default_factory=list)
    operator_credentials: bool = True


class AgentSection(_Section):
    """``[agents.NAME]``: one declared agent."""

    addresses: list[str] = Field(default_factory=list)
    identities: list[str] = Field(default_factory=list)
    public_key: str | None = None

    @field_validator("addresses", "identities")
    @classmethod
    def _qualified(cls, value: list[str]) -> list[str]:
        for item in value:
            transport, sep, rest = item.partition(":")
            if not sep or not transport or not rest:
                raise ValueError(f"{item!r} must look like 'transport:id'")
        return value

    def parsed_addresses(self) -> list[Address]:
        """The addresses as ``Address`` values."""
        return [parse_address(a) for a in self.addresses]


class GatewayConfig(_Section):
    """The whole configuration file."""

    # The folder of the config file it was loaded from (None: defaults, no file).
    _config_dir: Path | None = PrivateAttr(default=None)

    gateway: GatewaySection = Field(default_factory=GatewaySection)
    state: StateSection = Field(default_factory=StateSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    replicas: ReplicasSection = Field(default_factory=ReplicasSection)
    permissions: PermissionsSection = Field(default_factory=PermissionsSection)
    outbox: OutboxSection = Field(default_factory=OutboxSection)
    agents: dict[str, AgentSection] = Field(default_factory=dict)
    transports: dict[str, dict[str, Any]] = Field(default_factory=dict)
    mirrors: list[str] = Field(default_factory=list)

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, value: dict[str, AgentSection]) -> dict[str, AgentSection]:
        for name in value:
            check_name(name)
        return value

    @model_validator(mode="after")
    def _agents_are_not_operators(self) -> GatewayConfig:
        """No name or identity may be both an agent's and an operator's: an agent could
        otherwise run operator commands."""
        operators = set(self.permissions.operators)
        for name, agent in self.agents.items():
            for i, identity in enumerate(agent.identities):
                if identity in operators:
                    raise ValueError(
                        f"agents.{name}.identities[{i}] and permissions.operators both list "
                        f"{identity!r}: an agent can not also be an operator"
                    )
        for transport, options in self.transports.items():
            agents = options.get("tokens")
            people = options.get("operator_tokens")
            if not isinstance(agents, dict):
                continue
            people = people if isinstance(people, dict) else {}
            by_key = {name_key(str(who)): who for who in agents}
            for who in people:
                if name_key(str(who)) in by_key:
                    raise ValueError(
                        f"transports.{transport}.tokens.{by_key[name_key(str(who))]} and "
                        f"transports.{transport}.operator_tokens.{who} name the same caller: "
                        "agents and operators need different names"
                    )
            for who in agents:
                if f"{transport}:{who}" in operators:
                    raise ValueError(
                        f"transports.{transport}.tokens.{who} is an agent token and "
                        f"permissions.operators lists its identity '{transport}:{who}'"
                    )
        return self

    @field_validator("mirrors")
    @classmethod
    def _mirrors(cls, value: list[str]) -> list[str]:
        for item in value:
            parse_address(item)
        return value

    def state_settings(self) -> StateSettings:
        """The ``state`` package's settings derived from ``[state]`` and ``[gateway]``."""
        s = self.state
        return StateSettings(
            redis_url=s.redis_url,
            namespace=s.namespace,
            data_dir=self.gateway.data_dir,
            timeouts={k.upper(): v for k, v in s.timeouts.items()},
            retention_seconds=s.retention_days * 86400,
            sweep_interval_seconds=s.sweep_interval_seconds,
            purge_interval_seconds=s.purge_interval_seconds,
            sweep_batch=s.sweep_batch,
            command_timeout_seconds=s.command_timeout_seconds,
        )

    def transport_kind(self, name: str) -> str:
        """A transport's kind: its ``kind`` key, else its table name."""
        return str(self.transports[name].get("kind", name))

    def transport_options(self, name: str) -> TransportOptions:
        """A transport's options without ``kind``/``enabled``/``required``; relative path
        options are relative to the config file's folder (`load_options`)."""
        return TransportOptions(
            {
                k: v
                for k, v in self.transports[name].items()
                if k not in ("kind", "enabled", "required")
            },
            self._config_dir,
        )

    def enabled_transports(self) -> list[str]:
        """Names of transports whose ``enabled`` is not false."""
        return [n for n, t in self.transports.items() if t.get("enabled", True) is not False]

    def required_transports(self) -> list[str]:
        """Enabled transports ``/healthz`` needs up: all but those with ``required = false``."""
        return [
            n for n in self.enabled_transports() if self.transports[n].get("required", True)
            is not False
        ]


def parse_address(text: str) -> Address:
    """Parse ``transport:channel`` or ``transport:channel#thread``."""
    transport, sep, rest = text.partition(":")
    if not sep or not transport or not rest:
        raise ConfigError(f"address {text!r} must look like 'transport:channel[#thread]'")
    channel, _, thread = rest.partition("#")
    if not channel:
        raise ConfigError(f"address {text!r} has no channel")
    return Address(transport, channel, thread or None)


def _resolve_env_refs(value: Any, path: str, environ: Mapping[str, str]) -> Any:
    """Replace ``"env:NAME"`` strings with the environment variable's value."""
    if isinstance(value, str) and value.startswith("env:"):
        var = value[4:]
        if var not in environ:
            raise ConfigError(f"{path}: environment variable {var} is not set")
        return environ[var]
    if isinstance(value, dict):
        return {k: _resolve_env_refs(v, f"{path}.{k}", environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env_refs(v, f"{path}[{i}]", environ) for i, v in enumerate(value)]
    return value


def _env_value(var: str, path: list[str], value: str) -> Any:
    """An override's value for the key at ``path``: list and table keys take JSON
    (``["http:admin"]``, ``{"request": 60}``), a list also comma-separated values
    (``http:admin,http:ops``); anything else stays a string for pydantic to convert."""
    target = field_type(GatewayConfig, path)
    origin = get_origin(target)
    if origin not in (list, dict):
        return value
    text = value.strip()
    if text.startswith(("[", "{")):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{var}: {'.'.join(path)} is not valid JSON: {exc}") from None
        if not isinstance(parsed, origin):
            want = "a list" if origin is list else "a table (JSON object)"
            raise ConfigError(f"{var}: {'.'.join(path)} must be {want}")
        return parsed
    if origin is list:
        return [item.strip() for item in text.split(",") if item.strip()]
    key = ".".join(path)
    raise ConfigError(f"{var}: {key} is a table: give a JSON object ({{...}})")


def _apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Apply ``BPGW_A__B=value`` as ``data[a][b] = value`` (see ``_env_value``)."""
    for var, value in environ.items():
        if not var.startswith(ENV_PREFIX) or "__" not in var:
            continue
        parts = [p.lower() for p in var[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            continue
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{var}: {'.'.join(parts)} does not name a table key")
            node = child
        node[parts[-1]] = _env_value(var, parts, value)


def _relative_to_file(data: dict[str, Any], folder: Path) -> None:
    """A relative ``[gateway] data_dir`` of a config file's configuration (the file or an
    override) is relative to the file's folder, not to wherever the gateway started."""
    gateway = data.get("gateway")
    if not isinstance(gateway, dict):
        return
    value = gateway.get("data_dir")
    if isinstance(value, str) and value:
        gateway["data_dir"] = str(folder / Path(value).expanduser())


def load_config(
    path: Path | None = None, *, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Load, override and validate the configuration; ``path=None`` means defaults only."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    _apply_env_overrides(data, env)
    data = _resolve_env_refs(data, "config", env)
    folder = None if path is None else Path(path).absolute().parent
    if folder is not None:
        _relative_to_file(data, folder)
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "", GatewayConfig)) from None
    config._config_dir = folder
    return config

"""Configuration: TOML, environment overrides, secrets by reference, clear errors."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from adapters.base import Address
from gateway.config import (
    AgentSection,
    ConfigError,
    GatewayConfig,
    GatewaySection,
    OutboxSection,
    PermissionsSection,
    PolicySection,
    StateSection,
    load_config,
    parse_address,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


def test_defaults_are_the_embedded_setup() -> None:
    config = load_config(None, environ={})
    assert config.state.redis_url == "embedded"
    assert config.policy.undeclared_agents == "tofu"
    assert config.policy.pair_budget_messages == 20
    settings = config.state_settings()
    assert settings.timeouts["REQUEST"] == 1800 and settings.timeouts["CLARIFY"] == 600
    assert settings.retention_seconds == 7 * 86400


def test_example_file_is_valid_and_documents_every_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert GatewayConfig.model_validate(tomllib.loads(text)) == load_config(None, environ={})
    sections = {
        "gateway": GatewaySection,
        "state": StateSection,
        "policy": PolicySection,
        "permissions": PermissionsSection,
        "outbox": OutboxSection,
        "agents.X": AgentSection,
    }
    for section, model in sections.items():
        for key in model.model_fields:
            # Documented as a live or commented-out `key = ...` line, or as its own table.
            documented = re.search(rf"^#? ?{key} = ", text, re.M) or re.search(
                rf"^\[{section}\.{key}\]", text, re.M
            )
            assert documented, f"[{section}] {key} undocumented"
    for key in (
        "host",
        "port",
        "max_body_bytes",
        "inbox_max",
        "inbox_max_bytes",
        "inbox_visibility_seconds",
        "long_poll_max_seconds",
        "long_poll_max_waiters",
    ):
        assert re.search(rf"^# {key} = ", text, re.M), f"[transports.http] {key} undocumented"
    assert re.search(r"^mirrors = ", text, re.M)


def test_file_env_override_and_secret_reference(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        '[state]\nnamespace = "prod"\n'
        '[transports.http]\nport = 9000\n[transports.http.tokens]\nLotbot = "env:LOT_TOKEN"\n'
    )
    env = {"LOT_TOKEN": "s3cret-token", "BPGW_STATE__REDIS_URL": "redis://127.0.0.1:6379/2"}
    config = load_config(path, environ=env)
    assert config.state.namespace == "prod"
    assert config.state.redis_url == "redis://127.0.0.1:6379/2"
    assert config.transport_options("http")["tokens"] == {"Lotbot": "s3cret-token"}
    assert config.transport_kind("http") == "http" and config.enabled_transports() == ["http"]


@pytest.mark.parametrize(
    ("toml", "env", "names"),
    [
        ('[policy]\nundeclared_agents = "sometimes"\n', {}, "policy.undeclared_agents"),
        ("[policy]\nbogus = 1\n", {}, "policy.bogus"),
        ('[transports.http.tokens]\nA = "env:NOPE"\n', {}, "config.transports.http.tokens.A"),
        ('[agents.Lotbot]\naddresses = ["nocolon"]\n', {}, "agents.Lotbot.addresses"),
        ('mirrors = ["discord"]\n', {}, "mirrors"),
        ("[state\n", {}, "not valid TOML"),
        ("", {"BPGW_POLICY__PAIR_BUDGET_MESSAGES": "lots"}, "policy.pair_budget_messages"),
        ('[state]\nredis_url = "localhost:6379"\n', {}, "state.redis_url"),
    ],
)
def test_bad_config_names_the_key(
    tmp_path: Path, toml: str, env: dict[str, str], names: str
) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=re.escape(names)):
        load_config(path, environ=env)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_addresses() -> None:
    assert parse_address("discord:123#456") == Address("discord", "123", "456")
    assert parse_address("ainet:Device-ABC/智能体A") == Address("ainet", "Device-ABC/智能体A")
    for bad in ("discord", ":x", "discord:", "discord:#t"):
        with pytest.raises(ConfigError):
            parse_address(bad)

"""Configuration: TOML, environment overrides, secrets by reference, clear errors."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from adapters.base import Address, create_adapter
from adapters.options import TransportOptions, load_options
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
        ('[state]\nredis_url = "redis://h:6379/abc"\n', {}, "state.redis_url: the database"),
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


# -- error wording (issue 8 item 9) and list-valued overrides (item 14) -------------------


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[gateway]\nlog_levle = "DEBUG"\n',
            "unknown key gateway.log_levle (did you mean log_level?)",
        ),
        ("[gatway]\nname = 'x'\n", "unknown key gatway (did you mean gateway?)"),
        ("[policy]\nzzz = 1\n", "unknown key policy.zzz (known: undeclared_agents,"),
        (
            '[agents.Bot]\nadress = ["chat:x"]\n',
            "unknown key agents.Bot.adress (did you mean addresses?)",
        ),
        (
            "[transports.api]\nkind = 'http'\nprot = 1\n",
            "unknown key transports.api.prot (did you mean port?)",
        ),
        (
            '[state]\nsweep_batch = "lots"\n',
            "state.sweep_batch: Input should be a valid integer, unable to parse string as "
            "an integer (got 'lots')",
        ),
        ("[outbox]\nmax_attempts = 0\n", "outbox.max_attempts: Input should be greater than"),
        ('[permissions]\noperators = "http:admin"\n', "permissions.operators: Input should be"),
        ("[state.timeouts]\nrequest = -1\n", "state.timeouts: request timeout must be positive"),
        ("[transports.api]\nkind = 'http'\nport = 70000\n", "transports.api.port: Input should"),
        ("[state\n", "is not valid TOML"),
        ('mirrors = ["nope"]\n', "mirrors: address 'nope' must look like"),
        (
            "[transports.htp]\nport = 1\n",
            "transports.htp.kind: unknown transport kind 'htp' (did you mean http?)",
        ),
    ],
)
async def test_config_errors_read_the_same(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        config = load_config(path, environ={})
        for name in config.enabled_transports():  # transport options are checked here
            create_adapter(config.transport_kind(name), name, config.transport_options(name))
    text = str(err.value)
    assert text.startswith("invalid configuration: "), text
    assert text.count("invalid configuration") == 1, text
    assert message in text, text
    assert "Extra inputs" not in text and "Value error" not in text


def test_an_unknown_transport_kind_lists_the_shipped_ones(tmp_path: Path) -> None:
    # The adapter packages are imported lazily: the list must not depend on which were.
    with pytest.raises(ConfigError) as err:
        create_adapter("zzzz", "x", {})
    known = str(err.value).split("(known: ", 1)[1].rstrip(")").split(", ")
    assert {"http", "discord", "telegram", "slack", "mq9", "ainet"} <= set(known), known


def test_a_token_is_never_echoed_in_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text("[transports.api]\nkind = 'http'\n[transports.api.tokens]\nbot = 'sh0rt'\n")
    config = load_config(path, environ={})
    with pytest.raises(ConfigError) as err:
        create_adapter("http", "api", config.transport_options("api"))
    assert "transports.api.tokens.bot" in str(err.value) and "sh0rt" not in str(err.value)


@pytest.mark.parametrize(
    "value", ['["http:admin", "http:ops"]', "http:admin,http:ops", " http:admin , http:ops ,"]
)
def test_list_settings_from_the_environment(value: str) -> None:
    config = load_config(None, environ={"BPGW_PERMISSIONS__OPERATORS": value})
    assert config.permissions.operators == ["http:admin", "http:ops"]


def test_table_and_agent_list_settings_from_the_environment() -> None:
    env = {
        "BPGW_STATE__TIMEOUTS": '{"request": 60}',
        "BPGW_AGENTS__BOT__ADDRESSES": "chat:a,chat:b#t",
        "BPGW_PERMISSIONS__READ": "[]",
        "BPGW_STATE__SWEEP_BATCH": "5",
    }
    config = load_config(None, environ=env)
    assert config.state.timeouts == {"request": 60.0}
    assert config.agents["bot"].addresses == ["chat:a", "chat:b#t"]
    assert config.permissions.read == [] and config.state.sweep_batch == 5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BPGW_PERMISSIONS__OPERATORS": '["http:admin"'}, "is not valid JSON"),
        ({"BPGW_PERMISSIONS__OPERATORS": '{"a": 1}'}, "permissions.operators must be a list"),
        ({"BPGW_STATE__TIMEOUTS": "request=60"}, "state.timeouts is a table"),
        ({"BPGW_GATEWAY__LOG_LEVLE": "DEBUG"}, "unknown key gateway.log_levle (did you mean"),
    ],
)
def test_bad_environment_overrides(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, environ=env)
    assert str(err.value).startswith("invalid configuration: ") and message in str(err.value)
def test_retired_loop_guard_keys_still_load_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old.toml"
    path.write_text(
        "[policy]\ndedupe_window_seconds = 600\nloop_guard_max_entries = 100000\n"
        "pair_budget_messages = 7\n"
    )
    logger = logging.getLogger("bpgw.gateway.config")
    logger.addHandler(caplog.handler)  # "bpgw" may not propagate once logging is configured
    try:
        config = load_config(path, environ={})
    finally:
        logger.removeHandler(caplog.handler)
    assert config.policy.pair_budget_messages == 7
    assert "dedupe_window_seconds is no longer used" in caplog.text
    assert "loop_guard_max_entries is no longer used" in caplog.text
    with pytest.raises(ConfigError, match=r"policy\.dedupe_window"):  # still typo-checked
        load_config(None, environ={"BPGW_POLICY__DEDUPE_WINDOW": "1"})


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "gw.toml"
    path.write_text(
        '[gateway]\ndata_dir = "data"\n'
        '[transports.share]\nkind = "memory"\nworkspace = "shared"\n'
    )
    config = load_config(path, environ={})
    assert config.gateway.data_dir == conf / "data"
    options = config.transport_options("share")
    assert options == {"workspace": "shared"} and options.config_dir == conf
    # An override of a file's key is part of that configuration: the same folder.
    env = {"BPGW_GATEWAY__DATA_DIR": "elsewhere"}
    assert load_config(path, environ=env).gateway.data_dir == conf / "elsewhere"
    # Without a file, relative paths stay relative to the current folder.
    assert load_config(None, environ=env).gateway.data_dir == Path("elsewhere")


def test_load_options_resolves_path_options_against_the_config_folder() -> None:
    class Folders(BaseModel):
        model_config = ConfigDict(extra="forbid")
        workspace: Path
        creds_file: Path | None = None
        name: str = "x"

    base = Path("/etc/bpgw")
    options = TransportOptions(
        {"workspace": "shared", "creds_file": "/abs/c.creds", "name": "shared"}, base
    )
    loaded = load_options(Folders, "t", options)
    assert loaded.workspace == base / "shared"
    assert loaded.creds_file == Path("/abs/c.creds") and loaded.name == "shared"
    assert load_options(Folders, "t", {"workspace": "rel"}).workspace == Path("rel")

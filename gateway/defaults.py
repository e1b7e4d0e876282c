"""The embedded-defaults setup ``bpgw run`` uses when no config file is given.

A local HTTP transport on 127.0.0.1:8780 with three demo agents (Lotbot, Mantis,
SecurityBot) and one operator (admin). Their bearer tokens are random, kept in
``<data_dir>/tokens.json`` (mode 0600) so they stay the same across restarts.

An AINET workspace (transport ``ainet``, docs/ainet.md) is served in
``<data_dir>/ainet``: AINET agents join by writing files there; the bridge's own agent
id and spool live in ``<data_dir>/ainet-state``.

An mq9 transport (``mq9``, docs/mq9.md) on an embedded NATS: a private nats-server with
JetStream in ``<data_dir>/nats`` and the mq9 service in the gateway, so any mq9 client can
reach the gateway's mailbox ``bpgw.gateway`` at the NATS URL ``bpgw run`` prints.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig

DEMO_AGENTS = ("Lotbot", "Mantis", "SecurityBot")
OPERATOR = "admin"
DEFAULT_HTTP_PORT = 8780
AINET_TRANSPORT = "ainet"


def ainet_options(data_dir: Path) -> dict[str, Any]:
    """The embedded AINET workspace: a local folder, polled twice a second."""
    return {
        "kind": "ainet",
        "workspace": str(data_dir / "ainet"),
        "create_workspace": True,
        "state_dir": str(data_dir / "ainet-state"),
        "discovery": "poll",
        "poll_interval_seconds": 0.5,
    }


MQ9_TRANSPORT = "mq9"


def mq9_options(data_dir: Path) -> dict[str, Any]:
    """The embedded mq9 transport: its own nats-server and mq9 service."""
    return {"kind": "mq9", "nats_url": "embedded", "data_dir": str(data_dir / "nats")}


def load_or_create_tokens(data_dir: Path, *, create: bool = True) -> dict[str, str]:
    """Tokens for the demo agents and the operator, created on first use (with
    ``create=False`` missing ones are made up and nothing is written: ``bpgw check``)."""
    path = data_dir / "tokens.json"
    wanted = [*DEMO_AGENTS, OPERATOR]
    tokens: dict[str, str] = {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            tokens = {str(k): str(v) for k, v in loaded.items() if isinstance(v, str) and v}
    except (OSError, ValueError):
        tokens = {}
    if all(name in tokens for name in wanted):
        return tokens
    for name in wanted:
        tokens.setdefault(name, secrets.token_urlsafe(24))
    if not create:
        return tokens
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(tokens, fh, indent=2)
    return tokens


def embedded_config(
    data_dir: Path = Path(".bpgw"),
    *,
    port: int = DEFAULT_HTTP_PORT,
    redis_url: str = "embedded",
    create: bool = True,
) -> tuple[GatewayConfig, dict[str, str]]:
    """The default configuration and the tokens it uses (``create``: as in
    `load_or_create_tokens`)."""
    tokens = load_or_create_tokens(data_dir, create=create)
    data: dict[str, Any] = {
        "gateway": {"data_dir": str(data_dir), "log_format": "text"},
        "state": {"redis_url": redis_url},
        "permissions": {"read": ["*"], "operators": [f"http:{OPERATOR}"]},
        "agents": {
            name: {"addresses": [f"http:{name}"], "identities": [f"http:{name}"]}
            for name in DEMO_AGENTS
        },
        "transports": {
            "http": {
                "kind": "http",
                "host": "127.0.0.1",
                "port": port,
                "tokens": {name: tokens[name] for name in DEMO_AGENTS},
                "operator_tokens": {OPERATOR: tokens[OPERATOR]},
            },
            AINET_TRANSPORT: ainet_options(data_dir),
            MQ9_TRANSPORT: mq9_options(data_dir),
        },
    }
    return GatewayConfig.model_validate(data), tokens

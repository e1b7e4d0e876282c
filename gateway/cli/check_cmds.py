"""``bpgw check``: is everything ``bpgw run`` needs ready? One table, exit 0 only if so."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from adapters.base import ConfigError as TransportConfigError
from adapters.base import Probe
from gateway.app import create_adapters
from gateway.check import check_all
from gateway.cli.run_cmds import add_run_options, gateway_config
from gateway.config import ConfigError


def _verdict(row: Probe) -> str:
    if not row.ok:
        return "FAIL"
    return "warn" if row.fix else "ok"


def _table(rows: Sequence[Probe]) -> str:
    """One line per check (verdict, check, detail) and the fix under it where there is one."""
    width = max(len(row.check) for row in rows)
    lines = []
    for row in rows:
        lines.append(f"{_verdict(row):<4}  {row.check:<{width}}  {row.detail}".rstrip())
        if row.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {row.fix}")
    return "\n".join(lines)


def _summary(rows: Sequence[Probe]) -> str:
    failed = sum(not row.ok for row in rows)
    warned = sum(row.ok and bool(row.fix) for row in rows)
    if failed:
        return f"not ready: {failed} check(s) failed"
    return "ready" + (f" ({warned} warning(s))" if warned else "")


def _to_dict(row: Probe) -> dict[str, Any]:
    return {"check": row.check, "status": _verdict(row), "detail": row.detail, "fix": row.fix}


def _config_fix(args: argparse.Namespace, problem: str) -> str:
    if args.config is not None and f"config file {args.config} " in problem:
        if "not valid TOML" in problem:
            return "correct the TOML syntax at the line named above"
        return "give --config the path of a readable config file (see config.example.toml)"
    return "correct the key named above (every key: config.example.toml)"


def _cmd_check(args: argparse.Namespace) -> int:
    source = str(args.config) if args.config else "the embedded defaults"
    try:
        config, _ = gateway_config(args, create=False)
        adapters = create_adapters(config)
    except (ConfigError, TransportConfigError) as exc:
        rows = [Probe("configuration", False, str(exc), _config_fix(args, str(exc)))]
    else:
        names = ", ".join(adapters) or "none"
        rows = [Probe("configuration", True, f"{source}: valid; transports: {names}")]
        rows += asyncio.run(check_all(config, adapters))
    if args.json:
        print(json.dumps({"ready": all(r.ok for r in rows), "checks": [_to_dict(r) for r in rows]},
                         indent=2))
    else:
        print(_table(rows))
        print(_summary(rows))
    sys.stdout.flush()
    return 0 if all(row.ok for row in rows) else 1


def register(sub: Any) -> None:
    """Add ``check``."""
    cmd = sub.add_parser(
        "check",
        help="check the configuration, state store and transports before bpgw run",
        description="Validate the configuration, connect to the state store (version, "
        "persistence, memory) and probe every enabled transport the way bpgw run will use "
        "it, without starting the gateway. Prints one table (ok, warn or FAIL, with the fix); "
        "exit status 0 when everything is ready, 1 when anything is not.",
    )
    add_run_options(cmd)
    cmd.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    cmd.set_defaults(handler=_cmd_check)

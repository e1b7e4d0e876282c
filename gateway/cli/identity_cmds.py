"""``bpgw identity list|show|reset|purge``: who may speak as which agent, and learned
(TOFU) bindings an operator can forget."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.agents import AgentDirectory
from gateway.cli.state_cmds import add_connection_options, with_directory
from gateway.commands import identity_fields


def _cmd_list(args: argparse.Namespace) -> int:
    async def body(directory: AgentDirectory) -> int:
        rows: list[dict[str, Any]] = [
            {
                "name": a.name,
                "kind": a.source,
                "identities": sorted(a.identities),
                "addresses": [str(x) for x in a.addresses],
            }
            for a in directory.declared_agents()
        ]
        for item in await directory.learned_page(args.offset, args.limit):
            rows.append(
                {
                    "name": item.name,
                    "kind": "learned",
                    "identities": [item.identity] if item.identity else [],
                    "addresses": [str(item.address)] if item.address else [],
                    "last_seen": item.last_seen,
                }
            )
        if args.json:
            print(json.dumps({"agents": rows, "learned": await directory.learned_count()}))
            return 0
        for row in rows:
            print(
                f"{row['name']}  {row['kind']}  identities: {', '.join(row['identities']) or '-'}"
                f"  addresses: {', '.join(row['addresses']) or '-'}"
            )
        print(f"learned names: {await directory.learned_count()}")
        return 0

    return with_directory(args, lambda directory, _store, _settings: body(directory))


def _cmd_show(args: argparse.Namespace) -> int:
    async def body(directory: AgentDirectory) -> int:
        fields = await identity_fields(directory, args.name)
        if args.json:
            print(json.dumps(dict(fields)))
        else:
            for key, value in fields:
                print(f"{key}: {value}")
        return 0

    return with_directory(args, lambda directory, _store, _settings: body(directory))


def _cmd_reset(args: argparse.Namespace) -> int:
    async def body(directory: AgentDirectory) -> int:
        try:
            had = await directory.reset(args.name)
        except ValueError as exc:
            print(f"bpgw: cannot reset {args.name}: {exc}", file=sys.stderr)
            return 2
        print(
            f"{args.name}: learned binding forgotten (running gateways drop their cached "
            "copy within 10 s)"
            if had
            else f"{args.name}: nothing learned to forget"
        )
        return 0

    return with_directory(args, lambda directory, _store, _settings: body(directory))


def _cmd_purge(args: argparse.Namespace) -> int:
    async def body(directory: AgentDirectory) -> int:
        adopted = await directory.adopt_unindexed()
        if adopted:
            print(f"{adopted} name(s) learned before last-use times were kept now get one")
        print(f"reclaimed {await directory.purge_idle(args.limit)} idle learned name(s)")
        return 0

    return with_directory(args, lambda directory, _store, _settings: body(directory))


def register(sub: Any) -> None:
    """Add ``identity`` with its sub-commands."""
    identity = sub.add_parser("identity", help="show and reset who may speak as an agent")
    actions = identity.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="declared, token and learned agents")
    listing.add_argument("--offset", type=int, default=0, help="learned names to skip")
    listing.add_argument("--limit", type=int, default=100, help="learned names to show")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.set_defaults(handler=_cmd_list)
    show = actions.add_parser("show", help="who may speak as NAME, and what was learned")
    show.add_argument("name", metavar="NAME", help="agent name")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=_cmd_show)
    reset = actions.add_parser("reset", help="forget NAME's learned (TOFU) binding and address")
    reset.add_argument("name", metavar="NAME", help="agent name")
    reset.set_defaults(handler=_cmd_reset)
    purge = actions.add_parser("purge", help="reclaim names idle past learned_name_idle_days")
    purge.add_argument("--limit", type=int, default=10_000, metavar="N",
                       help="most names to reclaim in this run (default 10000)")
    purge.set_defaults(handler=_cmd_purge)
    for parser in (listing, show, reset, purge):
        add_connection_options(parser)

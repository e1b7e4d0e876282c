"""`bpgw outbox list|retry|drop`: the outbox's queues and dead letters, from any shell.

The same ``CommandResult`` as the ``/protocol outbox`` operator command. A running
gateway picks re-queued messages up within a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.cli.state_cmds import add_connection_options, with_store
from gateway.outbox import Outbox
from gateway.outbox_commands import outbox_command
from state.settings import StateSettings
from state.store import ConversationStore


def cmd_outbox(args: argparse.Namespace) -> int:
    """Run one outbox action and print its result (exit 1 when it did nothing asked)."""
    words = [args.action, *args.ids]
    if args.dest:
        words += ["--dest", args.dest]

    async def body(store: ConversationStore, settings: StateSettings) -> int:
        result = await outbox_command(Outbox(store.redis, settings.namespace), words)
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            print(result.to_text())
        return 0 if result.ok else 1

    if args.action in ("retry", "drop") and not args.ids:
        print(f"bpgw outbox {args.action}: give dead-letter ids or 'all'", file=sys.stderr)
        return 2
    return with_store(args, body)


def register(sub: Any) -> None:
    """Add `outbox` to the `bpgw` parser."""
    cmd = sub.add_parser(
        "outbox", help="outbox depth and dead letters: list, re-send (retry) or discard (drop)"
    )
    cmd.add_argument("action", nargs="?", default="list", choices=("list", "retry", "drop"),
                     help="list (default), retry: re-send dead letters, drop: discard them")
    cmd.add_argument("ids", nargs="*", metavar="ID",
                     help="dead-letter ids from `list`, or 'all' (retry, drop); "
                     "for list: a destination to show only")
    cmd.add_argument("--dest", default=None,
                     help="only dead letters of this destination (e.g. http:Mantis)")
    cmd.add_argument("--json", action="store_true", help="print the result as JSON")
    add_connection_options(cmd)
    cmd.set_defaults(handler=cmd_outbox)

"""The ``bpgw`` command line: one sub-command module per area, each with ``register``.

A command imports only the module that registers it: an agent that runs ``bpgw build``
or ``bpgw parse`` once per message should not wait for the gateway's imports (Redis,
aiohttp, NATS). ``bpgw --help`` and anything unknown register every module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

MODULES = (
    "protocol_cmds",
    "state_cmds",
    "identity_cmds",
    "run_cmds",
    "check_cmds",
    "mq9_cmds",
    "outbox_cmds",
)
"""Every module of ``gateway.cli`` that registers commands, in help order."""

COMMAND_MODULES = {
    **dict.fromkeys(("parse", "build", "reply", "keygen", "sign", "verify"), "protocol_cmds"),
    **dict.fromkeys(("status", "show", "sweep"), "state_cmds"),
    "identity": "identity_cmds",
    "run": "run_cmds",
    "demo": "run_cmds",
    "check": "check_cmds",
    "mq9": "mq9_cmds",
    "outbox": "outbox_cmds",
}
"""Which module registers each command (a test checks it against the modules)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: with ``command``'s module only when it is known, else with
    every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="bpgw", description="bot-protocol gateway: parse, track, enforce and relay."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    known = COMMAND_MODULES.get(command or "")
    for name in (known,) if known else MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bpgw`` console script; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    handler = args.handler
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except UnicodeEncodeError as exc:
        # Arguments arrive through os.fsdecode: bytes that are not UTF-8 become lone
        # surrogates, which nothing the commands talk to (Redis, NATS, JSON) can carry.
        # (File paths never get here: the os functions take them back as bytes.)
        bad = exc.object[exc.start : exc.end]
        if not isinstance(bad, str) or not all("\ud800" <= c <= "\udfff" for c in bad):
            raise
        print(f"bpgw: an argument is not valid UTF-8 (it holds the bytes "
              f"{os.fsencode(bad)!r})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

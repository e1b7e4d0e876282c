"""The ``bpgw`` command line: one sub-command module per area, each with ``register``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import (
    check_cmds,
    identity_cmds,
    mq9_cmds,
    outbox_cmds,
    protocol_cmds,
    run_cmds,
    state_cmds,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="bpgw", description="bot-protocol gateway: parse, track, enforce and relay."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        protocol_cmds, state_cmds, identity_cmds, run_cmds, check_cmds, mq9_cmds, outbox_cmds
    ):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bpgw`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""`bpgw status`, `bpgw show` and `bpgw sweep`: operator views of conversation state."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from adapters.base import CommandResult
from adapters.base import ConfigError as TransportConfigError
from gateway.agents import AgentDirectory
from gateway.app import create_adapters
from gateway.commands import conversation_result
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.conversation_view import conversation_to_dict
from gateway.notices import format_duration
from gateway.outbox import Outbox
from gateway.outbox_commands import outbox_status
from protocol.names import name_key
from state.connection import (
    EMBEDDED,
    BadRedisURL,
    RedisHandle,
    embedded_folder,
    open_redis,
    shown_url,
)
from state.records import Conversation
from state.settings import StateSettings
from state.store import ConversationStore
from state.sweeper import Sweeper


def cli_environ(args: argparse.Namespace) -> dict[str, str]:
    """The environment plus --redis-url, --namespace and --data-dir as ``BPGW_*``
    overrides: a value given on the command line is checked, and reported when wrong,
    exactly like the same key in a config file or the environment."""
    data_dir = getattr(args, "data_dir", None)
    explicit = {
        "BPGW_STATE__REDIS_URL": getattr(args, "redis_url", None),
        "BPGW_STATE__NAMESPACE": getattr(args, "namespace", None),
        # A path on the command line is relative to the current folder (a config's are
        # relative to the config file's).
        "BPGW_GATEWAY__DATA_DIR": None if data_dir is None else Path(data_dir).absolute(),
    }
    return {**os.environ, **{k: str(v) for k, v in explicit.items() if v is not None}}


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The configuration as the gateway would use it: the config file (or defaults),
    ``BPGW_*`` environment overrides, then the command line's options."""
    return load_config(getattr(args, "config", None), environ=cli_environ(args))


def settings_from_args(args: argparse.Namespace) -> StateSettings:
    """State settings of `config_from_args`."""
    return config_from_args(args).state_settings()


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """Add --config, --redis-url, --namespace and --data-dir (where the state lives)."""
    parser.add_argument("--config", type=Path, default=None,
                        help="gateway config file (TOML); its [state] section is used")
    parser.add_argument("--redis-url", default=None,
                        help="redis://host:port/db or 'embedded' (default: from the config, "
                        "env BPGW_STATE__REDIS_URL, else embedded)")
    parser.add_argument("--namespace", default=None,
                        help="key namespace (default: from the config, else bpgw)")
    parser.add_argument("--data-dir", default=None,
                        help="data folder of the embedded Valkey (default: [gateway] data_dir "
                        "of the config, else ./.bpgw)")


def missing_embedded_store(settings: StateSettings) -> str | None:
    """Why there is nothing to read, when the state is the embedded Valkey and its data
    folder does not exist; None otherwise. Read commands say this instead of creating an
    empty store in whatever folder they were run from."""
    if settings.redis_url != EMBEDDED:
        return None
    data_dir = Path(settings.data_dir)
    if embedded_folder(data_dir).exists():
        return None
    return (f"no state to read: the state store is the embedded Valkey of data folder "
            f"{data_dir.absolute()}, which holds no data (no gateway has run with it), so "
            "there is nothing to show. Point at the gateway's state with --config FILE, "
            "--redis-url URL or --data-dir DIR.")


def with_redis(settings: StateSettings,
               body: Callable[[RedisHandle], Awaitable[int]]) -> int:
    """Open the state store of ``settings``, run ``body`` and close it; exit status 1
    with one line when the store is missing or can not be used."""
    missing = missing_embedded_store(settings)
    if missing is not None:
        print(f"bpgw: {missing}", file=sys.stderr)
        return 1

    async def run() -> int:
        handle = await open_redis(settings)
        try:
            return await body(handle)
        finally:
            await handle.close()

    try:
        return asyncio.run(run())
    except BrokenPipeError:
        raise  # the reader went away (`| head`): not a state store problem
    except (RedisError, OSError, BadRedisURL) as exc:
        print(f"bpgw: cannot use the state store, {store_name(settings)}: {exc}",
              file=sys.stderr)
        return 1


def store_name(settings: StateSettings) -> str:
    """Which state store ``settings`` name, as a person would say it."""
    if settings.redis_url == EMBEDDED:
        return f"the embedded Valkey of data folder {Path(settings.data_dir).absolute()}"
    return shown_url(settings.redis_url)


def with_store(args: argparse.Namespace,
               body: Callable[[ConversationStore, StateSettings], Awaitable[int]]) -> int:
    """Run ``body`` on the conversation store the command line names (see `with_redis`)."""
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"bpgw: {exc}", file=sys.stderr)
        return 2
    return with_redis(settings, lambda handle: body(ConversationStore(handle.client, settings),
                                                    settings))


def with_directory(
    args: argparse.Namespace,
    body: Callable[[AgentDirectory, ConversationStore, StateSettings], Awaitable[int]],
) -> int:
    """Run ``body`` on the agent directory and the conversation store of the gateway the
    command line names, as the gateway builds it: declared agents, names that transport
    credentials own, learned names in Redis. Exit status 2 for a bad configuration."""
    try:
        config = config_from_args(args)
        # Creating an adapter connects nothing: it only names what its credentials own.
        owned = [
            item for adapter in create_adapters(config).values() for item in adapter.owned_names()
        ]
    except (ConfigError, TransportConfigError) as exc:
        print(f"bpgw: {exc}", file=sys.stderr)
        return 2
    settings = config.state_settings()
    prefix = "{" + settings.namespace + "}"
    return with_redis(settings, lambda handle: body(
        AgentDirectory(config, handle.client, prefix, owned),
        ConversationStore(handle.client, settings), settings))


def _summary(conv: Conversation, now: float) -> dict[str, Any]:
    return {"request_id": conv.request_id, "status": str(conv.status),
            "owes_reply": conv.owes_reply, "requester": conv.requester,
            "age_seconds": round(conv.age(now), 1), "deadline": conv.deadline,
            "task": conv.task}


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_status(args: argparse.Namespace) -> int:
    """Counts by status, outbox depth and dead letters, the oldest open conversations and
    the load per agent (each agent as declared or learned)."""
    async def body(directory: AgentDirectory, store: ConversationStore,
                   settings: StateSettings) -> int:
        now = time.time()
        counts = await store.counts()
        oldest = [_summary(c, now) for c in await store.oldest_open(args.limit)]
        by_key = await store.load_by_agent(args.limit)
        owing = {name_key(str(row["owes_reply"])) for row in oldest}
        shown = await directory.display_names(list(by_key.keys() | owing))
        load = {shown[k]: n for k, n in by_key.items()}
        outbox = Outbox(store.redis, settings.namespace)
        if args.json:
            _print_json({"counts": counts, "oldest_open": oldest, "load_by_agent": load,
                         "outbox": await outbox.stats()})
            return 0
        print(f"state: {store_name(settings)}, namespace {settings.namespace!r}")
        print("conversations: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if not any(counts.values()):
            # Often the wrong store or namespace rather than an idle gateway: say so.
            print("  (no conversations in this store and namespace; if the gateway uses "
                  "another, point at it with --config FILE, --redis-url URL, --namespace NS "
                  "or --data-dir DIR)")
        for name, line in await outbox_status(outbox):
            print(f"{name}: {line}")
        print(_table("oldest open", ("RequestId", "status", "opened", "waiting on", "due", "task"),
                     [(row["request_id"], row["status"],
                       f"{format_duration(row['age_seconds'])} ago",
                       shown[name_key(str(row["owes_reply"]))],
                       _due(row["deadline"], now), row["task"] or "-") for row in oldest]))
        print(_table("open load by agent", ("agent", "owes replies"),
                     [(agent, str(n)) for agent, n in load.items()]))
        return 0

    return with_directory(args, body)


def _due(deadline: float | None, now: float) -> str:
    if deadline is None:
        return "-"
    if deadline > now:
        return f"in {format_duration(deadline - now)}"
    return f"overdue by {format_duration(now - deadline)}"


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """``title:`` and its rows in aligned columns under a header, indented; ``title: none``
    without rows."""
    if not rows:
        return f"{title}: none"
    text = CommandResult(title=f"{title}:", columns=columns, rows=tuple(rows)).to_text()
    return text.replace("\n", "\n  ")


def cmd_show(args: argparse.Namespace) -> int:
    """One conversation with its whole history."""
    async def body(store: ConversationStore, _: StateSettings) -> int:
        conv = await store.get(args.request_id)
        if conv is None:
            print(f"no conversation {args.request_id} is known")
            return 1
        if args.json:
            _print_json(conversation_to_dict(conv))
            return 0
        print(conversation_result(conv, time.time(), local_times=True).to_text())
        return 0

    return with_store(args, body)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run one timeout sweep and one purge now, printing the report."""
    async def body(store: ConversationStore, settings: StateSettings) -> int:
        async def report_timeout(conv: Conversation) -> None:
            print(f"timed out: {conv.request_id} (waiting on {conv.history[-1].to})")

        report = await Sweeper(store, report_timeout, settings).run_once()
        _print_json(asdict(report)) if args.json else print(
            f"claimed {report.claimed}, purged {report.purged}"
            + (f", error: {report.error}" if report.error else ""))
        return 1 if report.error else 0

    return with_store(args, body)


def register(sub: Any) -> None:
    """Add `status`, `show` and `sweep` to the `bpgw` parser."""
    status = sub.add_parser("status", help="conversation counts, oldest open, load per agent")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--limit", type=int, default=10, metavar="N",
                        help="oldest open conversations and busiest agents to list (default 10)")
    status.set_defaults(handler=cmd_status)
    show = sub.add_parser("show", help="one conversation with its whole history")
    show.add_argument("request_id", metavar="REQUEST_ID", help="the conversation's RequestId")
    show.add_argument("--json", action="store_true",
                      help="print the conversation as JSON, as GET /v1/conversations/ID "
                      "returns it (times in epoch seconds)")
    show.set_defaults(handler=cmd_show)
    sweep = sub.add_parser("sweep", help="time out due conversations and purge old ones")
    sweep.add_argument("--once", action="store_true", required=True,
                       help="run one sweep now (the gateway runs them on a schedule)")
    sweep.add_argument("--json", action="store_true", help="print the report as JSON")
    sweep.set_defaults(handler=cmd_sweep)
    for parser in (status, show, sweep):
        add_connection_options(parser)

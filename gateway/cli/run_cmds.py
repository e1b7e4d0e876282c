"""``bpgw run`` (the gateway) and ``bpgw demo`` (a gateway plus scripted agents)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from adapters.base import ConfigError as TransportConfigError
from adapters.delivery import through_cancel
from gateway.app import Gateway
from gateway.cli.state_cmds import config_from_args
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.defaults import (
    AINET_TRANSPORT,
    DEFAULT_HTTP_PORT,
    MQ9_TRANSPORT,
    OPERATOR,
    embedded_config,
)
from gateway.demo import DemoError, run_demo
from gateway.demo_ainet import FileAgent, with_auditor, workspace_of
from gateway.demo_mq9 import MQ9_AGENT, connect_mq9_agent, with_mq9_agent
from gateway.logs import configure_logging
from state.connection import EMBEDDED, BadRedisURL, embedded_folder, shown_url


def register(sub: Any) -> None:
    """Add ``run`` and ``demo``."""
    run = sub.add_parser("run", help="run the gateway (embedded defaults without --config)")
    add_run_options(run)
    run.set_defaults(handler=_cmd_run)
    demo = sub.add_parser("demo", help="run a gateway and three scripted agents end to end")
    demo.add_argument("--json", action="store_true", help="print the conversation as JSON")
    demo.set_defaults(handler=_cmd_demo)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """--config, --data-dir and --port: what ``run`` runs (``check`` checks the same)."""
    parser.add_argument(
        "--config", type=Path, help="TOML config file (see config.example.toml)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="data folder (embedded Valkey, demo tokens); overrides [gateway] data_dir "
        "(default: from the config, else ./.bpgw)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"HTTP port of the embedded defaults (default {DEFAULT_HTTP_PORT}); with --config "
        "set [transports.NAME] port instead",
    )


def gateway_config(
    args: argparse.Namespace, *, create: bool = True
) -> tuple[GatewayConfig, dict[str, str] | None]:
    """The configuration ``run`` uses, and the demo tokens when it is the embedded
    defaults (``create``: as in `embedded_config`)."""
    # The config file (or defaults), BPGW_* environment overrides, then --data-dir.
    config = config_from_args(args)
    if args.config is not None:
        if args.port is not None:
            raise ConfigError(
                "--port applies to the embedded defaults only: with --config, set the port "
                "in the config file ([transports.NAME] port)"
            )
        return config, None
    return embedded_config(
        config.gateway.data_dir,
        port=DEFAULT_HTTP_PORT if args.port is None else args.port,
        redis_url=config.state.redis_url,
        create=create,
    )


def describe_state(gateway: Gateway) -> str:
    """Where the gateway keeps its state, as an operator needs to find it again."""
    cfg = gateway.config
    if cfg.state.redis_url != EMBEDDED:
        return f"Redis at {shown_url(gateway.redis_url)} (namespace {cfg.state.namespace!r})"
    return (
        f"the embedded Valkey at {gateway.redis_url} (namespace {cfg.state.namespace!r}), "
        f"data in {embedded_folder(cfg.gateway.data_dir).absolute()}"
    )


def _print_banner(gateway: Gateway, tokens: dict[str, str] | None) -> None:
    cfg = gateway.config
    print(f"bpgw gateway '{cfg.gateway.name}' running (Ctrl-C to stop)")
    print(f"  state: {describe_state(gateway)}")
    for name, adapter in gateway.adapters.items():
        url = getattr(adapter, "url", None) or getattr(adapter, "location", None)
        print(f"  transport {name}: {url or adapter.health().state}")
    if not gateway.adapters:
        print("  no transport is enabled: add a [transports.NAME] table (config.example.toml)")
    if tokens is not None:
        http = gateway.adapters.get("http")
        base = getattr(http, "url", "http://127.0.0.1:8780")
        print("  demo agent tokens (kept in data folder tokens.json):")
        for name, token in tokens.items():
            role = "operator" if name == OPERATOR else "agent"
            print(f"    {role:8} {name:12} {token}")
        if AINET_TRANSPORT in gateway.adapters:
            print("  AINET agents: write message files in the workspace's session/ or tasks/ "
                  "folders; start a PRIVATE message with @Mantis to ask Mantis (docs/ainet.md)")
        print(f"  try: curl -s {base}/healthz")
        print(
            "       bpgw build request --from Lotbot --to Mantis --task 'check disk' | "
            f"curl -s -H 'Authorization: Bearer {tokens['Lotbot']}' "
            f"-H 'Content-Type: text/plain' --data-binary @- {base}/v1/messages"
        )
        print(
            f"       curl -s -H 'Authorization: Bearer {tokens['Mantis']}' "
            f"'{base}/v1/agents/Mantis/inbox?wait=5'"
        )
        mq9: Any = gateway.adapters.get(MQ9_TRANSPORT)
        if mq9 is not None:
            print(
                f"  mq9 agents: any mq9 client on {mq9.url} SENDs blocks to mailbox "
                f"{mq9.mailbox} with header mq9-reply-to:<its own mailbox> (docs/mq9.md)"
            )
    sys.stdout.flush()


GC_YOUNG_THRESHOLD = 20_000
"""Net allocations between young-generation collections once serving (Python's: 700)."""


async def _serve(config: GatewayConfig, tokens: dict[str, str] | None) -> int:
    gateway = Gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await gateway.start()
        # Everything built so far (modules, pydantic schemas, config) lives as long as
        # the process: out of the collector's generations, a full collection no longer
        # walks it, which per-message garbage otherwise triggers over and over.
        gc.freeze()
        # Cyclic garbage is rare on the hot path (refcounting frees the rest): collecting
        # the young generation every 700 allocations cost ~3% of the CPU for nothing.
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        _print_banner(gateway, tokens)
        await stop.wait()
        print("bpgw: shutting down", flush=True)
    finally:
        await gateway.stop()
    return 0


async def _cancelled_by_sigterm(main: Coroutine[Any, Any, int]) -> int:
    """Await ``main``; SIGTERM cancels it like Ctrl-C, so its cleanup (embedded servers,
    temporary folders) runs instead of the process dying with children left behind.
    ``main`` may install its own SIGTERM handler (``bpgw run`` stops gracefully)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await main
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed (fewer cycles per socket operation).

    Returns 143 (128 + SIGTERM) when a SIGTERM cancelled it.
    """
    try:
        import uvloop
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        try:
            return runner.run(_cancelled_by_sigterm(main))
        except asyncio.CancelledError:
            return 128 + signal.SIGTERM


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        config, tokens = gateway_config(args)
        configure_logging(config.gateway.log_level, config.gateway.log_format)
        return _run_loop(_serve(config, tokens))
    except (ConfigError, TransportConfigError) as exc:
        print(f"bpgw: {exc}", file=sys.stderr)
        return 2
    except (RedisError, BadRedisURL) as exc:
        print(f"bpgw: cannot use the state store: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bpgw: cannot start: {exc}", file=sys.stderr)
        return 1


async def _demo(as_json: bool) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="bpgw-demo-"))
    base = load_config(None)
    config, tokens = embedded_config(data_dir, port=0, redis_url=base.state.redis_url)
    config = config.model_copy(
        update={"state": config.state.model_copy(update={"namespace": f"demo-{data_dir.name}"})}
    )
    config = with_mq9_agent(with_auditor(config, AINET_TRANSPORT))
    gateway = Gateway(config)
    try:
        await gateway.start()
        url = str(getattr(gateway.adapters["http"], "url", ""))
        say = (lambda _line: None) if as_json else print
        say(f"gateway up at {url}")
        say(f"state in {describe_state(gateway)} (removed when the demo ends)")
        auditor = FileAgent(workspace_of(gateway.adapters[AINET_TRANSPORT]))
        await asyncio.to_thread(auditor.join)
        say(f"AINET agent {auditor.id} joined {auditor.root}")
        mq9_agent = await connect_mq9_agent(gateway)
        try:
            conv = await run_demo(url, tokens, tokens[OPERATOR], say,
                                  others={MQ9_AGENT: mq9_agent}, auditor=auditor)
        finally:
            await mq9_agent.close()
    finally:
        # A SIGTERM during the demo's shutdown must not leave its embedded servers running.
        await through_cancel(gateway.stop())
        with contextlib.suppress(OSError):
            shutil.rmtree(data_dir)
    if as_json:
        print(json.dumps(conv, indent=2, ensure_ascii=False))
        return 0
    print(f"\nconversation {conv['request_id']} as the gateway tracked it: {conv['status']}")
    for event in conv["history"]:
        print(
            f"  {event['type']:9} {event['sender']:>12} -> {event['to']:<12} "
            f"depth {event['depth_current']}/{event['depth_max']}  -> {event['status']:11} "
            f"{event['excerpt'][:50]}"
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    configure_logging("WARNING", "text")
    try:
        return _run_loop(_demo(args.json))
    except DemoError as exc:
        print(f"bpgw demo failed: {exc}", file=sys.stderr)
        return 1

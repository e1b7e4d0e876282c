"""``bpgw mq9 serve``: the mq9-compatible mailbox service on a stock NATS server."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from pydantic import ValidationError

from adapters.mq9 import ServiceSettings, start_service, stop_service
from gateway.logs import configure_logging

# Limits settable on the command line: option name -> settings field.
_LIMITS = (
    "max_payload_bytes", "max_mailboxes", "max_messages_per_mailbox", "max_mailbox_bytes",
    "max_delayed_messages", "max_delay_seconds", "max_agents", "max_agent_bytes",
    "max_groups_bytes", "max_fetch_messages", "max_wait_ms", "max_inflight",
)


def register(sub: Any) -> None:
    """Add ``mq9 serve``."""
    mq9 = sub.add_parser("mq9", help="mq9 mailboxes on NATS")
    mq9_sub = mq9.add_subparsers(dest="mq9_command", metavar="ACTION", required=True)
    serve = mq9_sub.add_parser(
        "serve", help="answer $mq9.AI.* requests from JetStream (run as many as you like)")
    serve.add_argument("--nats", required=True, metavar="URL",
                       help="NATS server with JetStream, e.g. nats://127.0.0.1:4222")
    fields = ServiceSettings.model_fields
    serve.add_argument("--namespace", default=fields["namespace"].default,
                       help="prefix of the service's streams and KV buckets (default mq9)")
    serve.add_argument("--queue-group", default=fields["queue_group"].default,
                       help="NATS queue group shared by the instances (default mq9)")
    serve.add_argument("--payload-encoding", choices=("text", "base64"), default="text",
                       help="payload in FETCH/QUERY replies (default text, as the broker)")
    serve.add_argument("--storage", choices=("file", "memory"), default="file",
                       help="JetStream storage of the streams (default file)")
    serve.add_argument("--replicas", type=int, default=1, help="stream replicas (default 1)")
    serve.add_argument("--sweep-interval", type=float, default=10.0, metavar="SECONDS",
                       help="how often expired mailboxes are deleted (default 10)")
    for name in _LIMITS:
        serve.add_argument("--" + name.replace("_", "-"), type=int,
                           default=fields[name].default,
                           help=f"{fields[name].description or 'limit'} "
                           f"(default {fields[name].default})")
    serve.set_defaults(handler=_cmd_serve)


def _settings(args: argparse.Namespace) -> ServiceSettings:
    return ServiceSettings(
        namespace=args.namespace, queue_group=args.queue_group,
        payload_encoding=args.payload_encoding, storage=args.storage, replicas=args.replicas,
        sweep_interval_seconds=args.sweep_interval,
        **{name: getattr(args, name) for name in _LIMITS})


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"bpgw mq9 serve: {'.'.join(map(str, first['loc']))}: {first['msg']}",
              file=sys.stderr)
        return 2
    configure_logging()
    return asyncio.run(_serve(args.nats, settings))


async def _serve(url: str, settings: ServiceSettings) -> int:
    try:
        service = await start_service(url, settings)
    except Exception as exc:  # any start failure is reported, not a traceback
        print(f"bpgw mq9 serve: cannot start on {url}: {exc}", file=sys.stderr)
        return 1
    print(f"mq9 service on {url} (namespace {settings.namespace!r}, queue group "
          f"{settings.queue_group!r}); Ctrl-C to stop", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await stop_service(service)
    return 0

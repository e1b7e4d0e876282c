"""Benchmark of the Telegram transport (issue #11); prints one JSON object per line.

The real python-telegram-bot against the Bot API emulator of the tests (127.0.0.1), a real
gateway on a private Valkey it starts itself (never the machine's Redis):

    python benchmarks/bench_telegram.py [--messages 300]

- ``telegram_inbound_requests_per_s``: REQUESTs another bot posts in a forum topic, long
  polled, committed (update offset and cursor advanced, 👍 queued) and relayed to a second
  transport, end to end; one chat is processed in order.
- ``telegram_backlog_requests_per_s``: the same for updates left pending while the gateway
  was down (none dropped at start), including the gateway's start and ``getMe``.
- ``telegram_outbound_posts_per_s``: 10,000-character RESPONSEs sent (HTML, the too-long
  block as a ``.txt`` document), in Bot API calls per second.
- ``telegram_render_us``: splitting one such RESPONSE at 4,096 UTF-16 code units and
  rendering its parts as HTML.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from _common import (
    emit,
    emit_outbound_posts,
    main_with_valkey,
    microseconds_per_call,
    repo_on_path,
)

repo_on_path(tests=True)

from adapters.base import Address  # noqa: E402
from adapters.chunking import split_message, utf16_len  # noqa: E402
from adapters.telegram.text import to_html  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from protocol import build_request, build_response, render  # noqa: E402

from gwkit import make_config, memory, wait_up  # noqa: E402
from harness_telegram import telegram_options  # noqa: E402
from telegram_emulator import OPS, TOPIC, USERS, TelegramEmulator  # noqa: E402


def gateway_config(emulator: TelegramEmulator, redis_url: str, data: Path) -> GatewayConfig:
    tg = {"kind": "telegram", **telegram_options(emulator, reactions=False)}
    peer = {"addresses": [f"tg:{OPS}#{TOPIC}"], "identities": [f"tg:{USERS['peer']['id']}"]}
    return make_config(
        redis_url, "bench-telegram", data,
        gateway={"data_dir": str(data), "name": "bpgw", "log_format": "text",
                 "log_level": "WARNING"},
        transports={"tg": tg}, agents={"Peer": peer},
        replicas={"lease_seconds": 2},
        policy={"pair_budget_messages": 100_000},  # one bot pair sends them all
    )


async def post_and_relay(gateway: Gateway | None, emulator: TelegramEmulator,
                         first: int, count: int) -> float:
    """Peer posts ``count`` REQUESTs; with a gateway, seconds until all are relayed."""
    started = time.perf_counter()
    for n in range(first, first + count):
        text = render(build_request(sender="Peer", to="Mantis", task=f"job {n}",
                                    request_id=f"peer-t{n}"))
        await emulator.post("peer", text, thread=TOPIC)
    if gateway is not None:
        await until_relayed(gateway, first + count)
    return time.perf_counter() - started


async def until_relayed(gateway: Gateway, total: int) -> None:
    side = memory(gateway, "side")
    async with asyncio.timeout(120):
        while len(side.sent) < total:
            await side.wait_sent(lambda o: True, timeout=120)


async def run(messages: int, valkey_url: str, data: Path) -> None:
    half = messages // 2
    async with TelegramEmulator() as emulator:
        gateway = Gateway(gateway_config(emulator, valkey_url, data))
        await gateway.start()
        try:
            await wait_up(gateway, "tg")
            took = await post_and_relay(gateway, emulator, 0, half)
            emit("telegram_inbound_requests_per_s", half / took, "msg/s", messages=half)

            body = "\n".join(f"row {i}: " + "z" * 90 for i in range(100))
            big = render(build_response(sender="Mantis", to="Peer", request_id="peer-t0",
                                        status="success", result=body))
            await emit_outbound_posts("telegram_outbound_posts_per_s", gateway.adapters["tg"],
                                      Address("tg", str(OPS), str(TOPIC)), big,
                                      max(5, messages // 20))
            render_us = microseconds_per_call(
                lambda: [to_html(p.text) for p in split_message(big, 4096, utf16_len)], 1000)
            emit("telegram_render_us", render_us, "us", chars=len(big))
        finally:
            await gateway.stop()

        await post_and_relay(None, emulator, half, messages - half)  # while it is down
        gateway = Gateway(gateway_config(emulator, valkey_url, data))
        started = time.perf_counter()
        await gateway.start()
        try:
            await until_relayed(gateway, messages - half)
            emit("telegram_backlog_requests_per_s", (messages - half) /
                 (time.perf_counter() - started), "msg/s", messages=messages - half,
                 note="includes gateway start and getMe")
        finally:
            await gateway.stop()


if __name__ == "__main__":
    main_with_valkey(__doc__ or "", "bpgw-bench-telegram-", run)

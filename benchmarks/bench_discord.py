"""Benchmark of the Discord transport (issue #10); prints one JSON object per line.

The real discord.py client against the Discord emulator of the tests (127.0.0.1), a real
gateway on a private Valkey it starts itself (never the machine's Redis):

    python benchmarks/bench_discord.py [--messages 300]

- ``discord_inbound_requests_per_s``: REQUESTs another bot posts in one channel, read
  from the gateway socket, committed (cursor advanced, ✅ queued) and relayed to a second
  transport, end to end. One channel is processed in order, one message at a time.
- ``discord_catch_up_requests_per_s``: the same messages read from channel history after
  a restart (posted while the gateway was down).
- ``discord_outbound_posts_per_s``: 6,000-character RESPONSEs posted (split into parts,
  the too-long block as a .txt attachment), in parts per second.
- ``discord_split_us``: splitting one such RESPONSE without breaking a block.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from _common import (
    emit,
    emit_outbound_posts,
    main_with_valkey,
    microseconds_per_call,
    repo_on_path,
)

repo_on_path(tests=True)

from adapters.base import Address  # noqa: E402
from adapters.chunking import split_message  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from protocol import build_request, build_response, render  # noqa: E402

from discord_emulator import DiscordEmulator  # noqa: E402
from gwkit import make_config, memory, wait_up  # noqa: E402
from harness_discord import discord_options  # noqa: E402


def config(emulator: DiscordEmulator, redis_url: str, data: Path) -> Any:
    return make_config(
        redis_url, "bench-discord", data,
        gateway={"data_dir": str(data), "name": "bpgw", "log_format": "text",
                 "log_level": "WARNING"},
        transports={"dc": {"kind": "discord", **discord_options(emulator)}},
        agents={"Peer": {"addresses": [f"dc:{emulator.channels['general']}"],
                         "identities": [f"dc:{emulator.uid('peer')}"]}},
        replicas={"lease_seconds": 2},
        policy={"pair_budget_messages": 100_000},  # one bot pair sends them all
    )


async def relayed(gateway: Gateway, count: int, timeout: float = 120.0) -> None:  # noqa: ASYNC109
    side = memory(gateway, "side")
    for _ in range(count):
        await side.wait_sent(lambda o: o.text.startswith("```\n[REQUEST"), timeout=timeout)


async def run(messages: int, valkey_url: str, data: Path) -> None:
    async with DiscordEmulator() as emulator:
        texts = [render(build_request(sender="Peer", to="Mantis", task=f"job {i}",
                                      request_id=f"peer-b{i}")) for i in range(messages)]
        gateway = Gateway(config(emulator, valkey_url, data))
        await gateway.start()
        try:
            await wait_up(gateway, "dc")
            start = time.perf_counter()
            for text in texts[: messages // 2]:
                await emulator.post("peer", text)
            await relayed(gateway, messages // 2)
            took = time.perf_counter() - start
            emit("discord_inbound_requests_per_s", (messages // 2) / took, "msg/s",
                 messages=messages // 2)

            body = "\n".join(f"row {i}: " + "z" * 90 for i in range(60))
            big = render(build_response(sender="Mantis", to="Peer", request_id="peer-b0",
                                        status="success", result=body))
            await emit_outbound_posts("discord_outbound_posts_per_s", gateway.adapters["dc"],
                                      Address("dc", str(emulator.channels["general"])), big,
                                      max(5, messages // 20))
            emit("discord_split_us", microseconds_per_call(lambda: split_message(big, 2000), 2000),
                 "us", chars=len(big))
        finally:
            await gateway.stop()

        for text in texts[messages // 2:]:
            await emulator.post("peer", text)  # while the gateway is down
        gateway = Gateway(config(emulator, valkey_url, data))
        start = time.perf_counter()
        await gateway.start()
        try:
            await relayed(gateway, messages - messages // 2)
            took = time.perf_counter() - start
            emit("discord_catch_up_requests_per_s", (messages - messages // 2) / took, "msg/s",
                 messages=messages - messages // 2, note="includes gateway start and login")
        finally:
            await gateway.stop()


if __name__ == "__main__":
    main_with_valkey(__doc__ or "", "bpgw-bench-discord-", run)

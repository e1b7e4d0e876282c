"""Metrics: this process's counters for ``GET /metrics``, and the shared violation counts.

Every gateway has a ``CollectorRegistry`` of its own (several gateways in one process,
as in tests, never clash). Counters and histograms count what this process did
(Prometheus sums the replicas); gauges of shared state (conversations by status, outbox
depth, dead letters) are read from Redis when scraped, at most once a second, in a
bounded number of commands. Label values that come from outside (destinations carry
agent and channel names) are capped: past ``max_destinations`` distinct values they
become ``other``, so hostile names cannot grow the series. Layout: docs/observability.md.

Violations are also counted in Redis in one small hash per minute (kind -> count,
expiring after the hour), so ``violations in the last hour`` in status covers every
replica and costs the same 60 reads however many violations a flood produced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from adapters.base import HealthState

log = logging.getLogger("bpgw.gateway.metrics")

MINUTE = 60
HOUR_MINUTES = 60
OTHER = "other"
"""The label value every destination past the cap is counted under."""
SCRAPE_MIN_SECONDS = 1.0
"""Scrapes closer together than this reuse the last reading of Redis."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
SWEEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class CappedLabel:
    """Passes label values through until ``cap`` distinct ones were seen; then ``other``.

    The first ``cap`` values keep their own series for the life of the process; totals
    stay exact because every value is counted somewhere.
    """

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._cap:
            self._seen.add(value)
            return value
        return OTHER


@dataclass
class Reading:
    """Shared state read from Redis (and the transports) for one scrape."""

    conversations: Mapping[str, int] = field(default_factory=dict)
    outbox: Mapping[str, Any] = field(default_factory=dict)
    transports: Mapping[str, HealthState] = field(default_factory=dict)
    # Numeric connection figures per transport (``Adapter.stats()``: latency, reconnects).
    transport_stats: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    dispatching: bool = False
    store_up: bool = True


def top_destinations(
    per_dest: Mapping[str, int], keep: int
) -> Iterator[tuple[str, str, int]]:
    """(transport, destination label, value): the ``keep`` largest by name, the rest
    summed per transport under ``other``."""
    ranked = sorted(per_dest.items(), key=lambda kv: (-kv[1], kv[0]))
    rest: Counter[str] = Counter()
    for i, (dest, n) in enumerate(ranked):
        transport = dest.partition(":")[0]
        if i < keep:
            yield transport, dest, n
        else:
            rest[transport] += n
    for transport, n in sorted(rest.items()):
        yield transport, OTHER, n


def _gauge(
    name: str, doc: str, rows: Iterable[tuple[Sequence[str], float]],
    labels: Sequence[str] = (),
) -> GaugeMetricFamily:
    """One gauge family with a sample per ``(label values, value)`` row."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


class _SharedState(Collector):
    """Yields the gauges of the last ``Reading`` (no Redis access inside ``collect``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        r = self._metrics.reading
        keep = self._metrics.max_destinations
        yield _gauge("bpgw_state_store_up", "1 when the last scrape could read Redis",
                     [((), 1 if r.store_up else 0)])
        yield _gauge(
            "bpgw_conversations",
            "Conversations by status (live broadcasts and kept orphan ids too)",
            (((status,), n) for status, n in sorted(r.conversations.items())),
            labels=["status"],
        )
        out = r.outbox
        yield _gauge("bpgw_outbox_journal", "Outbox journal entries not dispatched yet",
                     [((), out.get("journal", 0))])
        for name, key, what in (
            ("bpgw_outbox_queued", "queued", "Deliveries waiting for a retry"),
            ("bpgw_outbox_dead_letters", "dead_letters", "Dead letters kept"),
        ):
            yield _gauge(
                name, f"{what}, per destination (the largest; the rest as other)",
                (((transport, dest), n)
                 for transport, dest, n in top_destinations(out.get(key, {}), keep)),
                labels=["transport", "destination"],
            )
        blocked = Counter(d.partition(":")[0] for d in out.get("blocked", {}))
        yield _gauge(
            "bpgw_outbox_blocked_destinations",
            "Destinations currently failing (deliveries queued behind a failure)",
            (((transport,), n) for transport, n in sorted(blocked.items())),
            labels=["transport"],
        )
        yield _gauge("bpgw_outbox_dispatching",
                     "1 when this replica holds the outbox dispatch lease",
                     [((), 1 if r.dispatching else 0)])
        yield _gauge(
            "bpgw_transport_state",
            "1 for each transport's current state, 0 for the others",
            (((transport, str(s)), 1 if s is state else 0)
             for transport, state in sorted(r.transports.items()) for s in HealthState),
            labels=["transport", "state"],
        )
        yield _gauge(
            "bpgw_transport_stat",
            "Connection figures transports report (latency_ms, reconnects, resumes, ...)",
            (((transport, stat), value)
             for transport, figures in sorted(r.transport_stats.items())
             for stat, value in sorted(figures.items())),
            labels=["transport", "stat"],
        )


class Metrics:
    """This process's instruments, the scrape, and the shared violation counts."""

    def __init__(
        self, redis: aioredis.Redis, key_prefix: str, *, max_destinations: int = 50
    ) -> None:
        self._redis = redis
        self._prefix = f"{key_prefix}:gw:violations:"
        self.outcomes: Counter[str] = Counter()
        self.violations_by_kind: Counter[str] = Counter()
        self.started_at = time.time()
        self.max_destinations = max_destinations
        self._destination = CappedLabel(max_destinations)
        self.reading = Reading()
        self._read_at = 0.0
        self._scrape_lock = asyncio.Lock()
        # Label children by (metric, labels); only bounded label sets go through it.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # Increments of the per-message counters not yet added to their children, by
        # (metric, labels): a dict update per message instead of the library's locked
        # increment, added in (``fold``) when scraped. Bounded like ``_children``.
        self._pending: Counter[tuple[Any, tuple[str, ...]]] = Counter()
        r = self.registry = CollectorRegistry(auto_describe=True)
        dest = ["transport", "destination"]
        self._in = PromCounter(
            "bpgw_messages_in", "Inbound messages by transport and type (protocol type, "
            "command, chat, malformed, echo)", ["transport", "type"], registry=r)
        self._out = PromCounter(
            "bpgw_messages_out", "Deliveries sent by transport and kind",
            ["transport", "kind"], registry=r)
        self._dispositions = PromCounter(
            "bpgw_dispositions", "Inbound envelopes by outcome", ["outcome"], registry=r)
        self._parse_errors = PromCounter(
            "bpgw_parse_errors", "Protocol parse errors by code", ["code"], registry=r)
        self._violations = PromCounter(
            "bpgw_violations", "Protocol violations by kind", ["kind"], registry=r)
        self._retries = PromCounter(
            "bpgw_outbox_retries", "Failed delivery attempts that will be retried",
            dest, registry=r)
        self._dead = PromCounter(
            "bpgw_outbox_dead_lettered", "Deliveries dead-lettered", dest, registry=r)
        self._latency = Histogram(
            "bpgw_delivery_latency_seconds", "From commit (journal entry) to delivered",
            ["transport"], buckets=LATENCY_BUCKETS, registry=r)
        self._sweep = Histogram(
            "bpgw_sweep_duration_seconds", "Duration of timeout sweeps and purges",
            ["job"], buckets=SWEEP_BUCKETS, registry=r)
        self._swept = PromCounter(
            "bpgw_sweep_items", "Conversations claimed as timed out (job=timeout) or "
            "purged (job=purge)", ["job"], registry=r)
        self._sweep_errors = PromCounter(
            "bpgw_sweep_errors", "Sweeps and purges that stopped on an error", ["job"],
            registry=r)
        r.register(_SharedState(self))

    # -- counting ------------------------------------------------------------------------

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: the hot path skips the library's checks."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count(self, outcome: str) -> None:
        """Count one envelope's outcome."""
        self.outcomes[outcome] += 1
        self._pending[(self._dispositions, (outcome,))] += 1

    def received(self, transport: str, kind: str) -> None:
        """Count one inbound message of ``kind`` (a protocol type, command, chat, ...)."""
        self._pending[(self._in, (transport, kind))] += 1

    def fold(self) -> None:
        """Add the counts ``count``, ``received`` and ``sent`` gathered since the last
        call to their Prometheus counters (``scrape`` does it first)."""
        pending, self._pending = self._pending, Counter()
        for (metric, labels), n in pending.items():
            self._child(metric, *labels).inc(n)

    def parse_errors(self, codes: Iterable[str]) -> None:
        """Count parse errors by code."""
        for code, n in Counter(codes).items():
            self._parse_errors.labels(code).inc(n)

    def sent(self, transport: str, kind: str, committed_at: float) -> None:
        """Count one delivery and its latency from the commit (epoch seconds)."""
        self._pending[(self._out, (transport, kind))] += 1
        self._child(self._latency, transport).observe(max(0.0, time.time() - committed_at))

    def retried(self, dest: str) -> None:
        """Count one failed attempt that will be retried."""
        self._retries.labels(dest.partition(":")[0], self._destination(dest)).inc()

    def dead_lettered(self, dest: str) -> None:
        """Count one dead-lettered delivery."""
        self._dead.labels(dest.partition(":")[0], self._destination(dest)).inc()

    def swept(self, job: str, items: int, seconds: float, error: str | None) -> None:
        """Record one sweep (``timeout``) or purge (``purge``) run."""
        self._sweep.labels(job).observe(seconds)
        self._swept.labels(job).inc(items)
        if error:
            self._sweep_errors.labels(job).inc()

    async def record_violation(self, kind: str) -> None:
        """Count one protocol violation (impersonation, signature, depth, loop, ...)."""
        self.violations_by_kind[kind] += 1
        self._violations.labels(kind).inc()
        key = f"{self._prefix}{int(time.time()) // MINUTE}"
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(key, kind, 1)
                pipe.expire(key, (HOUR_MINUTES + 1) * MINUTE)
                await pipe.execute()
        except RedisError as exc:  # a metrics write must never fail a message
            log.warning("could not record violation: %s", exc, extra={"reason": kind})

    # -- reading -------------------------------------------------------------------------

    async def scrape(self, read: Callable[[], Awaitable[Reading]]) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type.

        ``read`` gathers the shared state (keeping the last figures, with ``store_up``
        false, when Redis cannot be read); it runs at most once per
        ``SCRAPE_MIN_SECONDS``, and concurrent scrapes share one reading.
        """
        async with self._scrape_lock:
            now = time.monotonic()
            if now - self._read_at >= SCRAPE_MIN_SECONDS:
                self.reading = await read()
                self._read_at = now
            self.fold()
            return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def violations_last_hour(self) -> dict[str, int]:
        """Violations of the last hour across all replicas, by kind."""
        now_minute = int(time.time()) // MINUTE
        async with self._redis.pipeline(transaction=False) as pipe:
            for minute in range(now_minute - HOUR_MINUTES + 1, now_minute + 1):
                pipe.hgetall(f"{self._prefix}{minute}")
            buckets = await pipe.execute()
        counts: Counter[str] = Counter()
        for bucket in buckets:
            for kind, n in bucket.items():
                name = kind.decode() if isinstance(kind, bytes) else str(kind)
                counts[name] += int(n)
        return dict(counts)


def numeric_stats(stats: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of ``Adapter.stats()`` (booleans as 0/1; text and None left out)."""
    return {
        k: float(v) for k, v in stats.items()
        if isinstance(v, int | float) and not (isinstance(v, float) and v != v)
    }

"""The Gateway: wires config, Redis state, adapters, pipeline, commands and sweeps.

It is the ``GatewaySink`` every adapter talks to. Start order: state first (so nothing
is accepted before it can be tracked), then the sweeper, then the transports; stop in
reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

from redis.exceptions import RedisError

from adapters.base import (
    Adapter,
    CommandRequest,
    CommandResult,
    ConfigError,
    Cursors,
    Disposition,
    Envelope,
    HealthState,
    QueryError,
    Unavailable,
    create_adapter,
)
from gateway.agents import AgentDirectory
from gateway.commands import CancelNotice, Commands
from gateway.config import GatewayConfig
from gateway.conversation_view import conversation_to_dict
from gateway.dispatch import Dispatcher
from gateway.health import HealthProbe, Part
from gateway.leases import LeaseKeeper
from gateway.metrics import Metrics, Reading, numeric_stats
from gateway.notices import format_duration
from gateway.outbox import Outbox
from gateway.outbox_commands import outbox_status
from gateway.pipeline import Pipeline
from state.connection import RedisHandle, open_redis
from state.cursors import CursorStore
from state.inbound import Claim, InboundClaims
from state.leases import Lease
from state.store import ConversationStore
from state.sweeper import Sweeper

log = logging.getLogger("bpgw.gateway")

# How long an inbound claim stays "processing": longer than any pipeline run (commands
# answer within 30 s at most); a replica that dies mid-message frees it after this.
CLAIM_PROCESSING_SECONDS = 60.0
# How long a metrics scrape waits for the state store before answering from memory.
SCRAPE_READ_SECONDS = 2.0


@contextlib.contextmanager
def _store_answers() -> Iterator[None]:
    """Turn a state store that cannot answer into ``Unavailable`` (a 503, not a crash)."""
    try:
        yield
    except (RedisError, OSError, TimeoutError) as exc:
        raise Unavailable(f"the state store cannot answer now ({exc}); retry") from exc


def create_adapters(config: GatewayConfig) -> dict[str, Adapter]:
    """Every enabled transport's adapter (after importing ``[gateway] adapter_modules``,
    which register extra kinds); creating one connects nothing. Raises
    ``adapters.base.ConfigError`` for a bad transport table."""
    for module in config.gateway.adapter_modules:
        importlib.import_module(module)
    return {
        name: create_adapter(config.transport_kind(name), name, config.transport_options(name))
        for name in config.enabled_transports()
    }


class Gateway:
    """One running gateway process."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.adapters: dict[str, Adapter] = {}
        self._redis: RedisHandle | None = None
        self._store: ConversationStore | None = None
        self._pipeline: Pipeline | None = None
        self._directory: AgentDirectory | None = None
        self._sweeper: Sweeper | None = None
        self._metrics: Metrics | None = None
        self._claims: InboundClaims | None = None
        self._cursors: CursorStore | None = None
        self.leases: dict[str, LeaseKeeper] = {}
        # Names this process as a lease holder (unique across hosts, processes, restarts).
        self.replica_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._outbox: Outbox | None = None
        self._dispatcher: Dispatcher | None = None
        self._probe: HealthProbe | None = None
        self._started = asyncio.Event()
        # Transports started here (not lease-run ones): a failed start stops only these.
        self._running: list[str] = []

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Open state, create and start every enabled transport; return once running."""
        cfg = self.config
        settings = cfg.state_settings()
        # Create adapters first: a bad transport config fails before anything starts.
        self.adapters.update(create_adapters(cfg))
        self._hand_out_routes()
        self._redis = await open_redis(settings)
        try:
            await self._start_on(self._redis.client)
        except BaseException:
            # Whatever did start stops again, in order (sweeps before the store closes),
            # so a failed start leaves nothing running and logs nothing but its cause.
            await self.stop()
            raise

    def _hand_out_routes(self) -> None:
        """Give every transport's web routes (webhooks) to the transports serving them."""
        routes = [r for a in self.adapters.values() for r in a.web_routes()]
        if not routes:
            return
        servers = [a for a in self.adapters.values() if a.capabilities.web_server]
        if not servers:
            needing = ", ".join(sorted({r.transport for r in routes}))
            raise ConfigError(
                f"transports.{needing}: webhook mode needs an enabled transport that serves "
                "web routes (kind = \"http\"); add one or use polling"
            )
        for server in servers:
            server.serve_routes(routes)

    async def _start_on(self, redis: Any) -> None:
        cfg = self.config
        settings = cfg.state_settings()
        self._store = ConversationStore(redis, settings)
        await self._store.canonical_agent_indices()
        key_prefix = "{" + settings.namespace + "}"
        owned = [item for adapter in self.adapters.values() for item in adapter.owned_names()]
        directory = self._directory = AgentDirectory(cfg, redis, key_prefix, owned)
        self._metrics = Metrics(
            redis, key_prefix, max_destinations=cfg.gateway.metrics_max_destinations
        )
        self._claims = InboundClaims(
            redis,
            settings.namespace,
            processing_seconds=CLAIM_PROCESSING_SECONDS,
            done_seconds=cfg.replicas.inbound_dedupe_seconds,
        )
        self._cursors = CursorStore(redis, settings.namespace)
        outbox = self._outbox = Outbox(
            redis, settings.namespace, self.adapters, echo_ttl_seconds=cfg.outbox.echo_ttl_seconds
        )
        commands = Commands(
            cfg, self._store, directory, self._status_extras, self._on_cancel, outbox=outbox
        )
        self._pipeline = Pipeline(cfg, self._store, directory, outbox, self._metrics, commands)
        self._dispatcher = Dispatcher(
            outbox,
            self.adapters,
            cfg.outbox,
            on_dead_letter=self._pipeline.on_dead_letter,
            replica=self.replica_id,
            metrics=self._metrics,
        )
        self._sweeper = Sweeper(
            self._store, self._pipeline.on_timeout, settings, on_run=self._metrics.swept
        )
        self._probe = HealthProbe(
            redis, outbox.keys.journal, stall_seconds=cfg.outbox.stall_seconds
        )
        self._sweeper.start()
        for name, adapter in self.adapters.items():
            adapter.use_redis(redis, settings.namespace)
            if adapter.capabilities.single_connection:
                lease = Lease(
                    redis, settings.namespace, f"transport:{name}", self.replica_id,
                    cfg.replicas.lease_seconds,
                )
                self.leases[name] = LeaseKeeper(adapter, lease, self)
                continue
            self._running.append(name)  # stopped even if start fails half way
            await adapter.start(self)
            log.info("transport started", extra={"transport": name})
        await self._dispatcher.start()
        self._started.set()
        for keeper in self.leases.values():
            keeper.start()

    async def stop(self) -> None:
        """Stop the outbox, transports, sweeps and state; safe to call twice.

        Nothing is lost: what the outbox has not delivered stays journaled or queued in
        Redis for the next dispatcher.
        """
        if self._dispatcher is not None:
            await self._dispatcher.stop()
            self._dispatcher = None
        for keeper in self.leases.values():
            await keeper.stop()  # stops its adapter and frees the lease for another replica
        while self._running:
            name = self._running.pop()
            try:
                await self.adapters[name].stop()
            except Exception:
                log.exception("transport did not stop cleanly", extra={"transport": name})
        if self._sweeper is not None:
            await self._sweeper.stop()
            self._sweeper = None
        if self._redis is not None:
            await self._redis.close()
            self._redis = None
        self._started.clear()

    @property
    def store(self) -> ConversationStore:
        """The conversation store (after ``start``)."""
        if self._store is None:
            raise RuntimeError("gateway not started")
        return self._store

    @property
    def directory(self) -> AgentDirectory:
        """The agent directory (after ``start``)."""
        if self._directory is None:
            raise RuntimeError("gateway not started")
        return self._directory

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline (after ``start``)."""
        if self._pipeline is None:
            raise RuntimeError("gateway not started")
        return self._pipeline

    @property
    def redis_url(self) -> str:
        """The URL of the Redis the gateway uses (the embedded one's, when embedded)."""
        return self._redis.url if self._redis is not None else self.config.state.redis_url

    @property
    def outbox(self) -> Outbox:
        """The outbox (after ``start``): stats, dead letters."""
        if self._outbox is None:
            raise RuntimeError("gateway not started")
        return self._outbox

    async def sweep_once(self, now: float | None = None) -> None:
        """Run one timeout sweep now, as if the time were ``now`` (tests, operators)."""
        if self._sweeper is not None:
            await self._sweeper.run_once(now)
        await self.drain()

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109 - a plain bound
        """Wait until what was journaled so far is dispatched (delivered, queued or
        dead-lettered); False when this replica does not dispatch or it took too long."""
        if self._dispatcher is None:
            return False
        return await self._dispatcher.drain(timeout)

    # -- GatewaySink -------------------------------------------------------------------

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        """Adapters hand every inbound message here; returns once it is committed.

        A native message another replica already processed (or is processing) is not
        processed again. ``envelope.on_commit`` is awaited when the disposition says
        committed, before this returns.
        """
        if not self._fresh(envelope):
            (disposition,) = await self.on_envelopes([envelope])
            return disposition
        # No inbound claim to take or settle (the HTTP path): straight to the pipeline.
        # (Each await below is skipped when it has nothing to do: a coroutine made and
        # run per message costs more than the check.)
        if not self._started.is_set():
            await self._started.wait()
        disposition = await self._handle(envelope)
        if envelope.on_commit is not None:
            await self._committed(envelope, disposition)
        return disposition

    async def on_envelopes(self, envelopes: Sequence[Envelope], *, ordered: bool = True
                           ) -> list[Disposition]:
        """``on_envelope`` for a batch (a FETCH): their dispositions, in order.

        The inbound claims of the whole batch are taken, and settled, in one round trip
        each; one channel's envelopes run in order (an answer after its question), the
        channels side by side, so the state store batches their applies. ``ordered=False``:
        the envelopes need no order between them (an AINET round holds one file of each
        conversation, several from one agent), so all of them run side by side.
        """
        await self._started.wait()
        if not envelopes:
            return []
        claims = self._inbound_claims
        out: list[Disposition | None] = [None] * len(envelopes)
        try:
            keys = [await self._claim_key(e) for e in envelopes]
            found = iter(await claims.claim_many([k for k in keys if k is not None]))
        except Exception as exc:  # a store outage must not kill the adapter's task
            log.exception("inbound claims failed", extra={"transport": envelopes[0].transport})
            failed = Disposition("error", f"the gateway could not process this message: {exc}")
            return [failed] * len(envelopes)
        channels: dict[tuple[str, str] | int, list[int]] = {}
        for i, (envelope, key) in enumerate(zip(envelopes, keys, strict=True)):
            claim = next(found) if key is not None else Claim.NEW
            if claim is Claim.DONE:
                out[i] = Disposition("duplicate", "this native message was processed")
            elif claim is Claim.BUSY:
                keys[i] = None  # its holder settles it
                out[i] = Disposition("busy", "another replica is processing this message")
            else:
                group = (envelope.transport, envelope.channel) if ordered else i
                channels.setdefault(group, []).append(i)

        async def in_order(indexes: list[int]) -> None:
            for i in indexes:
                out[i] = await self._handle(envelopes[i])

        if len(channels) == 1:  # (one envelope, one channel: no task to run it in)
            await in_order(next(iter(channels.values())))
        else:
            await asyncio.gather(*(in_order(indexes) for indexes in channels.values()))
        handled = [i for indexes in channels.values() for i in indexes if keys[i] is not None]
        done = {i for i in handled if cast(Disposition, out[i]).committed}
        try:
            await claims.settle([cast(str, keys[i]) for i in handled if i in done],
                                [cast(str, keys[i]) for i in handled if i not in done])
        except Exception as exc:  # else a redelivery finds the claim busy until it expires
            log.exception("inbound claims failed", extra={"transport": envelopes[0].transport})
            for i in done:
                out[i] = Disposition("error", f"the gateway could not process this message: {exc}")
        dispositions = cast(list[Disposition], out)
        for envelope, disposition in zip(envelopes, dispositions, strict=True):
            await self._committed(envelope, disposition)
        return dispositions

    async def _handle(self, envelope: Envelope) -> Disposition:
        """The pipeline's disposition of ``envelope``; ``error`` when it failed."""
        try:
            return await self.pipeline.handle(envelope)
        except Exception as exc:  # a store outage must not kill the adapter's task
            log.exception(
                "pipeline failed",
                extra={"transport": envelope.transport, "native_id": envelope.native_id},
            )
            return Disposition("error", f"the gateway could not process this message: {exc}")

    def _fresh(self, envelope: Envelope) -> bool:
        """True when ``envelope``'s transport mints a new native id per delivery (a retry
        is a new message), so no inbound claim is needed."""
        adapter = self.adapters.get(envelope.transport)
        return adapter is not None and adapter.capabilities.fresh_native_ids

    async def _claim_key(self, envelope: Envelope) -> str | None:
        """The inbound claim of ``envelope``, or None when it needs none."""
        if self._fresh(envelope):
            return None
        if envelope.native_id is None or await self.pipeline.is_own(envelope):
            return None
        return self._inbound_claims.key(envelope.transport, envelope.channel, envelope.native_id)

    @staticmethod
    async def _committed(envelope: Envelope, disposition: Disposition) -> None:
        """Tell the transport the envelope is committed (its hook must not fail it)."""
        if envelope.on_commit is None or not disposition.committed:
            return
        try:
            await envelope.on_commit(disposition)
        except Exception:
            log.exception(
                "commit hook failed",
                extra={"transport": envelope.transport, "native_id": envelope.native_id},
            )

    @property
    def _inbound_claims(self) -> InboundClaims:
        if self._claims is None:
            raise RuntimeError("gateway not started")
        return self._claims

    def cursors(self, transport: str) -> Cursors:
        """The shared catch-up cursors of ``transport`` (after ``start``)."""
        if self._cursors is None:
            raise RuntimeError("gateway not started")
        return self._cursors.for_transport(transport)

    async def on_command(self, command: CommandRequest) -> CommandResult:
        """Adapters hand native slash commands here."""
        await self._started.wait()
        return await self.pipeline.command(command)

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """A filtered, paged list of conversations as JSON-ready dicts (filters as in
        ``ConversationStore.list``, any case); ``QueryError`` for an unknown status or a
        page past the bounds."""
        who = agent.lstrip("@") if agent else None
        with _store_answers():
            try:
                convs = await self.store.list(status=status, agent=who, offset=offset,
                                              limit=limit)
            except ValueError as exc:
                raise QueryError(str(exc)) from None
        return [conversation_to_dict(c) for c in convs]

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        """One conversation with its whole history, or None."""
        with _store_answers():
            conv = await self.store.get(request_id, with_history=True)
        return None if conv is None else conversation_to_dict(conv)

    async def deadlines(self, request_ids: Sequence[str]) -> list[float | None]:
        """The deadline of each conversation (None when none runs): ``DeadlineSource``."""
        with _store_answers():
            return await self.store.deadlines(request_ids)

    async def check_health(self) -> dict[str, Any]:
        """``health()`` after a fresh, time-bounded check of the store and the outbox."""
        if self._probe is not None and self._started.is_set():
            await self._probe.check()
        return self.health()

    def _store_part(self) -> Part:
        """The state store's part: the newer of the health check's and the sweeper's view.

        The sweeper touches Redis every few seconds, so between health checks its last
        run still tells whether the store answers.
        """
        report = self._sweeper.last_report if self._sweeper else None
        checked = self._probe.last if self._probe else None
        if checked is not None and (
            report is None or time.time() - report.at >= time.monotonic() - checked.at
        ):
            return checked.store
        if report is None:
            return Part("state_store", True, "unknown")
        if report.error:
            return Part("state_store", False, f"unreachable: {report.error}")
        return Part("state_store", True, "ok")

    def health_parts(self) -> list[Part]:
        """Everything the gateway needs, each ok or failing with why (``/healthz``).

        A required transport (every enabled one unless its table says ``required =
        false``) fails while it is down or still starting; a stalled outbox fails when its
        oldest undelivered message is older than ``[outbox] stall_seconds``.
        """
        parts = [Part("gateway", self._started.is_set(),
                      "running" if self._started.is_set() else "not started")]
        parts.append(self._store_part())
        required = set(self.config.required_transports())
        for name, adapter in self.adapters.items():
            health = adapter.health()
            need = name in required
            ok = not need or health.state not in (HealthState.DOWN, HealthState.STARTING)
            detail = f"{health.state}: {health.detail}" if health.detail else str(health.state)
            parts.append(Part(f"transport {name}", ok, detail + ("" if need else
                                                                  " (not required)")))
        checked = self._probe.last if self._probe else None
        parts.append(checked.outbox if checked else Part("outbox", True, "not checked yet"))
        return parts

    def health(self) -> dict[str, Any]:
        """Every part's state (``parts``, ``failing``), transports, sweeper and counters."""
        parts = self.health_parts()
        failing = [p.name for p in parts if not p.ok]
        transports = {
            name: {"state": str(a.health().state), "detail": a.health().detail, **a.stats()}
            for name, a in self.adapters.items()
        }
        report = self._sweeper.last_report if self._sweeper else None
        store = next(p for p in parts if p.name == "state_store")
        dispatcher = self._dispatcher
        outbox = {
            "dispatching_here": dispatcher is not None and dispatcher.holding,
            "error": None if dispatcher is None else dispatcher.last_error,
            "blocked": dict(self._outbox.blocked) if self._outbox else {},
        }
        return {
            "status": "degraded" if failing else "ok",
            "failing": failing,
            "parts": [p.to_dict() for p in parts],
            "state_store": store.detail,
            "transports": transports,
            "outbox": outbox,
            "last_sweep": None if report is None else dataclasses.asdict(report),
            "outcomes": dict(self._metrics.outcomes) if self._metrics else {},
        }

    async def metrics(self) -> tuple[bytes, str]:
        """This process's metrics in the Prometheus text format, and the content type."""
        if self._metrics is None:
            raise RuntimeError("gateway not started")
        return await self._metrics.scrape(self._reading)

    async def _reading(self) -> Reading:
        """Shared state for a scrape: a few bounded reads (docs/observability.md)."""
        assert self._metrics is not None
        dispatcher = self._dispatcher
        reading = Reading(
            transports={name: a.health().state for name, a in self.adapters.items()},
            transport_stats={
                name: figures for name, a in self.adapters.items()
                if (figures := numeric_stats(a.stats()))
            },
            dispatching=dispatcher is not None and dispatcher.holding,
        )
        try:
            async with asyncio.timeout(SCRAPE_READ_SECONDS):
                reading.conversations = await self.store.counts()
                reading.outbox = await self.outbox.stats()
        except (RedisError, OSError) as exc:  # the scrape still answers, from memory
            # (a frozen store: TimeoutError, an OSError, after SCRAPE_READ_SECONDS)
            log.warning("metrics: could not read the state store: %s", exc)
            last = self._metrics.reading
            reading.conversations, reading.outbox = last.conversations, last.outbox
            reading.store_up = False
        return reading

    # -- helpers for commands -------------------------------------------------------

    async def _status_extras(self) -> list[tuple[str, str]]:
        assert self._metrics is not None
        violations = await self._metrics.violations_last_hour()
        health = self.health()
        report = self._sweeper.last_report if self._sweeper else None
        if report is None:
            sweep = "not yet run"
        else:
            sweep = (
                f"{format_duration(time.time() - report.at)} ago, claimed {report.claimed}, "
                f"purged {report.purged}" + (f", error: {report.error}" if report.error else "")
            )
        return [
            (
                "violations (last hour)",
                ", ".join(f"{k}: {v}" for k, v in sorted(violations.items())) or "none",
            ),
            (
                "transports",
                ", ".join(f"{n}: {t['state']}" for n, t in health["transports"].items()) or "none",
            ),
            *(
                (f"transport {name}", ", ".join(f"{k}: {v}" for k, v in stats.items()))
                for name, a in self.adapters.items()
                if (stats := a.stats())
            ),
            ("last sweep", sweep),
            *await outbox_status(self.outbox),
        ]

    async def _on_cancel(self, notice: CancelNotice) -> None:
        await self.pipeline.on_cancel(notice)

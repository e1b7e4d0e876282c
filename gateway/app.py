"""The Gateway: wires config, Redis state, adapters, pipeline, commands and sweeps.

It is the ``GatewaySink`` every adapter talks to. Start order: state first (so nothing
is accepted before it can be tracked), then the sweeper, then the transports; stop in
reverse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from adapters.base import (
    Adapter,
    CommandRequest,
    CommandResult,
    Disposition,
    Envelope,
    HealthState,
    create_adapter,
)
from gateway.agents import AgentDirectory
from gateway.commands import CancelNotice, Commands
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.notices import format_duration
from gateway.outbox import Outbox
from gateway.pipeline import Pipeline
from state.connection import RedisHandle, open_redis
from state.records import Conversation
from state.store import ConversationStore
from state.sweeper import Sweeper

log = logging.getLogger("bpgw.gateway")


def conversation_to_dict(conv: Conversation) -> dict[str, Any]:
    """JSON-ready form of a conversation (enums as strings, history as a list)."""
    data = dataclasses.asdict(conv)
    data["status"] = str(conv.status)
    data["owes_reply"] = None if conv.is_terminal else conv.owes_reply
    return data


class Gateway:
    """One running gateway process."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.adapters: dict[str, Adapter] = {}
        self._redis: RedisHandle | None = None
        self._store: ConversationStore | None = None
        self._pipeline: Pipeline | None = None
        self._sweeper: Sweeper | None = None
        self._metrics: Metrics | None = None
        self._started = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Open state, create and start every enabled transport; return once running."""
        cfg = self.config
        settings = cfg.state_settings()
        # Create adapters first: a bad transport config fails before anything starts.
        for name in cfg.enabled_transports():
            self.adapters[name] = create_adapter(
                cfg.transport_kind(name), name, cfg.transport_options(name)
            )
        self._redis = await open_redis(settings)
        redis = self._redis.client
        self._store = ConversationStore(redis, settings)
        key_prefix = "{" + settings.namespace + "}"
        directory = AgentDirectory(cfg, redis, key_prefix)
        self._metrics = Metrics(redis, key_prefix)
        outbox = Outbox(self.adapters)
        commands = Commands(cfg, self._store, directory, self._status_extras, self._on_cancel)
        self._pipeline = Pipeline(cfg, self._store, directory, outbox, self._metrics, commands)
        self._sweeper = Sweeper(self._store, self._pipeline.on_timeout, settings)
        self._sweeper.start()
        for name, adapter in self.adapters.items():
            await adapter.start(self)
            log.info("transport started", extra={"transport": name})
        self._started.set()

    async def stop(self) -> None:
        """Stop transports, sweeps and state; safe to call twice."""
        for name, adapter in reversed(list(self.adapters.items())):
            try:
                await adapter.stop()
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
    def pipeline(self) -> Pipeline:
        """The pipeline (after ``start``)."""
        if self._pipeline is None:
            raise RuntimeError("gateway not started")
        return self._pipeline

    @property
    def redis_url(self) -> str:
        """The URL of the Redis the gateway uses (the embedded one's, when embedded)."""
        return self._redis.url if self._redis is not None else self.config.state.redis_url

    async def sweep_once(self, now: float | None = None) -> None:
        """Run one timeout sweep now, as if the time were ``now`` (tests, operators)."""
        if self._sweeper is not None:
            await self._sweeper.run_once(now)

    # -- GatewaySink -------------------------------------------------------------------

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        """Adapters hand every inbound message here."""
        await self._started.wait()
        try:
            return await self.pipeline.handle(envelope)
        except Exception as exc:  # a store outage must not kill the adapter's task
            log.exception(
                "pipeline failed",
                extra={"transport": envelope.transport, "native_id": envelope.native_id},
            )
            return Disposition("error", f"the gateway could not process this message: {exc}")

    async def on_command(self, command: CommandRequest) -> CommandResult:
        """Adapters hand native slash commands here."""
        await self._started.wait()
        return await self.pipeline.command(command)

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """A filtered, paged list of conversations as JSON-ready dicts."""
        convs = await self.store.list(status=status, agent=agent, offset=offset, limit=limit)
        return [conversation_to_dict(c) for c in convs]

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        """One conversation with its whole history, or None."""
        conv = await self.store.get(request_id, with_history=True)
        return None if conv is None else conversation_to_dict(conv)

    def health(self) -> dict[str, Any]:
        """Per-transport state, sweeper state and counters."""
        transports = {
            name: {"state": str(a.health().state), "detail": a.health().detail}
            for name, a in self.adapters.items()
        }
        report = self._sweeper.last_report if self._sweeper else None
        # The sweeper touches Redis every few seconds: its last run tells whether the
        # state store answers, without a round trip on every health check.
        if report is None:
            store = "unknown"
        elif report.error:
            store = f"unreachable: {report.error}"
        else:
            store = "ok"
        states = [a.health().state for a in self.adapters.values()]
        ok = (
            self._started.is_set()
            and all(s is HealthState.UP for s in states)
            and not store.startswith("unreachable")
        )
        return {
            "status": "ok" if ok else "degraded",
            "state_store": store,
            "transports": transports,
            "last_sweep": None if report is None else dataclasses.asdict(report),
            "outcomes": dict(self._metrics.outcomes) if self._metrics else {},
        }

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
            ("last sweep", sweep),
        ]

    async def _on_cancel(self, notice: CancelNotice) -> None:
        await self.pipeline.on_cancel(notice)

"""Periodic sweeps inside the gateway process: time out due conversations, purge old ones."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from state.records import Conversation
from state.settings import StateSettings
from state.store import ConversationStore

log = logging.getLogger(f"bpgw.{__name__}")

MAX_BATCHES_PER_SWEEP = 10
"""Claim batches one sweep may take before yielding to the next interval."""
NOTICE_GRACE_SECONDS = 10.0
"""How long after a claim its notices may still be on their way from the claiming replica;
older ones are owed by a replica that died, and any sweep posts them."""
STOP_WAIT_SECONDS = 10.0
"""How long ``stop`` lets a sweep or purge in progress finish before cancelling it."""


RunObserver = Callable[[str, int, float, "str | None"], None]
"""Told of each run: job (``timeout`` or ``purge``), items, seconds, error or None."""


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did; ``error`` says why it stopped early (Redis down, ...)."""

    claimed: int
    purged: int
    at: float
    error: str | None = None


class Sweeper:
    """Runs claim_due and purge_expired on an AsyncIOScheduler; never dies on errors.

    Each claimed conversation is passed to ``on_timeout`` (the gateway posts the
    notices). A failing callback is logged and does not stop the sweep; the claim left a
    mark (``ConversationStore.owed_notices``), so a later sweep on any replica calls it
    again.
    """

    def __init__(self, store: ConversationStore,
                 on_timeout: Callable[[Conversation], Awaitable[None]],
                 settings: StateSettings, *, on_run: RunObserver | None = None) -> None:
        self.store = store
        self.on_timeout = on_timeout
        self.settings = settings
        self.on_run = on_run
        self.last_report: SweepReport | None = None
        self._scheduler: Any = None
        # The sweep or purge in progress, per job. The scheduler only starts these tasks:
        # its executor cancels the jobs it runs when it shuts down (and logs each as
        # failed), so the work runs in tasks the sweeper owns and ``stop`` waits for.
        self._running: dict[str, asyncio.Task[SweepReport]] = {}

    def start(self) -> None:
        """Schedule the sweep and purge jobs on the running event loop."""
        scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
        options = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        # The first sweep runs at once: what fell due while no gateway ran is handled now.
        scheduler.add_job(self._launch, "interval", args=(self.sweep,),
                          seconds=self.settings.sweep_interval_seconds,
                          id="bpgw-sweep", next_run_time=datetime.now(UTC), **options)
        scheduler.add_job(self._launch, "interval", args=(self.purge,),
                          seconds=self.settings.purge_interval_seconds,
                          id="bpgw-purge", **options)
        scheduler.start()
        self._scheduler = scheduler

    async def _launch(self, job: Callable[[], Coroutine[Any, Any, SweepReport]]) -> None:
        """The scheduled job: start ``job`` unless its previous run is still going."""
        name = getattr(job, "__name__", "job")
        running = self._running.get(name)
        if self._scheduler is None or (running is not None and not running.done()):
            return
        self._running[name] = asyncio.create_task(job())

    async def stop(self) -> None:
        """Stop scheduling, then let a sweep or purge in progress finish (bounded), so
        whatever closes the store next does not cut one off half way."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        tasks = [t for t in self._running.values() if not t.done()]
        self._running.clear()
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def sweep(self, now: float | None = None) -> SweepReport:
        """Claim due conversations batch by batch and hand each to the callback."""
        at = time.time() if now is None else now

        async def step() -> int:
            batch = await self.store.claim_due(now=at, limit=self.settings.sweep_batch)
            for conv in batch:
                await self._notify(conv)
            return len(batch)

        claimed, error = await self._batches(step, "timeout")
        if error is None:
            error = await self._owed(at)
        return self._report(SweepReport(claimed=claimed, purged=0, at=at, error=error))

    async def _owed(self, at: float) -> str | None:
        """Post the notices of conversations claimed long enough ago that the replica
        which claimed them must have died before posting them (the callback posts them
        at most once, whoever gets there first)."""
        try:
            owed = await self.store.owed_notices(
                older_than=NOTICE_GRACE_SECONDS, now=at, limit=self.settings.sweep_batch)
            if owed:
                log.warning("posting the timeout notices of %d conversation(s) another sweep "
                            "claimed but did not post", len(owed))
            for conv in owed:
                await self._notify(conv)
        except Exception as exc:  # Redis outage: the marks stay for the next sweep
            return f"{type(exc).__name__}: {exc}"
        return None

    async def purge(self, now: float | None = None) -> SweepReport:
        """Remove terminal conversations older than the retention."""
        at = time.time() if now is None else now

        async def step() -> int:
            return await self.store.purge_expired(now=at, limit=self.settings.sweep_batch)

        purged, error = await self._batches(step, "purge")
        return self._report(SweepReport(claimed=0, purged=purged, at=at, error=error))

    async def _batches(self, step: Callable[[], Awaitable[int]], what: str
                       ) -> tuple[int, str | None]:
        """Run ``step`` until a short batch; a Redis outage is logged and reported.

        ``what`` (``timeout`` or ``purge``) names the run for ``on_run``.
        """
        done = 0
        error: str | None = None
        started = time.monotonic()
        try:
            for _ in range(MAX_BATCHES_PER_SWEEP):
                count = await step()
                done += count
                if count < self.settings.sweep_batch:
                    break
        except Exception as exc:  # Redis outage: log, report, retry next interval
            error = f"{type(exc).__name__}: {exc}"
            log.warning("%s run failed after %d items, will retry: %s", what, done, error)
        if self.on_run is not None:
            self.on_run(what, done, time.monotonic() - started, error)
        return done, error

    async def run_once(self, now: float | None = None) -> SweepReport:
        """One sweep and one purge, now; the combined report."""
        swept = await self.sweep(now)
        purged = await self.purge(now)
        report = SweepReport(claimed=swept.claimed, purged=purged.purged, at=swept.at,
                             error=swept.error or purged.error)
        return self._report(report)

    async def _notify(self, conv: Conversation) -> None:
        try:
            await self.on_timeout(conv)
        except Exception:
            log.exception("timeout callback failed for %s", conv.request_id,
                          extra={"request_id": conv.request_id, "trace_id": conv.trace_id})

    def _report(self, report: SweepReport) -> SweepReport:
        self.last_report = report
        return report

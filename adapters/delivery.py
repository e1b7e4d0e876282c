"""Delivery helpers shared by chat transports.

``PartialSends``: a message split into several native posts may fail half way (a rate
limit on the third part). The outbox retries the whole message with the same ``id``; the
transport remembers the native ids of the parts already posted so the retry posts only
the rest, and the receipt still lists every part.

``Background``: best-effort side work (reactions) run off the delivery path, bounded
in count, so a rate-limited reaction never holds up a channel.

``through_cancel``: work that must not stop half way (files written but not recorded,
embedded servers started but not stopped) finishes even when its caller is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("bpgw.adapters.delivery")

# Parts already posted of messages whose later part failed (the oldest are forgotten).
PARTIAL_SENDS_MAX = 1000
# Background tasks in flight at most (beyond, new ones are skipped and logged).
BACKGROUND_MAX = 100


class PartialSends:
    """Native ids already posted per outbox message id (bounded, oldest forgotten)."""

    def __init__(self, limit: int = PARTIAL_SENDS_MAX) -> None:
        self._limit = limit
        self._ids: OrderedDict[str, list[str]] = OrderedDict()

    def take(self, key: str | None) -> list[str]:
        """The ids posted by earlier attempts of ``key`` (forgotten here: ``keep`` them
        again if this attempt fails too)."""
        return self._ids.pop(key, []) if key else []

    def keep(self, key: str | None, ids: list[str]) -> None:
        """Remember the parts of ``key`` posted so far, for the next attempt."""
        if not key or not ids:
            return
        self._ids[key] = ids
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)


class Background:
    """Bounded fire-and-forget tasks that are cancelled on ``cancel_all``."""

    def __init__(self, log: logging.Logger, limit: int = BACKGROUND_MAX) -> None:
        self._log = log
        self._limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Start ``work`` unless ``limit`` tasks are running (then it is skipped)."""
        if len(self._tasks) >= self._limit:
            work.close()
            self._log.warning("too many background tasks in flight; %s skipped", what)
            return
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        """Cancel whatever is still running (on stop)."""
        for task in list(self._tasks):
            task.cancel()


def reaction_for(outcome: str, accepted: str, refused: str) -> str | None:
    """The reaction a chat transport puts on a message the gateway handled: ``accepted``
    on an accepted block, ``refused`` on a malformed or rejected one, none otherwise."""
    if outcome == "accepted":
        return accepted
    return refused if outcome in ("malformed", "rejected") else None


async def settle(tasks: Iterable[asyncio.Task[Any] | None], grace: float) -> None:
    """Let ``tasks`` finish for up to ``grace`` seconds, then cancel what still runs (a
    transport stopping: the message in hand is done, the rest is caught up next time)."""
    running = [t for t in tasks if t is not None and not t.done()]
    if running:
        _, pending = await asyncio.wait(running, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def through_cancel(job: Awaitable[T], grace: float | None = None, *,
                        cancel_late: bool = False) -> T:
    """Await ``job``; if the caller is cancelled meanwhile, let ``job`` finish first (for
    at most ``grace`` seconds; None: until it is done), then re-raise the cancel. A job
    still running after the grace goes on by itself, or is cancelled with ``cancel_late``.

    A failure of ``job`` after the cancel is logged, not raised: the cancel wins.
    """
    task = asyncio.ensure_future(job)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task], timeout=grace)
        if cancel_late:
            task.cancel()
        task.add_done_callback(_log_failure)
        raise


def _log_failure(task: asyncio.Future[Any]) -> None:
    """Consume the outcome of work its caller stopped waiting for (no 'never retrieved'
    warning); a failure there is only logged."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("work finished after its caller was cancelled failed: %s", exc)

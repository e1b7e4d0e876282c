"""Loop guards: a TTL set of recently seen keys and a per-agent-pair message budget.

Both are in-process: they stop loops at the replica that sees the traffic. The
exactly-once guarantee across replicas comes from the state store's fingerprints.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


class RecentSet:
    """Remembers keys for ``ttl`` seconds (bounded to ``max_items``, oldest evicted first)."""

    def __init__(
        self, ttl: float, max_items: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._max = max_items
        self._clock = clock
        self._items: OrderedDict[str, float] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._items:
            key, expires = next(iter(self._items.items()))
            if expires > now and len(self._items) <= self._max:
                break
            del self._items[key]

    def add(self, key: str) -> bool:
        """Record ``key``; True when it was not already present (and unexpired)."""
        now = self._clock()
        self._expire(now)
        if key in self._items:
            return False
        self._items[key] = now + self._ttl
        return True

    def __contains__(self, key: object) -> bool:
        now = self._clock()
        self._expire(now)
        return key in self._items


@dataclass(frozen=True)
class BudgetVerdict:
    """Whether a message between two agents may pass, and whether to tell someone."""

    allowed: bool
    # True only for the message that tripped the budget, so one notice is sent, not one
    # per blocked message.
    tripped: bool = False
    retry_after: float = 0.0


class PairBudget:
    """At most ``limit`` messages per ``window`` seconds between two agents, then a cooldown.

    The pair is unordered (A->B and B->A share a budget): a ping-pong uses both directions.
    """

    def __init__(
        self,
        limit: int,
        window: float,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._window = window
        self._cooldown = cooldown
        self._clock = clock
        self._sent: dict[tuple[str, str], deque[float]] = {}
        self._blocked_until: dict[tuple[str, str], float] = {}

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        x, y = a.casefold(), b.casefold()
        return (x, y) if x <= y else (y, x)

    def check(self, sender: str, recipient: str) -> BudgetVerdict:
        """Count one message from ``sender`` to ``recipient`` if the budget allows it."""
        now = self._clock()
        pair = self._pair(sender, recipient)
        until = self._blocked_until.get(pair)
        if until is not None:
            if now < until:
                return BudgetVerdict(False, retry_after=until - now)
            del self._blocked_until[pair]
            self._sent.pop(pair, None)
        sent = self._sent.setdefault(pair, deque())
        while sent and sent[0] <= now - self._window:
            sent.popleft()
        if len(sent) >= self._limit:
            self._blocked_until[pair] = now + self._cooldown
            return BudgetVerdict(False, tripped=True, retry_after=self._cooldown)
        sent.append(now)
        return BudgetVerdict(True)

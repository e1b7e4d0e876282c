"""Loop guards: a TTL set of recently seen keys and a per-agent-pair message budget.

Both are in-process: they stop loops at the replica that sees the traffic. The
exactly-once guarantee across replicas comes from the state store's fingerprints.
Both are bounded in entries, and idle entries are dropped, so a stream of new names
costs no memory once they fall silent.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_MAX_ITEMS = 100_000


class RecentSet:
    """Remembers keys for ``ttl`` seconds (bounded to ``max_items``, oldest evicted first)."""

    def __init__(
        self,
        ttl: float,
        max_items: int = DEFAULT_MAX_ITEMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._max = max_items
        self._clock = clock
        # Insertion order is expiry order: every key gets the same ttl.
        self._items: OrderedDict[str, float] = OrderedDict()

    def _expire(self, now: float) -> None:
        items = self._items
        while items:
            key, expires = next(iter(items.items()))
            if expires > now and len(items) <= self._max:
                break
            del items[key]

    def add(self, key: str) -> bool:
        """Record ``key``; True when it was not already present (and unexpired)."""
        now = self._clock()
        self._expire(now)
        if key in self._items:
            return False
        self._items[key] = now + self._ttl
        self._expire(now)  # over max_items: the oldest goes
        return True

    def __contains__(self, key: object) -> bool:
        now = self._clock()
        self._expire(now)
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class BudgetVerdict:
    """Whether a message between two agents may pass, and whether to tell someone."""

    allowed: bool
    # True only for the message that tripped the budget, so one notice is sent, not one
    # per blocked message.
    tripped: bool = False
    retry_after: float = 0.0


@dataclass
class _Slot:
    """One budget key's send times (oldest first) and the end of its cooldown."""

    sent: array[float] = field(default_factory=lambda: array("d"))
    blocked_until: float = 0.0
    last_seen: float = 0.0


class PairBudget:
    """At most ``limit`` messages per ``window`` seconds between two agents, then a cooldown.

    A message counts against two budgets, and passes only when both allow it:

    - the unordered pair of names (A->B and B->A share a budget: a ping-pong uses both
      directions);
    - the sender's native identity (``http:dave``) towards the recipient, so one
      credential speaking under several names has one budget, not one per alias.

    ``check`` is the whole interface; a shared (Redis) implementation needs only the
    same keys, window, cooldown and one ``tripped`` verdict per cooldown. A key is
    forgotten once its window and cooldown have passed with no message, and at most
    ``max_keys`` keys are kept (the least recently used go first).
    """

    def __init__(
        self,
        limit: int,
        window: float,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self._limit = limit
        self._window = window
        self._cooldown = cooldown
        self._clock = clock
        self._max = max_keys
        # Least recently used first, so idle keys are found at the front.
        self._slots: OrderedDict[tuple[str, str], _Slot] = OrderedDict()

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        x, y = a.casefold(), b.casefold()
        return (x, y) if x <= y else (y, x)

    def __len__(self) -> int:
        return len(self._slots)

    def _reclaim(self, now: float) -> None:
        """Drop keys idle past their window and cooldown, and the LRU keys over the cap."""
        slots = self._slots
        idle_before = now - self._window
        while slots:
            key, slot = next(iter(slots.items()))
            if len(slots) <= self._max and (
                slot.last_seen > idle_before or slot.blocked_until > now
            ):
                break
            del slots[key]

    def _slot(self, key: tuple[str, str], now: float) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        else:
            self._slots.move_to_end(key)
        slot.last_seen = now
        return slot

    def _verdict(self, slot: _Slot, now: float) -> BudgetVerdict | None:
        """The refusal for ``slot`` (None: it has room); starts the cooldown when it trips."""
        if slot.blocked_until:
            if now < slot.blocked_until:
                return BudgetVerdict(False, retry_after=slot.blocked_until - now)
            slot.blocked_until = 0.0
            del slot.sent[:]  # cooldown over: a fresh window
        del slot.sent[: bisect_right(slot.sent, now - self._window)]
        if len(slot.sent) >= self._limit:
            slot.blocked_until = now + self._cooldown
            return BudgetVerdict(False, tripped=True, retry_after=self._cooldown)
        return None

    def check(self, sender: str, recipient: str, identity: str | None = None) -> BudgetVerdict:
        """Count one message from ``sender`` (speaking as ``identity``) to ``recipient``."""
        now = self._clock()
        self._reclaim(now)
        slots = [self._slot(self._pair(sender, recipient), now)]
        if identity is not None:
            slots.append(self._slot(("\0" + identity, recipient.casefold()), now))
        refused = [v for v in (self._verdict(s, now) for s in slots) if v is not None]
        if refused:
            # Notify once: a trip on either key is the news; otherwise the longest wait.
            return max(refused, key=lambda v: (v.tripped, v.retry_after))
        for slot in slots:
            slot.sent.append(now)
        self._reclaim(now)
        return BudgetVerdict(True)

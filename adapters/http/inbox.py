"""Bounded per-agent inboxes with long-poll waiting (no busy-waiting).

Each inbox is a deque guarded by the event loop (single-threaded, so no lock) and an
``asyncio.Event`` that is set while the inbox holds messages. ``take`` waits on the
event; ``put`` never drops: a full inbox raises ``InboxFull``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


class InboxFull(Exception):
    """The inbox holds ``inbox_max`` messages already."""


@dataclass(frozen=True)
class InboxMessage:
    """One message waiting in an agent's inbox, as the inbox endpoint returns it."""

    id: str
    text: str
    kind: str
    request_id: str | None = None
    trace_id: str | None = None
    reply_to: str | None = None
    thread: str | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (built by hand: ``dataclasses.asdict`` deep-copies and is slow)."""
        return {
            "id": self.id,
            "text": self.text,
            "kind": self.kind,
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "reply_to": self.reply_to,
            "thread": self.thread,
            "at": self.at,
        }


class Inbox:
    """One agent's bounded FIFO of messages."""

    def __init__(self, owner: str, capacity: int) -> None:
        self.owner = owner
        self.capacity = capacity
        self._items: deque[InboxMessage] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: InboxMessage) -> None:
        """Append one message and wake waiting readers; raise ``InboxFull`` when full."""
        if len(self._items) >= self.capacity:
            raise InboxFull(
                f"inbox of {self.owner} is full ({self.capacity} messages waiting); "
                "the agent is not reading it"
            )
        self._items.append(message)
        self._ready.set()

    def put_back(self, messages: Iterable[InboxMessage]) -> None:
        """Return taken but undelivered messages to the front, in their order.

        They were in the inbox a moment ago, so the bound does not apply to them.
        """
        self._items.extendleft(reversed(list(messages)))
        if self._items:
            self._ready.set()

    def pop(self, limit: int) -> list[InboxMessage]:
        """Remove and return up to ``limit`` messages, oldest first."""
        taken = [self._items.popleft() for _ in range(min(limit, len(self._items)))]
        if not self._items:
            self._ready.clear()
        return taken

    def wake(self) -> None:
        """Wake every waiting reader so it re-checks its stop condition."""
        self._ready.set()

    async def take(
        self, limit: int, wait_seconds: float, *, give_up: Callable[[], bool]
    ) -> list[InboxMessage]:
        """Wait up to ``wait_seconds`` for a message, then pop up to ``limit``.

        Returns an empty list on timeout, or without popping anything when
        ``give_up()`` turns true (the reader went away or the transport is stopping),
        so no message is taken for a reader that can no longer receive it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while not self._items and not give_up():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._ready.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._ready.wait()
            except TimeoutError:
                return []
        if give_up():
            return []
        return self.pop(limit)


class Inboxes:
    """Every inbox of one transport, created on first use."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._boxes: dict[str, Inbox] = {}

    def __iter__(self) -> Iterator[Inbox]:
        return iter(list(self._boxes.values()))

    def get(self, owner: str) -> Inbox | None:
        """The inbox of ``owner`` when it exists."""
        return self._boxes.get(owner)

    def ensure(self, owner: str) -> Inbox:
        """The inbox of ``owner``, created empty when missing."""
        box = self._boxes.get(owner)
        if box is None:
            box = self._boxes[owner] = Inbox(owner, self.capacity)
        return box

    def wake_all(self) -> None:
        """Wake every waiting reader of every inbox (used when stopping)."""
        for box in self:
            box.wake()

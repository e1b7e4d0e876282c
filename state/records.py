"""Plain, immutable records the store returns: conversations, events and outcomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class ConvStatus(StrEnum):
    """Status of one conversation."""

    OPEN = "open"
    CLARIFYING = "clarifying"
    HANDED_OFF = "handed_off"
    DONE = "done"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"


TERMINAL: frozenset[ConvStatus] = frozenset(
    {ConvStatus.DONE, ConvStatus.PARTIAL, ConvStatus.FAILED, ConvStatus.CANCELLED,
     ConvStatus.TIMEOUT}
)
"""Statuses a conversation never leaves."""

ACTIVE: frozenset[ConvStatus] = frozenset(
    {ConvStatus.OPEN, ConvStatus.CLARIFYING, ConvStatus.HANDED_OFF}
)
"""Statuses in which somebody owes a reply and a deadline runs."""


@dataclass(frozen=True)
class Origin:
    """Where a message came from, so notices go back into the same thread."""

    transport: str
    channel: str
    thread: str | None = None
    native_id: str | None = None

    def problem(self) -> str | None:
        """Why this origin may not be stored (a field over ``ORIGIN_MAX_BYTES``), or None."""
        # Checked for every message: at most 4 bytes a character, so short fields (all
        # but hostile ones) need no look at the limits one by one.
        if (len(self.transport) <= _SHORT_TRANSPORT and len(self.channel) <= _SHORT_FIELD
                and len(self.thread or "") <= _SHORT_FIELD
                and len(self.native_id or "") <= _SHORT_FIELD):
            return None
        for name, what, limit in _ORIGIN_LIMITS:
            found = size_problem(what, getattr(self, name), limit)
            if found is not None:
                return found
        return None


def size_problem(what: str, value: str | None, limit: int) -> str | None:
    """Why ``value`` is too long to store (over ``limit`` bytes of UTF-8), or None."""
    # Most values are short: at most 4 bytes per character, so no encoding needed.
    if value is None or len(value) * 4 <= limit:
        return None
    size = len(value.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return None
    return f"the {what} is {size} bytes; the gateway stores at most {limit} bytes of it"


ORIGIN_MAX_BYTES: dict[str, int] = {
    "transport": 64,
    "channel": 256,
    "thread": 256,
    "native_id": 256,
}
"""Bytes (UTF-8) each transport-supplied field of a conversation may take (docs/state.md).
Longer ones are refused, never cut: a cut native id would break deduplication, a cut
thread or channel would send replies elsewhere."""
# (field, how a refusal names it, limit), and the lengths in characters that always fit.
_ORIGIN_LIMITS = tuple((name, name.replace("_", " "), limit)
                       for name, limit in ORIGIN_MAX_BYTES.items())
_SHORT_TRANSPORT = ORIGIN_MAX_BYTES["transport"] // 4
_SHORT_FIELD = min(ORIGIN_MAX_BYTES["channel"], ORIGIN_MAX_BYTES["thread"],
                   ORIGIN_MAX_BYTES["native_id"]) // 4


@dataclass(frozen=True)
class Event:
    """One entry of a conversation's append-only history.

    ``type`` is a protocol message type, or ``CANCEL`` / ``TIMEOUT`` for the
    operator's and the sweeper's own events. ``status`` is the conversation's
    status after the event.
    """

    type: str
    sender: str
    to: str
    depth_current: int
    depth_max: int
    status: str
    transport: str
    native_id: str | None
    at: float
    excerpt: str


@dataclass(frozen=True)
class Conversation:
    """One conversation, keyed by its RequestId."""

    request_id: str
    trace_id: str | None
    kind: str
    requester: str
    assignee: str
    status: ConvStatus
    depth_current: int
    depth_max: int
    priority: str
    task: str
    created_at: float
    updated_at: float
    deadline: float | None
    origin: Origin
    history: tuple[Event, ...] = ()

    @property
    def owes_reply(self) -> str:
        """Who the conversation waits on: the requester while clarifying, else the assignee."""
        return self.requester if self.status is ConvStatus.CLARIFYING else self.assignee

    @property
    def is_terminal(self) -> bool:
        """True once the conversation can take no more messages."""
        return self.status in TERMINAL

    def age(self, now: float) -> float:
        """Seconds since the conversation was opened."""
        return max(0.0, now - self.created_at)


class Outcome(StrEnum):
    """What applying one message did."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    ILLEGAL = "illegal"
    ORPHAN = "orphan"
    DEPTH = "depth"
    LOOP = "loop"  # refused by a loop-guard budget (ConversationStore.apply ``budget``)
    TOO_LONG = "too_long"  # a field over its bound (Origin.problem, orphans per RequestId)


@dataclass(frozen=True)
class Budget:
    """A loop guard the apply script checks and charges in the same atomic step.

    At most ``limit`` messages per ``window`` seconds may count against each of the
    budgets ``names`` (one Redis key each, in the namespace's slot); the message that
    finds one full starts its ``cooldown``. Duplicates never count.
    """

    names: tuple[str, ...]
    limit: int
    window: float
    cooldown: float


@dataclass(frozen=True)
class ApplyResult:
    """Result of one apply or cancel.

    ``reason`` is a sentence a person can act on ("" when applied);
    ``conversation`` is the record after the step (before it when refused, None
    when there is none), decoded when first read (most callers never read it);
    ``previous_status`` is the status before the step. An outcome ``loop`` says in
    ``retry_after`` how many seconds until the budget lets messages pass, and ``tripped``
    is True only for the message that started the cooldown.
    """

    outcome: Outcome
    reason: str
    # The record, or a function decoding it (see ``conversation``).
    source: Conversation | Callable[[], Conversation] | None
    previous_status: ConvStatus | None = None
    retry_after: float = 0.0
    tripped: bool = False

    @property
    def conversation(self) -> Conversation | None:
        """The conversation (decoded once, on first use)."""
        if callable(self.source):
            object.__setattr__(self, "source", self.source())
        assert not callable(self.source)
        return self.source

    @property
    def applied(self) -> bool:
        """True when the message changed the conversation."""
        return self.outcome is Outcome.APPLIED

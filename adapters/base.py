"""The transport contract: every chat platform and bridge is an ``Adapter``.

Modelled on Matterbridge's Bridger (connect, send, disconnect) and Errbot's backend:
an adapter turns native traffic into ``Envelope`` objects handed to a ``GatewaySink``,
sends ``Outbound`` messages and reports the native ids they became, and declares what
the platform can do. Operator commands arrive as ``CommandRequest`` and come back as a
platform-neutral ``CommandResult`` the adapter renders natively.

Nothing here imports a platform library; each adapter module imports its own.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import pkgutil
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from json.encoder import encode_basestring as _json_str
from typing import Any, Protocol, TypeVar, runtime_checkable

from adapters.chunking import split_message


@dataclass(frozen=True)
class Author:
    """Who wrote a native message, as the platform identifies them."""

    id: str
    display_name: str = ""
    is_bot: bool = False
    # True when the gateway itself wrote the message (our own echo).
    is_self: bool = False
    # Platform roles of the author (role ids and names), for ``role:`` permissions of
    # commands typed as messages.
    roles: tuple[str, ...] = ()


@dataclass(frozen=True)
class Address:
    """Where a message goes on one transport: a channel, optionally a thread in it."""

    transport: str
    channel: str
    thread: str | None = None

    def __str__(self) -> str:
        thread = f"#{self.thread}" if self.thread else ""
        return f"{self.transport}:{self.channel}{thread}"


@dataclass(frozen=True)
class OwnedName:
    """An agent name a transport credential proves (an HTTP token configured for it).

    The gateway makes ``identity`` that agent's identity from the start, whatever the
    identity policy, and sends its messages to ``address`` unless the config says where.
    """

    name: str
    identity: str
    address: Address
    # The config key that grants it, for error messages (``transports.http.tokens.Carol``).
    source: str


@dataclass(frozen=True)
class Envelope:
    """One inbound native message, reduced to what the gateway needs."""

    transport: str
    channel: str
    author: Author
    text: str
    thread: str | None = None
    native_id: str | None = None
    at: float = field(default_factory=time.time)
    # Set by an adapter that can tell the message is a copy the gateway relayed.
    relayed: bool = False
    # Called by the gateway once the envelope is committed (see ``Disposition.committed``),
    # before ``on_envelope`` returns; transports that acknowledge natively (an mq9 ACK, an
    # AINET file mark, a catch-up cursor) do it here. Never called for an uncommitted one.
    on_commit: CommitHook | None = field(default=None, compare=False, repr=False)

    @property
    def address(self) -> Address:
        """The channel/thread this envelope came from (where replies go)."""
        return Address(self.transport, self.channel, self.thread)

    @property
    def identity(self) -> str:
        """The author's transport-qualified identity, e.g. ``discord:1234``."""
        return f"{self.transport}:{self.author.id}"


class OutboundKind(StrEnum):
    """What an outbound message is, so adapters can style it."""

    PROTOCOL = "protocol"  # a protocol block (relayed or built by the gateway)
    NOTICE = "notice"  # a human-readable notice (error, violation, timeout)


@dataclass(frozen=True)
class Outbound:
    """One message to send on one transport."""

    address: Address
    text: str
    kind: OutboundKind = OutboundKind.PROTOCOL
    # The agent the message is for, when there is one (inbox transports route on it).
    recipient: str | None = None
    # The native id to reply to / thread under, when the platform supports it.
    reply_to: str | None = None
    request_id: str | None = None
    trace_id: str | None = None
    # The structured message (protocol.Message) when the sender had it at hand; None for
    # notices and for messages delivered from the outbox journal (parse ``text`` then).
    message: Any = None
    # The gateway's stable id of this message (its outbox journal id, "<ms>-<seq>"):
    # the same on every delivery attempt, increasing in the order messages were
    # accepted. Inbox transports use it as the message id agents see and to deliver each
    # message once; None for messages sent outside the outbox.
    id: str | None = None


_K = TypeVar("_K", bound=Hashable)


def remembered_json(encode: Callable[[_K], str], memo: dict[_K, str], *, entries: int,
                    max_chars: int) -> Callable[[_K], str]:
    """``encode`` (a value's JSON), remembered in ``memo``: at most ``entries`` values
    whose JSON is at most ``max_chars`` characters (their keys, which it writes out, no
    longer), so ``memo`` holds at most ``2 * entries * max_chars`` characters. When full
    it is emptied and starts again (cheaper than keeping an order per entry). For the
    few values a gateway writes over and over: a relayed text, the places of its
    messages."""

    def remembered(key: _K) -> str:
        found = memo.get(key)
        if found is None:
            found = encode(key)
            if len(found) <= max_chars:
                if len(memo) >= entries:
                    memo.clear()
                memo[key] = found
        return found

    return remembered


JSON_TEXTS_MAX = 1024
"""Texts ``json_text`` remembers at most (then it forgets them all and starts again)."""
JSON_TEXT_MAX_CHARS = 2048
"""The longest JSON ``json_text`` remembers (so it holds at most some 4M characters)."""
_json_texts: dict[str, str] = {}
json_text = remembered_json(_json_str, _json_texts, entries=JSON_TEXTS_MAX,
                            max_chars=JSON_TEXT_MAX_CHARS)
"""``text`` as a JSON string, non-ASCII as it is (``json.dumps(text,
ensure_ascii=False)``), remembered for a while: a relayed message's text is written into
its outbox journal entry and again, once dispatched, into an inbox transport's stored
body. Both get the same str object (the dispatcher takes the entry the journal wrote),
whose hash Python keeps, so the second is a look-up instead of another pass over the
whole text."""


@dataclass(frozen=True)
class Receipt:
    """The native ids one outbound message became (a long message may become several)."""

    native_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do; the gateway adapts its output to it."""

    max_message_length: int | None = None
    threads: bool = False
    reactions: bool = False
    edits: bool = False
    sees_other_bots: bool = True
    native_commands: bool = False
    # The platform allows one connection per credential (a Discord gateway session,
    # Telegram long polling): with several replicas only the one holding the transport's
    # lease in Redis runs it; another takes over when that replica dies.
    single_connection: bool = False
    # Every inbound native id is minted fresh by this process (the HTTP API): the platform
    # never shows one message twice, so the gateway skips the cross-replica inbound claim.
    fresh_native_ids: bool = False
    # The platform shows the gateway's own posts back to it (a chat channel). False (an
    # mq9 mailbox: the gateway SENDs only to others'): the gateway neither records its
    # posts' native ids nor looks inbound ids up among them (no echo round trips).
    echoes_own_posts: bool = True
    # ``send_batch`` stores several messages for one destination in one round trip (the
    # HTTP inboxes): the outbox hands it every message waiting for a destination at once.
    batched_sends: bool = False
    # Serves other transports' ``web_routes`` (webhooks) on its own listener (the HTTP
    # transport): the gateway hands it every route at start.
    web_server: bool = False


class HealthState(StrEnum):
    """Coarse state of one transport."""

    STARTING = "starting"
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"
    # A single-connection transport whose lease another replica holds (healthy: it is
    # running there, and this replica takes over if that one dies).
    STANDBY = "standby"


@dataclass(frozen=True)
class Health:
    """A transport's state with a short human-readable detail."""

    state: HealthState
    detail: str = ""


@dataclass(frozen=True)
class Probe:
    """One readiness check ``bpgw check`` prints as a table row.

    ``fix`` tells the operator what to do when ``ok`` is False (empty when it is True).
    """

    check: str
    ok: bool
    detail: str = ""
    fix: str = ""


@dataclass(frozen=True)
class CommandRequest:
    """An operator command (``/protocol <name> <args>``) from any transport."""

    transport: str
    channel: str
    author: Author
    name: str
    args: tuple[str, ...] = ()
    thread: str | None = None
    # Platform roles of the author (role ids/names), for role-based permissions.
    roles: tuple[str, ...] = ()
    # The author proved an operator credential of this transport (the HTTP API's
    # ``operator_tokens``): an operator unless ``[permissions] operator_credentials`` is
    # false. Platform roles never set it: anyone may name a Discord role "operator".
    operator: bool = False

    @property
    def identity(self) -> str:
        """The author's transport-qualified identity."""
        return f"{self.transport}:{self.author.id}"


def split_command_words(words: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The words after ``/protocol`` as (command, args): the command lower-cased,
    ``help`` when there is none. Every transport's command parsing ends here."""
    if not words:
        return ("help", ())
    return (words[0].lower(), tuple(words[1:]))


@dataclass(frozen=True)
class CommandResult:
    """A platform-neutral command answer: a title, key/value fields and a table."""

    title: str
    fields: tuple[tuple[str, str], ...] = ()
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    ok: bool = True
    footer: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for HTTP and logs)."""
        return {
            "title": self.title,
            "ok": self.ok,
            "fields": [{"name": k, "value": v} for k, v in self.fields],
            "columns": list(self.columns),
            "rows": [list(r) for r in self.rows],
            "footer": self.footer,
        }

    def to_text(self) -> str:
        """A plain-text rendering any transport can show (adapters may do better)."""
        lines = [self.title]
        lines.extend(f"{name}: {value}" for name, value in self.fields)
        if self.columns:
            table = [self.columns, *self.rows]
            widths = [
                max(len(r[i]) if i < len(r) else 0 for r in table) for i in range(len(self.columns))
            ]
            for row in table:
                lines.append(
                    "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
                )
        if self.footer:
            lines.append(self.footer)
        return "\n".join(lines)


@dataclass(frozen=True)
class Disposition:
    """What the gateway did with one envelope (HTTP returns it; chat adapters may ignore it).

    ``outcome`` is one of: ``ignored`` (ordinary chat), ``dropped`` (our own or a relayed
    copy), ``malformed``, ``rejected`` (identity, signature, depth, illegal transition,
    loop budget), ``duplicate``, ``accepted``, ``command``, ``busy`` (another replica is
    processing the same native message right now) or ``error`` (the state store could
    not be reached).
    """

    outcome: str
    detail: str = ""
    request_ids: tuple[str, ...] = ()
    errors: tuple[dict[str, Any], ...] = ()
    # Machine-readable delivery warnings, e.g. ``{"code": "no_address", "agent": "Mantis",
    # "request_id": ..., "detail": ...}``; codes are listed in docs/gateway.md.
    warnings: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "outcome": self.outcome,
            "detail": self.detail,
            "request_ids": list(self.request_ids),
            "errors": list(self.errors),
            "warnings": list(self.warnings),
        }

    @property
    def committed(self) -> bool:
        """True when the gateway is done with the envelope for good: acknowledge it.

        Every outcome but ``error`` and ``busy`` is final (a duplicate or a refusal too:
        delivering it again changes nothing). On ``error``/``busy`` nothing is kept;
        leave the native message unacknowledged so the platform (or catch-up) brings it
        again.
        """
        return self.outcome not in UNCOMMITTED_OUTCOMES


UNCOMMITTED_OUTCOMES = frozenset({"error", "busy"})
"""Dispositions after which the transport must not acknowledge the native message."""

CommitHook = Callable[[Disposition], Awaitable[None]]
"""``Envelope.on_commit``: awaited with the disposition once the envelope is committed."""


class CommitWindow:
    """Turns out-of-order commits of ordered native messages into a safe cursor.

    A transport that hands a batch to the gateway concurrently (Telegram updates, a
    catch-up page) may only confirm position N once everything up to N is committed.
    ``track`` each native id in arrival order, ``commit`` it when its disposition says
    so; ``commit`` returns the id the cursor may now advance to (the last of the
    contiguous committed prefix), or None when the prefix did not grow. An uncommitted
    envelope holds the cursor back, so catch-up brings it (and what follows) again; the
    gateway's inbound claims and state fingerprints make the replays harmless.
    Bounded: at most ``limit`` ids in flight (``track`` raises ``OverflowError`` beyond).
    """

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._order: dict[str, bool] = {}  # native id -> committed, in arrival order

    def __len__(self) -> int:
        return len(self._order)

    def track(self, native_id: str) -> None:
        """Register ``native_id`` as the next message in order (idempotent)."""
        if native_id not in self._order:
            if len(self._order) >= self._limit:
                raise OverflowError(f"more than {self._limit} native messages in flight")
            self._order[native_id] = False

    def commit(self, native_id: str) -> str | None:
        """Mark ``native_id`` committed; the new cursor position, or None if unchanged."""
        if native_id not in self._order:
            return None
        self._order[native_id] = True
        advanced: str | None = None
        while self._order:
            first = next(iter(self._order))
            if not self._order[first]:
                break
            del self._order[first]
            advanced = first
        return advanced


class Cursors(Protocol):
    """Catch-up cursors of one transport: the last committed native id per channel.

    Kept in Redis and shared by every replica (``state/cursors.py``). ``advance`` is a
    monotonic compare-and-set: an id older than the stored one never moves it back.
    Decimal ids (Discord snowflakes, Telegram update ids, Slack ``ts``, stream sequence
    numbers) compare as numbers of any length; any other id compares byte-wise, so use
    names that sort in order (zero-padded, ISO timestamps).
    """

    async def get(self, channel: str) -> str | None:
        """The channel's cursor, or None when nothing was committed there yet."""

    async def advance(self, channel: str, native_id: str) -> bool:
        """Move the channel's cursor to ``native_id`` if that is newer; True if it moved.

        Raises ``OverflowError`` for a new channel beyond the transport's bound.
        """

    async def all(self) -> dict[str, str]:
        """Every channel's cursor (at most the transport's channel bound)."""

    async def forget(self, channel: str) -> None:
        """Drop a channel's cursor (the channel was deleted or left)."""


@runtime_checkable
class DeadlineSource(Protocol):
    """A sink that tells conversations' deadlines in one round trip (the gateway does);
    a transport that carries a message's useful life (mq9-ttl) checks for it."""

    async def deadlines(self, request_ids: Sequence[str]) -> list[float | None]:
        """The Unix-time deadline of each conversation (None: none runs, or unknown)."""


class GatewaySink(Protocol):
    """What the gateway offers an adapter: ingest envelopes, answer commands, queries."""

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        """Hand one inbound native message to the gateway pipeline."""

    async def on_envelopes(self, envelopes: Sequence[Envelope], *, ordered: bool = True
                           ) -> list[Disposition]:
        """Hand a batch (one channel's envelopes in order; ``ordered=False``: no order
        needed between any of them), cheaper than one by one."""

    async def on_command(self, command: CommandRequest) -> CommandResult:
        """Run an operator command and return its platform-neutral result."""

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """A filtered, paged list of conversations as JSON-ready dicts.

        ``status``: None, ``all``, ``active``, ``finished`` or one status (any case);
        ``agent``: a party of the conversation. Raises ``QueryError`` for a filter that
        names nothing (an unknown status) or a page past the bounds, and ``Unavailable``
        when the state store cannot answer now.
        """

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        """One conversation with its whole history, or None when unknown (``Unavailable``
        when the state store cannot answer now)."""

    def health(self) -> dict[str, Any]:
        """The gateway's and every transport's health as last seen, JSON-ready."""

    async def check_health(self) -> dict[str, Any]:
        """``health()`` after a fresh, time-bounded check of the state store (a second at
        most): ``status`` is ``ok`` or ``degraded``, ``failing`` names the failing parts
        and ``parts`` lists every part as ``{"name", "ok", "detail"}``."""

    async def metrics(self) -> tuple[bytes, str]:
        """The gateway's metrics in the Prometheus text format, and their content type."""

    def cursors(self, transport: str) -> Cursors:
        """The shared catch-up cursors of ``transport`` (see ``Cursors``)."""

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109 - a plain bound
        """Wait until the outbound messages caused so far are dispatched (tests, demo)."""


class Adapter(ABC):
    """One transport instance. Subclasses set ``capabilities`` and implement the four methods."""

    capabilities: Capabilities = Capabilities()
    def __init__(self, name: str) -> None:
        self.name = name
        self._health = Health(HealthState.STARTING)
        # With ``capabilities.single_connection``: the fencing epoch of the lease this
        # replica holds while the adapter runs (0 otherwise); a larger epoch means a newer
        # holder, so an adapter may pass it to anything that can refuse stale writers.
        self.lease_epoch = 0

    @abstractmethod
    async def start(self, sink: GatewaySink) -> None:
        """Connect and begin handing inbound envelopes to ``sink``; return once running."""

    @abstractmethod
    async def send(self, message: Outbound) -> Receipt:
        """Deliver one outbound message; raise ``DeliveryError`` when it can't be."""

    async def send_batch(self, messages: Sequence[Outbound]) -> list[Receipt | DeliveryError]:
        """Deliver ``messages`` (all for one destination) in order.

        Returns one ``Receipt`` per message delivered, in order; a delivery that failed
        ends the list with its ``DeliveryError`` and the messages after it are not tried.
        A transport that sends different conversations side by side may go on past the
        first failure: the outcomes stay positional, and a ``Receipt`` after it is a
        message delivered all the same (anything else there: not delivered). The default
        sends one by one; a transport that can do better sets ``capabilities.batched_sends``.
        """
        out: list[Receipt | DeliveryError] = []
        for message in messages:
            try:
                out.append(await self.send(message))
            except DeliveryError as exc:
                out.append(exc)
                break
        return out

    @abstractmethod
    async def stop(self) -> None:
        """Disconnect and release resources; safe to call twice.

        A ``single_connection`` adapter may be started again after ``stop`` (its replica
        lost and later regained the lease).
        """

    def use_redis(self, redis: Any, namespace: str) -> None:  # noqa: B027 - optional hook
        """Called by the gateway before ``start`` with its Redis client and key namespace.

        Transports that keep durable state in Redis (the HTTP inboxes) store it there;
        the default ignores it.
        """

    def destination(self, message: Outbound) -> str:
        """The queue ``message`` is delivered in order through: its channel by default.

        The outbox keeps one ordered queue, rate limit and backoff per destination; an
        inbox transport returns the inbox (recipient) instead.
        """
        return message.address.channel

    def health(self) -> Health:
        """The transport's current state."""
        return self._health

    def stats(self) -> Mapping[str, Any]:
        """Connection figures (latency, reconnects, last event...) shown in ``/healthz``
        and ``/protocol status`` next to ``health()``: JSON-ready values; none by default."""
        return {}

    def set_health(self, state: HealthState, detail: str = "") -> None:
        """Record a state change (adapters call this from their connection handling)."""
        self._health = Health(state, detail)

    async def start_failed(self, detail: str, cleanup: Callable[[], Awaitable[None]],
                           logger: logging.Logger) -> None:
        """What a transport whose ``start`` failed does before re-raising: ``cleanup``
        what it started, go DOWN with ``detail`` (what the operator should fix) and log
        it on the transport's ``logger`` (``bpgw.adapters.<kind>``)."""
        await cleanup()
        self.set_health(HealthState.DOWN, detail)
        kind = logger.name.rsplit(".", 1)[-1]
        logger.error("%s transport %s did not start: %s", kind, self.name, detail,
                     extra={"transport": self.name})

    async def probe(self) -> Sequence[Probe]:
        """Check, without starting, that the transport can run as configured.

        ``bpgw check`` calls it before ``start`` (and without a gateway): a chat platform
        makes its token-check call, a server checks its port is free, a bridge connects or
        writes a probe file. Must return within a few seconds and leave nothing running.
        The default reports that the transport has no probe.
        """
        return (Probe(f"transport {self.name}", True, "no readiness probe for this kind"),)

    def web_routes(self) -> Sequence[WebRoute]:
        """Endpoints this transport needs on the gateway's HTTP listener (a platform's
        webhook); none unless overridden. A transport with routes needs a transport with
        ``capabilities.web_server`` enabled too (the gateway refuses to start otherwise)."""
        return ()

    def serve_routes(self, routes: Sequence[WebRoute]) -> None:  # noqa: B027 - optional hook
        """Called before ``start`` on a ``web_server`` transport with every other
        transport's ``web_routes``; it serves them next to its own endpoints."""

    def owned_names(self) -> Sequence[OwnedName]:
        """Agent names this transport's own credentials prove (none unless overridden)."""
        return ()

    def render_command_result(self, result: CommandResult) -> str:
        """Render a command result for this platform; plain text unless overridden."""
        return result.to_text()

    def split_text(self, text: str) -> list[str]:
        """Split ``text`` into chunks that fit ``capabilities.max_message_length``.

        Cuts only on line boundaries between fenced blocks (``adapters/chunking.py``); a
        block longer than the limit stays whole in a chunk of its own (a transport that
        can send files uses ``split_message`` and sends such a block as a file instead).
        """
        limit = self.capabilities.max_message_length
        if limit is None or len(text) <= limit:
            return [text]
        return [part.block or part.text for part in split_message(text, limit)]


@dataclass(frozen=True)
class WebRequest:
    """A request to a ``WebRoute``, platform-neutral: headers (case-insensitive lookups
    through ``header``), the raw body (bounded by the serving transport) and the peer."""

    headers: Mapping[str, str]
    body: bytes
    remote: str | None = None

    def header(self, name: str) -> str | None:
        """One header's value, whatever the case of its name."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)


@dataclass(frozen=True)
class WebResponse:
    """What a ``WebRoute`` answers: a status, a JSON-ready body, extra headers."""

    status: int
    body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


WebHandler = Callable[[WebRequest], Awaitable[WebResponse]]


@dataclass(frozen=True)
class WebRoute:
    """An endpoint a transport serves on the gateway's HTTP listener (a webhook).

    ``path`` must not start with ``/v1/`` (the HTTP API's own) nor clash with another
    route; the handler must answer within a few seconds and never raise.
    """

    path: str
    handler: WebHandler
    method: str = "POST"
    # Which transport asked for it (for logs and error messages).
    transport: str = ""


class DeliveryError(Exception):
    """An outbound message could not be delivered; the outbox retries it, then dead-letters it.

    ``retry_after`` is the platform's hint (a rate limit's Retry-After, a full inbox) of
    how many seconds to wait before trying this destination again; None when unknown.
    ``code`` is a short machine-readable reason senders are shown (``inbox_full``,
    ``rate_limited``, ...); ``delivery_failed`` when nothing more specific applies.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, code: str = "delivery_failed"
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.code = code


class ConfigError(ValueError):
    """The configuration (the gateway's or a transport's) is invalid.

    The message names the key and the reason, and always starts with ``PREFIX``, so
    every configuration error reads the same wherever it was raised.
    """

    PREFIX = "invalid configuration: "

    def __init__(self, message: str) -> None:
        super().__init__(message if message.startswith(self.PREFIX) else self.PREFIX + message)


class QueryError(ValueError):
    """A query the gateway cannot answer as asked (an unknown status filter); the
    message says what is accepted. Transports answer it as the caller's error (HTTP 400)."""


class Unavailable(Exception):
    """The gateway cannot answer now (its state store is unreachable or too slow).

    Transports answer it as a temporary failure (HTTP 503 with ``Retry-After``).
    """

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


AdapterFactory = Callable[[str, Mapping[str, Any]], Adapter]

_REGISTRY: dict[str, AdapterFactory] = {}


def register_adapter(kind: str) -> Callable[[AdapterFactory], AdapterFactory]:
    """Class/function decorator registering a factory for transport ``kind``."""

    def decorate(factory: AdapterFactory) -> AdapterFactory:
        _REGISTRY[kind] = factory
        return factory

    return decorate


def registered_kinds() -> Sequence[str]:
    """Names of every registered transport kind."""
    return sorted(_REGISTRY)


def available_kinds() -> list[str]:
    """Every transport kind a config may name: the registered ones and the adapter
    packages shipped under ``adapters/`` (imported only when used)."""
    shipped = importlib.import_module("adapters").__path__
    packages = {m.name for m in pkgutil.iter_modules(shipped) if m.ispkg}
    return sorted(set(registered_kinds()) | packages)


def create_adapter(kind: str, name: str, options: Mapping[str, Any]) -> Adapter:
    """Instantiate the adapter registered for ``kind`` as transport ``name``.

    The module ``adapters.<kind>`` is imported on first use, so a platform library is
    only imported when a transport of its kind is enabled.
    """
    if kind not in _REGISTRY and kind.isidentifier():
        try:
            importlib.import_module(f"adapters.{kind}")
        except ModuleNotFoundError as exc:
            if exc.name != f"adapters.{kind}":
                raise ConfigError(
                    f"transports.{name}.kind: {kind!r} needs a package that is not installed "
                    f"({exc.name}); install bpgw[{kind}]"
                ) from exc
    try:
        factory = _REGISTRY[kind]
    except KeyError:
        known = available_kinds()
        close = difflib.get_close_matches(kind, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
        raise ConfigError(
            f"transports.{name}.kind: unknown transport kind {kind!r} ({hint})"
        ) from None
    return factory(name, options)

"""Operator commands (``/protocol ...``), written once as platform-neutral results.

Each adapter renders a ``CommandResult`` natively (embeds, Block Kit, HTML, JSON).
Read commands are open to ``[permissions] read`` (everyone by default); ``cancel`` and the
other operator commands need ``[permissions] operators`` or a transport's operator
credential (``CommandRequest.operator``, unless ``operator_credentials = false``).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from adapters.base import CommandRequest, CommandResult, split_command_words
from gateway.agents import AgentDirectory, LearnedName
from gateway.config import GatewayConfig
from gateway.conversation_view import event_to
from gateway.notices import format_duration
from gateway.outbox import Outbox
from gateway.outbox_commands import outbox_command
from protocol.names import name_key
from protocol.text import lone_surrogate
from state.records import ACTIVE, Conversation, ConvStatus, Outcome
from state.store import LIST_FILTERS, ConversationStore, list_statuses

log = logging.getLogger("bpgw.gateway.commands")

READ_COMMANDS = frozenset({"status", "show", "list", "agents", "help"})
OPERATOR_COMMANDS = frozenset({"cancel", "key", "identity", "outbox"})
LIST_LIMIT = 25
# `/protocol agents [offset] [limit]`: rows per page by default and at most.
AGENTS_PAGE = 25
AGENTS_PAGE_MAX = 100

HELP_ROWS: tuple[tuple[str, str], ...] = (
    ("status [agent]", "counts, oldest open, per-agent load, violations, transports, sweeps"),
    ("show <RequestId>", "one conversation with its whole history across transports"),
    (
        "list [status] [agent]",
        f"up to {LIST_LIMIT} conversations; status: all (default), active, finished or one "
        "status; agent: any party (requester, addressee, assignees)",
    ),
    (
        "agents [offset] [limit]",
        f"declared and learned agents, where they live, who may speak as them "
        f"({AGENTS_PAGE} a page, at most {AGENTS_PAGE_MAX})",
    ),
    ("cancel <RequestId> [reason]", "mark a conversation cancelled and tell both parties"),
    ("key <agent> <public-key|remove>", "register an agent's Ed25519 key: it must then sign"),
    ("identity show|reset <agent>", "who may speak as an agent; forget a learned binding"),
    ("outbox [list|retry|drop] ...", "delivery queues and dead letters: list, re-send, discard"),
    ("help", "this list"),
)


def parse_command(text: str, prefix: str) -> tuple[str, tuple[str, ...]] | None:
    """``"/protocol show abc-1"`` -> ``("show", ("abc-1",))``; None when not a command."""
    stripped = text.strip()
    if not stripped.startswith(prefix):
        return None
    rest = stripped[len(prefix) :]
    if rest and not rest[0].isspace():
        return None  # "/protocolx" is not ours
    return split_command_words(rest.split())


@dataclass(frozen=True)
class CancelNotice:
    """What the gateway must tell people after a cancel (sent by the pipeline)."""

    conversation: Conversation
    by: str
    reason: str


def _ago(now: float, then: float | None) -> str:
    return "-" if then is None else format_duration(now - then)


def _clock(at: float, *, day: bool) -> str:
    """``at`` in local time (with the date when ``day``), e.g. ``21:40:02 CET``."""
    stamp = time.localtime(at)
    text = time.strftime("%Y-%m-%d %H:%M:%S" if day else "%H:%M:%S", stamp)
    return f"{text} {time.strftime('%Z', stamp)}".rstrip()


def _relative(at: float, now: float) -> str:
    return f"in {_ago(at, now)}" if at > now else f"{_ago(now, at)} ago"


def conversation_result(
    conv: Conversation, now: float, *, local_times: bool = False
) -> CommandResult:
    """``show``: one conversation with its history, as chat, HTTP and ``bpgw show`` show it.

    Times are ages ("5m ago"); with ``local_times`` (a terminal on the gateway's host)
    also the local clock time, and the age becomes the opening time.
    """

    def when(at: float, *, day: bool = False) -> str:
        relative = _relative(at, now)
        return f"{_clock(at, day=day)} ({relative})" if local_times else relative

    origin = conv.origin
    deadline = "-" if conv.deadline is None or conv.is_terminal else when(conv.deadline)
    opened = (
        ("opened", when(conv.created_at, day=True))
        if local_times
        else ("age", _ago(now, conv.created_at))
    )
    return CommandResult(
        title=f"{conv.kind} {conv.request_id}: {conv.status}",
        fields=(
            ("TraceId", conv.trace_id or "-"),
            ("requester", f"@{conv.requester}"),
            ("assignee", f"@{conv.assignee}"),
            ("owes reply", "-" if conv.is_terminal else f"@{conv.owes_reply}"),
            ("depth", f"{conv.depth_current}/{conv.depth_max}"),
            ("priority", conv.priority),
            ("task", conv.task or "-"),
            opened,
            ("deadline", deadline),
            (
                "origin",
                f"{origin.transport}:{origin.channel}"
                + (f"#{origin.thread}" if origin.thread else ""),
            ),
        ),
        columns=("when", "type", "from", "to", "depth", "status", "via", "excerpt"),
        rows=tuple(
            (
                when(e.at),
                e.type,
                e.sender,
                event_to(conv, e) or "-",
                f"{e.depth_current}/{e.depth_max}",
                e.status,
                e.transport,
                e.excerpt,
            )
            for e in conv.history
        ),
    )


class Commands:
    """Runs operator commands against the state store and the agent directory."""

    def __init__(
        self,
        config: GatewayConfig,
        store: ConversationStore,
        directory: AgentDirectory,
        status_extras: Callable[[], Awaitable[Sequence[tuple[str, str]]]],
        on_cancel: Callable[[CancelNotice], Awaitable[None]],
        *,
        outbox: Outbox | None = None,
    ) -> None:
        self._config = config
        self._outbox = outbox
        self._store = store
        self._directory = directory
        self._status_extras = status_extras
        self._on_cancel = on_cancel

    def allowed(self, cmd: CommandRequest) -> bool:
        """Whether the author may run ``cmd`` (unknown commands: as a read command)."""
        perms = self._config.permissions
        if cmd.operator and perms.operator_credentials:
            return True
        rules = (
            perms.operators if cmd.name in OPERATOR_COMMANDS else [*perms.read, *perms.operators]
        )
        for rule in rules:
            if rule == "*" or rule == cmd.identity:
                return True
            if rule.startswith("role:"):
                transport, _, role = rule[5:].partition(":")
                if transport == cmd.transport and role in cmd.roles:
                    return True
        return False

    async def run(self, cmd: CommandRequest) -> CommandResult:
        """Run one command, bounded by the configured timeout; never raises."""
        if not self.allowed(cmd):
            who = "operators" if cmd.name in OPERATOR_COMMANDS else "readers"
            return CommandResult(
                title=f"/protocol {cmd.name}: permission denied",
                fields=(("why", f"{cmd.identity} is not among the configured {who}"),),
                ok=False,
            )
        for arg in cmd.args:
            if (bad := lone_surrogate(arg)) is not None:
                return CommandResult(
                    title=f"/protocol {cmd.name}: bad argument",
                    fields=(("why", f"{arg!r} is not valid Unicode ({bad}, a lone "
                             "surrogate)"),),
                    ok=False,
                )
        handler = {
            "status": self._status,
            "show": self._show,
            "list": self._list,
            "agents": self._agents,
            "cancel": self._cancel,
            "key": self._key,
            "identity": self._identity,
            "outbox": self._outbox_cmd,
            "help": self._help,
        }.get(cmd.name)
        if handler is None:
            return CommandResult(
                title=f"/protocol {cmd.name}: unknown command",
                columns=("command", "what it does"),
                rows=HELP_ROWS,
                ok=False,
            )
        timeout = self._config.gateway.command_timeout_seconds
        try:
            return await asyncio.wait_for(handler(cmd), timeout)
        except TimeoutError:
            log.warning("command timed out", extra={"reason": cmd.name})
            return CommandResult(
                title=f"/protocol {cmd.name}: no answer within {timeout:g}s",
                fields=(("why", "the state store is slow or unreachable; try again shortly"),),
                ok=False,
            )
        except Exception as exc:  # a store outage must become an answer, not a crash
            log.exception("command failed", extra={"reason": cmd.name})
            return CommandResult(
                title=f"/protocol {cmd.name} failed",
                fields=(("error", f"{type(exc).__name__}: {exc}"),),
                ok=False,
            )

    async def _outbox_cmd(self, cmd: CommandRequest) -> CommandResult:
        if self._outbox is None:
            return CommandResult(title="no outbox in this process", ok=False)
        return await outbox_command(self._outbox, cmd.args)

    async def _help(self, cmd: CommandRequest) -> CommandResult:
        return CommandResult(
            title="bot-protocol gateway commands",
            columns=("command", "what it does"),
            rows=HELP_ROWS,
        )

    async def _status(self, cmd: CommandRequest) -> CommandResult:
        now = time.time()
        agent = cmd.args[0].lstrip("@") if cmd.args else None
        counts, by_key = await asyncio.gather(self._store.counts(), self._store.load_by_agent())
        # The store counts by name key; show each agent as declared or learned.
        shown = await self._directory.display_names(list(by_key))
        load = {shown[k]: n for k, n in by_key.items()}
        if agent is None:
            oldest = await self._store.oldest_open(limit=10)
        else:
            convs = await self._store.list(status="active", agent=agent, limit=200)
            oldest = sorted(convs, key=lambda c: c.created_at)[:10]
        fields: list[tuple[str, str]] = [
            ("by status", ", ".join(f"{s}: {counts.get(s, 0)}" for s in ConvStatus)),
            (
                "open load per agent",
                ", ".join(f"@{a}: {n}" for a, n in load.items()) or "nobody owes a reply",
            ),
        ]
        if agent is not None:
            owed = sum(n for a, n in load.items() if name_key(a) == name_key(agent))
            fields.insert(0, ("agent", f"@{agent} owes {owed} repl{'y' if owed == 1 else 'ies'}"))
        fields.extend(await self._status_extras())
        return CommandResult(
            title="bot-protocol status" + (f" for @{agent}" if agent else ""),
            fields=tuple(fields),
            columns=("RequestId", "type", "status", "age", "owes reply", "requester"),
            rows=tuple(
                (
                    c.request_id,
                    c.kind,
                    str(c.status),
                    _ago(now, c.created_at),
                    f"@{c.owes_reply}",
                    f"@{c.requester}",
                )
                for c in oldest
            ),
            footer="oldest open conversations first",
        )

    async def _show(self, cmd: CommandRequest) -> CommandResult:
        if not cmd.args:
            return CommandResult(title="usage: /protocol show <RequestId>", ok=False)
        conv = await self._store.get(cmd.args[0], with_history=True)
        if conv is None:
            return CommandResult(title=f"no conversation {cmd.args[0]!r}", ok=False)
        return conversation_result(conv, time.time())

    async def _list(self, cmd: CommandRequest) -> CommandResult:
        try:
            status, agent = list_args(cmd.args)
            convs = await self._store.list(status=status, agent=agent, limit=LIST_LIMIT)
        except ValueError as exc:
            return CommandResult(
                title="usage: /protocol list [status] [agent]",
                fields=(("why", str(exc)), ("status", ", ".join(LIST_FILTERS) + " (default all)")),
                ok=False,
            )
        now = time.time()
        filters = ", ".join(f for f in (status or "all", f"@{agent}" if agent else None) if f)
        return CommandResult(
            title=f"conversations ({filters})",
            columns=("RequestId", "type", "status", "requester", "assignee", "depth", "updated"),
            rows=tuple(
                (
                    c.request_id,
                    c.kind,
                    str(c.status),
                    f"@{c.requester}",
                    f"@{c.assignee}",
                    f"{c.depth_current}/{c.depth_max}",
                    f"{_ago(now, c.updated_at)} ago",
                )
                for c in convs
            ),
            footer=f"{len(convs)} shown (at most {LIST_LIMIT}), {_list_order(status, agent)}"
            + _status_hint(agent if not convs else None),
        )

    async def _agents(self, cmd: CommandRequest) -> CommandResult:
        try:
            offset = int(cmd.args[0]) if cmd.args else 0
            limit = int(cmd.args[1]) if len(cmd.args) > 1 else AGENTS_PAGE
        except ValueError:
            return CommandResult(title="usage: /protocol agents [offset] [limit]", ok=False)
        offset, limit = max(0, offset), min(max(1, limit), AGENTS_PAGE_MAX)
        declared = self._directory.declared_agents()
        shown = declared[offset : offset + limit]
        learned: list[LearnedName] = []
        if len(shown) < limit:
            learned = await self._directory.learned_page(
                max(0, offset - len(declared)), limit - len(shown)
            )
        total = len(declared) + await self._directory.learned_count()
        load = {name_key(a): n for a, n in (await self._store.load_by_agent()).items()}
        names = [a.name for a in shown] + [n.name for n in learned]
        registered = await self._directory.registered_keys(names)
        rows: list[tuple[str, ...]] = []
        for agent in shown:
            key = name_key(agent.name)
            rows.append(
                (
                    f"@{agent.name}",
                    agent.source,
                    ", ".join(str(a) for a in agent.addresses) or "-",
                    ", ".join(sorted(agent.identities)) or "(first seen)",
                    "config" if agent.public_key else registered.get(key, "no"),
                    str(load.get(key, 0)),
                )
            )
        for item in learned:
            key = name_key(item.name)
            rows.append(
                (
                    f"@{item.name}",
                    "learned",
                    str(item.address or "-"),
                    item.identity or "-",
                    registered.get(key, "no"),
                    str(load.get(key, 0)),
                )
            )
        last = offset + len(rows)
        return CommandResult(
            title="agents",
            fields=(("undeclared names", str(self._config.policy.undeclared_agents)),),
            columns=("agent", "kind", "addresses", "identities", "signs", "open load"),
            rows=tuple(rows),
            footer=f"{offset + 1 if rows else offset}-{last} of {total}"
            + (f"; next page: agents {last} {limit}" if last < total else ""),
        )

    async def _identity(self, cmd: CommandRequest) -> CommandResult:
        if len(cmd.args) != 2 or cmd.args[0] not in ("show", "reset"):
            return CommandResult(title="usage: /protocol identity show|reset <agent>", ok=False)
        action, name = cmd.args[0], cmd.args[1].lstrip("@")
        if action == "reset":
            try:
                had = await self._directory.reset(name)
            except ValueError as exc:
                return CommandResult(
                    title=f"cannot reset @{name}", fields=(("why", str(exc)),), ok=False
                )
            log.info("identity reset", extra={"sender": name, "identity": cmd.identity})
            if not had:
                return CommandResult(title=f"@{name} had no learned identity or address")
            return CommandResult(
                title=f"@{name} forgotten: the next identity to use the name binds it",
                fields=(("reset by", cmd.identity),),
            )
        return CommandResult(
            title=f"identity of @{name}", fields=tuple(await identity_fields(self._directory, name))
        )

    async def _key(self, cmd: CommandRequest) -> CommandResult:
        if len(cmd.args) != 2:
            return CommandResult(
                title="usage: /protocol key <agent> <public-key|remove>",
                fields=(("public-key", "base64url of the raw 32 bytes (`bpgw keygen` writes it)"),),
                ok=False,
            )
        agent, text = cmd.args[0].lstrip("@"), cmd.args[1]
        try:
            key_id = await self._directory.register_key(agent, None if text == "remove" else text)
        except ValueError as exc:
            return CommandResult(
                title=f"cannot set @{agent}'s key", fields=(("why", str(exc)),), ok=False
            )
        log.info(
            "agent key %s",
            "removed" if key_id is None else "registered",
            extra={"sender": agent, "identity": cmd.identity},
        )
        if key_id is None:
            return CommandResult(title=f"@{agent} no longer has a registered key")
        return CommandResult(
            title=f"@{agent} must now sign its messages",
            fields=(("KeyId", key_id), ("registered by", cmd.identity)),
        )

    async def _cancel(self, cmd: CommandRequest) -> CommandResult:
        if not cmd.args:
            return CommandResult(title="usage: /protocol cancel <RequestId> [reason]", ok=False)
        request_id = cmd.args[0]
        reason = " ".join(cmd.args[1:]) or "cancelled by an operator"
        by = cmd.author.display_name or cmd.identity
        result = await self._store.cancel(request_id, by=by, reason=reason)
        if result.outcome is not Outcome.APPLIED or result.conversation is None:
            return CommandResult(
                title=f"cannot cancel {request_id}", fields=(("why", result.reason),), ok=False
            )
        await self._on_cancel(CancelNotice(result.conversation, by, reason))
        conv = result.conversation
        return CommandResult(
            title=f"cancelled {request_id}",
            fields=(
                ("was", str(result.previous_status or "-")),
                ("told", f"@{conv.requester} and @{conv.assignee}"),
                ("reason", reason),
            ),
        )


def _list_order(status: str | None, agent: str | None) -> str:
    """How ``ConversationStore.list`` orders a listing with these filters."""
    if agent:
        return "newest first"
    statuses = list_statuses(status)
    if len(statuses) > 1:
        return "active oldest first, then finished most recently finished first"
    return "oldest first" if statuses[0] in ACTIVE else "most recently finished first"


def _status_hint(agent: str | None) -> str:
    """For an empty listing of an agent named like a status filter: the likely typo."""
    close = difflib.get_close_matches((agent or "").lower(), list(LIST_FILTERS), n=1)
    return f"; no agent @{agent} here: did you mean the status {close[0]}?" if close else ""


def list_args(args: Sequence[str]) -> tuple[str | None, str | None]:
    """``list [status] [agent]`` -> (status, agent) in either order.

    A word that is a status filter (``all``, ``active``, ``finished``, a status) is the
    status; any other word, or one starting with ``@``, is the agent (so ``@active`` is
    an agent named active). ``all`` is never an agent. ValueError for anything else.
    """
    status: str | None = None
    agent: str | None = None
    for arg in args:
        if not arg.startswith("@") and arg.lower() in LIST_FILTERS:
            if status is not None:
                raise ValueError(f"two statuses: {status} and {arg}")
            status = arg.lower()
        elif agent is None and arg.lstrip("@"):
            agent = arg.lstrip("@")
        else:
            raise ValueError(f"unexpected {arg!r}: give at most one status and one agent")
    return status, agent


async def identity_fields(directory: AgentDirectory, name: str) -> list[tuple[str, str]]:
    """What the directory knows about who may speak as ``name`` (command and CLI)."""
    fields = [("key", name_key(name))]
    reserved = directory.reserved(name)
    if reserved is not None:
        return [*fields, ("kind", f"reserved (@{reserved})")]
    agent = directory.declared(name)
    if agent is not None:
        fields += [
            ("kind", "declared in [agents]" if agent.source == "declared" else "transport token"),
            ("name", agent.name),
            ("identities", ", ".join(sorted(agent.identities)) or "(first seen)"),
            ("addresses", ", ".join(str(a) for a in agent.addresses) or "-"),
        ]
    learned = await directory.learned(name)
    if learned is not None:
        at = learned.last_seen
        fields += [
            ("learned name", learned.name),
            ("bound to", learned.identity or "-"),
            ("last seen at", str(learned.address or "-")),
            ("last seen", "-" if at is None else f"{format_duration(time.time() - at)} ago"),
        ]
    if agent is None and learned is None:
        fields.append(("kind", "unknown: nobody spoke as it yet"))
    return fields

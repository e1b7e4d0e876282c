"""The gateway pipeline, one direction only:

envelope -> drop our own and relayed copies -> commands -> parse -> (malformed: error reply)
-> authenticate the sender -> enforce depth -> loop guards -> apply to state -> route
-> relay. Ordinary chat is ignored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from adapters.base import (
    Address,
    CommandRequest,
    CommandResult,
    Disposition,
    Envelope,
    OutboundKind,
)
from gateway import notices
from gateway.agents import AgentDirectory, IdentityVerdict, SenderCheck
from gateway.commands import CancelNotice, Commands, parse_command
from gateway.config import GatewayConfig, parse_address
from gateway.frozen import shared_address
from gateway.guards import PairBudget
from gateway.logs import ids
from gateway.metrics import Metrics
from gateway.outbox import Item, Outbox, journal_entry
from protocol import (
    DEPTH_BOUNDED_TYPES,
    Depth,
    Message,
    MessageType,
    Status,
    addresses_everyone,
    build_response,
    fingerprint_and_render,
    name_key,
    parse,
    render,
    signature_problem,
)
from protocol.ids import new_request_id
from state.frozen import maker
from state.records import Conversation, ConvStatus, Origin, Outcome, size_problem
from state.store import ConversationStore

log = logging.getLogger("bpgw.gateway.pipeline")

# Bytes of an author id (a native identity, kept in identity bindings and loop-guard
# keys); longer ones are refused like oversize origin fields (docs/state.md "Bounds").
AUTHOR_ID_MAX_BYTES = 256
# Most parse errors one disposition carries (what the HTTP API answers with).
MAX_ERRORS_REPORTED = 100


@dataclass(frozen=True)
class _Rejection:
    """Why one message was refused: what to count and what to tell the sender."""

    kind: str  # metrics/violation kind: impersonation, signature, depth, loop, ...
    reason: str
    violation: bool = True


class Pipeline:
    """Processes envelopes from every transport and relays what they carry."""

    def __init__(
        self,
        config: GatewayConfig,
        store: ConversationStore,
        directory: AgentDirectory,
        outbox: Outbox,
        metrics: Metrics,
        commands: Commands,
    ) -> None:
        self._config = config
        self._store = store
        self._directory = directory
        self._outbox = outbox
        self._metrics = metrics
        self._commands = commands
        self._name = config.gateway.name
        # Asked for every message: read out of the (frozen) config once, not through two
        # pydantic attribute hooks (a few hundred instructions each) every time.
        self._command_prefix = config.gateway.command_prefix
        self._max_block_bytes = config.policy.max_block_bytes
        self._max_blocks = config.policy.max_blocks_per_message
        self._budget = PairBudget(config.policy)
        # Every message goes to the mirrors too, with no agent (made once).
        self._mirrors: list[tuple[Address, str | None]] = [
            (parse_address(m), None) for m in config.mirrors
        ]

    # -- entry points -------------------------------------------------------------

    async def is_own(self, env: Envelope) -> bool:
        """True for the gateway's own message or a relayed copy (dropped first)."""
        return (
            env.author.is_self
            or env.relayed
            or await self._outbox.is_echo(env.transport, env.native_id)
        )

    async def handle(self, env: Envelope) -> Disposition:
        """Run one inbound envelope through the pipeline."""
        metrics = self._metrics
        # (is_own without its coroutine when there is no echo marker to look up: the HTTP
        # API's fresh native ids)
        maybe_own = (env.author.is_self or env.relayed
                     or self._outbox.echo_possible(env.transport, env.native_id))
        if maybe_own and await self.is_own(env):
            metrics.received(env.transport, "echo")
            return self._count(
                Disposition("dropped", "the gateway's own message or a relayed copy")
            )
        origin = _make_origin(transport=env.transport, channel=env.channel, thread=env.thread,
                              native_id=env.native_id)
        problem = origin.problem()
        problem = problem or size_problem("author id", env.author.id, AUTHOR_ID_MAX_BYTES)
        if problem is not None:
            return self._count(await self._too_long(env, problem))
        command = parse_command(env.text, self._command_prefix)
        if command is not None:
            metrics.received(env.transport, "command")
            result = await self.command(
                CommandRequest(
                    env.transport,
                    env.channel,
                    env.author,
                    command[0],
                    command[1],
                    thread=env.thread,
                    roles=env.author.roles,
                )
            )
            adapter = self._outbox.adapter(env.transport)
            text = adapter.render_command_result(result) if adapter else result.to_text()
            await self._notify(env.address, text, reply_to=env.native_id)
            return self._count(Disposition("command", result.title))
        parsed = parse(env.text, max_block_bytes=self._max_block_bytes)
        if not parsed.found_block:
            metrics.received(env.transport, "chat")
            return self._count(Disposition("ignored", "no protocol block"))
        for msg in parsed.messages:
            metrics.received(env.transport, str(msg.type))
        results: list[Disposition] = []
        if parsed.errors:
            metrics.received(env.transport, "malformed")
            metrics.parse_errors(e.code for e in parsed.errors)
            log.info(
                "malformed protocol block",
                extra={
                    "transport": env.transport,
                    "channel": env.channel,
                    "native_id": env.native_id,
                    "reason": parsed.errors[0].code,
                },
            )
            await self._notify(
                env.address, notices.malformed(parsed.errors), reply_to=env.native_id
            )
            # Hostile input can carry one error per line: report a bounded number.
            shown = parsed.errors[:MAX_ERRORS_REPORTED]
            more = len(parsed.errors) - len(shown)
            results.append(
                Disposition(
                    "malformed",
                    "; ".join(e.message for e in shown[: notices.MAX_ERRORS_SHOWN])
                    + (f" (and {more} more errors)" if more else ""),
                    errors=tuple(e.to_dict() for e in shown),
                )
            )
        cap = self._max_blocks
        address = shared_address(env.transport, env.channel, env.thread)  # (env.address: a new one)
        for msg in parsed.messages[:cap]:
            results.append(await self._handle_message(env, msg, origin, address))
        if len(parsed.messages) > cap:
            results.append(await self._too_many_blocks(env, parsed.messages[cap:], cap))
        return self._count(_combine(results))

    async def _too_long(self, env: Envelope, problem: str) -> Disposition:
        """Refuse an envelope whose transport-supplied fields exceed what state stores
        (never cut: a cut native id breaks deduplication, a cut thread misroutes)."""
        log.warning(
            "envelope refused: %s",
            problem,
            extra={"transport": env.transport, "identity": env.identity, "reason": "too_long"},
        )
        await self._metrics.record_violation("too_long")
        # Told on the channel without the thread (and not at all if the channel is the
        # oversize field): nothing oversize is journaled either.
        if Origin(env.transport, env.channel).problem() is None:
            await self._notify(
                Address(env.transport, env.channel),
                notices.rejected("this message", problem, None, None),
            )
        return Disposition("rejected", f"too_long: {problem}; nothing was processed")

    async def _too_many_blocks(self, env: Envelope, extra: list[Message], cap: int) -> Disposition:
        """Refuse the blocks past the per-message cap, so one post does bounded work."""
        total = cap + len(extra)
        reason = (
            f"this message carries {total} protocol blocks; at most {cap} per message are "
            f"processed, so blocks {cap + 1}-{total} were refused: send them in separate "
            "messages"
        )
        log.warning(
            "too many protocol blocks in one message",
            extra={"transport": env.transport, "identity": env.identity, "reason": reason},
        )
        await self._metrics.record_violation("too_many_blocks")
        shown = [m.request_id for m in extra[:MAX_ERRORS_REPORTED]]
        await self._notify(
            env.address,
            notices.rejected(f"{len(extra)} protocol block(s) of this message", reason, None, None),
            reply_to=env.native_id,
        )
        return Disposition("rejected", f"too_many_blocks: {reason}", tuple(shown))

    async def command(self, cmd: CommandRequest) -> CommandResult:
        """Run an operator command (from text or a native slash command)."""
        return await self._commands.run(cmd)

    async def on_timeout(self, conv: Conversation) -> None:
        """Sweep callback: tell the origin thread, and send the requester a failed RESPONSE.

        Both are journaled in one step that also clears the conversation's "notices owed"
        mark the claim set, so they are posted exactly once, even when the replica that
        claimed the conversation died before posting them (another sweep finds the mark).
        """
        owes, waited = _who_timed_out(conv)
        origin = _origin_address(conv)
        entries = [
            self._notice_entry(
                origin,
                notices.timed_out(conv.request_id, conv.trace_id, owes, waited, conv.kind),
                reply_to=conv.origin.native_id,
                request_id=conv.request_id,
                trace_id=conv.trace_id,
            ),
            *await self._gateway_response(
                conv,
                to=conv.requester,
                status=Status.FAILED,
                result=(
                    f"Timed out: no answer from @{owes} after "
                    f"{notices.format_duration(waited)}. TraceId: {conv.trace_id or '-'}"
                ),
                also=(origin,),
            ),
        ]
        if not await self._outbox.enqueue_once(entries, self._store.keys.notify,
                                               conv.request_id):
            return  # another replica posted them already
        log.info(
            "conversation timed out",
            extra={"request_id": conv.request_id, "trace_id": conv.trace_id, "recipient": owes},
        )

    async def on_cancel(self, notice: CancelNotice) -> None:
        """After an operator's cancel: tell the requester and the assignee."""
        conv = notice.conversation
        result = f"Cancelled by {notice.by}: {notice.reason}"
        entries = await self._gateway_response(
            conv,
            to=conv.requester,
            status=Status.CANCELLED,
            result=result,
            also=(_origin_address(conv),),
        )
        if name_key(conv.assignee) not in (name_key(conv.requester), "all"):
            entries += await self._gateway_response(
                conv, to=conv.assignee, status=Status.CANCELLED, result=result
            )
        await self._outbox.enqueue(entries)

    # -- one message ----------------------------------------------------------------

    async def _handle_message(self, env: Envelope, msg: Message, origin: Origin,
                              address: Address) -> Disposition:
        """One message of ``env`` (which came from ``origin``, seen at ``address``)."""
        identity = env.identity
        # The fields straight from the instance dict: each attribute of a model goes
        # through pydantic's __getattr__ hook (a few hundred instructions, see _message_call).
        fields = msg.__dict__
        rejection = await self._authenticate(msg, fields, identity, address)
        if (rejection is None and fields["type"] in DEPTH_BOUNDED_TYPES
                and fields["depth"].at_limit):
            rejection = _Rejection(
                "depth",
                f"{msg.type} at depth {msg.depth} is over the limit: at current == max only "
                "a RESPONSE may be sent",
            )
        if rejection is not None:
            return await self._reject(env, msg, rejection)
        fp, rendered = fingerprint_and_render(msg)
        targets = await self._targets(msg, address, None)
        # No agent's address among the targets (mirrors only, or none at all). (The
        # targets first: they usually decide it, without the model's attribute hook.)
        unheld = not any(r for _, r in targets) and not msg.is_broadcast
        if unheld:
            refused = await self._unholdable_recipient(msg)
            if refused is not None:
                return await self._reject(env, msg, refused)
        # The relays are journaled in the same atomic step as the state change, and the
        # loop guard is checked and charged in it too (shared by every replica).
        entry = (
            self._entry(msg, targets, sender_at=address, text=rendered, fields=fields)
            if targets else ""
        )
        # @all counts as one peer, so a BROADCAST storm from one agent is bounded too.
        budget = self._budget.budget(fields["sender"], fields["to"], identity)
        applied = await self._store.apply(
            msg, origin, fingerprint=fp, journal=entry, budget=budget
        )
        outcome = applied.outcome
        orphan = False
        # The other outcomes are told apart only when it is not the usual one: each
        # ``Outcome.X`` read goes through EnumType's __getattr__ hook (several hundred).
        if outcome is not _APPLIED:
            if outcome is Outcome.DUPLICATE:
                log.info("duplicate message counted once",
                         extra=ids(msg, transport=env.transport))
                return Disposition(
                    "duplicate", f"already accepted: {applied.reason}", (msg.request_id,)
                )
            if outcome is Outcome.LOOP:
                policy = self._config.policy
                reason = (
                    f"@{msg.sender} ({env.identity}) and @{msg.to} exceeded "
                    f"{policy.pair_budget_messages} messages per "
                    f"{policy.pair_budget_window_seconds:g}s; relaying between them "
                    f"resumes in {applied.retry_after:.0f}s"
                )
                return await self._reject(
                    env, msg, _Rejection("loop", reason), notify=applied.tripped
                )
            if outcome is Outcome.DEPTH:
                return await self._reject(
                    env, msg, _Rejection("depth", applied.reason), conv=applied.conversation
                )
            if outcome is Outcome.TOO_LONG:
                return await self._reject(env, msg, _Rejection("too_long", applied.reason))
            if outcome in (Outcome.CONFLICT, Outcome.ILLEGAL):
                return await self._reject(
                    env, msg, _Rejection(str(outcome), applied.reason, violation=False)
                )
            orphan = outcome is Outcome.ORPHAN
        if log.isEnabledFor(logging.INFO):  # the hot path: build the context only if logged
            log.info(
                "message accepted",
                extra=ids(
                    msg,
                    transport=env.transport,
                    outcome=str(outcome),
                    reason=f"queued for {len(targets)}",
                ),
            )
        warnings = self._warnings(msg, targets)
        if unheld and not await self._directory.addresses(msg.to):
            warnings.insert(0, _no_address(msg))
            await self._notify(
                address,
                notices.rejected(
                    f"delivery of {msg.type} to @{msg.to}",
                    f"@{msg.to} has no known address; declare it under [agents.{msg.to}] "
                    "addresses (the conversation is tracked)",
                    msg.request_id,
                    msg.trace_id,
                ),
                reply_to=env.native_id,
            )
        detail = "orphan RESPONSE kept" if orphan else "applied"
        return _make_disposition(
            outcome="accepted",
            detail=f"{detail}; queued for delivery to {len(targets)} address(es)",
            request_ids=(fields["request_id"],),
            warnings=tuple(warnings),
        )

    async def _unholdable_recipient(self, msg: Message) -> _Rejection | None:
        """Why ``msg`` may not be addressed to its recipient: a name nobody may ever
        hold, so the conversation would wait on nobody. Only asked for a recipient with
        no address (such a name is never bound, so never has one)."""
        if self._directory.reserved(msg.to) is not None:
            prefix = self._config.gateway.command_prefix
            return _Rejection(
                "illegal",
                f"@{msg.to} is (or looks like) the gateway's own name; the gateway answers "
                f"no protocol messages: address an agent, or ask the gateway with {prefix} "
                "commands",
                violation=False,
            )
        other = await self._directory.looks_like(msg.to)
        if other is None:
            return None
        return _Rejection(
            "impersonation",
            f"the recipient @{msg.to} looks like @{other}, another agent's name, and nobody "
            f"may hold it; address @{other} by its own name",
        )

    def _warnings(
        self, msg: Message, targets: list[tuple[Address, str | None]]
    ) -> list[dict[str, Any]]:
        """What the sender should know about where its message is going right now."""
        out: list[dict[str, Any]] = []
        blocked = self._outbox.blocked
        if not blocked:
            return out
        for address, recipient in targets:
            why = blocked.get(self._outbox.destination_of(address, recipient))
            if why is not None:
                code, _, detail = why.partition("\t")
                out.append(
                    {
                        "code": code or "delivery_failing",
                        "agent": recipient,
                        "address": str(address),
                        "request_id": msg.request_id,
                        "detail": (detail or code)
                        + "; the message is queued and retried, then dead-lettered",
                    }
                )
        return out

    async def _authenticate(self, msg: Message, fields: dict[str, Any], identity: str,
                            address: Address) -> _Rejection | None:
        """Why ``msg`` (whose instance dict is ``fields``) may not be accepted from
        ``identity`` at ``address``, or None."""
        # The identity check comes last: under tofu it binds the name, and a message
        # that fails its Signature or squats a RequestId must not bind anything.
        # (Each look-up is awaited only when the directory's memory can not answer it:
        # a coroutine made and run per message for nothing costs more than the check.)
        directory = self._directory
        sender = fields["sender"]
        known, key = directory.known_public_key(sender)
        if not known:
            key = await directory.public_key(sender)
        if key is not None:
            if fields["signature"] is None:
                return _Rejection(
                    "signature", f"@{sender} must sign its messages (Signature field missing)"
                )
            problem = signature_problem(msg, key)
            if problem is not None:
                return _Rejection(
                    "signature", f"the Signature does not verify for @{sender}: {problem}"
                )
        if fields["type"] in _OPENERS:
            request_id = fields["request_id"]
            known, owner = directory.known_request_id_owner(request_id, sender)
            if not known:
                owner = await directory.request_id_owner(request_id, sender)
            if owner is not None:
                return _Rejection(
                    "request_id",
                    f"RequestId {request_id} has the form <agent>-<suffix> of @{owner}; "
                    f"only @{owner} may open it. Use a RequestId of your own, like "
                    f"{new_request_id(sender)}",
                )
        check = directory.fixed_check(sender, identity) or await directory.check_sender(
            sender, identity, address
        )
        if not check.ok:
            return _identity_rejection(check, msg, identity)
        return None

    async def _reject(
        self,
        env: Envelope,
        msg: Message,
        why: _Rejection,
        *,
        notify: bool = True,
        conv: Conversation | None = None,
    ) -> Disposition:
        log.warning(
            "message rejected: %s",
            why.reason,
            extra=ids(msg, transport=env.transport, identity=env.identity, outcome=why.kind),
        )
        if why.violation:
            await self._metrics.record_violation(why.kind)
        if notify:
            await self._notify(
                env.address,
                notices.rejected(
                    f"{msg.type} from @{msg.sender}", why.reason, msg.request_id, msg.trace_id
                ),
                reply_to=env.native_id,
            )
        if why.kind == "depth" and self._config.policy.close_on_depth_violation:
            await self._close_on_depth(env, msg, why.reason, conv)
        return Disposition("rejected", f"{why.kind}: {why.reason}", (msg.request_id,))

    async def _close_on_depth(
        self, env: Envelope, msg: Message, reason: str, conv: Conversation | None
    ) -> None:
        """Fail the conversation so nobody waits forever for a chain that was cut."""
        if conv is None:
            conv = await self._store.get(msg.request_id, with_history=False)
        result = f"Depth limit: {reason}"
        if conv is None:
            # A new REQUEST already at the limit: no conversation to close, but its sender
            # still gets a failed RESPONSE instead of waiting for an answer.
            reply = build_response(
                sender=self._name,
                to=msg.sender,
                request_id=msg.request_id,
                status=Status.FAILED,
                result=result,
                trace_id=msg.trace_id,
                depth=msg.depth,
            )
            await self._outbox.enqueue(await self._relay(reply, None, None, also=(env.address,)))
            return
        parties = {name_key(conv.requester), name_key(conv.assignee)}
        if conv.is_terminal or (name_key(msg.sender) not in parties and "all" not in parties):
            return  # a bystander's bad message must not end someone else's conversation
        closed = await self._store.close(
            conv.request_id, status=ConvStatus.FAILED, by=self._name, reason=result
        )
        if closed.outcome is Outcome.APPLIED:
            await self._outbox.enqueue(await self._gateway_response(
                conv,
                to=conv.requester,
                status=Status.FAILED,
                result=result,
                also=(_origin_address(conv),),
            ))

    # -- routing and relay ------------------------------------------------------------

    async def _targets(
        self, msg: Message, seen_at: Address | None, conv: Conversation | None
    ) -> list[tuple[Address, str | None]]:
        """Where ``msg`` must be delivered, with the agent each address is for."""
        wanted: list[tuple[Address, str | None]] = []
        to = msg.__dict__["to"]  # (no attribute hook per field: see _handle_message)
        if addresses_everyone(to):
            sender = name_key(msg.sender)
            for address, name in await self._directory.broadcast_targets():
                if name_key(name) != sender:
                    wanted.append((address, name))
        else:
            # Delivered under the name as its agent writes it (@mantis reaches Mantis).
            declared = self._directory.declared_addresses(to)
            wanted.extend(declared if declared is not None
                          else await self._directory.addresses(to))
        wanted.extend(self._mirrors)
        out: list[tuple[Address, str | None]] = []
        seen: set[tuple[str, str]] = set()
        if seen_at is not None:
            # Already visible there: everyone in that channel saw the original.
            seen.add((seen_at.transport, seen_at.channel))
        for address, recipient in wanted:
            key = (address.transport, address.channel)
            if key in seen:
                continue
            seen.add(key)
            out.append((_in_thread(address, conv), recipient))
        return out

    def _entry(
        self,
        msg: Message,
        targets: list[tuple[Address, str | None]],
        *,
        sender_at: Address | None = None,
        conv: Conversation | None = None,
        text: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> str:
        """The journal entry relaying ``msg`` (``text``: ``render(msg)`` and ``fields``:
        its instance dict, when the caller has them already) to ``targets``.

        With ``conv`` the placement (thread, reply-to) is resolved here; without it the
        state script resolves it from the conversation's origin in the same commit.
        """
        deliveries = [
            (
                a.transport,
                a.channel,
                a.thread or "",
                recipient or "",
                (_reply_to(a, conv) or "") if conv is not None else "",
            )
            for a, recipient in targets
        ]
        if fields is None:
            fields = msg.__dict__  # (no attribute hook per field: see _handle_message)
        return journal_entry(
            render(msg) if text is None else text,
            _PROTOCOL,
            deliveries,
            request_id=fields["request_id"],
            trace_id=fields["trace_id"],
            sender_at=sender_at,
        )

    async def _relay(
        self,
        msg: Message,
        seen_at: Address | None,
        conv: Conversation | None,
        *,
        also: tuple[Address, ...] = (),
    ) -> list[str]:
        """The journal entry relaying a gateway-built ``msg`` to its targets (plus
        ``also``), if it has any."""
        targets = await self._targets(msg, seen_at, conv)
        have = {(a.transport, a.channel) for a, _ in targets}
        for extra_addr in also:
            if (extra_addr.transport, extra_addr.channel) not in have:
                have.add((extra_addr.transport, extra_addr.channel))
                targets.append((_in_thread(extra_addr, conv), None))
        return [self._entry(msg, targets, conv=conv)] if targets else []

    async def _gateway_response(
        self,
        conv: Conversation,
        *,
        to: str,
        status: Status,
        result: str,
        also: tuple[Address, ...] = (),
    ) -> list[str]:
        """The journal entry of a RESPONSE from the gateway itself (timeouts, cancels, depth
        closes)."""
        depth = Depth(current=min(conv.depth_current + 1, conv.depth_max), max=conv.depth_max)
        reply = build_response(
            sender=self._name,
            to=to,
            request_id=conv.request_id,
            status=status,
            result=result,
            trace_id=conv.trace_id,
            depth=depth,
        )
        return await self._relay(reply, None, conv, also=also)

    async def _notify(self, address: Address, text: str, **ids: str | None) -> None:
        """Journal a notice (``ids``: reply_to, request_id, trace_id as in
        ``_notice_entry``); a failed notice is dead-lettered without telling anyone."""
        await self._outbox.enqueue([self._notice_entry(address, text, **ids)])

    @staticmethod
    def _notice_entry(
        address: Address,
        text: str,
        *,
        reply_to: str | None = None,
        request_id: str | None = None,
        trace_id: str | None = None,
    ) -> str:
        """The journal entry of a notice to ``address``."""
        return journal_entry(
            text,
            OutboundKind.NOTICE,
            [(address.transport, address.channel, address.thread or "", "", reply_to or "")],
            request_id=request_id,
            trace_id=trace_id,
        )

    async def on_dead_letter(self, item: Item) -> None:
        """Tell the sender when its message could not be delivered (dispatcher callback)."""
        out = item.out
        if item.sender_at is None or out.kind is not OutboundKind.PROTOCOL:
            return
        who = f"@{out.recipient}" if out.recipient else str(out.address)
        await self._notify(
            item.sender_at,
            notices.rejected(
                f"delivery to {who}",
                f"gave up after {item.attempts} attempt(s) ({item.error}); the message is "
                "dead-lettered and an operator can re-send it (/protocol outbox)",
                out.request_id,
                out.trace_id,
            ),
            request_id=out.request_id,
            trace_id=out.trace_id,
        )

    def _count(self, disposition: Disposition) -> Disposition:
        self._metrics.count(disposition.outcome)
        return disposition


# Every message has an origin, and most an accepted disposition (gateway.frozen).
_make_origin = maker(Origin)
_make_disposition = maker(Disposition)

# Messages that open a conversation under their RequestId.
_OPENERS = frozenset({MessageType.REQUEST, MessageType.BROADCAST})
# Enum members the message path reads every time, read once here: ``Enum.X`` in a
# function goes through EnumType's __getattr__ hook (several hundred instructions).
_APPLIED = Outcome.APPLIED
_PROTOCOL = OutboundKind.PROTOCOL


def _identity_rejection(check: SenderCheck, msg: Message, identity: str) -> _Rejection:
    """What a sender is told when it may not speak as its From."""
    name = msg.sender
    verdict = check.verdict
    if verdict is IdentityVerdict.UNDECLARED:
        return _Rejection(
            "undeclared",
            f"@{name} is not a declared agent (policy: pin); declare it under [agents]",
        )
    if verdict is IdentityVerdict.RESERVED:
        what = "addresses everyone" if check.detail == "all" else "is the gateway's own name"
        return _Rejection("impersonation", f"@{name} is reserved: @{check.detail} {what}")
    if verdict is IdentityVerdict.CONFUSABLE:
        return _Rejection(
            "impersonation",
            f"@{name} looks like @{check.detail}, another agent's name; {identity} may not "
            "use it",
        )
    if verdict is IdentityVerdict.TOO_MANY_NAMES:
        return _Rejection(
            "too_many_names",
            f"{identity} already speaks as {check.detail} names, the most one identity may "
            "hold ([policy] max_names_per_identity); an operator can free one with "
            "/protocol identity reset NAME",
        )
    return _Rejection("impersonation", f"{identity} may not speak as @{name}")


def _no_address(msg: Message) -> dict[str, Any]:
    return {
        "code": "no_address",
        "agent": msg.to,
        "address": None,
        "request_id": msg.request_id,
        "detail": f"@{msg.to} has no known address; the conversation is tracked but nothing "
        "was sent to it",
    }


def _who_timed_out(conv: Conversation) -> tuple[str, float]:
    """Who did not answer a timed-out conversation, and for how many seconds.

    The sweeper's TIMEOUT event is last in the history and names who owed the reply; the
    event before it started the wait (the status is already ``timeout``, so
    ``owes_reply`` can no longer tell a CLARIFY's requester from the assignee).
    """
    history = conv.history
    if history and history[-1].type == "TIMEOUT":
        since = history[-2].at if len(history) >= 2 else conv.created_at
        return history[-1].to, history[-1].at - since
    return conv.owes_reply, time.time() - conv.updated_at


def _origin_address(conv: Conversation) -> Address:
    o = conv.origin
    return Address(o.transport, o.channel, o.thread)


def _in_thread(address: Address, conv: Conversation | None) -> Address:
    """Put replies into the thread where the conversation started, on that channel."""
    if conv is None or address.thread:
        return address
    o = conv.origin
    if o.thread and address.transport == o.transport and address.channel == o.channel:
        return Address(address.transport, address.channel, o.thread)
    return address


def _reply_to(address: Address, conv: Conversation | None) -> str | None:
    if conv is None:
        return None
    o = conv.origin
    if address.transport == o.transport and address.channel == o.channel:
        return o.native_id
    return None


_SEVERITY = ("accepted", "duplicate", "ignored", "rejected", "malformed")


def _combine(results: list[Disposition]) -> Disposition:
    """One disposition for a chat message that held several blocks (the worst wins)."""
    if not results:
        return Disposition("ignored", "no protocol block")
    if len(results) == 1:
        return results[0]
    worst = max(results, key=lambda d: _SEVERITY.index(d.outcome) if d.outcome in _SEVERITY else 0)
    return Disposition(
        worst.outcome,
        "; ".join(d.detail for d in results if d.detail),
        tuple(rid for d in results for rid in d.request_ids),
        tuple(e for d in results for e in d.errors),
        tuple(w for d in results for w in d.warnings),
    )

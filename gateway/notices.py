"""Texts of the notices the gateway posts to people and agents.

Plain text only: adapters style it for their platform. Every notice names the RequestId
(and TraceId where known) so a reader can find the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol import ParseError

NOTICE_PREFIX = "⚠️ bot-protocol gateway:"
# A hostile message can hold thousands of errors; people are shown the first few.
MAX_ERRORS_SHOWN = 10


def _ids(request_id: str | None, trace_id: str | None) -> str:
    parts = []
    if request_id:
        parts.append(f"RequestId {request_id}")
    if trace_id:
        parts.append(f"TraceId {trace_id}")
    return f" ({', '.join(parts)})" if parts else ""


def malformed(errors: Sequence[ParseError]) -> str:
    """A malformed-block reply: each error's code, block, line, field and how to fix it."""
    lines = [f"{NOTICE_PREFIX} this message has a malformed protocol block and was not relayed."]
    for err in errors[:MAX_ERRORS_SHOWN]:
        where = f"block {err.block}, line {err.line}"
        if err.field:
            where += f", field {err.field}"
        lines.append(f"- {err.code} ({where}): {err.message}")
        if err.hint:
            lines.append(f"  fix: {err.hint}")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"... and {len(errors) - MAX_ERRORS_SHOWN} more errors")
    return "\n".join(lines)


def rejected(what: str, reason: str, request_id: str | None, trace_id: str | None) -> str:
    """A message was refused (identity, signature, depth, transition, loop budget)."""
    return f"{NOTICE_PREFIX} {what} rejected{_ids(request_id, trace_id)}: {reason}"


def timed_out(
    request_id: str, trace_id: str | None, owes: str, waited_seconds: float, kind: str
) -> str:
    """A conversation's deadline passed."""
    return (
        f"{NOTICE_PREFIX} {kind} {request_id} timed out: no answer from @{owes} "
        f"after {format_duration(waited_seconds)}{_ids(None, trace_id)}. "
        "The requester has been sent a failed RESPONSE."
    )


def cancelled(request_id: str, trace_id: str | None, by: str, reason: str) -> str:
    """An operator cancelled a conversation."""
    why = f": {reason}" if reason else ""
    return f"{NOTICE_PREFIX} {request_id} was cancelled by {by}{why}{_ids(None, trace_id)}"


def format_duration(seconds: float) -> str:
    """``95`` -> ``1m 35s``; ``7260`` -> ``2h 1m``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"

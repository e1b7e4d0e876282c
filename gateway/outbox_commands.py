"""``/protocol outbox`` and ``bpgw outbox``: list, re-send and discard dead letters.

Written once as a ``CommandResult`` so the operator command and the CLI show the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from adapters.base import CommandResult
from gateway.notices import format_duration
from gateway.outbox import Outbox

USAGE = (
    "outbox [list [destination]] | outbox retry <id...|all> [--dest D] | "
    "outbox drop <id...|all> [--dest D]"
)
LIST_LIMIT = 50
EXCERPT = 60


def _split(args: Sequence[str]) -> tuple[list[str], str | None]:
    """Ids (``all`` = every one) and an optional ``--dest DESTINATION``."""
    ids: list[str] = []
    dest: str | None = None
    rest = list(args)
    while rest:
        word = rest.pop(0)
        if word == "--dest" and rest:
            dest = rest.pop(0)
        elif word != "all":
            ids.append(word)
    return ids, dest


async def outbox_command(outbox: Outbox, args: Sequence[str]) -> CommandResult:
    """Run ``outbox list|retry|drop``; never raises for bad arguments."""
    action = args[0].lower() if args else "list"
    rest = list(args[1:])
    if action == "list":
        return await _list(outbox, rest[0] if rest else None)
    if action in ("retry", "drop"):
        ids, dest = _split(rest)
        if not ids and "all" not in rest:
            return CommandResult(title=f"usage: {USAGE}", ok=False)
        n = await (outbox.retry(ids, dest) if action == "retry" else outbox.drop(ids, dest))
        done = "re-queued for delivery" if action == "retry" else "discarded"
        return CommandResult(title=f"{n} dead letter(s) {done}", ok=n > 0 or not ids)
    return CommandResult(title=f"usage: {USAGE}", ok=False)


STATUS_DESTINATIONS = 10
"""Destinations ``outbox_status`` names (the largest); the rest are summed."""


def _largest(per_dest: dict[str, int]) -> str:
    """``dest: n, ...`` of the largest ``STATUS_DESTINATIONS``, then how many more."""
    ranked = sorted(per_dest.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{d}: {n}" for d, n in ranked[:STATUS_DESTINATIONS])
    rest = ranked[STATUS_DESTINATIONS:]
    if rest:
        shown += f" and {sum(n for _, n in rest)} more at {len(rest)} other destination(s)"
    return shown


async def outbox_status(outbox: Outbox) -> list[tuple[str, str]]:
    """The outbox lines of ``/protocol status`` and ``bpgw status``: depth, dead letters."""
    stats = await outbox.stats()
    queued = sum(stats["queued"].values())
    depth = f"{stats['journal']} to dispatch, {queued} awaiting retry"
    if queued:
        depth += f" ({_largest(stats['queued'])})"
    return [("outbox", depth), ("dead letters", _largest(stats["dead_letters"]) or "none")]


async def _list(outbox: Outbox, dest: str | None) -> CommandResult:
    stats = await outbox.stats()
    letters = await outbox.dead_letters(dest, limit=LIST_LIMIT)
    now = time.time()
    queued = stats["queued"]
    fields = (
        ("to dispatch", str(stats["journal"])),
        (
            "awaiting retry",
            ", ".join(f"{d}: {n}" for d, n in sorted(queued.items())) or "none",
        ),
        (
            "dead letters kept",
            ", ".join(f"{d}: {n}" for d, n in sorted(stats["dead_letters"].items())) or "none",
        ),
        (
            "blocked",
            "; ".join(
                f"{d}: {why.replace(chr(9), ': ')}" for d, why in sorted(stats["blocked"].items())
            )
            or "none",
        ),
    )
    rows = tuple(
        (
            dl.id,
            dl.dest,
            dl.item.out.request_id or "-",
            str(dl.item.out.kind),
            str(dl.item.attempts),
            f"{format_duration(now - dl.at)} ago",
            (dl.item.error or "-")[:EXCERPT],
        )
        for dl in letters
    )
    return CommandResult(
        title="outbox" + (f" ({dest})" if dest else ""),
        fields=fields,
        columns=("id", "destination", "RequestId", "kind", "attempts", "when", "error"),
        rows=rows,
        footer=f"showing up to {LIST_LIMIT} dead letters, oldest first; "
        "re-send with: outbox retry <id|all>",
    )

"""Command results for Slack: Block Kit for ``respond()`` and mrkdwn text, within
Slack's limits (https://api.slack.com/reference/block-kit/blocks)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from adapters.base import CommandResult
from adapters.results import Markup, rich_text, table
from adapters.slack.text import escape

HEADER_MAX = 150
SECTION_TEXT_MAX = 3000
FIELDS_PER_SECTION = 10
FIELD_TEXT_MAX = 2000
BLOCKS_MAX = 50
CONTEXT_TEXT_MAX = 3000
# Text answers (a command typed as a message) are split by the outbox like any message.
MRKDWN_MAX = 8000

MRKDWN = Markup(
    bold=lambda s: f"*{s}*",
    italic=lambda s: f"_{s}_",
    block=lambda s: f"```\n{s}\n```",
)
"""Slack's mrkdwn for text posted through ``send`` (which escapes what Slack requires)."""
ESCAPED = replace(MRKDWN, escape=escape)
"""mrkdwn placed in Block Kit directly (escaped here)."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


def blocks(result: CommandResult) -> list[dict[str, Any]]:
    """A ``CommandResult`` as Block Kit: a header, the fields in sections of ten, the
    table as a preformatted section, the footer as context."""
    icon = "" if result.ok else "⚠️ "
    out: list[dict[str, Any]] = [{
        "type": "header",
        "text": {"type": "plain_text", "text": _cut(icon + result.title, HEADER_MAX) or "-"},
    }]
    fields = [
        _mrkdwn(_cut(f"*{escape(name or '-')}*\n{escape(value or '-')}", FIELD_TEXT_MAX))
        for name, value in result.fields
    ]
    room = BLOCKS_MAX - 3  # header, table, footer
    while fields and room > 0:
        out.append({"type": "section", "fields": fields[:FIELDS_PER_SECTION]})
        fields = fields[FIELDS_PER_SECTION:]
        room -= 1
    footer = result.footer
    if fields:
        footer = f"{footer} ({len(fields)} more fields not shown)".strip()
    grid = table(result, SECTION_TEXT_MAX, ESCAPED)
    if grid:
        out.append({"type": "section", "text": _mrkdwn(grid)})
    if footer:
        out.append({"type": "context",
                    "elements": [_mrkdwn(_cut(escape(footer), CONTEXT_TEXT_MAX))]})
    return out


def mrkdwn(result: CommandResult) -> str:
    """A ``CommandResult`` as one mrkdwn message, unescaped (``send`` escapes it)."""
    return rich_text(result, MRKDWN, MRKDWN_MAX)

"""Discord output forms: command results as embeds (within Discord's embed limits) and as
markdown text."""

from __future__ import annotations

import discord

from adapters.base import CommandResult
from adapters.results import MARKDOWN, rich_text, table

# Discord's embed limits (https://discord.com/developers/docs/resources/message#embed-object).
TITLE_MAX = 256
FIELDS_MAX = 25
FIELD_NAME_MAX = 256
FIELD_VALUE_MAX = 1024
DESCRIPTION_MAX = 4096
FOOTER_MAX = 2048
EMBED_TOTAL_MAX = 6000
OK_COLOUR = 0x2ECC71
ERROR_COLOUR = 0xE74C3C
# Text answers are split by the outbox like any message: this bounds only their size.
MARKDOWN_MAX = 8000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def embed(result: CommandResult) -> discord.Embed:
    """A ``CommandResult`` as one embed: title, inline fields, the table as a code block."""
    out = discord.Embed(
        title=_cut(result.title, TITLE_MAX),
        colour=OK_COLOUR if result.ok else ERROR_COLOUR,
        description=table(result, DESCRIPTION_MAX) or None,
    )
    budget = EMBED_TOTAL_MAX - len(out.title or "") - len(out.description or "") - FOOTER_MAX
    fields = list(result.fields)
    shown = fields[: FIELDS_MAX - (1 if len(fields) > FIELDS_MAX else 0)]
    for name, value in shown:
        name, value = _cut(name or "-", FIELD_NAME_MAX), _cut(value or "-", FIELD_VALUE_MAX)
        if len(name) + len(value) > budget:
            break
        budget -= len(name) + len(value)
        out.add_field(name=name, value=value, inline=len(value) <= 40)
    hidden = len(fields) - len(out.fields)
    footer = result.footer
    if hidden:
        footer = f"{footer} ({hidden} more fields not shown)".strip()
    if footer:
        out.set_footer(text=_cut(footer, FOOTER_MAX))
    return out


def markdown(result: CommandResult) -> str:
    """A ``CommandResult`` as message text: bold title, fields, the table in a code block."""
    return rich_text(result, MARKDOWN, MARKDOWN_MAX)

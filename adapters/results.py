"""Command results as chat text: one renderer, a markup per platform.

A ``CommandResult`` (title, fields, a table, a footer) becomes a message in the markup
of the platform: Discord markdown, Telegram HTML, or plain text with the table fenced.
The table is a monospaced block cut to fit the room it is given, on a line boundary.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

from adapters.base import CommandResult


def _same(text: str) -> str:
    return text


@dataclass(frozen=True)
class Markup:
    """How a platform marks text up; ``escape`` makes plain text safe inside it."""

    bold: Callable[[str], str]
    italic: Callable[[str], str]
    block: Callable[[str], str]
    escape: Callable[[str], str] = _same


def _fenced(body: str) -> str:
    return f"```\n{body}\n```"


MARKDOWN = Markup(bold=lambda s: f"**{s}**", italic=lambda s: f"_{s}_", block=_fenced)
"""Discord (and any markdown chat)."""

HTML = Markup(
    bold=lambda s: f"<b>{s}</b>",
    italic=lambda s: f"<i>{s}</i>",
    block=lambda s: f"<pre>{s}</pre>",
    escape=lambda s: html.escape(s, quote=False),
)
"""Telegram's HTML parse mode."""

PLAIN = Markup(bold=_same, italic=_same, block=_fenced)
"""Plain text with the table fenced (a transport converts fences itself)."""


def table(result: CommandResult, limit: int, markup: Markup = MARKDOWN) -> str:
    """The result's columns and rows as one block of at most ``limit`` characters
    (marked up); "" without columns or room. Cut rows end with a line "…"."""
    if not result.columns:
        return ""
    text = CommandResult(title="", columns=result.columns, rows=result.rows).to_text()
    lines = text.split("\n")[1:]
    room = limit - len(markup.block(""))
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        size = len(markup.escape(line)) + 1
        last = index == len(lines) - 1
        if used + size > room - (0 if last else 2):
            kept.append("…")
            break
        kept.append(markup.escape(line))
        used += size
    if not kept or kept == ["…"]:
        return ""
    return markup.block("\n".join(kept))


def rich_text(result: CommandResult, markup: Markup, limit: int) -> str:
    """The whole result as one message of at most ``limit`` characters: bold title,
    fields, the table as a block, the footer in italics; fields that do not fit are
    left out (and counted), the table gets the room that is left."""
    e = markup.escape
    head = [markup.bold(e(result.title))]
    tail = [markup.italic(e(result.footer))] if result.footer else []
    budget = limit - len(head[0]) - sum(len(t) + 1 for t in tail)
    hidden = 0
    for name, value in result.fields:
        line = f"{markup.bold(e(name) + ':')} {e(value)}"
        if len(line) + 1 > budget - 40:  # keep room for the "more fields" note
            hidden += 1
            continue
        head.append(line)
        budget -= len(line) + 1
    if hidden:
        note = markup.italic(f"({hidden} more fields not shown)")
        head.append(note)
        budget -= len(note) + 1
    block = table(result, budget - 1, markup) if budget > 1 else ""
    return "\n".join(head + ([block] if block else []) + tail)

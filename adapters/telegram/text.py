"""Telegram text both ways: entities to fenced blocks on input, fences to HTML on output.

Telegram clients turn a fenced block into plain text plus a ``pre`` entity (a ``code``
entity for inline code), and a bot posting in HTML or Markdown parse mode does the same;
entity offsets and lengths count UTF-16 code units. On input the transport puts the
fences back around each ``pre`` entity (and around a multi-line ``code`` one), so the
protocol parser sees the block. On output blocks go in HTML parse mode as ``<pre>`` with
``&``, ``<`` and ``>`` escaped (everything else is escaped too), and message length is
counted in UTF-16 code units, as Telegram does.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass

from adapters.chunking import FENCE, block_body, segments


@dataclass(frozen=True)
class Entity:
    """A message entity as Telegram sends it (offsets in UTF-16 code units)."""

    type: str
    offset: int
    length: int


def _is_block(entity: Entity, content: str) -> bool:
    return entity.type == "pre" or (entity.type == "code" and "\n" in content.strip())


def fenced(text: str, entities: Iterable[Entity]) -> str:
    """``text`` with every ``pre`` (and multi-line ``code``) entity put back in fences.

    Entities overlapping one already handled, or reaching past the text, are clamped or
    skipped: hostile offsets never raise.
    """
    data = text.encode("utf-16-le", "surrogatepass")
    units = len(data) // 2

    def piece(start: int, end: int) -> str:
        return data[start * 2 : end * 2].decode("utf-16-le", "surrogatepass")

    out: list[str] = []
    pos = 0
    for entity in sorted(entities, key=lambda e: e.offset):
        start = max(entity.offset, 0)
        end = min(start + max(entity.length, 0), units)
        if start < pos or start >= end:
            continue
        content = piece(start, end)
        if not _is_block(entity, content) or FENCE in content:
            continue
        before = piece(pos, start)
        out.append(before)
        if before and not before.endswith("\n"):
            out.append("\n")
        out.append(f"{FENCE}\n{content.strip(chr(10))}\n{FENCE}")
        after = piece(end, end + 1)
        if after and after != "\n":
            out.append("\n")
        pos = end
    out.append(piece(pos, units))
    return "".join(out)


def escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as HTML entities (all Telegram's HTML mode needs)."""
    return html.escape(text, quote=False)


def to_html(text: str) -> str:
    """Plain text with fenced blocks as Telegram HTML: blocks in ``<pre>``, all escaped."""
    out: list[str] = []
    for unit, is_block in segments(text):
        body = block_body(unit) if is_block else None
        if body is None:
            out.append(escape(unit))
            continue
        out.append(f"<pre>{escape(body.rstrip(chr(10)))}</pre>")
        if unit.endswith("\n"):
            out.append("\n")
    return "".join(out)


"""Splitting outbound text into platform-sized messages without breaking a fenced block.

Chat platforms cap a message's length (Discord 2,000 characters, Telegram 4,096, Slack
about 40,000). A protocol block cut in two is two malformed blocks, so the text is cut
only on line boundaries *between* blocks. A block that does not fit one message on its
own becomes a ``Part`` with ``block`` set: the transport sends it as a file (Discord a
``.txt`` attachment, Telegram a document) with ``text`` (the block's header line) as the
message, and reads such files back on input, so nothing is ever truncated.

Fences follow the parser's rules (protocol/parser.py): a block opens at a line starting,
after white space, with three or more backticks and closes at the next line ending with
at least as many.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

FENCE = "```"


@dataclass(frozen=True)
class Part:
    """One outbound message: ``text``, plus ``block`` when a block goes as a file."""

    text: str
    block: str | None = None


def _opener_width(line: str) -> int:
    """The fence width when ``line`` opens a block, else 0."""
    stripped = line.lstrip()
    if not stripped.startswith(FENCE):
        return 0
    tag = stripped.lstrip("`")
    if FENCE in tag:
        return 0  # ```inline``` on one line
    return len(stripped) - len(tag)


def _closes(line: str, width: int) -> bool:
    stripped = line.rstrip()
    return len(stripped) - len(stripped.rstrip("`")) >= width


def segments(text: str) -> Iterator[tuple[str, bool]]:
    """The text as units that must not be cut: (a whole fenced block, True) or
    (one line outside blocks, False); each unit ends with its line break, if it had one."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        width = _opener_width(lines[i])
        if not width:
            yield lines[i], False
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not ("`" in lines[end] and _closes(lines[end], width)):
            end += 1
        end = min(end, len(lines) - 1)
        yield "".join(lines[i : end + 1]), True
        i = end + 1


def block_body(block: str) -> str | None:
    """The lines inside a whole fenced block (as ``segments`` yields it), without the
    fences; None when ``block`` is not one (an unterminated fence)."""
    lines = block.splitlines(keepends=True)
    width = _opener_width(lines[0]) if lines else 0
    if not width or len(lines) < 2 or not _closes(lines[-1], width):
        return None
    return "".join(lines[1:-1])


def header_line(block: str) -> str:
    """The first non-empty line inside a fenced block (``[RESPONSE → @Lotbot]``)."""
    for line in block.splitlines()[1:]:
        if line.strip():
            return line.strip()
    return "(empty block)"


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (how Telegram counts message length and offsets)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _cut(unit: str, limit: int, size: Callable[[str], int]) -> Iterator[str]:
    """``unit`` in pieces of at most ``limit`` by ``size`` (character by character when a
    plain slice is too big, so a character is never split)."""
    while unit:
        piece = unit[:limit]
        while size(piece) > limit and len(piece) > 1:
            piece = piece[: max(1, len(piece) - (size(piece) - limit))]
        yield piece
        unit = unit[len(piece) :]


def split_message(text: str, limit: int, size: Callable[[str], int] = len) -> list[Part]:
    """Cut ``text`` into parts of at most ``limit`` characters, never inside a block.

    ``size`` measures a piece of text (characters by default; ``utf16_len`` where the
    platform counts UTF-16 code units). Lines are packed greedily; a line outside blocks
    longer than ``limit`` is cut at ``limit`` (it holds no block). A block longer than
    ``limit`` becomes a part of its own whose ``block`` is the whole fenced block and
    whose ``text`` is its header line (cut to ``limit``). Joining every part's ``block or
    text`` gives back ``text``.
    """
    if limit < 1:
        raise ValueError("limit must be positive")
    if size(text) <= limit:
        return [Part(text)]
    parts: list[Part] = []
    current = ""
    used = 0

    def flush() -> None:
        nonlocal current, used
        if current:
            parts.append(Part(current))
            current, used = "", 0

    for unit, is_block in segments(text):
        unit_size = size(unit)
        if used + unit_size <= limit:
            current += unit
            used += unit_size
            continue
        flush()
        if unit_size <= limit:
            current, used = unit, unit_size
        elif is_block:
            parts.append(Part(next(_cut(header_line(unit), limit, size), ""), block=unit))
        else:
            parts.extend(Part(piece) for piece in _cut(unit, limit, size))
    flush()
    return parts

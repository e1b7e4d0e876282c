"""Blocks carried as text files: how chat transports read them back and name them.

A block too long for one chat message is sent as a ``.txt`` file (a Discord attachment, a
Telegram document) with its header line as the message (``adapters/chunking.py``). On
input every transport reads such files the same way: only ``.txt`` files, at most
``max_bytes`` each (a bigger one is named in the text instead of read), decoded as UTF-8,
and a file holding a bare block (no fence) read as one fenced block.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from adapters.chunking import FENCE

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class NotReadable(Exception):
    """A message could not be read whole (a file failed to download): retry later."""


@dataclass(frozen=True)
class TextFile:
    """One file attached to a native message: its name, size and how to download it."""

    name: str
    size: int | None
    read: Callable[[], Awaitable[bytes]]


def is_block_file(name: str) -> bool:
    """Whether a file may hold a block (``.txt``, the name block files get)."""
    return name.lower().endswith(".txt")


async def read_text_files(
    files: Iterable[TextFile], max_bytes: int, errors: tuple[type[BaseException], ...]
) -> list[str]:
    """The text of each block file in ``files`` (see the module docstring).

    A download failing with one of ``errors`` raises ``NotReadable`` (the message is
    read again later); a file over ``max_bytes`` becomes a note saying so.
    """
    texts = []
    for file in files:
        if not is_block_file(file.name):
            continue
        if file.size is not None and file.size > max_bytes:
            texts.append(
                f"(attachment {file.name} not read: {file.size} bytes is over "
                f"attachment_max_bytes {max_bytes})"
            )
            continue
        try:
            data = await file.read()
        except errors as exc:
            raise NotReadable(f"attachment {file.name}: {exc or type(exc).__name__}") from None
        text = data[:max_bytes].decode("utf-8", errors="replace")
        if FENCE not in text and text.lstrip().startswith("["):
            text = f"{FENCE}\n{text.strip()}\n{FENCE}"
        texts.append(text)
    return texts


def block_filename(request_id: str | None) -> str:
    """``<RequestId>.txt`` made safe for a file name (``block.txt`` without one)."""
    stem = _UNSAFE_NAME.sub("_", request_id or "")[:80].strip("._") or "block"
    return f"{stem}.txt"

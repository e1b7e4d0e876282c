"""Slack's message text and what the agent wrote, both ways.

Slack stores text with ``&``, ``<`` and ``>`` escaped and turns what a person or bot
typed into tokens: ``<@U123>`` for a mention, ``<#C123|general>`` for a channel,
``<https://x|label>`` for a link, ``<!here>`` for a broadcast. ``to_plain`` turns those
back into what was written (``@name``, ``#general``, the URL) before the protocol parser
reads the text, and reads fences Slack glued to their content (```` ```[REQUEST ...] ````).
``escape`` is what Slack requires on output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_TOKEN = re.compile(r"<([^<>\n]{1,2000})>")
_ESCAPES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
# A fence with text glued to it: "```[REQUEST → @x]" or "last line```".
_GLUED_OPEN = re.compile(r"^(\s*`{3,})(?=[^`\s])(?![A-Za-z0-9_+.-]*\s*$)(.*)$")
_GLUED_CLOSE = re.compile(r"^(.*[^`\s])(`{3,})\s*$")


def escape(text: str) -> str:
    """Text as Slack wants it in ``chat.postMessage`` (``&``, ``<``, ``>`` escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    """Slack's three entities back to characters (``&amp;`` last, so ``&amp;lt;`` stays
    ``&lt;``, as it was typed)."""
    for entity, char in _ESCAPES:
        text = text.replace(entity, char)
    return text


def user_ids(text: str) -> set[str]:
    """The user ids mentioned without a label (``<@U123>``), to look up their names."""
    return {m.group(1)[1:] for m in _TOKEN.finditer(text)
            if m.group(1).startswith("@") and "|" not in m.group(1)}


def _token(body: str, names: Mapping[str, str]) -> str:
    target, _, label = body.partition("|")
    if target.startswith("@"):
        return "@" + (label or names.get(target[1:]) or target[1:])
    if target.startswith("#"):
        return "#" + (label or target[1:])
    if target.startswith("!"):
        if target.startswith("!subteam^") or target.startswith("!date^"):
            return label or target[1:]
        return "@" + target[1:]  # <!here>, <!channel>, <!everyone>
    if label:
        return label  # a link written as text, or <mailto:a@b|a@b>
    return target


def to_plain(text: str, names: Mapping[str, str] | None = None) -> str:
    """What was written, from Slack's stored form (see the module docstring).

    ``names`` maps user ids to the names to show for unlabelled mentions; an unknown id
    is shown as ``@U123``.
    """
    known = names or {}
    plain = _TOKEN.sub(lambda m: _token(m.group(1), known), text)
    return read_fences(unescape(plain))


def read_fences(text: str) -> str:
    """Put fences Slack glued to their first or last line back on lines of their own."""
    out: list[str] = []
    inside = False
    for line in text.split("\n"):
        if not inside:
            opened = _GLUED_OPEN.match(line)
            if opened and "```" not in opened.group(2):
                out.extend((opened.group(1), opened.group(2)))
                inside = True
                continue
            if line.lstrip().startswith("```") and "```" not in line.lstrip()[3:].lstrip("`"):
                inside = True
            out.append(line)
            continue
        closed = _GLUED_CLOSE.match(line)
        if closed and not closed.group(1).lstrip().startswith("```"):
            out.extend((closed.group(1), closed.group(2)))
        else:
            out.append(line)
        if line.rstrip().endswith("```"):
            inside = False
    return "\n".join(out)

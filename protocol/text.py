"""Value text rules shared by the models, the parser and the renderer.

* Line breaks: CRLF and a lone CR both read as LF.
* Values are trimmed, and no line of a value keeps trailing white space; an empty value
  counts as absent.
* Fence escaping: a value must never close the fence, so on output a zero-width space
  (U+200B) goes after each pair of backticks that another backtick follows (the second
  backtick of every ```` ``` ````); input removes exactly that character again. A U+200B
  that the sender wrote after two backticks is escaped the same way, so the round trip
  is exact for every string.
"""

from __future__ import annotations

import re

ZWSP = "\u200b"

# Both patterns are fixed-width look-arounds plus literals: they can not backtrack.
_ESCAPE = re.compile("``(?=[`\u200b])")
_UNESCAPE = re.compile("(?<=``)\u200b(?=[`\u200b])")


def normalize_newlines(text: str) -> str:
    """Read CRLF and lone CR as LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def join_value(lines: list[str]) -> str:
    """The value of some lines: trailing white space of each line dropped, then trimmed."""
    if len(lines) == 1:
        return lines[0].strip()
    return "\n".join([line.rstrip() for line in lines]).strip()


def clean_value(value: str) -> str:
    """A value as the wire carries it: line breaks normalised, no trailing white space on
    any line, trimmed. Chat platforms often drop trailing spaces, so they carry no meaning.
    """
    return join_value(normalize_newlines(value).split("\n"))


def escape_fences(value: str) -> str:
    """Make ``value`` unable to close a code fence (reversible with `unescape_fences`)."""
    if "``" not in value:
        return value
    return _ESCAPE.sub("``" + ZWSP, value)


def unescape_fences(value: str) -> str:
    """Undo `escape_fences`."""
    if ZWSP not in value:
        return value
    return _UNESCAPE.sub("", value)

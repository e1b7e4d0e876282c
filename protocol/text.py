"""Value text rules shared by the models, the parser and the renderer.

* Line breaks: every character some common line splitter breaks at reads as LF: CRLF,
  a lone CR, and the ones Python's ``str.splitlines`` also breaks at (VT, FF, FS, GS, RS,
  NEL, U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR). The parser reads them so
  before anything else and every value is stored so, so the renderer writes a value
  holding one as continuation lines: Python's ``splitlines``, JavaScript's
  ``split(/\r?\n/)`` and a split at U+2028 all see the same fields.
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
# A UTF-16 surrogate code point: in a Python str only ever unpaired (a JSON "\ud800"
# escape, say), which no UTF-8 store, platform or file can carry.
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> str | None:
    """A description of the first lone UTF-16 surrogate in ``text`` (``"U+D800 at
    character 12"``), or None when there is none (free for ASCII text)."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    return f"U+{ord(found.group()):04X} at character {found.start()}"

# Both patterns are fixed-width look-arounds plus literals: they can not backtrack.
_ESCAPE = re.compile("``(?=[`\u200b])")
_UNESCAPE = re.compile("(?<=``)\u200b(?=[`\u200b])")


# Every line boundary of str.splitlines except LF itself (CRLF is one boundary).
_BREAKS = re.compile("\r\n|[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def normalize_newlines(text: str) -> str:
    """Read CRLF and every other line boundary of ``str.splitlines`` as LF."""
    if "\r" in text:
        return _BREAKS.sub("\n", text)
    if only_lf_breaks(text):
        return text
    return _OTHER_BREAKS.sub("\n", text) if _OTHER_BREAKS.search(text) else text


def only_lf_breaks(text: str) -> bool:
    """True when ``text`` holds printable characters and LFs only: then it has no other
    line break, no lone surrogate and no U+200B, none of which is printable.

    One or two C scans (``str.isprintable`` is a table look-up a character), where a
    regular expression search for either costs several times as much on non-ASCII
    text (an arrow in a header makes a protocol block non-ASCII). Each LF is replaced
    by a space, which is printable as the LF is not: a copy of the same length with the
    LFs overwritten, about half the work of cutting them out. False says nothing:
    search then."""
    return text.isprintable() or ("\n" in text and text.replace("\n", " ").isprintable())


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

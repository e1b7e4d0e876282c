"""Agent names: what a valid name is, the one key names compare under, and lookalikes.

* ``check_name``: 1-128 printable characters without white space, and none of the
  invisible ones (format and bidi controls such as U+200B, U+00AD, U+202E, and the other
  default-ignorable code points), so a name shows as what it is.
* ``name_key``: the canonical key every comparison uses (NFKC, case folded, NFKC again:
  ``Mantis``, ``mantis`` and fullwidth ``ｍａｎｔｉｓ`` are one name). The name as written
  stays the display name.
* ``skeleton``: the UTS #39 skeleton of the key (confusables data of the
  ``confusable-homoglyphs`` package), so ``Маntis`` with a Cyrillic М and ``Mantis`` have
  the same skeleton; a name whose skeleton belongs to another name impersonates it.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from confusable_homoglyphs import confusables

NAME_MAX_LEN = 128

# Default_Ignorable_Code_Point characters that str.isprintable() accepts (it refuses every
# Cc, Cf, Zl, Zp and non-space Zs already): combining grapheme joiner, Hangul fillers,
# Khmer inherent vowels, Mongolian variation selectors, variation selectors.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xE0100, 0xE01EF),
)
# Direction marks the confusables data writes around right-to-left characters.
_MARKS = "\u200e\u200f"


def _ignorable(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def invalid_name_reason(value: str) -> str | None:
    """Why ``value`` is not a valid agent name, or None when it is."""
    if not value or len(value) > NAME_MAX_LEN:
        return f"a name is 1-{NAME_MAX_LEN} characters"
    # isprintable() is false for controls, format characters (Cf: soft hyphen, zero-width
    # and bidi controls), separators other than " ", unassigned and private-use ones.
    if value.isprintable() and " " not in value:
        if value.isascii() or not any(_ignorable(c) for c in value):
            return None
    bad = next(c for c in value if not c.isprintable() or c == " " or _ignorable(c))
    what = "white space" if bad.isspace() else "an invisible or control character"
    return (
        f"a name may not contain {what} (U+{ord(bad):04X} "
        f"{unicodedata.name(bad, unicodedata.category(bad))})"
    )


def check_name(value: str) -> str:
    """Validate an agent name (sender or recipient, without the ``@``); raise ValueError."""
    # The common case (printable ASCII without a space) costs two C-level scans.
    if value and len(value) <= NAME_MAX_LEN and value.isascii() and value.isprintable():
        if " " not in value:
            return value
    reason = invalid_name_reason(value)
    if reason is not None:
        raise ValueError(reason)
    return value


@lru_cache(maxsize=65536)
def name_key(name: str) -> str:
    """The canonical key of a name: NFKC, case folded, NFKC again (NFKC_Casefold)."""
    if name.isascii():
        return name.lower()
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def _homoglyphs(char: str) -> list[str]:
    """The characters (or strings) the confusables data lists as looking like ``char``."""
    found = confusables.is_confusable(char, greedy=True)
    if not found:
        return []
    return [glyph["c"].strip(_MARKS) for glyph in found[0]["homoglyphs"]]


def _caseless_class(char: str) -> set[str]:
    """Single characters that look like ``char`` in any case, case folded."""
    members: set[str] = set()
    for variant in {char, char.lower(), char.upper()}:
        if len(variant) != 1:
            continue
        near = [g for g in _homoglyphs(variant) if len(g) == 1]
        members.update((variant, *near))
        for glyph in near:
            members.update(g for g in _homoglyphs(glyph) if len(g) == 1)
    return {m.casefold() for m in members if len(m.casefold()) == 1} or {char}


@lru_cache(maxsize=8192)
def _prototype(char: str) -> str:
    """One fixed stand-in for the characters that look like ``char`` in any case.

    The data lists each source character with its UTS #39 prototype and each prototype
    with its sources, so a character's lookalikes are its homoglyphs and theirs; the least
    of them (case folded, names being caseless) stands for all. Where one of them has a
    sequence as prototype (``m`` looks like ``rn``), the sequence stands for them.
    """
    members = _caseless_class(char)
    longer = [g for m in members for g in _homoglyphs(m) if len(g) > 1]
    if longer:
        return "".join(min(_caseless_class(c)) for c in min(longer))
    return min(members)


@lru_cache(maxsize=65536)
def skeleton(name: str) -> str:
    """The confusable skeleton of a name's key: names with equal skeletons look alike."""
    text = unicodedata.normalize("NFD", name_key(name))
    return unicodedata.normalize("NFD", "".join(_prototype(c) for c in text))

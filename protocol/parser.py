"""`parse`: chat text in, protocol messages and errors out (wire-format.md sections 1-3).

The parser works line by line with plain string operations and one possessive regex per
line, so time and memory stay linear in the input and no input can make it backtrack.
It never raises: every problem becomes a `ParseError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn, SupportsIndex

from protocol.errors import ErrorCode, ParseError, make_error
from protocol.fields import (
    ATTRIBUTES,
    FIELD_KEYS,
    REQUIRED_FIELDS,
    WEAK_ALIASES,
    WIRE_KEYS,
    normalize_key,
)
from protocol.models import (
    MESSAGE_CLASSES,
    REQUEST_ID_MAX_LEN,
    TOKEN_MAX_LEN,
    VERSION_MAX_LEN,
    Message,
    MessageType,
    check_token,
    checked_constructor,
)
from protocol.names import check_name
from protocol.text import (
    ZWSP,
    lone_surrogate,
    normalize_newlines,
    only_lf_breaks,
    unescape_fences,
)
from protocol.values import parse_depth, parse_priority, parse_status

FENCE = "```"
DEFAULT_MAX_BLOCK_BYTES = 65536

_TYPES = {member.value: member for member in MessageType}

# Per message type, the text before a line's first colon -> what it is (`_key_entry`).
# Bounded in entries and key length, so arbitrary input can not make it grow without limit.
_KEY_CACHE_MAX = 4096
_KEY_CACHE_MAX_LEN = 64
# Appended after a block's last line: a field line that ends the last real field's value.
_END_LINE = "End:"

# Header text (inside the brackets) -> (type, recipient) or (None, error code, message).
_HEADER_CACHE_MAX = 1024
_HEADER_CACHE_MAX_LEN = 160
_HEADERS: dict[str, tuple[_TypeSpec | None, str, ErrorCode]] = {}


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What `parse` found: the valid messages, the errors, and whether any block was seen.

    ``found_block`` is True when the text held at least one protocol-shaped block (a fenced
    block whose first non-empty line is ``[`` ... ``]``), even an invalid one.
    """

    messages: list[Message] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    found_block: bool = False


class _EmptyList(list[Any]):
    """An empty list that refuses to grow: the lists of the shared no-block result."""

    __slots__ = ()

    def _read_only(self, *args: object) -> NoReturn:
        raise TypeError("the lists of a ParseResult without any block are read-only")

    def append(self, item: Any, /) -> NoReturn:
        self._read_only()

    def extend(self, items: Iterable[Any], /) -> NoReturn:
        self._read_only()

    def insert(self, index: SupportsIndex, item: Any, /) -> NoReturn:
        self._read_only()

    def __setitem__(self, index: Any, item: Any, /) -> NoReturn:
        self._read_only()

    def __iadd__(self, items: Iterable[Any], /) -> NoReturn:  # type: ignore[misc]
        self._read_only()

    def __imul__(self, count: SupportsIndex, /) -> NoReturn:
        self._read_only()


_new_object = object.__new__
_set_messages = ParseResult.__dict__["messages"].__set__
_set_errors = ParseResult.__dict__["errors"].__set__
_set_found_block = ParseResult.__dict__["found_block"].__set__

# Chat without a fence (most traffic) gets this one immutable result: building a new
# frozen dataclass per call costs more than the whole scan. Its lists are empty, compare
# equal to ``[]`` and refuse to grow; nothing else in them can change.
_NO_BLOCK = ParseResult(_EmptyList(), _EmptyList(), False)


def parse(text: str | bytes, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> ParseResult:
    """Read every protocol block in a chat message; never raises.

    Bytes are decoded as UTF-8 (undecodable bytes become U+FFFD). CRLF and lone CR read as
    LF. Blocks are numbered from 1 in the order their fences open (ordinary code blocks
    count too); lines are numbered from 1 at the first line after the opening fence.
    Text without any block gets one shared result whose (empty) lists are read-only.
    """
    if type(text) is not str:
        if isinstance(text, bytes | bytearray | memoryview):
            text = bytes(text).decode("utf-8", errors="replace")
        else:
            text = str(text)
    # "`" is a memchr; most chat has no backtick at all.
    if "`" not in text or FENCE not in text:
        return _NO_BLOCK
    messages: list[Message] = []
    errors: list[ParseError] = []
    found = False
    # A text of at most limit/4 characters can not hold a block over the limit.
    check_size = len(text) > max_block_bytes // 4
    # The usual text: nothing to normalise or look for. (A CR is a memchr away, and with
    # one the scan of only_lf_breaks would be wasted: the searches follow anyway.)
    if "\r" not in text and only_lf_breaks(text):
        has_zwsp = has_surrogate = False
    else:
        has_zwsp = ZWSP in text
        has_surrogate = lone_surrogate(text) is not None
        text = normalize_newlines(text)
    for number, content, closed, joined in _fenced_blocks(text):
        # The header is the first non-empty line; anything else makes ordinary chat.
        head = 0
        for line in content:
            inner = line.strip()
            if inner:
                break
            head += 1
        else:
            continue  # an empty code block
        if inner[0] != "[" or inner[-1] != "]":
            continue  # an ordinary code block: not a protocol message, not an error
        found = True
        if not closed:
            errors.append(
                make_error(
                    "unterminated_block",
                    number,
                    len(content),
                    "The protocol block is never closed by a ``` line.",
                )
            )
        elif check_size and _too_large(joined, max_block_bytes):
            errors.append(
                make_error(
                    "too_large",
                    number,
                    head + 1,
                    f"The block is larger than the limit of {max_block_bytes} bytes.",
                )
            )
        elif has_surrogate and (bad := _surrogate_line(content)) is not None:
            errors.append(
                make_error(
                    "bad_value",
                    number,
                    bad[0],
                    f"The block holds {bad[1]} of that line, half of a UTF-16 surrogate "
                    "pair without its other half: not valid Unicode, so it can not be "
                    "stored or relayed.",
                )
            )
        else:
            message = _read_block(content, head, inner[1:-1], number, errors, has_zwsp)
            if message is not None:
                messages.append(message)
    # What ParseResult(messages, errors, found) makes, without the frozen dataclass's
    # __init__ (object.__setattr__ per field), which costs as much as a small parse.
    result = _new_object(ParseResult)
    _set_messages(result, messages)
    _set_errors(result, errors)
    _set_found_block(result, found)
    return result


def _fenced_blocks(text: str) -> Iterator[tuple[int, list[str], bool, str]]:
    """Yield (block number, content lines, closed, the lines joined by LF) for every
    fenced block.

    A fence opens at a line starting (after white space) with three or more backticks; the
    rest of that line is a language tag. It closes at the next line that ends with at least
    as many backticks; text before them on that line is the block's last line.

    ``str.find`` jumps from one ``` to the next, so only lines holding a fence are looked
    at in Python; every search starts where the last one ended (linear time).
    """
    size = len(text)
    number = 0
    # (``_find_fence`` written out on the common path, here and below.)
    pos = text.find("`")
    if pos >= 0 and not text.startswith(FENCE, pos):
        pos = text.find(FENCE, pos + 1)
    while pos >= 0:
        end = text.find("\n", pos)
        if end < 0:
            end = size
        # ``pos`` is the first fence of its line: everything after the last line end
        # looked at has no fence.
        if end - pos == 3 and (pos == 0 or text[pos - 1] == "\n"):
            opener = FENCE  # the usual bare ``` line
        elif pos == 0 or text[pos - 1] == "\n":
            opener = text[pos:end]
        else:
            opener = text[text.rfind("\n", 0, pos) + 1 : end].lstrip()
            if not opener.startswith(FENCE):
                pos = _find_fence(text, end)  # a fence inside a line
                continue
        tag = opener.lstrip("`")
        if FENCE in tag:
            pos = _find_fence(text, end)  # ```inline code```
            continue
        width = len(opener) - len(tag)
        number += 1
        body = end + 1  # the first content line starts here
        search = body
        while True:
            found = text.find("`", search) if search < size else -1
            if found >= 0 and not text.startswith(FENCE, found):
                found = text.find(FENCE, found + 1)
            if found < 0:
                joined = text[body:]
                yield number, (joined.split("\n") if end < size else []), False, joined
                return
            search = text.find("\n", found)
            if search < 0:
                search = size
            if search - found == 3 and width == 3 and text[found - 1] == "\n":
                line_start = found  # the usual bare ``` line closes the block
                before = ""
                break
            last = text[search - 1]
            if last != "`" and not last.isspace():
                continue  # the line does not end with backticks: not a closing fence
            line_start = text.rfind("\n", 0, found) + 1
            closer = text[line_start:search].rstrip()
            before = closer.rstrip("`")
            if len(closer) - len(before) >= width:
                break
        if line_start > body:
            joined = text[body : line_start - 1]
            content = joined.split("\n")
        else:
            joined = ""
            content = []
        if before and not before.isspace():
            joined = f"{joined}\n{before}" if content else before
            content.append(before)
        if content:  # (an empty block is ordinary chat: nothing to yield)
            yield number, content, True, joined
        if search >= size:
            return
        pos = text.find("`", search)
        if pos >= 0 and not text.startswith(FENCE, pos):
            pos = text.find(FENCE, pos + 1)


def _find_fence(text: str, start: int) -> int:
    """``text.find(FENCE, start)``, faster: a fence is usually the next backtick, and the
    one-character search is a memchr while the three-character one is several times
    slower. Either way it is one or two C searches (linear time)."""
    index = text.find("`", start)
    if index < 0 or text.startswith(FENCE, index):
        return index
    return text.find(FENCE, index + 1)


def _surrogate_line(content: list[str]) -> tuple[int, str] | None:
    """(line number, description) of a block's first lone surrogate, or None."""
    for number, line in enumerate(content, 1):
        if (bad := lone_surrogate(line)) is not None:
            return number, bad
    return None


def _too_large(joined: str, limit: int) -> bool:
    """Whether the UTF-8 form of a block's lines (joined by LF) is over ``limit`` bytes."""
    chars = len(joined)
    if chars <= limit // 4:
        return False  # even at 4 bytes a character it fits
    if chars > limit:
        return True  # at least one byte a character
    if joined.isascii():  # O(1) in CPython: one byte a character, no need to encode
        return False
    return len(joined.encode("utf-8", "surrogatepass")) > limit


class _HeaderError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


def _read_header(inner: str) -> tuple[MessageType, str]:
    """The (type, recipient) of a header's inside; raises `_HeaderError`."""
    unicode_arrow = inner.find("→")
    ascii_arrow = inner.find("->")
    if unicode_arrow < 0 and ascii_arrow < 0:
        raise _HeaderError(
            "bad_header", "The header has no arrow (→ or ->) between type and recipient."
        )
    if unicode_arrow < 0 or 0 <= ascii_arrow < unicode_arrow:
        type_text, recipient = inner[:ascii_arrow], inner[ascii_arrow + 2 :]
    else:
        type_text, recipient = inner[:unicode_arrow], inner[unicode_arrow + 1 :]
    type_text, recipient = type_text.strip(), recipient.strip()
    message_type = _TYPES.get(type_text.upper())
    if message_type is None:
        if not type_text:
            raise _HeaderError("bad_header", "The header has no message type before the arrow.")
        raise _HeaderError("unknown_type", f"{type_text[:40]!r} is not a message type.")
    if not recipient.startswith("@"):
        raise _HeaderError("bad_header", "The recipient must be written as @Name, e.g. @Mantis.")
    try:
        return message_type, check_name(unescape_fences(recipient[1:]))
    except ValueError as exc:
        raise _HeaderError("bad_header", f"The recipient is not valid: {exc}.") from None


def _header_entry(inner: str) -> tuple[_TypeSpec | None, str, ErrorCode]:
    """(type table, recipient, unused code) or (None, error message, error code); cached."""
    entry: tuple[_TypeSpec | None, str, ErrorCode]
    try:
        message_type, recipient = _read_header(inner)
        entry = (_TYPE_SPECS[message_type], recipient, "bad_header")
    except _HeaderError as exc:
        entry = (None, exc.message, exc.code)
    if len(inner) <= _HEADER_CACHE_MAX_LEN and len(_HEADERS) < _HEADER_CACHE_MAX:
        _HEADERS[inner] = entry
    return entry


def _token_checker(what: str, max_len: int = TOKEN_MAX_LEN) -> Callable[[str], str]:
    # (A partial, not a lambda: called in C, one Python frame fewer for every RequestId
    # and TraceId read.)
    return partial(check_token, what=what, max_len=max_len)


# Converters whose errors already quote the value.
_SELF_DESCRIBING = frozenset({"depth", "status", "priority", "urgency"})

_CONVERTERS: dict[str, Callable[[str], object]] = {
    "from": check_name,
    "request_id": _token_checker("a RequestId", REQUEST_ID_MAX_LEN),
    "depth": parse_depth,
    "status": parse_status,
    "priority": parse_priority,
    "urgency": lambda value: parse_priority(value, "Urgency"),
    "trace_id": _token_checker("a TraceId"),
    "key_id": _token_checker("a KeyId"),
    "signature": _token_checker("a Signature"),
    "version": _token_checker("a Protocol-Version", VERSION_MAX_LEN),
}


def _key_norm(key: str) -> str:
    """The normalised key of the text before a line's first colon; "" when not a key.

    Same rule as ``[A-Za-z][A-Za-z0-9_-]*`` (ASCII only), with str methods instead of a
    regex.
    """
    if (
        key
        and key.isascii()
        and key[0].isalpha()
        and key.replace("-", "").replace("_", "").isalnum()
    ):
        return normalize_key(key)
    return ""


def _key_entry(
    key: str, table: dict[str, _FieldEntry], known: dict[str, _FieldEntry]
) -> _FieldEntry:
    """What the text before a line's first colon is for one type: a field's entry from
    ``table``, `_META` (an unknown key) or `_NOT_A_KEY`; remembered in ``known``."""
    norm = _key_norm(key)
    entry = table.get(norm, _META) if norm else _NOT_A_KEY
    if len(key) <= _KEY_CACHE_MAX_LEN and len(known) < _KEY_CACHE_MAX:
        known[key] = entry
    return entry


# Converted values of the fields whose values repeat (names, enums, depths), so a repeated
# value is checked once. Bounded per field; the checks are pure functions of the text.
_CONVERTED_MAX = 1024
_CONVERTED_MAX_LEN = 128
_CACHED_FIELDS = frozenset({"from", "depth", "status", "priority", "urgency", "version", "key_id"})
# Stands in for a value that failed its check: the field is present (so not missing).
_INVALID = object()

# What the parser knows of one field of one type:
# (canonical name, model attribute or None for the weak OriginalRequestId alias,
#  converter or None for free text, cache of converted values or None when the values
#  rarely repeat).
_FieldEntry = tuple[str, str | None, Callable[[str], object] | None, dict[str, object] | None]
# Two sentinels, told apart by identity (so they must not be equal constants).
_META: _FieldEntry = ("(meta)", None, None, None)  # a key the type does not read
_NOT_A_KEY: _FieldEntry = ("(not a key)", None, None, None)  # the line continues a value


def _field_table(type_name: str) -> dict[str, _FieldEntry]:
    """{normalised input key: entry} of the fields a type reads."""
    table: dict[str, _FieldEntry] = {}
    for norm, canonical in FIELD_KEYS[type_name].items():
        attribute = None if norm in WEAK_ALIASES else ATTRIBUTES[canonical]
        table[norm] = (canonical, attribute, _CONVERTERS.get(canonical), _CACHES.get(canonical))
    return table


_CACHES: dict[str, dict[str, object]] = {name: {} for name in _CACHED_FIELDS}

# Per type: (name, field table, its cache of keys as written (`_key_entry`), required
# (canonical, attribute) pairs, constructor).
_TypeSpec = tuple[
    str,
    dict[str, _FieldEntry],
    dict[str, _FieldEntry],
    tuple[tuple[str, str], ...],
    Callable[[dict[str, Any]], Any],
]
_TYPE_SPECS: dict[MessageType, _TypeSpec] = {
    member: (
        member.value,
        _field_table(member.value),
        {},
        tuple((name, ATTRIBUTES[name]) for name in REQUIRED_FIELDS[member.value]),
        checked_constructor(MESSAGE_CLASSES[member]),
    )
    for member in MessageType
}


def _read_block(
    content: list[str],
    head: int,
    inner: str,
    number: int,
    errors: list[ParseError],
    has_zwsp: bool = True,
) -> Message | None:
    """Turn one protocol-shaped block into a message, or add its errors and return None.

    ``inner`` is the header line without white space and brackets; ``has_zwsp`` False
    promises that no line holds a U+200B.
    """
    errors_before = len(errors)
    header_line = head + 1
    header = _HEADERS.get(inner)
    if header is None:
        header = _header_entry(inner)
    spec, recipient, code = header
    if spec is None:
        errors.append(make_error(code, number, header_line, recipient))
        return None
    type_name, table, known, required, build = spec

    # One pass over the lines, each split at its first colon by str.partition. A field
    # line (``Key:`` at the very start) ends the value of the field before it, which is
    # then matched to its field, checked and converted; any other line continues that
    # value. The extra last line only ends the last field. Unknown keys (and a spare
    # OriginalRequestId) are kept as meta. ``data`` gets the model attribute of every
    # present field (``_INVALID`` when its value failed a check).
    data: dict[str, Any] = {"to": recipient}
    seen: dict[str, int] = {}  # canonical -> line number of its first line
    weak: list[str] = []  # OriginalRequestId values
    meta: list[tuple[str, str, bool]] = []
    lines = content[header_line:]
    lines.append(_END_LINE)
    pending = 0  # line number of the field line whose value is being read; 0: none yet
    pending_key = pending_rest = ""
    pending_entry = meta_entry = _META
    not_a_key = _NOT_A_KEY
    continued = False  # whether the pending field has continuation lines
    # (No list of the split lines: each line's parts are freed at once, so a block of many
    # lines does not keep thousands of tuples alive for the cyclic garbage collector.)
    for line_no, line in enumerate(lines, header_line + 1):
        key, colon, rest = line.partition(":")
        if colon:
            entry = known.get(key)
            if entry is None:
                entry = _key_entry(key, table, known)
            if entry is not not_a_key:
                if pending:
                    if continued:
                        value = _join_continued(pending_rest, content[pending : line_no - 1])
                        continued = False
                    else:
                        value = pending_rest.strip()
                    if has_zwsp and ZWSP in value:
                        value = unescape_fences(value)
                    if pending_entry is meta_entry:
                        if value:
                            meta.append((pending_key, value, False))
                    else:
                        canonical, attribute, converter, cache = pending_entry
                        if attribute is None:  # the weak alias of RequestId
                            if weak:
                                errors.append(
                                    _duplicate(number, pending, canonical, pending_key, None)
                                )
                            else:
                                weak.append(value)
                            if value:
                                meta.append((pending_key, value, True))
                        elif canonical in seen:
                            errors.append(
                                _duplicate(number, pending, canonical, pending_key, seen[canonical])
                            )
                        else:
                            seen[canonical] = pending
                            if not value:
                                pass
                            elif converter is None:
                                data[attribute] = value
                            elif cache is None:
                                try:
                                    data[attribute] = converter(value)
                                except ValueError as exc:
                                    _reject(
                                        pending_entry, value, exc, pending, number, data, errors
                                    )
                            elif value in cache:
                                data[attribute] = cache[value]
                            else:
                                _convert(pending_entry, value, pending, number, data, errors)
                pending = line_no
                pending_key = key
                pending_rest = rest
                pending_entry = entry
                continue
        if pending:
            continued = True
        elif content[line_no - 1].strip():
            errors.append(
                make_error(
                    "bad_value",
                    number,
                    line_no,
                    "This line after the header is not a `Key: value` field.",
                )
            )
    if weak and "request_id" not in seen:
        _convert(table["requestid"], weak[0], header_line, number, data, errors)
        meta = [item for item in meta if not item[2]]

    for canonical, attribute in required:
        if attribute not in data:
            errors.append(
                make_error(
                    "missing_field",
                    number,
                    header_line,
                    f"A {type_name} needs a {WIRE_KEYS[canonical]} field.",
                    canonical,
                )
            )
    if type_name == "RESPONSE" and "status" not in data and "result" not in data:
        errors.append(
            make_error(
                "missing_field",
                number,
                header_line,
                "A RESPONSE needs a Status or a Result field.",
                "status",
            )
        )
    if len(errors) > errors_before:
        errors[errors_before:] = sorted(errors[errors_before:], key=lambda error: error.line)
        return None

    if meta:
        data["meta"] = tuple((key, value) for key, value, _ in meta)
    # Every value passed the model's own checks above, so skip a second validation.
    return build(data)  # type: ignore[no-any-return]


def _convert(
    entry: _FieldEntry,
    value: str,
    line_no: int,
    number: int,
    data: dict[str, Any],
    errors: list[ParseError],
) -> None:
    """Check ``value`` and store it under the model attribute (and in the entry's cache),
    or add a ParseError."""
    _, attribute, converter, cache = entry
    assert attribute is not None and converter is not None
    try:
        converted = converter(value)
    except ValueError as exc:
        _reject(entry, value, exc, line_no, number, data, errors)
        return
    data[attribute] = converted
    if cache is not None and len(value) <= _CONVERTED_MAX_LEN and len(cache) < _CONVERTED_MAX:
        cache[value] = converted


def _reject(
    entry: _FieldEntry,
    value: str,
    exc: ValueError,
    line_no: int,
    number: int,
    data: dict[str, Any],
    errors: list[ParseError],
) -> None:
    """Record a value that failed its check: present (not missing) but invalid."""
    canonical, attribute, _, _ = entry
    assert attribute is not None
    data[attribute] = _INVALID
    errors.append(
        make_error(
            "bad_depth" if canonical == "depth" else "bad_value",
            number,
            line_no,
            _value_problem(canonical, value, exc),
            canonical,
        )
    )


def _join_continued(first: str, rest: list[str]) -> str:
    """A value from its first line and continuation lines (two leading spaces removed);
    trailing white space of every line dropped, then trimmed."""
    lines = [first.rstrip()]
    for line in rest:
        lines.append((line[2:] if line.startswith("  ") else line).rstrip())
    return "\n".join(lines).strip()


def _value_problem(canonical: str, value: str, exc: ValueError) -> str:
    """One sentence naming the field, the value and the rule it breaks."""
    if canonical in _SELF_DESCRIBING:
        return f"{exc}."
    return f"{WIRE_KEYS[canonical]} {value[:40]!r} is not valid: {exc}."


def _duplicate(
    number: int, line_no: int, canonical: str, key: str, seen_line: int | None
) -> ParseError:
    first = f" (first given on line {seen_line})" if seen_line else ""
    return make_error(
        "duplicate_field",
        number,
        line_no,
        f"{key} gives the {WIRE_KEYS[canonical]} field a second time{first}.",
        canonical,
    )

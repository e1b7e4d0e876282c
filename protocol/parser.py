"""`parse`: chat text in, protocol messages and errors out (wire-format.md sections 1-3).

The parser works line by line with plain string operations and one possessive regex per
line, so time and memory stay linear in the input and no input can make it backtrack.
It never raises: every problem becomes a `ParseError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, ParseError, make_error
from protocol.fields import (
    ATTRIBUTES,
    FIELD_KEYS,
    KEY_LINE,
    REQUIRED_FIELDS,
    WEAK_ALIASES,
    WIRE_KEYS,
    normalize_key,
)
from protocol.models import (
    MESSAGE_CLASSES,
    VERSION_MAX_LEN,
    Message,
    MessageType,
    check_name,
    check_request_id,
    check_token,
)
from protocol.text import ZWSP, join_value, normalize_newlines, unescape_fences
from protocol.values import parse_depth, parse_priority, parse_status

FENCE = "```"
DEFAULT_MAX_BLOCK_BYTES = 65536

_TYPES = {member.value: member for member in MessageType}
# Normalised forms of the usual spellings, to skip normalize_key on the common path.
_NORMALIZED = {key: normalize_key(key) for key in (*WIRE_KEYS.values(), "Body", "Version")}


@dataclass(frozen=True, slots=True)
class ParseResult:
    """What `parse` found: the valid messages, the errors, and whether any block was seen.

    ``found_block`` is True when the text held at least one protocol-shaped block (a fenced
    block whose first non-empty line is ``[`` ... ``]``), even an invalid one.
    """

    messages: list[Message] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    found_block: bool = False


def parse(text: str | bytes, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> ParseResult:
    """Read every protocol block in a chat message; never raises.

    Bytes are decoded as UTF-8 (undecodable bytes become U+FFFD). CRLF and lone CR read as
    LF. Blocks are numbered from 1 in the order their fences open (ordinary code blocks
    count too); lines are numbered from 1 at the first line after the opening fence.
    """
    if type(text) is not str:
        if isinstance(text, bytes | bytearray | memoryview):
            text = bytes(text).decode("utf-8", errors="replace")
        else:
            text = str(text)
    if FENCE not in text:
        return ParseResult([], [], False)
    messages: list[Message] = []
    errors: list[ParseError] = []
    found = False
    # A text of at most limit/4 characters can not hold a block over the limit.
    check_size = len(text) > max_block_bytes // 4
    for number, content, closed in _fenced_blocks(normalize_newlines(text).split("\n")):
        head = _header_index(content)
        if head is None:
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
        elif check_size and _too_large(content, max_block_bytes):
            errors.append(
                make_error(
                    "too_large",
                    number,
                    head + 1,
                    f"The block is larger than the limit of {max_block_bytes} bytes.",
                )
            )
        else:
            message = _read_block(content, head, number, errors)
            if message is not None:
                messages.append(message)
    return ParseResult(messages=messages, errors=errors, found_block=found)


def _fenced_blocks(lines: list[str]) -> Iterator[tuple[int, list[str], bool]]:
    """Yield (block number, content lines, closed) for every fenced block.

    A fence opens at a line starting (after white space) with three or more backticks; the
    rest of that line is a language tag. It closes at the next line that ends with at least
    as many backticks; text before them on that line is the block's last line.
    """
    count = len(lines)
    index = 0
    number = 0
    while index < count:
        line = lines[index]
        index += 1
        if FENCE not in line:
            continue
        opener = line.lstrip()
        if not opener.startswith(FENCE):
            continue
        tag = opener.lstrip("`")
        if FENCE in tag:
            continue  # ```code``` on one line: inline code, not a block
        width = len(opener) - len(tag)
        number += 1
        start = index
        while index < count:
            candidate = lines[index]
            if FENCE in candidate:
                body = candidate.rstrip()
                before = body.rstrip("`")
                if len(body) - len(before) >= width:
                    content = lines[start:index]
                    if before.strip():
                        content.append(before)
                    index += 1
                    yield number, content, True
                    break
            index += 1
        else:
            yield number, lines[start:], False


def _header_index(content: list[str]) -> int | None:
    """Index of the header line when the block is protocol-shaped, else None."""
    for index, line in enumerate(content):
        stripped = line.strip()
        if stripped:
            return index if stripped[0] == "[" and stripped[-1] == "]" else None
    return None


def _too_large(content: list[str], limit: int) -> bool:
    chars = sum(len(line) for line in content) + len(content)
    if chars <= limit // 4:
        return False  # even at 4 bytes a character it fits
    if chars > limit:
        return True
    return len("\n".join(content).encode("utf-8", "surrogatepass")) > limit


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


def _check_version(value: str) -> str:
    return check_token(value, "a Protocol-Version", VERSION_MAX_LEN)


def _token_checker(wire_key: str) -> Callable[[str], str]:
    return lambda value: check_token(value, f"a {wire_key}")


# Converters whose errors already quote the value.
_SELF_DESCRIBING = frozenset({"depth", "status", "priority", "urgency"})

_CONVERTERS: dict[str, Callable[[str], object]] = {
    "from": check_name,
    "request_id": check_request_id,
    "depth": parse_depth,
    "status": parse_status,
    "priority": parse_priority,
    "urgency": lambda value: parse_priority(value, "Urgency"),
    "trace_id": _token_checker("TraceId"),
    "key_id": _token_checker("KeyId"),
    "signature": _token_checker("Signature"),
    "version": _check_version,
}


def _read_block(
    content: list[str], head: int, number: int, errors: list[ParseError]
) -> Message | None:
    """Turn one protocol-shaped block into a message, or add its errors and return None."""
    errors_before = len(errors)
    header_line = head + 1
    try:
        message_type, recipient = _read_header(content[head].strip()[1:-1])
    except _HeaderError as exc:
        errors.append(make_error(exc.code, number, header_line, exc.message))
        return None
    type_name = message_type.value

    # 1. Split lines into fields: (original key, line number, value parts).
    entries: list[tuple[str, int, list[str]]] = []
    parts: list[str] | None = None
    for index in range(head + 1, len(content)):
        line = content[index]
        match = KEY_LINE.match(line)
        if match is not None:
            end = match.end()
            parts = [line[end:]]
            entries.append((line[: end - 1], index + 1, parts))
        elif parts is not None:
            parts.append(line[2:] if line.startswith("  ") else line)
        elif line.strip():
            errors.append(
                make_error(
                    "bad_value",
                    number,
                    index + 1,
                    "This line after the header is not a `Key: value` field.",
                )
            )

    # 2. Match keys to fields; keep other keys (and a spare OriginalRequestId) as meta.
    keys = FIELD_KEYS[type_name]
    normalized = dict(_NORMALIZED)  # grows with this block's own keys only
    values: dict[str, tuple[str, int]] = {}
    seen: dict[str, int] = {}
    weak: dict[str, str] = {}
    meta: list[tuple[str, str, bool]] = []
    for key, line_no, value_parts in entries:
        value = join_value(value_parts)
        if ZWSP in value:
            value = unescape_fences(value)
        norm = normalized.get(key)
        if norm is None:
            norm = normalized[key] = normalize_key(key)
        canonical = keys.get(norm)
        if canonical is None or norm in WEAK_ALIASES:
            if canonical is not None and norm in weak:
                errors.append(_duplicate(number, line_no, canonical, key, seen_line=None))
            elif canonical is not None:
                weak[norm] = value
            if value:
                meta.append((key, value, canonical is not None))
            continue
        if canonical in seen:
            errors.append(_duplicate(number, line_no, canonical, key, seen[canonical]))
            continue
        seen[canonical] = line_no
        if value:
            values[canonical] = (value, line_no)
    if "request_id" not in seen and weak:
        values["request_id"] = (next(iter(weak.values())), header_line)
        meta = [item for item in meta if not item[2]]

    # 3. Check and convert values.
    data: dict[str, object] = {"to": recipient}
    for canonical, (value, line_no) in values.items():
        converter = _CONVERTERS.get(canonical)
        try:
            data[ATTRIBUTES[canonical]] = value if converter is None else converter(value)
        except ValueError as exc:
            errors.append(
                make_error(
                    "bad_depth" if canonical == "depth" else "bad_value",
                    number,
                    line_no,
                    _value_problem(canonical, value, exc),
                    canonical,
                )
            )
    for canonical in REQUIRED_FIELDS[type_name]:
        if canonical not in values:
            errors.append(
                make_error(
                    "missing_field",
                    number,
                    header_line,
                    f"A {type_name} needs a {WIRE_KEYS[canonical]} field.",
                    canonical,
                )
            )
    if message_type is MessageType.RESPONSE and "status" not in values and "result" not in values:
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
    return MESSAGE_CLASSES[message_type].from_checked(data)  # type: ignore[return-value]


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

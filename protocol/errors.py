"""Errors: `ParseError` values reported by the parser and `BuildError` raised by builders."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

ErrorCode = Literal[
    "bad_header",
    "unknown_type",
    "missing_field",
    "duplicate_field",
    "bad_value",
    "bad_depth",
    "unterminated_block",
    "too_large",
]

ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)
"""Every error code, in the order of the spec."""

HINTS: dict[ErrorCode, str] = {
    "bad_header": "Start the block with a header such as [REQUEST → @Agent].",
    "unknown_type": "Use one of REQUEST, RESPONSE, CLARIFY, HANDOFF or BROADCAST.",
    "missing_field": "Add the field as a `Key: value` line at the start of a line.",
    "duplicate_field": (
        "Give each field once; indent a continuation line by two spaces so it is not "
        "read as a field."
    ),
    "bad_value": "Correct the value as the message says (see docs/protocol.md, Fields).",
    "bad_depth": "Write Depth as current/max with 1 <= current <= max <= 50, e.g. 1/5.",
    "unterminated_block": "Close the block with a line of three backticks (```).",
    "too_large": "Split the content over several messages or raise max_block_bytes.",
}


@dataclass(frozen=True, slots=True)
class ParseError:
    """One problem found in one protocol block; parsing reports these instead of raising."""

    code: ErrorCode
    block: int
    line: int
    field: str | None
    message: str
    hint: str

    def to_dict(self) -> dict[str, str | int | None]:
        """The error as a JSON-ready dict (keys: code, block, line, field, message, hint)."""
        return asdict(self)

    def __str__(self) -> str:
        where = f"block {self.block}, line {self.line}"
        if self.field:
            where += f", field {self.field}"
        return f"{self.code} ({where}): {self.message} Hint: {self.hint}"


# ParseError's slots, set directly: the frozen dataclass __init__ (object.__setattr__ per
# field) costs most of an error, and an input can carry one error per line.
_new_error = object.__new__
_set_code = ParseError.__dict__["code"].__set__
_set_block = ParseError.__dict__["block"].__set__
_set_line = ParseError.__dict__["line"].__set__
_set_field = ParseError.__dict__["field"].__set__
_set_message = ParseError.__dict__["message"].__set__
_set_hint = ParseError.__dict__["hint"].__set__


def make_error(
    code: ErrorCode, block: int, line: int, message: str, field: str | None = None
) -> ParseError:
    """A `ParseError` with the standard hint for ``code``.

    The same object as ``ParseError(code=code, ..., hint=HINTS[code])``, built faster.
    """
    error = _new_error(ParseError)
    _set_code(error, code)
    _set_block(error, block)
    _set_line(error, line)
    _set_field(error, field)
    _set_message(error, message)
    _set_hint(error, HINTS[code])
    return error


class BuildError(ValueError):
    """A message could not be built: a value breaks the rules, or the depth is used up."""


class DepthLimitError(BuildError):
    """A REQUEST, CLARIFY or HANDOFF at ``current == max``: only a RESPONSE may be sent."""

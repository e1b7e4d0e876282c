"""The AINET v0.3 message file: parse (hostile bytes in, value or error out) and render.

::

    === Message ===
    FROM: Device-ABC123/智能体A
    TO: Device-DEF456/智能体B        (or BROADCAST / TASK)
    TYPE: PRIVATE                    (PRIVATE / BROADCAST / TASK; absent in multi-turn files)
    TIME: 2026-03-29 11:35:00        (yyyy-MM-dd HH:mm:ss)
    【Content】
    any text, any language, any number of lines
    【Status】PENDING                 (PENDING / DONE)

``parse`` never raises: it returns an ``AinetMessage`` or a ``MessageError`` with a code,
a reason and the 1-based line. The *last* ``【Status】`` line ends the content, so content
may itself contain such a line. ``=== Reply ===`` headers (the architecture page's
point-to-point reply) are accepted too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from adapters.ainet.names import UnsafeNameError, canonical, check_agent_id

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
DEFAULT_MAX_BYTES = 256 * 1024
MAX_HEADER_LINES = 16
CONTENT_MARK = "【Content】"
STATUS_MARK = "【Status】"
_HEADER = re.compile(r"=+\s*(Message|Reply)\s*=+", re.IGNORECASE)
_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", re.ASCII)
_KEY = re.compile(r"\s*([A-Za-z]+)\s*[:：]\s?(.*)")


class AinetType(StrEnum):
    """The three AINET message types."""

    PRIVATE = "PRIVATE"
    BROADCAST = "BROADCAST"
    TASK = "TASK"


class AinetStatus(StrEnum):
    """A message's status line: still open, or the last turn of its exchange."""

    PENDING = "PENDING"
    DONE = "DONE"


Fields = dict[str, tuple[str, int]]  # KEY -> (value, 1-based line)
RESERVED_TO = {"BROADCAST": AinetType.BROADCAST, "TASK": AinetType.TASK}


@dataclass(frozen=True)
class AinetMessage:
    """One AINET message. ``to`` is an agent id or ``BROADCAST``/``TASK``."""

    sender: str
    to: str
    type: AinetType
    time: datetime
    content: str
    status: AinetStatus = AinetStatus.PENDING
    # Multi-turn conversation files carry no TYPE line (v0.3 examples); keep that on render.
    type_line: bool = True
    reply_header: bool = False

    def is_from(self, agent_id: str) -> bool:
        """True when ``agent_id`` wrote this message (under the canonical comparison)."""
        return canonical(self.sender) == canonical(agent_id)


@dataclass(frozen=True)
class MessageError:
    """Why a file is not an AINET message: a stable ``code``, a reason and the line."""

    code: str
    detail: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        return f"{self.code}: {self.detail}{where}"


def format_time(moment: datetime) -> str:
    """``moment`` as AINET's ``yyyy-MM-dd HH:mm:ss``."""
    return moment.strftime(TIME_FORMAT)


def normalize_text(text: str) -> str:
    """Newlines as ``\\n`` only (CRLF and lone CR converted)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def render(msg: AinetMessage) -> str:
    """The file text of ``msg`` (UTF-8 when written), ending in a newline."""
    lines = ["=== Reply ===" if msg.reply_header else "=== Message ===",
             f"FROM: {msg.sender}", f"TO: {msg.to}"]
    if msg.type_line:
        lines.append(f"TYPE: {msg.type.value}")
    lines += [f"TIME: {format_time(msg.time)}", CONTENT_MARK,
              normalize_text(msg.content), f"{STATUS_MARK}{msg.status.value}"]
    return "\n".join(lines) + "\n"


def _decode(data: bytes, max_bytes: int) -> str | MessageError:
    if len(data) > max_bytes:
        return MessageError("too_large", f"the file is over {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return MessageError("not_utf8", f"not UTF-8 text (byte {exc.start})")
    if "\x00" in text:
        return MessageError("not_text", "the file contains NUL characters")
    return normalize_text(text.removeprefix("\ufeff"))


def _header_fields(lines: list[str], first: int) -> tuple[Fields, int] | MessageError:
    """Parse ``KEY: value`` lines from ``first`` up to the 【Content】 line."""
    fields: Fields = {}
    for index in range(first, min(len(lines), first + MAX_HEADER_LINES + 1)):
        line = lines[index]
        if line.strip().startswith(CONTENT_MARK):
            return fields, index
        if not line.strip():
            continue
        match = _KEY.fullmatch(line)
        if match is None:
            return MessageError("bad_header", f"expected KEY: value, got {line[:40]!r}", index + 1)
        key = match.group(1).upper()
        if key in fields:
            return MessageError("duplicate_field", f"{key} appears twice", index + 1)
        fields[key] = (match.group(2).strip(), index + 1)
    if len(lines) > first + MAX_HEADER_LINES:
        return MessageError("bad_header", f"no {CONTENT_MARK} within {MAX_HEADER_LINES} lines")
    return MessageError("no_content", f"no {CONTENT_MARK} line (truncated file?)")


def _address(value: str, line: int) -> str | MessageError:
    if value.upper() in RESERVED_TO:
        return value.upper()
    try:
        return check_agent_id(value)
    except UnsafeNameError as exc:
        return MessageError("bad_field", f"TO: {exc}", line)


def _message_type(fields: Fields, to: str) -> tuple[AinetType, bool] | MessageError:
    implied = RESERVED_TO.get(to, AinetType.PRIVATE)
    if "TYPE" not in fields:
        return implied, False
    value, line = fields["TYPE"]
    try:
        kind = AinetType(value.upper())
    except ValueError:
        return MessageError("bad_field", f"TYPE {value[:20]!r} is not PRIVATE, BROADCAST or TASK",
                            line)
    if kind is not implied:
        return MessageError("bad_field", f"TYPE {kind.value} does not match TO {to[:40]!r}", line)
    return kind, True


def _time(fields: Fields) -> datetime | MessageError:
    value, line = fields["TIME"]
    if _TIME.fullmatch(value) is None:
        return MessageError("bad_time", f"TIME {value[:30]!r} is not yyyy-MM-dd HH:mm:ss", line)
    try:
        return datetime.strptime(value, TIME_FORMAT)
    except ValueError:
        return MessageError("bad_time", f"TIME {value!r} is not a real date and time", line)


def _status(lines: list[str], start: int) -> tuple[AinetStatus, int] | MessageError:
    """The last 【Status】 line at or after ``start`` and its status value."""
    for index in range(len(lines) - 1, start - 1, -1):
        stripped = lines[index].strip()
        if stripped.startswith(STATUS_MARK):
            value = stripped[len(STATUS_MARK):].strip().upper()
            if any(line.strip() for line in lines[index + 1:]):
                return MessageError("trailing_text", "text after the 【Status】 line", index + 2)
            try:
                return AinetStatus(value), index
            except ValueError:
                return MessageError("bad_status", f"status {value[:20]!r} is not PENDING or DONE",
                                    index + 1)
    return MessageError("no_status", f"no {STATUS_MARK} line (truncated file?)")


def parse(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> AinetMessage | MessageError:
    """Parse one AINET message file; never raises, whatever ``data`` holds."""
    text = _decode(data, max_bytes)
    if isinstance(text, MessageError):
        return text
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return MessageError("empty", "the file is empty")
    header = _HEADER.fullmatch(lines[first].strip())
    if header is None:
        return MessageError("no_header", "the first line is not === Message ===", first + 1)
    found = _header_fields(lines, first + 1)
    if isinstance(found, MessageError):
        return found
    fields, content_line = found
    for key in ("FROM", "TO", "TIME"):
        if key not in fields:
            return MessageError("missing_field", f"no {key} line", content_line + 1)
    try:
        sender = check_agent_id(fields["FROM"][0])
    except UnsafeNameError as exc:
        return MessageError("bad_field", f"FROM: {exc}", fields["FROM"][1])
    to = _address(*fields["TO"])
    if isinstance(to, MessageError):
        return to
    kind = _message_type(fields, to)
    if isinstance(kind, MessageError):
        return kind
    moment = _time(fields)
    if isinstance(moment, MessageError):
        return moment
    status = _status(lines, content_line + 1)
    if isinstance(status, MessageError):
        return status
    inline = lines[content_line].strip()[len(CONTENT_MARK):]
    body = ([inline] if inline else []) + lines[content_line + 1:status[1]]
    return AinetMessage(sender=sender, to=to, type=kind[0], time=moment,
                        content="\n".join(body), status=status[0], type_line=kind[1],
                        reply_header=header.group(1).lower() == "reply")

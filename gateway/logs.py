"""Structured logging carrying RequestId and TraceId: one JSON object per line, or one
readable ``key=value`` line per event on a terminal (``log_format``).

Call sites pass context with ``extra=ids(msg)`` (or explicit keys); the formatter copies
every known context key into the record it prints.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

CONTEXT_KEYS = (
    "request_id",
    "trace_id",
    "transport",
    "channel",
    "native_id",
    "sender",
    "recipient",
    "type",
    "message_type",
    "outcome",
    "reason",
    "identity",
)


def ids(msg: Any, **more: Any) -> dict[str, Any]:
    """Logging ``extra`` for a protocol message: its RequestId, TraceId, type and parties."""
    extra: dict[str, Any] = {
        "request_id": getattr(msg, "request_id", None),
        "trace_id": getattr(msg, "trace_id", None),
        "type": str(getattr(msg, "type", "")) or None,
        "sender": getattr(msg, "sender", None),
        "recipient": getattr(msg, "to", None),
    }
    extra.update(more)
    return extra


def _timestamp(record: logging.LogRecord) -> str:
    """The record's time in UTC, ISO 8601 with milliseconds."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with its context keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


# Control characters (ESC included) and line separators, escaped so text from outside (a
# name, a reason quoting a message) can neither start a forged log line nor drive the
# terminal.
_ESCAPES = {
    c: f"\\x{c:02x}" for c in (*range(32), 127, 0x85)
} | {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"}
_PLAIN_VALUE = re.compile(r"[^\s\"=\\]+")


def _printable(text: str) -> str:
    return text.translate(_ESCAPES)


def _value(value: Any) -> str:
    """A ``key=value`` value: bare when plain, else JSON-quoted (escapes included)."""
    text = str(value)
    if _PLAIN_VALUE.fullmatch(text) and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False).translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """One line per event for a terminal: ``time level logger message key=value ...``.

    The context keys (RequestId and TraceId first) follow the message; values with
    spaces, quotes or control characters are JSON-quoted. A traceback follows on
    indented lines, so every line starting at column 0 is one event.
    """

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record),
            f"{record.levelname:<7}",
            record.name,
            _printable(record.getMessage()),
        ]
        parts.extend(
            f"{k}={_value(record.__dict__[k])}"
            for k in CONTEXT_KEYS
            if record.__dict__.get(k) is not None
        )
        text = " ".join(parts)
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            text += "".join(f"\n    {_printable(line)}" for line in trace.splitlines())
        return text


# Libraries whose own loggers go through the same handler, so nothing they log reaches
# standard error as plain multi-line text (Python's last-resort handler): aiohttp's
# aiohttp.server / .web / .access / .internal, and asyncio's unhandled-error reports.
LIBRARY_LOGGERS = ("aiohttp", "asyncio")


class ClientErrorFilter(logging.Filter):
    """A malformed request logged by aiohttp's HTTP server (the Slack transport's own
    listener; the ``http`` transport's server logs its own one line) is the client's
    error, not ours: one warning line naming it, without the parser's traceback (a client
    sending garbage must not be able to fill the log with tracebacks)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        # By module name: the gateway does not import aiohttp (a transport's library).
        if exc is not None and type(exc).__module__ == "aiohttp.http_exceptions":
            record.msg = f"{record.getMessage()}: {' '.join(str(exc).split())}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """Send the ``bpgw`` loggers (and ``LIBRARY_LOGGERS``) to standard error in the
    chosen format: ``json``, ``text``, or ``auto`` (text on a terminal, else JSON)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ClientErrorFilter())
    root = logging.getLogger("bpgw")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers[:] = [handler]
        library.setLevel(max(logging.getLevelName(level.upper()), logging.WARNING))
        library.propagate = False
    # APScheduler is chatty at INFO; its warnings still show.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)

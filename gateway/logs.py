"""Structured logging: one JSON object per line, carrying RequestId and TraceId.

Call sites pass context with ``extra=ids(msg)`` (or explicit keys); the formatter copies
every known context key into the record it prints.
"""

from __future__ import annotations

import json
import logging
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


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with its context keys."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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


class TextFormatter(logging.Formatter):
    """Human-readable lines with the context keys appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        base = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        context = " ".join(
            f"{k}={record.__dict__[k]}" for k in CONTEXT_KEYS if record.__dict__.get(k) is not None
        )
        text = f"{base} {context}".rstrip()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


# Libraries whose own loggers go through the same handler, so nothing they log reaches
# standard error as plain multi-line text (Python's last-resort handler): aiohttp's
# aiohttp.server / .web / .access / .internal, and asyncio's unhandled-error reports.
LIBRARY_LOGGERS = ("aiohttp", "asyncio")


class ClientErrorFilter(logging.Filter):
    """A malformed request logged by the HTTP server is the client's error, not ours:
    one warning line naming it, without the parser's traceback (a client sending
    garbage must not be able to fill the log with tracebacks)."""

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


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Send the ``bpgw`` loggers (and ``LIBRARY_LOGGERS``) to standard error in the
    chosen format."""
    handler = logging.StreamHandler(sys.stderr)
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

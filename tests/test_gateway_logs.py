"""Log formats: readable text lines for a terminal, JSON otherwise, both with the ids."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from gateway.logs import JsonFormatter, TextFormatter, configure_logging, ids
from protocol import build_request


def _record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("bpgw.gateway.pipeline", logging.WARNING, __file__, 1, msg, args,
                               exc_info)
    record.__dict__.update(extra)
    return record


TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING bpgw\.gateway\.pipeline (?P<rest>.*)$"
)


def test_a_text_line_is_time_level_logger_message_then_the_ids() -> None:
    req = build_request(sender="Lotbot", to="Mantis", task="x", trace_id="tr-1")
    line = TextFormatter().format(
        _record("message %s: %s", "rejected", "loop", **ids(req, transport="web"))
    )
    found = TEXT_LINE.match(line)
    assert found, line
    assert found["rest"] == (
        f"message rejected: loop request_id={req.request_id} trace_id=tr-1 transport=web "
        "sender=Lotbot recipient=Mantis type=REQUEST"
    )


def test_outside_text_cannot_forge_a_line_or_drive_the_terminal() -> None:
    hostile = 'x\n2026-01-01T00:00:00.000Z ERROR bpgw fake\x1b[2J\u2028'
    line = TextFormatter().format(
        _record("refused: %s", hostile, sender=hostile, reason="two words", identity="a=b")
    )
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line
    assert "refused: x\\n2026-01-01" in line and "\\x1b[2J" in line
    # Values with spaces, quotes or controls are JSON-quoted, so key=value stays parseable.
    assert 'reason="two words"' in line and 'identity="a=b"' in line
    assert json.loads(line.split(" sender=", 1)[1].split(" reason=")[0]) == hostile


def test_a_traceback_follows_on_indented_lines() -> None:
    text = TextFormatter().format(_record("boom", exc=True, request_id="r-1"))
    first, *rest = text.split("\n")
    assert TEXT_LINE.match(first) and first.endswith("boom request_id=r-1")
    # Every line of it indented, the exception's own text too: no line can pass for an event.
    assert rest and all(line.startswith("    ") for line in rest)
    assert [line.strip() for line in rest[-2:]] == ["ValueError: bad", "thing"]


def test_json_lines_carry_the_same_context() -> None:
    out = json.loads(JsonFormatter().format(_record("hi", request_id="r-1", trace_id="t-1")))
    assert (out["level"], out["logger"], out["msg"]) == ("warning", "bpgw.gateway.pipeline", "hi")
    assert (out["request_id"], out["trace_id"]) == ("r-1", "t-1")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    names = ("bpgw", "aiohttp", "asyncio")
    saved = [(logging.getLogger(n), logging.getLogger(n).handlers[:],
              logging.getLogger(n).level, logging.getLogger(n).propagate) for n in names]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("restore_logging")
def test_auto_is_text_on_a_terminal_and_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    for stream, formatter in ((io.StringIO(), JsonFormatter), (_Tty(), TextFormatter)):
        monkeypatch.setattr(sys, "stderr", stream)
        configure_logging("INFO", "auto")
        logging.getLogger("bpgw.test").info("hello", extra={"request_id": "r-9"})
        handler = logging.getLogger("bpgw").handlers[0]
        assert isinstance(handler.formatter, formatter)
        written = stream.getvalue()
        assert written.count("\n") == 1 and "r-9" in written
    configure_logging("INFO", "json")  # as configured, whatever the stream
    assert isinstance(logging.getLogger("bpgw").handlers[0].formatter, JsonFormatter)

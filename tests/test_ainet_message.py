"""AINET message files: the seed's examples, round trips, and hostile bytes."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.ainet.message import (
    AinetMessage,
    AinetStatus,
    AinetType,
    MessageError,
    parse,
    render,
)

SEED_BROADCAST = """=== Message ===
FROM: Device-ABC123/智能体A
TO: BROADCAST
TYPE: BROADCAST
TIME: 2026-03-29 11:21:50
【Content】
AI Agent Device-ABC123/智能体A has joined AINET(AI-Net) collaboration network.
【Status】PENDING
"""

SEED_TURN = """=== Message ===
FROM: Device-ABC123/智能体A
TO: Device-DEF456/智能体B
TIME: 2026-04-07 10:30:00
【Content】
Thanks! Task completed.
【Status】DONE
"""

SEED_REPLY = """=== Reply ===
FROM: Device-DEF456/智能体B
TO: Device-ABC123/智能体A
TIME: 2026-03-29 11:35:30
【Content】
审查完成，发现以下问题...
【Status】DONE
"""


def ok(data: bytes | str) -> AinetMessage:
    result = parse(data.encode() if isinstance(data, str) else data)
    assert isinstance(result, AinetMessage), result
    return result


def err(data: bytes | str, **kw: int) -> MessageError:
    result = parse(data.encode() if isinstance(data, str) else data, **kw)
    assert isinstance(result, MessageError), result
    return result


def test_seed_broadcast_parses_and_renders_byte_for_byte() -> None:
    msg = ok(SEED_BROADCAST)
    assert msg.sender == "Device-ABC123/智能体A"
    assert (msg.to, msg.type, msg.status) == ("BROADCAST", AinetType.BROADCAST, AinetStatus.PENDING)
    assert msg.time == datetime(2026, 3, 29, 11, 21, 50)
    assert msg.content.startswith("AI Agent Device-ABC123/智能体A has joined")
    assert render(msg) == SEED_BROADCAST


def test_multi_turn_file_without_type_line_round_trips() -> None:
    msg = ok(SEED_TURN)
    assert msg.type is AinetType.PRIVATE and not msg.type_line
    assert msg.status is AinetStatus.DONE
    assert render(msg) == SEED_TURN


def test_reply_header_accepted_and_kept() -> None:
    msg = ok(SEED_REPLY)
    assert msg.reply_header and msg.content == "审查完成，发现以下问题..."
    assert render(msg) == SEED_REPLY


def test_task_type_inferred_and_checked() -> None:
    task = SEED_BROADCAST.replace("TO: BROADCAST\nTYPE: BROADCAST", "TO: TASK\nTYPE: TASK")
    assert ok(task).type is AinetType.TASK
    mismatch = SEED_BROADCAST.replace("TYPE: BROADCAST", "TYPE: PRIVATE")
    assert err(mismatch).code == "bad_field"


def test_crlf_bom_and_content_with_a_status_line() -> None:
    body = "line one\n【Status】DONE is what I will write later\n\nlast"
    msg = AinetMessage("Device-X1/a", "Device-Y2/b", AinetType.PRIVATE,
                       datetime(2026, 1, 2, 3, 4, 5), body)
    text = render(msg)
    assert ok(text) == msg
    assert ok("\ufeff" + text.replace("\n", "\r\n")) == msg


@pytest.mark.parametrize(("mutate", "code"), [
    (lambda t: t.replace("=== Message ===", "hello"), "no_header"),
    (lambda t: t.replace("FROM: Device-ABC123/智能体A\n", ""), "missing_field"),
    (lambda t: t.replace("TO: BROADCAST\n", "TO: BROADCAST\nTO: BROADCAST\n"), "duplicate_field"),
    (lambda t: t.replace("TIME: 2026-03-29 11:21:50", "TIME: 2026-03-29T11:21:50"), "bad_time"),
    (lambda t: t.replace("TIME: 2026-03-29 11:21:50", "TIME: 2026-02-30 11:21:50"), "bad_time"),
    (lambda t: t.replace("【Status】PENDING", "【Status】MAYBE"), "bad_status"),
    (lambda t: t.replace("【Status】PENDING\n", ""), "no_status"),
    (lambda t: t.split("【Content】")[0], "no_content"),
    (lambda t: t + "more text\n", "trailing_text"),
    (lambda t: t.replace("FROM: Device-ABC123/智能体A", "FROM: ../../etc/passwd"), "bad_field"),
    (lambda t: t.replace("FROM: Device-ABC123/智能体A", "FROM: nodevice"), "bad_field"),
    (lambda t: t.replace("TYPE: BROADCAST", "TYPE: SPAM"), "bad_field"),
    (lambda t: t.replace("TIME", "WHAT: x\nTIME", 1).replace("TO:", "T0 -"), "bad_header"),
    (lambda t: "", "empty"),
])
def test_malformed_files_give_clear_error_values(mutate: object, code: str) -> None:
    assert callable(mutate)
    error = err(mutate(SEED_BROADCAST))
    assert error.code == code and error.detail


def test_byte_level_hostility() -> None:
    assert err(b"\xff\xfe=== Message ===").code == "not_utf8"
    assert err(SEED_BROADCAST.encode().replace(b"Content", b"Con\x00tent")).code == "not_text"
    assert err(SEED_BROADCAST.encode() + b"x" * 100, max_bytes=100).code == "too_large"
    # A half-written file (cut anywhere) is an error value, never an exception.
    data = SEED_BROADCAST.encode()
    for cut in range(len(data) - 1):
        result = parse(data[:cut])
        assert isinstance(result, MessageError) or data[cut:].strip() == b""


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_parse_never_raises_on_any_bytes(data: bytes) -> None:
    assert isinstance(parse(data), AinetMessage | MessageError)


lines = st.lists(st.sampled_from([
    "=== Message ===", "FROM: Device-A1/x", "TO: BROADCAST", "TYPE: TASK",
    "TIME: 2026-01-01 00:00:00",
    "【Content】", "【Status】DONE", "【Status】", "", "FROM:", "TO: Device-B/智能", "x: y", "\x00",
]), max_size=14)


@settings(max_examples=400)
@given(lines)
def test_parse_never_raises_on_shuffled_protocol_lines(parts: list[str]) -> None:
    assert isinstance(parse("\n".join(parts).encode()), AinetMessage | MessageError)


@settings(max_examples=200)
@given(st.text(max_size=300))
def test_any_content_round_trips(content: str) -> None:
    msg = AinetMessage("Device-Host1ABCD/名前", "BROADCAST", AinetType.BROADCAST,
                       datetime(2026, 5, 6, 7, 8, 9), content)
    parsed = parse(render(msg).encode("utf-8", "surrogatepass"))
    if "\x00" in content or any(0xD800 <= ord(c) <= 0xDFFF for c in content):
        assert isinstance(parsed, MessageError)
    else:
        expected = content.replace("\r\n", "\n").replace("\r", "\n")
        assert isinstance(parsed, AinetMessage) and parsed.content == expected

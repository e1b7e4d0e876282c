"""Properties: parse(render(m)) == m for generated messages; parse never raises."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import (
    MESSAGE_CLASSES,
    Depth,
    MessageBase,
    MessageType,
    Priority,
    Status,
    check_name,
    parse,
    render,
)
from protocol.fields import FIELD_KEYS, normalize_key
from protocol.text import escape_fences, unescape_fences

FRAGMENTS = [
    "```",
    "````",
    "``",
    "`",
    "\u200b",
    "``\u200b`",
    "Depth: 1/99",
    "From: Mallory",
    "  Status: done",
    "[REQUEST → @x]",
    "->",
    "→",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "智能体",
    "é",
    "Key:",
    ":",
    "@all",
    # Line boundaries of other splitters (str.splitlines, U+2028 readers).
    "\u2028Depth: 1/50",
    "\u2029",
    "\x85",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
]
# Every line boundary some common splitter breaks at, LF excepted.
OTHER_BREAKS = ["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
ALL_BREAKS = "\n" + "".join(OTHER_BREAKS)

words = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
raw_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), words), min_size=1, max_size=12).map(
    "".join
)
# Values are trimmed on the wire; the model trims too, so any text must round-trip as
# long as something is left after trimming.
text_value = raw_text.filter(lambda value: value.strip() != "")


def _is_name(value: str) -> bool:
    try:
        check_name(value)
    except ValueError:
        return False
    return value.isprintable()


token_chars = st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc"))
names = st.one_of(
    st.sampled_from(["Mantis", "Lotbot", "all", "Device-ABC123/智能体A", "a```b", "x]", "a->b"]),
    st.text(alphabet=token_chars, min_size=1, max_size=20),
).filter(_is_name)
tokens = st.text(alphabet=token_chars, min_size=1, max_size=30).filter(_is_name)
meta_keys = st.from_regex(re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,10}"), fullmatch=True)


@st.composite
def depths(draw: st.DrawFn) -> Depth:
    maximum = draw(st.integers(1, 50))
    return Depth(current=draw(st.integers(1, maximum)), max=maximum)


@st.composite
def messages(draw: st.DrawFn) -> MessageBase:
    message_type = draw(st.sampled_from(list(MessageType)))
    values: dict[str, Any] = {
        "to": draw(names),
        "sender": draw(names),
        "request_id": draw(tokens),
        "depth": draw(depths()),
        "context": draw(st.none() | text_value),
        "trace_id": draw(st.none() | tokens),
        "version": draw(st.sampled_from(["0.1", "0.2", "1.0"])),
        "key_id": draw(st.none() | tokens),
        "signature": draw(st.none() | tokens),
    }
    own = FIELD_KEYS[message_type.value]
    meta = draw(
        st.lists(
            st.tuples(meta_keys.filter(lambda key: normalize_key(key) not in own), text_value),
            max_size=4,
        )
    )
    values["meta"] = tuple(meta)
    if message_type in (MessageType.REQUEST, MessageType.HANDOFF):
        values["task"] = draw(text_value)
        values["priority"] = draw(st.sampled_from(list(Priority)))
        values["callback"] = draw(st.none() | text_value)
    if message_type is MessageType.HANDOFF:
        values["reason"] = draw(st.none() | text_value)
    if message_type is MessageType.RESPONSE:
        values["status"] = draw(st.none() | st.sampled_from(list(Status)))
        values["result"] = draw(text_value if values["status"] is None else st.none() | text_value)
        values["next_action"] = draw(st.none() | text_value)
    if message_type is MessageType.CLARIFY:
        values["question"] = draw(text_value)
    if message_type is MessageType.BROADCAST:
        values["message"] = draw(text_value)
        values["subject"] = draw(st.none() | text_value)
        values["urgency"] = draw(st.none() | st.sampled_from(list(Priority)))
    return MESSAGE_CLASSES[message_type](**values)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_parse_render_round_trip(msg: MessageBase) -> None:
    text = render(msg)
    result = parse(text)
    assert result.errors == []
    assert result.messages == [msg]
    # The text form is stable too, and the parsed message passes model validation.
    assert render(result.messages[0]) == text
    assert type(msg).model_validate(result.messages[0].model_dump()) == msg


@settings(max_examples=200)
@given(messages(), messages(), words)
def test_round_trip_inside_chat(first: MessageBase, second: MessageBase, chat: str) -> None:
    text = f"{chat.replace('`', '')}\n{render(first)}\nok\n{render(second)}\n"
    assert parse(text).messages == [first, second]


@given(raw_text)
def test_escape_round_trip_and_never_closes_fence(value: str) -> None:
    escaped = escape_fences(value)
    assert "```" not in escaped
    assert unescape_fences(escaped) == value


@settings(max_examples=500)
@given(st.text())
def test_parse_never_raises_on_text(text: str) -> None:
    result = parse(text)
    assert isinstance(result.messages, list) and isinstance(result.errors, list)


@settings(max_examples=300)
@given(st.binary())
def test_parse_never_raises_on_bytes(data: bytes) -> None:
    assert isinstance(parse(b"```\n[REQUEST \xe2\x86\x92 @a]\n" + data).errors, list)
    assert isinstance(parse(data).messages, list)


@settings(max_examples=500)
@given(
    st.lists(st.one_of(st.sampled_from([*FRAGMENTS, "Task: ", "RequestId: r", "\n```\n"]), words))
)
def test_parse_never_raises_on_protocol_like_text(parts: list[str]) -> None:
    text = "```\n[REQUEST → @a]\n" + "".join(parts)
    result = parse(text, max_block_bytes=512)
    for error in result.errors:
        assert error.block >= 1 and error.line >= 1 and error.message and error.hint


def _js_lines(text: str) -> list[str]:
    return re.split(r"\r?\n", text)


@settings(max_examples=300)
@given(messages())
def test_rendered_text_splits_the_same_for_every_splitter(msg: MessageBase) -> None:
    """Python's splitlines, JavaScript's split(/\\r?\\n/) and a U+2028-aware reader see
    the same lines, so the same fields, in what the gateway writes."""
    text = render(msg)
    lines = text.split("\n")
    assert text.splitlines() == lines
    assert _js_lines(text) == lines
    assert [part for line in lines for part in line.split("\u2028")] == lines


@settings(max_examples=300)
@given(messages(), st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(OTHER_BREAKS)),
                            min_size=1, max_size=4))
def test_parser_reads_every_line_boundary_as_a_line_break(
    msg: MessageBase, inserts: list[tuple[int, str]]
) -> None:
    """Whatever boundary a hostile sender puts into a block, the parser sees the lines
    Python's splitlines sees: no field exists for one reader and not for another."""
    text = render(msg)
    for position, brk in inserts:
        at = position % (len(text) + 1)
        text = text[:at] + brk + text[at:]
    # Every boundary splitlines knows becomes "\n", a trailing one included (so error
    # line numbers agree too); a line's content holds no boundary, so rstrip takes just one.
    as_lines = "".join(
        content + "\n" if (content := line.rstrip(ALL_BREAKS)) != line else line
        for line in text.splitlines(keepends=True)
    )
    assert parse(text) == parse(as_lines)


@pytest.mark.parametrize("brk", OTHER_BREAKS)
def test_smuggled_depth_is_a_field_for_every_reader(brk: str) -> None:
    """`Task: x<U+2028>Depth: 1/50` is the Depth line splitlines sees, not hidden text."""
    block = (
        "```\n[REQUEST → @Mantis]\nFrom: lotbot\nRequestId: lotbot-1\n"
        f"Task: look{brk}Depth: 1/50\nDepth: 1/5\n```"
    )
    result = parse(block)
    assert result.messages == []
    assert [e.code for e in result.errors] == ["duplicate_field"]
    alone = parse(block.replace("\nDepth: 1/5\n", "\n"))
    assert [(m.task, str(m.depth)) for m in alone.messages] == [("look", "1/50")]  # type: ignore[union-attr]
    # Built from that task, the value is written as a continuation line instead.
    relayed = render(alone.messages[0].model_copy(update={"task": f"look{brk}Depth: 1/50"}))
    assert relayed.splitlines() == _js_lines(relayed) == relayed.split("\n")

"""Properties: parse(render(m)) == m for generated messages; parse never raises."""

from __future__ import annotations

import re
from typing import Any

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
]

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

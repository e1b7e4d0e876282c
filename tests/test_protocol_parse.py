"""parse(): every rule and error code of wire-format.md sections 1-3."""

from __future__ import annotations

import pytest

from protocol import (
    ERROR_CODES,
    Broadcast,
    Depth,
    MessageType,
    ParseResult,
    Priority,
    Request,
    Response,
    Status,
    build_request,
    parse,
    render,
)
from protocol.text import ZWSP, lone_surrogate, normalize_newlines, only_lf_breaks

SPEC_EXAMPLE = """```
[REQUEST → @Mantis]
From: Lotbot
RequestId: lotbot-8f2d4e
Task: Check disk usage on build-01
  and report anything over 80%
Context: nightly audit
Depth: 1/5
Priority: normal
```"""


def block(*lines: str, fence: str = "```") -> str:
    return "\n".join((fence, *lines, "```"))


def one(text: str) -> Request | Response | Broadcast:
    result = parse(text)
    assert result.errors == [], result.errors
    assert len(result.messages) == 1
    return result.messages[0]  # type: ignore[return-value]


def errors_of(text: str) -> list[tuple[str, int, int, str | None]]:
    result = parse(text)
    assert result.messages == []
    return [(e.code, e.block, e.line, e.field) for e in result.errors]


def test_spec_example() -> None:
    msg = one(SPEC_EXAMPLE)
    assert msg == Request(
        to="Mantis",
        sender="Lotbot",
        request_id="lotbot-8f2d4e",
        task="Check disk usage on build-01\nand report anything over 80%",
        context="nightly audit",
        depth=Depth(current=1, max=5),
        priority=Priority.NORMAL,
    )
    assert render(msg) == SPEC_EXAMPLE


def test_text_without_fence_is_no_block() -> None:
    result = parse("just chatting about [REQUEST → @Mantis] From: x")
    assert result == ParseResult(messages=[], errors=[], found_block=False)
    # Such results are shared, so their (empty) lists refuse to grow.
    assert isinstance(result.messages, list) and len(result.errors) == 0
    with pytest.raises(TypeError):
        result.errors.append(parse(block("[PING → @a]")).errors[0])
    assert parse("`code` without a fence").errors == []


def test_ordinary_code_block_is_not_an_error() -> None:
    result = parse(block("def f():", "    return 1"))
    assert (result.messages, result.errors, result.found_block) == ([], [], False)
    assert not parse(block("", "  ", "")).found_block


def test_text_outside_blocks_is_ignored_and_language_tag_allowed() -> None:
    text = "hello\n" + SPEC_EXAMPLE.replace("```\n", "```text\n", 1) + "\nbye ```"
    assert one(text).task.startswith("Check disk")  # type: ignore[union-attr]


def test_several_blocks_parse_separately() -> None:
    second = SPEC_EXAMPLE.replace("lotbot-8f2d4e", "lotbot-2")
    result = parse(f"a\n{SPEC_EXAMPLE}\nb\n{block('x = 1')}\n{second}")
    assert [m.request_id for m in result.messages] == ["lotbot-8f2d4e", "lotbot-2"]
    assert result.found_block and result.errors == []


def test_header_variants() -> None:
    msg = one(block("  [ request->@a ]", "From: b", "RequestId: r", "Task: t"))
    assert (msg.type, msg.to) == (MessageType.REQUEST, "a")
    msg = one(block("[Broadcast  →  @all]", "From: b", "RequestId: r", "Message: m"))
    assert msg.is_broadcast
    msg = one(block("[HANDOFF → @Device-ABC123/智能体A]", "From: b", "RequestId: r", "Task: t"))
    assert msg.to == "Device-ABC123/智能体A"


def test_first_non_empty_line_is_the_header() -> None:
    msg = one(block("", "   ", "[REQUEST → @a]", "From: b", "RequestId: r", "Task: t"))
    assert msg.to == "a"


def test_fence_closing_at_end_of_line_and_bytes_input() -> None:
    text = "```\n[REQUEST → @a]\nFrom: b\nRequestId: r\nTask: t```"
    assert one(text).task == "t"  # type: ignore[union-attr]
    assert parse(text.encode("utf-8")).messages == parse(text).messages


@pytest.mark.parametrize(
    "key", ["RequestId", "request-id", "REQUEST_ID", "request_Id", "Request-ID"]
)
def test_key_normalisation(key: str) -> None:
    assert one(block("[REQUEST → @a]", "From: b", f"{key}: r-1", "Task: t")).request_id == "r-1"


def test_crlf_and_lone_cr_read_as_lf() -> None:
    crlf = SPEC_EXAMPLE.replace("\n", "\r\n")
    assert one(crlf) == one(SPEC_EXAMPLE)
    cr = SPEC_EXAMPLE.replace("\n", "\r")
    assert one(cr) == one(SPEC_EXAMPLE)


def test_values_trimmed_and_empty_means_absent() -> None:
    msg = one(block("[REQUEST → @a]", "From:   b  ", "RequestId: r", "Task:  t  ", "Context:   "))
    assert (msg.sender, msg.task, msg.context) == ("b", "t", None)  # type: ignore[union-attr]


def test_continuation_lines_lose_two_spaces_only() -> None:
    msg = one(block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: one", "    two", "three"))
    assert msg.task == "one\n  two\nthree"  # type: ignore[union-attr]


def test_injected_field_in_value_renders_as_continuation() -> None:
    from protocol import build_request

    msg = build_request(sender="b", to="a", task="x\nDepth: 1/99", request_id="r")
    text = render(msg)
    assert "\n  Depth: 1/99\n" in text
    back = one(text)
    assert back == msg and back.depth == Depth()


def test_fence_in_value_is_escaped_and_restored() -> None:
    from protocol import build_request

    msg = build_request(sender="b", to="a", task="```\nrm -rf /\n```", request_id="r")
    text = render(msg)
    assert text.count("```") == 2
    assert "``\u200b`" in text
    assert one(text) == msg


def test_status_aliases() -> None:
    def status(value: str) -> Status | None:
        return one(block("[RESPONSE → @a]", "From: b", "RequestId: r", f"Status: {value}")).status  # type: ignore[union-attr]

    assert status("success") is Status.DONE
    assert status("partial_success") is Status.PARTIAL
    assert status("canceled") is Status.CANCELLED
    assert status("DONE") is Status.DONE
    assert status("failed") is Status.FAILED


def test_body_alias_and_original_request_id() -> None:
    msg = one(block("[RESPONSE → @a]", "From: b", "OriginalRequestId: r-9", "Body: all good"))
    assert (msg.request_id, msg.result, msg.meta) == ("r-9", "all good", ())  # type: ignore[union-attr]
    msg = one(block("[BROADCAST → @all]", "From: b", "RequestId: r", "Body: hi"))
    assert msg.message == "hi"  # type: ignore[union-attr]
    # Next to a RequestId, OriginalRequestId is kept as meta and written back.
    text = block(
        "[CLARIFY → @a]", "From: b", "OriginalRequestId: o-1", "RequestId: r", "Question: q"
    )
    msg = one(text)
    assert (msg.request_id, msg.meta) == ("r", (("OriginalRequestId", "o-1"),))
    assert one(render(msg)) == msg


def test_meta_kept_in_order_with_spelling_and_other_types_fields() -> None:
    text = block(
        "[RESPONSE → @a]",
        "From: b",
        "RequestId: r",
        "x-b: 2",
        "Status: done",
        "X-A: 1",
        "Task: not a RESPONSE field",
        "x-b: 3",
    )
    msg = one(text)
    assert msg.meta == (("x-b", "2"), ("X-A", "1"), ("Task", "not a RESPONSE field"), ("x-b", "3"))
    assert one(render(msg)) == msg


def test_defaults_depth_priority_version() -> None:
    msg = one(block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t"))
    assert (msg.depth, msg.priority, msg.version) == (
        Depth(current=1, max=5),
        Priority.NORMAL,
        "0.1",
    )  # type: ignore[union-attr]
    msg = one(block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", "Version: 0.2"))
    assert msg.version == "0.2" and "Protocol-Version: 0.2" in render(msg)


# --- errors -----------------------------------------------------------------------------


def test_bad_header_shapes() -> None:
    assert errors_of(block("[REQUEST @a]", "From: b")) == [("bad_header", 1, 1, None)]
    assert errors_of(block("[REQUEST → a]", "From: b")) == [("bad_header", 1, 1, None)]
    assert errors_of(block("[ → @a]")) == [("bad_header", 1, 1, None)]
    assert errors_of(block("[REQUEST → @]")) == [("bad_header", 1, 1, None)]
    assert errors_of(block(f"[REQUEST → @{'x' * 129}]")) == [("bad_header", 1, 1, None)]


def test_unknown_type() -> None:
    assert errors_of("hi\n" + block("", "[PING → @a]")) == [("unknown_type", 1, 2, None)]


def test_missing_fields() -> None:
    assert errors_of(block("[REQUEST → @a]")) == [
        ("missing_field", 1, 1, "from"),
        ("missing_field", 1, 1, "request_id"),
        ("missing_field", 1, 1, "task"),
    ]
    assert errors_of(block("[RESPONSE → @a]", "From: b", "RequestId: r")) == [
        ("missing_field", 1, 1, "status")
    ]
    assert errors_of(block("[CLARIFY → @a]", "From: b", "RequestId: r", "Question:")) == [
        ("missing_field", 1, 1, "question")
    ]
    assert errors_of(block("[BROADCAST → @all]", "From: b", "RequestId: r")) == [
        ("missing_field", 1, 1, "message")
    ]


def test_duplicate_fields() -> None:
    text = block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", "task: u")
    assert errors_of(text) == [("duplicate_field", 1, 5, "task")]
    text = block("[RESPONSE → @a]", "From: b", "RequestId: r", "Result: x", "Body: y")
    assert errors_of(text) == [("duplicate_field", 1, 5, "result")]
    text = block(
        "[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", "Depth: 1/5", "Depth: 1/99"
    )
    assert errors_of(text)[0] == ("duplicate_field", 1, 6, "depth")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("Status: maybe", "status"),
        ("Priority: urgent", "priority"),
        ("RequestId: has space", "request_id"),
        ("From: two words", "from"),
        ("TraceId: a b", "trace_id"),
        ("Version: 1 0", "version"),
    ],
)
def test_bad_values(line: str, field: str) -> None:
    lines = ["[RESPONSE → @a]", "From: b", "RequestId: r", "Status: done", "Priority: low"]
    key = line.split(":")[0]
    lines = [x for x in lines if not x.startswith(key)]
    if field == "priority":
        lines[0] = "[REQUEST → @a]"
        lines.append("Task: t")
    lines.append(line)
    errors = parse(block(*lines)).errors
    assert [(e.code, e.field) for e in errors] == [("bad_value", field)]
    assert errors[0].message and errors[0].hint


@pytest.mark.parametrize("depth", ["0/5", "6/5", "1/51", "x/5", "1-5", "1/", "١/٥", "1/5/7"])
def test_bad_depth(depth: str) -> None:
    text = block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", f"Depth: {depth}")
    assert errors_of(text) == [("bad_depth", 1, 5, "depth")]


def test_depth_bounds_accepted() -> None:
    for depth in ("1/1", "50/50", " 3 / 7 "):
        msg = one(
            block("[RESPONSE → @a]", "From: b", "RequestId: r", "Status: done", f"Depth: {depth}")
        )
        assert str(msg.depth) == depth.replace(" ", "")


def test_unterminated_block() -> None:
    assert errors_of("```\n[REQUEST → @a]\nFrom: b") == [("unterminated_block", 1, 2, None)]
    # An unterminated ordinary code block is plain chat.
    assert parse("```\nprint(1)\n").found_block is False


def test_too_large_is_configurable() -> None:
    text = block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: " + "x" * 70_000)
    assert errors_of(text) == [("too_large", 1, 1, None)]
    assert parse(text, max_block_bytes=100_000).messages[0].task.endswith("x")  # type: ignore[union-attr]
    # The limit counts UTF-8 bytes, not characters.
    wide = block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: " + "é" * 100)
    chars = len(wide) - 8  # the content between the fences
    assert parse(wide, max_block_bytes=chars + 10).errors[0].code == "too_large"
    assert parse(wide, max_block_bytes=chars + 110).errors == []


def test_too_large_means_over_the_limit() -> None:
    text = block("[REQUEST -> @a]", "From: b", "RequestId: r", "Task: x")
    size = len(text) - 8  # the bytes between the fences (all ASCII)
    assert parse(text, max_block_bytes=size).errors == []
    assert [e.code for e in parse(text, max_block_bytes=size - 1).errors] == ["too_large"]


def test_text_before_first_field_is_an_error() -> None:
    text = block("[REQUEST → @a]", "hello there", "From: b", "RequestId: r", "Task: t")
    assert errors_of(text) == [("bad_value", 1, 2, None)]


def test_error_in_one_block_keeps_others() -> None:
    result = parse(block("[PING → @a]") + "\n" + SPEC_EXAMPLE)
    assert [e.code for e in result.errors] == ["unknown_type"]
    assert result.errors[0].block == 1
    assert len(result.messages) == 1


def test_every_error_code_is_reachable() -> None:
    samples = [
        block("[nope]"),
        block("[PING → @a]"),
        block("[REQUEST → @a]"),
        block("[REQUEST → @a]", "From: b", "From: c", "RequestId: r", "Task: t"),
        block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", "Priority: asap"),
        block("[REQUEST → @a]", "From: b", "RequestId: r", "Task: t", "Depth: 9/5"),
        "```\n[REQUEST → @a]\n",
    ]
    codes = {e.code for text in samples for e in parse(text).errors}
    codes |= {e.code for e in parse(samples[0], max_block_bytes=2).errors}
    assert codes == set(ERROR_CODES)


def test_error_to_dict() -> None:
    error = parse(block("[PING → @a]")).errors[0]
    assert error.to_dict() == {
        "code": "unknown_type",
        "block": 1,
        "line": 1,
        "field": None,
        "message": error.message,
        "hint": error.hint,
    }
    assert "block 1, line 1" in str(error)


def test_parsed_messages_pass_model_validation() -> None:
    for msg in parse(
        SPEC_EXAMPLE
        + "\n"
        + block("[BROADCAST → @all]", "From: b", "RequestId: r", "Message: m", "X: y")
    ).messages:
        assert type(msg).model_validate(msg.model_dump()) == msg


def test_trailing_white_space_of_value_lines_carries_no_meaning() -> None:
    from protocol import build_request

    msg = build_request(sender="b", to="a", task="one   \n  two\t\n\nthree ", request_id="r")
    assert msg.task == "one\n  two\n\nthree"
    text = block(
        "[REQUEST → @a]", "From: b", "RequestId: r", "Task: one  ", "    two  ", "", "  three"
    )
    assert one(text).task == msg.task  # type: ignore[union-attr]


def test_a_lone_surrogate_is_a_bad_value_not_a_message() -> None:
    # JSON can carry "\ud800"; no UTF-8 store or platform can: refused at the parser.
    text = render(build_request(sender="Lotbot", to="Mantis", task="check XX disk"))
    result = parse(text.replace("XX", "\ud800"))
    assert result.messages == [] and result.found_block
    [error] = result.errors
    assert error.code == "bad_value" and error.line == 4 and "U+D800" in error.message
    # Outside any block it is ordinary chat, and a paired character is fine.
    assert parse("a \udfff b").errors == []
    assert parse(text.replace("XX", "\U0001f600")).messages[0].task == "check \U0001f600 disk"



@pytest.mark.parametrize("inner", [
    "", "plain", "a\nb", "\n", "\n\n", "a\r\nb", "a\rb", "a\x0bb", "a\x0cb", "a\x1cb",
    "a\x1db", "a\x1eb", "a\x85b", "a\u2028b", "a\u2029b", "a\u200bb", "a\ud800b",
    "a\udfffb", "\ud83d\ude00", "a\tb", "a\x00b", "a\x7fb", "a\xadb", "a\u200eb",
    "→ a\nb", "a \nb ", " \n ",
])
def test_only_lf_breaks_is_printable_but_for_lf(inner: str) -> None:
    """only_lf_breaks: True exactly when every character but LF is printable, and then
    the text holds no other line break, no U+200B and no lone surrogate (the parser skips
    looking for them); around a header's arrow and other text too."""
    for text in (inner, f"```\n[REQUEST → @B]\n{inner}\n```", inner * 3):
        expected = all(c == "\n" or c.isprintable() for c in text)
        assert only_lf_breaks(text) is expected
        if expected:
            assert normalize_newlines(text) == text and ZWSP not in text
            assert lone_surrogate(text) is None

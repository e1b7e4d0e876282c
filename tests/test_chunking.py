"""adapters/chunking.py: cuts only between blocks, and a too-long block goes whole."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adapters.chunking import Part, header_line, split_message, utf16_len
from protocol import build_response, parse, render


def block(n: int, size: int) -> str:
    return render(
        build_response(sender="A", to="B", request_id=f"a-{n}", status="success", result="z" * size)
    )


def test_short_text_is_one_part() -> None:
    assert split_message("hello", 10) == [Part("hello")]


def test_blocks_are_never_cut_and_a_huge_one_goes_as_a_file() -> None:
    text = "\n".join(["intro", block(1, 50), "mid", block(2, 500), "outro", block(3, 60)])
    parts = split_message(text, 200)
    assert "".join(p.block or p.text for p in parts) == text
    [huge] = [p for p in parts if p.block]
    assert huge.text == "[RESPONSE → @B]" == header_line(huge.block or "")
    assert all(len(p.text) <= 200 for p in parts)
    found = [m.request_id for p in parts for m in parse(p.block or p.text).messages]
    assert found == ["a-1", "a-2", "a-3"]
    assert not any(parse(p.block or p.text).errors for p in parts)


def test_a_long_prose_line_is_cut_at_the_limit() -> None:
    assert [p.text for p in split_message("x" * 25, 10)] == ["x" * 10, "x" * 10, "x" * 5]


def test_an_unclosed_fence_runs_to_the_end() -> None:
    text = "a\n```\n[REQUEST → @B]\nFrom: A\n" + "y\n" * 20
    parts = split_message(text, 12)
    assert parts[0].text == "a\n" and parts[1].block == text[2:]


@given(
    st.lists(
        st.one_of(st.text(alphabet="ab \n", max_size=30), st.integers(1, 80).map(str)),
        max_size=12,
    ),
    st.integers(5, 60),
)
def test_parts_join_back_to_the_text(pieces: list[str], limit: int) -> None:
    text = "\n".join(block(i, int(p)) if p.isdigit() else p for i, p in enumerate(pieces))
    parts = split_message(text, limit)
    assert "".join(p.block or p.text for p in parts) == text
    for p in parts:
        assert len(p.text) <= limit
        if p.block is not None:
            assert not parse(p.block).errors


def test_split_by_utf16_code_units_keeps_blocks_whole() -> None:
    emoji = "😀"  # two UTF-16 code units
    assert utf16_len(emoji * 3) == 6 and utf16_len("abc") == 3
    block = "```\n[RESPONSE → @Peer]\n" + "Result: " + emoji * 10 + "\n```\n"
    text = (emoji * 30 + "\n") * 2 + block + "x" * 5 + "\n"
    parts = split_message(text, 64, size=utf16_len)
    assert all(utf16_len(p.text) <= 64 for p in parts)
    assert "".join(p.block or p.text for p in parts) == text
    assert any(p.text.startswith(block) for p in parts)
    # A line longer than the limit is cut between characters, never inside one.
    [*pieces] = split_message(emoji * 50, 9, size=utf16_len)
    assert all(utf16_len(p.text) <= 9 for p in pieces) and "".join(
        p.text for p in pieces) == emoji * 50

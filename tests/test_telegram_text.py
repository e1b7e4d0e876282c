"""Telegram text both ways (adapters/telegram/text.py): entities (UTF-16 offsets) back to
fenced blocks on input, fences to escaped HTML on output; hostile offsets never raise."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from adapters.chunking import utf16_len
from adapters.telegram.text import Entity, fenced, to_html
from protocol import build_request, parse, render

BLOCK = render(build_request(sender="Peer", to="Mantis", task="a < b & c", request_id="t-1"))
BODY = BLOCK.removeprefix("```\n").removesuffix("\n```")


def units(text: str) -> int:
    return utf16_len(text)


def test_a_pre_entity_after_astral_characters_is_fenced_at_the_right_place() -> None:
    before = "look 😀🎉 here:\n"  # two characters of two UTF-16 units each
    text = before + BODY + "\nthanks"
    out = fenced(text, [Entity("bold", 0, 4), Entity("pre", units(before), units(BODY))])
    assert out == before + BLOCK + "\nthanks"
    assert [m.request_id for m in parse(out).messages] == ["t-1"]


def test_fences_go_on_lines_of_their_own_and_inline_code_stays_inline() -> None:
    text = "see" + BODY + "end `x`"
    out = fenced(text, [Entity("pre", 3, units(BODY)), Entity("code", 3 + units(BODY) + 5, 1)])
    assert out == "see\n" + BLOCK + "\nend `x`"
    multi = "a\nb"
    assert fenced(multi, [Entity("code", 0, 3)]) == "```\na\nb\n```"


def test_text_already_fenced_is_left_alone() -> None:
    assert fenced(BLOCK, [Entity("pre", 0, units(BLOCK))]) == BLOCK
    assert fenced(BLOCK, []) == BLOCK


@given(st.text(st.characters(blacklist_characters="`"), max_size=60),
       st.lists(st.tuples(st.sampled_from(["pre", "code", "bold"]),
                          st.integers(-5, 80), st.integers(-5, 80)), max_size=6))
def test_hostile_entities_never_raise_and_keep_the_text(
        text: str, raw: list[tuple[str, int, int]]) -> None:
    out = fenced(text, [Entity(*e) for e in raw])

    def bare(t: str) -> bytes:  # a hostile offset may split a surrogate pair: compare units
        return t.replace("```", "").replace("\n", "").encode("utf-16-le", "surrogatepass")

    assert bare(out) == bare(text)


def test_lone_surrogates_from_hostile_json_are_kept() -> None:
    text = "x\ud800y\n" + BODY
    out = fenced(text, [Entity("pre", 4, units(BODY))])
    assert out == "x\ud800y\n" + BLOCK


def test_html_escapes_everything_and_puts_blocks_in_pre() -> None:
    html = to_html("a <b> & c\n" + BLOCK + "\nbye")
    assert html == ("a &lt;b&gt; &amp; c\n<pre>" + BODY.replace("&", "&amp;").replace("<", "&lt;")
                    .replace(">", "&gt;") + "</pre>\nbye")


def test_an_unterminated_fence_is_sent_as_text_not_as_a_closed_block() -> None:
    assert to_html("```\n[REQUEST → @X]\nFrom: @Y") == "```\n[REQUEST → @X]\nFrom: @Y"

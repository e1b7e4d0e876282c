"""Slack's stored text back to what was written, escaping on output, and command results
as Block Kit within Slack's limits."""

from __future__ import annotations

import pytest

from adapters.base import CommandResult
from adapters.slack.render import BLOCKS_MAX, FIELDS_PER_SECTION, HEADER_MAX, blocks, mrkdwn
from adapters.slack.text import escape, read_fences, to_plain, unescape, user_ids
from protocol import build_request, parse, render


@pytest.mark.parametrize(("stored", "written"), [
    ("a &gt; b &amp;&amp; c &lt; d", "a > b && c < d"),
    ("&amp;lt; stays as typed", "&lt; stays as typed"),
    ("ask <@U0LOT>", "ask @Lotbot"),
    ("ask <@U0NEW>", "ask @U0NEW"),
    ("ask <@U0X|xavier>", "ask @xavier"),
    ("in <#C0GEN|general> and <#C0OTHER>", "in #general and #C0OTHER"),
    ("see <https://x.example/a?b=1&amp;c=2>", "see https://x.example/a?b=1&c=2"),
    ("see <https://x.example|the docs>", "see the docs"),
    ("mail <mailto:a@b.example|a@b.example>", "mail a@b.example"),
    ("<!here> and <!channel>", "@here and @channel"),
    ("<!subteam^S0ABC|@oncall> please", "@oncall please"),
    ("typed a&lt;b and c&gt;d", "typed a<b and c>d"),
])
def test_stored_text_reads_as_written(stored: str, written: str) -> None:
    assert to_plain(stored, {"U0LOT": "Lotbot"}) == written


def test_mentions_to_look_up_are_the_unlabelled_ones() -> None:
    assert user_ids("<@U1> <@U2|two> <#C1> <@U1>") == {"U1"}


def test_fences_glued_to_their_lines_are_read() -> None:
    block = render(build_request(sender="Peer", to="Mantis", task="x", request_id="r-1"))
    inner = block.removeprefix("```\n").removesuffix("\n```")
    for glued in (f"```{inner}```", f"```{inner}\n```", f"```\n{inner}```"):
        assert [render(m) for m in parse(read_fences(glued)).messages] == [block], glued
    # A language tag and longer fences stay as they are.
    assert read_fences("```python\ncode\n```") == "```python\ncode\n```"
    assert read_fences("````\nx\n````") == "````\nx\n````"
    assert read_fences("plain ``` inline ``` text") == "plain ``` inline ``` text"


def test_escape_and_unescape_round_trip() -> None:
    text = "a < b > c & d &lt; e"
    assert escape(text) == "a &lt; b &gt; c &amp; d &amp;lt; e"
    assert unescape(escape(text)) == text
    assert to_plain(escape(text)) == text


def test_block_kit_stays_within_slacks_limits() -> None:
    result = CommandResult(
        title="t" * 500,
        fields=tuple((f"f{i}", "v & <x>" * 10) for i in range(700)),
        columns=("id", "status"),
        rows=tuple((f"r-{i}", "open") for i in range(2000)),
        footer="done <ok>",
        ok=False,
    )
    out = blocks(result)
    assert len(out) <= BLOCKS_MAX
    assert out[0]["type"] == "header" and len(out[0]["text"]["text"]) <= HEADER_MAX
    sections = [b for b in out if b["type"] == "section"]
    assert all(len(b.get("fields", [])) <= FIELDS_PER_SECTION for b in sections)
    assert all(len(f["text"]) <= 2000 for b in sections for f in b.get("fields", []))
    grid = [b for b in sections if "text" in b]
    assert grid and len(grid[0]["text"]["text"]) <= 3000 and "r-0" in grid[0]["text"]["text"]
    footer = out[-1]
    assert footer["type"] == "context" and "more fields not shown" in footer["elements"][0][
        "text"]
    assert "&lt;x&gt;" in sections[0]["fields"][0]["text"]  # escaped inside Block Kit


def test_text_answers_are_unescaped_mrkdwn() -> None:
    text = mrkdwn(CommandResult(title="status", fields=(("open", "a<b"),), footer="ok"))
    assert text.startswith("*status*") and "*open:* a<b" in text and text.endswith("_ok_")

"""Operator commands: each one's output, permissions, and the text-command path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adapters.base import OutboundKind
from gateway.commands import parse_command
from protocol import build_request, render, reply_clarify

from gwkit import make_config, memory, running, sent_to


@pytest.fixture
def cfg_args(redis_url: str, namespace: str, tmp_path: Path) -> tuple[str, str, Path]:
    return redis_url, namespace, tmp_path


def test_parse_command() -> None:
    assert parse_command("/protocol status", "/protocol") == ("status", ())
    assert parse_command("  /protocol SHOW abc-1 ", "/protocol") == ("show", ("abc-1",))
    assert parse_command("/protocol", "/protocol") == ("help", ())
    assert parse_command("/protocolx status", "/protocol") is None
    assert parse_command("hello /protocol status", "/protocol") is None


async def _two_conversations(gw) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    chat, side = memory(gw, "chat"), memory(gw, "side")
    first = build_request(sender="Lotbot", to="Mantis", task="check disk")
    second = build_request(sender="Lotbot", to="SecurityBot", task="audit logins")
    await chat.inject(render(first), author_id="u-lot")
    # Creation times are kept to the millisecond: keep "oldest first" unambiguous.
    await asyncio.sleep(0.01)
    await chat.inject(render(second), author_id="u-lot")
    clar = reply_clarify(first, sender="Mantis", question="which host?")
    await side.inject(render(clar), author_id="u-mantis", channel="mantis-room")
    return first.request_id, second.request_id


async def test_status_counts_oldest_load_transports_and_sweeps(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        first, second = await _two_conversations(gw)
        result = await memory(gw, "chat").command("status", author_id="anyone")
        assert result.ok
        fields = dict(result.fields)
        assert "open: 1" in fields["by status"] and "clarifying: 1" in fields["by status"]
        assert "@Lotbot: 1" in fields["open load per agent"]  # owes the CLARIFY answer
        assert "@SecurityBot: 1" in fields["open load per agent"]
        assert fields["violations (last hour)"] == "none"
        assert "chat: up" in fields["transports"] and "side: up" in fields["transports"]
        assert "last sweep" in fields
        assert [row[0] for row in result.rows] == [first, second]  # oldest first
        assert result.rows[0][4] == "@Lotbot" and result.rows[1][4] == "@SecurityBot"


async def test_an_argument_that_is_not_valid_unicode_is_refused(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        for name in ("status", "show", "list"):
            result = await memory(gw, "chat").command(name, "@a\ud800", author_id="x")
            assert not result.ok and result.title == f"/protocol {name}: bad argument"
            assert "U+D800" in dict(result.fields)["why"]


async def test_status_for_one_agent(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        _, second = await _two_conversations(gw)
        result = await memory(gw, "chat").command("status", "@SecurityBot", author_id="x")
        assert result.ok and "SecurityBot" in result.title
        assert [row[0] for row in result.rows] == [second]
        assert dict(result.fields)["agent"] == "@SecurityBot owes 1 reply"


async def test_show_has_the_whole_history(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        first, _ = await _two_conversations(gw)
        result = await memory(gw, "chat").command("show", first, author_id="x")
        assert result.ok and first in result.title and "clarifying" in result.title
        assert [row[1] for row in result.rows] == ["REQUEST", "CLARIFY"]
        assert [row[6] for row in result.rows] == ["chat", "side"]  # across transports
        assert dict(result.fields)["owes reply"] == "@Lotbot"
        missing = await memory(gw, "chat").command("show", "nope-1", author_id="x")
        assert not missing.ok
        usage = await memory(gw, "chat").command("show", author_id="x")
        assert not usage.ok and "usage" in usage.title


async def test_list_filters_by_status_and_agent(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        first, second = await _two_conversations(gw)
        chat = memory(gw, "chat")
        everything = await chat.command("list", author_id="x")
        assert {row[0] for row in everything.rows} == {first, second}
        clarifying = await chat.command("list", "clarifying", author_id="x")
        assert [row[0] for row in clarifying.rows] == [first]
        sec = await chat.command("list", "@SecurityBot", author_id="x")
        assert [row[0] for row in sec.rows] == [second]
        # Any party: the requester finds both; a finished one is listed by default.
        await chat.command("cancel", second, author_id="op")
        lot = await chat.command("list", "Lotbot", author_id="x")
        assert [row[0] for row in lot.rows] == [second, first]  # newest first
        assert lot.footer == "2 shown (at most 25), newest first"
        assert [r[0] for r in (await chat.command("list", author_id="x")).rows] == [first, second]
        # `all` is the status filter, never an agent called @all; either order works.
        every = await chat.command("list", "all", author_id="x")
        assert [row[0] for row in every.rows] == [first, second] and every.title.endswith("(all)")
        done = await chat.command("list", "@SecurityBot", "finished", author_id="x")
        assert [row[0] for row in done.rows] == [second]
        assert (await chat.command("list", "active", "Mantis", author_id="x")).rows[0][0] == first
        for bad in (("done", "open"), ("Lotbot", "Mantis"), ("all", "@")):
            refused = await chat.command("list", *bad, author_id="x")
            assert not refused.ok and refused.title.startswith("usage"), bad
        # A word that is no status is an agent; an empty answer points at the likely typo.
        typo = await chat.command("list", "opne", author_id="x")
        assert typo.ok and typo.rows == () and typo.title == "conversations (all, @opne)"
        assert "did you mean the status open?" in typo.footer


async def test_agents_lists_declared_and_learned(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        await chat.inject(
            render(build_request(sender="Newbie", to="Mantis", task="hi")), author_id="u-new"
        )
        result = await chat.command("agents", author_id="x")
        rows = {row[0]: row for row in result.rows}
        assert rows["@Lotbot"][1] == "declared" and rows["@Lotbot"][2] == "chat:main"
        # Learned names show as their agent wrote them.
        assert rows["@Newbie"][1] == "learned" and rows["@Newbie"][3] == "chat:u-new"


async def test_help_unknown_and_read_permissions(cfg_args, redis_client) -> None:
    config = make_config(*cfg_args, permissions={"read": ["chat:u-lot"], "operators": ["chat:op"]})
    async with running(config) as gw:
        chat = memory(gw, "chat")
        helped = await chat.command("help", author_id="u-lot")
        assert helped.ok and any(row[0].startswith("cancel") for row in helped.rows)
        unknown = await chat.command("frobnicate", author_id="u-lot")
        assert not unknown.ok and "unknown" in unknown.title
        denied = await chat.command("status", author_id="stranger")
        assert not denied.ok and "permission" in denied.title
        operator = await chat.command("status", author_id="op")
        assert operator.ok


async def test_role_based_operator(cfg_args, redis_client) -> None:
    config = make_config(*cfg_args, permissions={"operators": ["role:chat:Ops"]})
    async with running(config) as gw:
        chat = memory(gw, "chat")
        req = build_request(sender="Lotbot", to="Mantis", task="x")
        await chat.inject(render(req), author_id="u-lot")
        refused = await chat.command("cancel", req.request_id, author_id="someone")
        assert not refused.ok
        ok = await chat.command("cancel", req.request_id, author_id="someone", roles=("Ops",))
        assert ok.ok


async def test_text_command_is_answered_in_the_same_thread(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        d = await chat.inject("/protocol status", author_id="human", is_bot=False, thread="t1")
        assert d.outcome == "command"
        answers = sent_to(chat, "main", OutboundKind.NOTICE)
        assert len(answers) == 1 and answers[0].address.thread == "t1"
        assert answers[0].text.startswith("bot-protocol status")

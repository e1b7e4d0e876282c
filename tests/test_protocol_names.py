"""Agent names: invisible characters refused, one canonical key, lookalikes share a skeleton."""

from __future__ import annotations

import pytest

from protocol import parse
from protocol.names import check_name, invalid_name_reason, name_key, skeleton

INVISIBLE = [
    "Mant\u200bis",  # zero-width space
    "Mantis\xad",  # soft hyphen
    "\u202eMantis",  # right-to-left override
    "Man\u200dtis",  # zero-width joiner
    "Mantis\u2060",  # word joiner
    "\ufeffMantis",  # BOM
    "Man\u034ftis",  # combining grapheme joiner
    "Man\u3164tis",  # Hangul filler
    "Mantis\ufe0f",  # variation selector
    "Man\x07tis",  # control
    "Man\u2028tis",  # line separator
    "Man tis",
]


@pytest.mark.parametrize("name", INVISIBLE)
def test_invisible_and_control_characters_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="may not contain"):
        check_name(name)
    assert invalid_name_reason(name) is not None


@pytest.mark.parametrize("name", INVISIBLE[:4])
def test_a_block_with_an_invisible_sender_or_recipient_is_malformed(name: str) -> None:
    block = f"```\n[REQUEST → @{name}]\nFrom: lotbot\nRequestId: lotbot-1\nTask: t\n```"
    result = parse(block)
    assert result.messages == [] and result.errors[0].code == "bad_header"
    block = f"```\n[REQUEST → @Mantis]\nFrom: {name}\nRequestId: lotbot-1\nTask: t\n```"
    assert parse(block).messages == []


@pytest.mark.parametrize(
    "name", ["智能体A", "翻译助手", "Ünïcødé", "Device-ABC123/智能体A", "a```b"]
)
def test_non_latin_names_keep_working(name: str) -> None:
    assert check_name(name) == name


def test_one_key_whatever_the_spelling() -> None:
    assert name_key("Mantis") == name_key("mantis") == name_key("ｍａｎｔｉｓ") == "mantis"
    assert name_key("Straße") == name_key("STRASSE")
    assert name_key("智能体A") == "智能体a"
    assert name_key("Mantis") != name_key("Маntis")  # another name, but a lookalike:


@pytest.mark.parametrize(
    "lookalike", ["Маntis", "Μantis", "MANTIS", "rnantis", "Mant1s", "ｍａｎｔｉｓ"]
)
def test_lookalikes_share_the_skeleton(lookalike: str) -> None:
    assert skeleton(lookalike) == skeleton("Mantis")


@pytest.mark.parametrize("other", ["Mantas", "Manti5", "翻译", "Lotbot", "Mantis2"])
def test_different_names_have_different_skeletons(other: str) -> None:
    assert skeleton(other) != skeleton("Mantis")

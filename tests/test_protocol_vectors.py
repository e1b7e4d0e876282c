"""Test vectors in the deployed v0.1 format: tests/vectors/NAME.txt -> NAME.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol import exit_status, parse, render, result_to_dict

VECTORS = Path(__file__).parent / "vectors"
CASES = sorted(VECTORS.glob("*.txt"))


def test_vectors_exist() -> None:
    assert len(CASES) >= 8
    assert all(case.with_suffix(".json").exists() for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_vector(case: Path) -> None:
    expected = json.loads(case.with_suffix(".json").read_text(encoding="utf-8"))
    result = parse(case.read_bytes())
    got = result_to_dict(result)
    got["exit"] = exit_status(result)
    assert got == expected
    # Every parsed message survives our own rendering unchanged.
    for msg in result.messages:
        assert parse(render(msg)).messages == [msg]


def test_crlf_vector_really_has_crlf() -> None:
    assert b"\r\n" in (VECTORS / "07_crlf_request.txt").read_bytes()

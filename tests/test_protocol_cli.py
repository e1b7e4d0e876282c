"""`bpgw parse/build/keygen/sign/verify` run as a real subprocess (section 6 contract)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from cli_kit import bpgw

VECTORS = Path(__file__).parent / "vectors"


def test_parse_json_exit_0_from_stdin_and_file() -> None:
    text = (VECTORS / "01_spec_request.txt").read_text(encoding="utf-8")
    expected = json.loads((VECTORS / "01_spec_request.json").read_text(encoding="utf-8"))
    del expected["exit"]
    for args, stdin in (
        (["parse", "--json"], text),
        (["parse", "-", "--json"], text),
        (["parse", str(VECTORS / "01_spec_request.txt"), "--json"], ""),
    ):
        proc = bpgw(*args, stdin=stdin)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == expected


def test_parse_exit_1_without_block() -> None:
    proc = bpgw("parse", "--json", stdin="hello, no protocol here\n```\ncode\n```\n")
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"messages": [], "errors": []}
    assert "no protocol block" in bpgw("parse", stdin="hi").stdout


def test_parse_exit_2_on_errors_with_details() -> None:
    proc = bpgw("parse", "--json", str(VECTORS / "06_errors.txt"))
    assert proc.returncode == 2
    codes = [error["code"] for error in json.loads(proc.stdout)["errors"]]
    assert codes == [
        "bad_depth",
        "duplicate_field",
        "unknown_type",
        "bad_value",
        "bad_value",
        "unterminated_block",
    ]
    human = bpgw("parse", str(VECTORS / "06_errors.txt"))
    assert human.returncode == 2
    assert "bad_depth (block 1, line 5, field depth)" in human.stderr and "hint:" in human.stderr


def test_parse_max_block_bytes_and_missing_file() -> None:
    text = (VECTORS / "01_spec_request.txt").read_text(encoding="utf-8")
    proc = bpgw("parse", "--json", "--max-block-bytes", "20", stdin=text)
    assert proc.returncode == 2 and json.loads(proc.stdout)["errors"][0]["code"] == "too_large"
    proc = bpgw("parse", "does-not-exist.txt")
    assert proc.returncode == 2 and "can not read does-not-exist.txt" in proc.stderr


def test_build_then_parse() -> None:
    proc = bpgw(
        "build",
        "request",
        "--from",
        "Lotbot",
        "--to",
        "@Mantis",
        "--task",
        "check\nDepth: 9/9",
        "--priority",
        "high",
        "--depth",
        "2/5",
        "--request-id",
        "lotbot-1",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("```\n[REQUEST → @Mantis]\n")
    (msg,) = json.loads(bpgw("parse", "--json", stdin=proc.stdout).stdout)["messages"]
    assert (msg["task"], msg["priority"], msg["depth"], msg["request_id"]) == (
        "check\nDepth: 9/9",
        "high",
        {"current": 2, "max": 5},
        "lotbot-1",
    )
    proc = bpgw("build", "BROADCAST", "--from", "a", "--message", "hi", "--subject", "s")
    assert "[BROADCAST → @all]" in proc.stdout and proc.returncode == 0


def test_build_errors_exit_2() -> None:
    proc = bpgw("build", "REQUEST", "--from", "a", "--to", "b", "--task", "t", "--depth", "5/5")
    assert proc.returncode == 2 and "only a RESPONSE" in proc.stderr and proc.stdout == ""
    proc = bpgw("build", "RESPONSE", "--from", "a", "--to", "b", "--request-id", "r")
    assert proc.returncode == 2 and "Status or a Result" in proc.stderr


def test_keygen_sign_verify(tmp_path: Path) -> None:
    proc = bpgw("keygen", "lot", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    key, pub = tmp_path / "lot.key", tmp_path / "lot.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and pub.exists()
    assert bpgw("keygen", "lot", "--dir", str(tmp_path)).returncode == 2  # no silent overwrite

    text = (VECTORS / "05_two_blocks_clarify_handoff.txt").read_text(encoding="utf-8")
    signed = bpgw("sign", "--key", str(key), "--key-id", "lot-1", stdin=text)
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.count("Signature: ed25519:") == 2 and "KeyId: lot-1" in signed.stdout

    ok = bpgw("verify", "--pubkey", str(pub), stdin=signed.stdout.replace("\n", "\r\n"))
    assert ok.returncode == 0 and ok.stdout.count(": ok:") == 2

    tampered = bpgw(
        "verify", "--pubkey", str(pub), stdin=signed.stdout.replace("sda or sdb", "sdc")
    )
    assert tampered.returncode == 2
    assert "message 1: FAILED" in tampered.stdout and "message 2: ok" in tampered.stdout

    unsigned = bpgw("verify", "--pubkey", str(pub), stdin=text)
    assert unsigned.returncode == 2 and "not signed" in unsigned.stdout
    assert bpgw("sign", "--key", str(tmp_path / "missing.key"), stdin=text).returncode == 2

"""`bpgw parse/build/keygen/sign/verify` run as a real subprocess (section 6 contract)."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import stat
from pathlib import Path
from typing import Any

import pytest
from cli_kit import bpgw

from gateway import cli
from gateway.cli import main
from protocol import build_broadcast, load_private_key, message_to_dict, parse, render, sign

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
    assert proc.returncode == 2 and "needs --status or --result" in proc.stderr


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``bpgw ARGS`` in this process (messages and help; the subprocess tests above and
    below cover the real command)."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_build_names_missing_and_stray_options(capsys: pytest.CaptureFixture[str]) -> None:
    proc = bpgw("build", "REQUEST", "--from", "Lotbot")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "bpgw build REQUEST: --to and --task are required for a REQUEST\n"
    cases = {
        ("RESPONSE", "--from", "Mantis", "--to", "Lotbot", "--status", "done"):
            "bpgw build RESPONSE: --request-id is required for a RESPONSE (the RequestId",
        ("CLARIFY", "--from", "M", "--to", "L", "--request-id", "r"):
            "bpgw build CLARIFY: --question is required for a CLARIFY",
        ("REQUEST", "--from", "a", "--to", "b", "--task", "t", "--question", "q"):
            "bpgw build REQUEST: --question does not apply to a REQUEST (it takes --to, --task",
    }
    for args, message in cases.items():
        code, out, err = _in_process(capsys, "build", *args)
        assert code == 2 and out == "", args
        assert err.startswith(message) and err.count("\n") == 1, err


def _options_without_help(help_text: str) -> list[str]:
    """Option and argument lines of argparse help that carry no text: an entry's help
    follows on its line after two spaces, or on the next, deeper indented line."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        entry = re.fullmatch(r"  ([-a-z][^ ]*(?: [^ ]+)*?)(  +\S.*)?", line)
        if entry is None or entry.group(1).startswith("-h"):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if entry.group(2) is None and not following.startswith(" " * 8):
            bare.append(entry.group(1))
    return bare


def test_every_build_reply_keygen_status_option_has_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("build", "reply", "keygen", "status", "show", "sweep", "verify", "run",
                    "outbox", "identity list", "identity purge"):
        code, text, _ = _in_process(capsys, *command.split(), "--help")
        assert code == 0 and "--" in text and _options_without_help(text) == [], (command, text)
    assert _options_without_help("  --json\n  --limit N   how many\n") == ["--json"]


REQUEST_TEXT = """Mantis, please:
```
[REQUEST → @Mantis]
From: Lotbot
RequestId: lotbot-42
Task: check disk
Depth: 2/6
TraceId: trace-7
```
"""


def _parsed(text: str) -> dict[str, Any]:
    (msg,) = parse(text).messages
    return message_to_dict(msg)


def test_reply_builds_the_reply_to_a_parsed_message(tmp_path: Path) -> None:
    source = tmp_path / "request.txt"
    source.write_text(REQUEST_TEXT, encoding="utf-8")
    done = bpgw("reply", str(source), "--status", "done", "--result", "sda at 91%")
    assert done.returncode == 0, done.stderr
    reply = _parsed(done.stdout)
    assert {k: reply[k] for k in ("type", "from", "to", "request_id", "trace_id", "depth",
                                  "status", "result")} == {
        "type": "RESPONSE", "from": "Mantis", "to": "Lotbot", "request_id": "lotbot-42",
        "trace_id": "trace-7", "depth": {"current": 3, "max": 6}, "status": "done",
        "result": "sda at 91%"}
    # From standard input: a CLARIFY, its answer (a Result, no Status), then the final
    # RESPONSE back to the requester.
    clarify = bpgw("reply", "-", "--question", "which host?", stdin=REQUEST_TEXT)
    asked = _parsed(clarify.stdout)
    assert (asked["type"], asked["from"], asked["to"], asked["depth"]["current"]) == (
        "CLARIFY", "Mantis", "Lotbot", 3)
    answer = bpgw("reply", "--result", "build-01", stdin=clarify.stdout)
    answered = _parsed(answer.stdout)
    assert (answered["type"], answered["from"], answered["to"], answered["result"]) == (
        "RESPONSE", "Lotbot", "Mantis", "build-01")
    assert "status" not in answered and answered["depth"]["current"] == 4
    final = _parsed(bpgw("reply", "--status", "done", stdin=answer.stdout).stdout)
    assert (final["from"], final["to"], final["depth"]["current"]) == ("Mantis", "Lotbot", 5)


def test_reply_handoff_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def file(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    request = file("request.txt", REQUEST_TEXT)
    code, out, _ = _in_process(capsys, "reply", request, "--handoff-to", "SecurityBot",
                               "--task", "check it")
    handoff = _parsed(out)
    assert code == 0 and (handoff["type"], handoff["from"], handoff["to"]) == (
        "HANDOFF", "Mantis", "SecurityBot")
    assert (handoff["request_id"], handoff["depth"]["current"]) == ("lotbot-42", 3)
    _, done, _ = _in_process(capsys, "reply", request, "--status", "done")
    broadcast = build_broadcast(sender="ops", message="maintenance")
    two = REQUEST_TEXT + REQUEST_TEXT.replace("lotbot-42", "lotbot-43")
    cases = [
        (file("done.txt", done), ("--status", "done"), "ended conversation lotbot-42"),
        (request, ("--result", "x", "--question", "y"), "make different replies"),
        (request, (), "say what the reply is"),
        (request, ("--handoff-to", "X"), "--task is required with --handoff-to"),
        (file("chat.txt", "no block here"), ("--status", "done"), "no protocol message"),
        (file("b.txt", render(broadcast)), ("--status", "done"), "a BROADCAST takes no reply"),
        (file("two.txt", two), ("--status", "done"), "choose one with --block N"),
    ]
    for path, args, message in cases:
        code, out, err = _in_process(capsys, "reply", path, *args)
        assert code == 2 and message in err and out == "", (args, err)
    code, out, _ = _in_process(capsys, "reply", str(tmp_path / "two.txt"), "--status", "done",
                               "--block", "2")
    assert code == 0 and _parsed(out)["request_id"] == "lotbot-43"


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
    assert unsigned.returncode == 2 and "not signed (no Signature field)" in unsigned.stdout
    assert bpgw("sign", "--key", str(tmp_path / "missing.key"), stdin=text).returncode == 2


def test_verify_says_why_a_block_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    for name in ("Mantis", "Lotbot"):
        assert _in_process(capsys, "keygen", name, "--dir", str(keys))[0] == 0
    (tmp_path / "Mantis.key").write_bytes((keys / "Mantis.key").read_bytes())
    (keys / "Mantis.key").unlink()
    (keys / "Lotbot.key").unlink()
    text = (VECTORS / "05_two_blocks_clarify_handoff.txt").read_text(encoding="utf-8")
    signed = tmp_path / "signed.txt"
    code, out, _ = _in_process(capsys, "sign", "--key", str(tmp_path / "Mantis.key"),
                               str(VECTORS / "05_two_blocks_clarify_handoff.txt"))
    signed.write_text(out, encoding="utf-8")
    (first, second) = parse(out).messages
    changed = render(first.model_copy(update={"question": "sdc?"})) + "\n" + render(second)
    (tmp_path / "changed.txt").write_text(changed, encoding="utf-8")
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    other = render(sign(second.model_copy(update={"sender": "Nobody"}),
                        load_private_key((tmp_path / "Mantis.key").read_bytes())))
    (tmp_path / "nobody.txt").write_text(other, encoding="utf-8")
    cases = [
        ("changed.txt", ("--keys", str(keys)),
         ["message 1: FAILED: CLARIFY lotbot-8f2d4e from Mantis", "the text changed after it "
          "was signed (KeyId", "message 2: ok"]),
        ("signed.txt", ("--pubkey", str(keys / "Lotbot.pub")),
         ["message 1: FAILED", "wrong key: signed with key"]),
        ("plain.txt", ("--keys", str(keys)), ["FAILED", "not signed (no Signature field)"]),
        ("nobody.txt", ("--keys", str(keys)),
         ["FAILED: HANDOFF lotbot-8f2d4e from Nobody", "unknown agent Nobody"]),
    ]
    for name, args, wanted in cases:
        code, out, _ = _in_process(capsys, "verify", str(tmp_path / name), *args)
        assert code == 2 and all(w in out for w in wanted), (name, out)
    # A Mantis block signed with Lotbot's key: the folder names whose key it was.
    lot_key = tmp_path / "Lotbot.key"
    assert _in_process(capsys, "keygen", "Lotbot", "--dir", str(tmp_path))[0] == 0
    (keys / "Lotbot.pub").write_bytes((tmp_path / "Lotbot.pub").read_bytes())
    code, out, _ = _in_process(capsys, "sign", "--key", str(lot_key), "--key-id", "k1",
                               str(VECTORS / "05_two_blocks_clarify_handoff.txt"))
    (tmp_path / "by-lotbot.txt").write_text(out, encoding="utf-8")
    code, out, _ = _in_process(capsys, "verify", str(tmp_path / "by-lotbot.txt"),
                               "--keys", str(keys))
    assert code == 2 and "wrong key: signed with the key in Lotbot.pub, not Mantis's" in out
    code, out, _ = _in_process(capsys, "verify", str(signed), "--keys", str(keys))
    assert code == 0 and out.count(": ok:") == 2
    huge = tmp_path / "huge.pub"
    huge.write_bytes(b"A" * 100_000)
    code, out, err = _in_process(capsys, "verify", str(signed), "--pubkey", str(huge))
    assert code == 2 and out == "" and "not a key file" in err


def test_each_command_is_registered_by_the_module_main_imports_for_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = Path(cli.__file__).parent
    assert {path.stem for path in folder.glob("*_cmds.py")} == set(cli.MODULES)
    registered = {}
    for name in cli.MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"gateway.cli.{name}").register(sub)
        registered.update(dict.fromkeys(sub.choices, name))
    assert registered == cli.COMMAND_MODULES
    code, out, _ = _in_process(capsys, "--help")
    assert code == 0 and all(command in out for command in registered)

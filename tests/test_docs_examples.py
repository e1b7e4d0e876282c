"""The examples in the docs run as written (issue 8 item 5).

Fenced blocks marked ```` ```sh example ```` are run, in document order, in one bash
session (shell variables carry over, as when a reader pastes them into one terminal),
with ``bpgw`` on the PATH running this checkout. A ```` ```json output ```` block right
after an example is what that example prints, compared as JSON: dicts have the same
keys, lists the same length, and every value is equal except that a documented string
containing ``…`` matches any string starting with the part before it (``"…"`` matches
any string) and a documented float matches any number (times). A ```` ```text output ````
block (fenced with four backticks when it holds a protocol block) must equal the
printed text, surrounding blank lines aside. docs/http-api.md runs
against a real ``bpgw run`` process, configured by its ```` ```toml config ```` block, on
the session's Redis; README.md's quick examples run in an empty folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gwkit import healthy
from servers import free_port

ROOT = Path(__file__).resolve().parent.parent
DOC_URL = "http://127.0.0.1:8780"  # what the docs use; replaced by the test gateway's URL
WILDCARD = "…"
_FENCE = re.compile(r"^(`{3,})(.*)$")
_MARKER = "@@bpgw-docs-example {}@@"


def fenced_blocks(path: Path) -> list[tuple[str, str]]:
    """(info string, content) of every fenced block of a Markdown file, in order.

    A block closes at a line of only backticks, at least as many as opened it, so a
    four-backtick fence can hold a protocol block's three-backtick fences.
    """
    blocks: list[tuple[str, str]] = []
    info: str | None = None
    opening = ""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = _FENCE.match(line)
        if info is None:
            if fence:
                opening, info, lines = fence.group(1), fence.group(2).strip(), []
        elif fence and not fence.group(2).strip() and len(fence.group(1)) >= len(opening):
            blocks.append((info, "\n".join(lines)))
            info = None
        else:
            lines.append(line)
    assert info is None, f"{path}: a fenced block is never closed"
    return blocks


class Text(str):
    """A documented ``text output``: compared as text, not as JSON."""


def examples(path: Path) -> list[tuple[str, Any]]:
    """Each ``sh example`` block with what the output block after it documents: parsed
    JSON (``json output``), ``Text`` (``text output``) or None (no output block)."""
    blocks = fenced_blocks(path)
    found: list[tuple[str, Any]] = []
    for i, (info, text) in enumerate(blocks):
        if info in ("json output", "text output"):
            assert i and blocks[i - 1][0] == "sh example", f"{path}: output of no example"
        if info != "sh example":
            continue
        kind, shown = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
        documented: Any = None
        if kind == "json output":
            documented = json.loads(shown)
        elif kind == "text output":
            documented = Text(shown)
        found.append((text, documented))
    return found


def mismatches(documented: Any, actual: Any, where: str = "$") -> list[str]:
    """Where ``actual`` differs from the ``documented`` JSON (rules in the module doc)."""
    if isinstance(documented, dict):
        if not isinstance(actual, dict):
            return [f"{where}: documented an object, got {actual!r}"]
        if set(documented) != set(actual):
            return [f"{where}: documented keys {sorted(documented)}, got {sorted(actual)}"]
        return [m for k in documented for m in mismatches(documented[k], actual[k], f"{where}.{k}")]
    if isinstance(documented, list):
        if not isinstance(actual, list) or len(actual) != len(documented):
            return [f"{where}: documented {len(documented)} items, got {actual!r}"]
        return [
            m
            for i, (d, a) in enumerate(zip(documented, actual, strict=True))
            for m in mismatches(d, a, f"{where}[{i}]")
        ]
    if isinstance(documented, str) and WILDCARD in documented:
        prefix = documented.split(WILDCARD, 1)[0]
        ok = isinstance(actual, str) and actual.startswith(prefix)
        return [] if ok else [f"{where}: documented {documented!r}, got {actual!r}"]
    if isinstance(documented, float):
        ok = isinstance(actual, int | float) and not isinstance(actual, bool)
        return [] if ok else [f"{where}: documented a number, got {actual!r}"]
    return [] if documented == actual else [f"{where}: documented {documented!r}, got {actual!r}"]


def _bpgw_on_path(folder: Path) -> dict[str, str]:
    """An environment whose ``bpgw`` runs this checkout, without the caller's BPGW_* vars."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "bpgw"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gateway.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    return env


def run_examples(
    found: list[tuple[str, Any]], folder: Path, env: dict[str, str], url: str = DOC_URL
) -> list[str]:
    """Run the examples in one bash session; each one's output, in order."""
    script = ["set -eo pipefail"]
    for i, (text, _) in enumerate(found):
        script += [f"echo; echo '{_MARKER.format(i)}'", text.replace(DOC_URL, url)]
    script.append(f"echo; echo '{_MARKER.format('end')}'")
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0 and _MARKER.format("end") in out, (
        f"an example failed (exit {done.returncode}):\n{out[-3000:]}\n{done.stderr[-3000:]}"
    )
    parts = out.split("\n" + _MARKER.format(0) + "\n", 1)[1]
    outputs = []
    for i in range(1, len(found) + 1):
        mark = _MARKER.format(i if i < len(found) else "end")
        text, parts = parts.split("\n" + mark + "\n", 1)
        outputs.append(text)
    return outputs


def check_outputs(found: list[tuple[str, Any]], outputs: list[str]) -> None:
    """Every documented output matches what its example printed."""
    for (text, documented), printed in zip(found, outputs, strict=True):
        if documented is None:
            continue
        if isinstance(documented, Text):
            assert printed.strip("\n") == documented.strip("\n"), (
                f"example:\n{text}\nprinted:\n{printed}\ndocumented:\n{documented}"
            )
            continue
        try:
            actual = json.loads(printed)
        except json.JSONDecodeError:
            pytest.fail(f"example printed no single JSON value:\n{text}\n---\n{printed}")
        problems = mismatches(documented, actual)
        assert not problems, f"example:\n{text}\nprinted:\n{printed}\n" + "\n".join(problems)


# -- the checker itself ----------------------------------------------------------------------


def test_the_comparison_rules() -> None:
    doc = {"id": "…", "text": "```\n[REQUEST…", "at": 1.5, "n": 2, "xs": [None, True]}
    good = {"id": "17-0", "text": "```\n[REQUEST → @x]", "at": 17, "n": 2, "xs": [None, True]}
    assert mismatches(doc, good) == []
    for key, bad in (("id", 3), ("text", "[RESPONSE"), ("at", "x"), ("n", 3), ("xs", [None])):
        assert mismatches(doc, {**good, key: bad}), key
    assert mismatches(doc, {**good, "extra": 1}) and mismatches(doc, [good])


def test_fenced_blocks_are_found(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        'text\n```sh example\necho \'{"a": 1}\'\n```\n\n```json output\n{"a": 1}\n```\n'
        "```sh\nnot run\n```\n```sh example\ntrue\n```\n"
        "```sh example\nprintf 'x\\n```\\n'\n```\n````text output\nx\n```\n````\n"
    )
    found = examples(page)
    assert found == [
        ("echo '{\"a\": 1}'", {"a": 1}),
        ("true", None),
        ("printf 'x\\n```\\n'", "x\n```"),
    ]
    assert isinstance(found[2][1], Text)
    outputs = run_examples(found, tmp_path, dict(os.environ))
    check_outputs(found, outputs)
    page.write_text('```sh example\necho \'{"a": 2}\'\n```\n```json output\n{"a": 1}\n```\n')
    with pytest.raises(AssertionError, match=r"\$.a: documented 1, got 2"):
        check_outputs(examples(page), run_examples(examples(page), tmp_path, dict(os.environ)))
    page.write_text("```sh example\necho y\n```\n```text output\nx\n```\n")
    with pytest.raises(AssertionError, match="documented:"):
        check_outputs(examples(page), run_examples(examples(page), tmp_path, dict(os.environ)))


# -- the docs ----------------------------------------------------------------------------------


def test_readme_quick_examples_run(tmp_path: Path) -> None:
    found = examples(ROOT / "README.md")
    assert any("bpgw build" in text for text, _ in found)
    outputs = run_examples(found, tmp_path, _bpgw_on_path(tmp_path))
    check_outputs(found, outputs)
    assert "Signature:" in "".join(outputs)


async def _start_gateway(
    config: Path, folder: Path, env: dict[str, str], port: int
) -> asyncio.subprocess.Process:
    """``bpgw run --config`` on ``port`` (its log in ``folder/gw.log``), once healthy."""
    with (folder / "gw.log").open("wb") as log:  # a file: a full pipe would block it
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "run", "--config", str(config),
            cwd=folder,
            env={**env, "BPGW_TRANSPORTS__API__PORT": str(port)},
            stdout=log,
            stderr=log,
        )
    if await healthy(f"http://127.0.0.1:{port}", proc):
        return proc
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    log_text = (folder / "gw.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"bpgw run never became healthy:\n{log_text}")


async def test_http_api_examples_run_against_a_real_gateway(
    tmp_path: Path, redis_url: str, namespace: str, redis_client: Any
) -> None:
    doc = ROOT / "docs" / "http-api.md"
    [config] = [text for info, text in fenced_blocks(doc) if info == "toml config"]
    found = examples(doc)
    # The page's own walk-through: two agents, a REQUEST and its RESPONSE, commands.
    script = "\n".join(text for text, _ in found)
    for needed in ("bpgw build REQUEST", "bpgw reply", "/v1/commands", "cancel"):
        assert needed in script, needed
    gw_toml = tmp_path / "gw.toml"
    gw_toml.write_text(
        config
        + '\n[gateway]\ndata_dir = "data"\nlog_format = "text"\n'
        + f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n',
        encoding="utf-8",
    )
    env = _bpgw_on_path(tmp_path)
    port = free_port()
    proc = await _start_gateway(gw_toml, tmp_path, env, port)
    try:
        outputs = await asyncio.to_thread(
            run_examples, found, tmp_path, env, f"http://127.0.0.1:{port}"
        )
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0, (tmp_path / "gw.log").read_text(errors="replace")[-3000:]
    check_outputs(found, outputs)

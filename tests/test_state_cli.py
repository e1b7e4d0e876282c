"""`bpgw status`, `bpgw show` and `bpgw sweep --once` against a real server."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from test_state_helpers import ORIGIN, T0, clarify, request, response, store

from gateway.cli import main
from state.store import ConversationStore

__all__ = ["store"]


def _run(capsys: pytest.CaptureFixture[str], redis_url: str, namespace: str,
         *argv: str) -> tuple[int, str]:
    code = main([*argv, "--redis-url", redis_url, "--namespace", namespace])
    return code, capsys.readouterr().out


async def test_status_show_sweep(store: ConversationStore, redis_url: str, namespace: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(clarify("r1"), ORIGIN, now=T0)
    await store.apply(request("r2", to="Heron"), ORIGIN)
    code, out = await _to_thread(capsys, redis_url, namespace, "status", "--json")
    data = json.loads(out)
    assert code == 0 and data["counts"]["clarifying"] == 1 and data["counts"]["open"] == 1
    assert data["load_by_agent"] == {"lotbot": 1, "heron": 1}
    assert [c["request_id"] for c in data["oldest_open"]] == ["r1", "r2"]
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "r1", "--json")
    shown = json.loads(out)
    assert code == 0 and [e["type"] for e in shown["history"]] == ["REQUEST", "CLARIFY"]
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "nope")
    assert code == 1 and "no conversation nope" in out
    code, out = await _to_thread(capsys, redis_url, namespace, "sweep", "--once")
    assert code == 0 and "timed out: r1 (waiting on Lotbot)" in out and "claimed 1" in out
    code, out = await _to_thread(capsys, redis_url, namespace, "status")
    assert code == 0 and "timeout 1" in out and "heron: 1" in out
    assert re.search(r"^  r2  open +opened \d+s ago  waiting on Heron, due in 2\d*m \d+s  ",
                     out, re.M), out


async def _to_thread(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    # The CLI runs its own event loop (asyncio.run), so it runs in a worker thread here.
    return await asyncio.to_thread(_run, capsys, *args)


async def test_state_commands_read_the_gateway_config(
    store: ConversationStore, redis_url: str, namespace: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await store.apply(request("cfg-1"), ORIGIN)
    config = tmp_path / "gw.toml"
    config.write_text(f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n')

    def run() -> tuple[int, str]:
        code = main(["status", "--json", "--config", str(config)])
        return code, capsys.readouterr().out

    code, out = await asyncio.to_thread(run)
    assert code == 0 and json.loads(out)["counts"]["open"] == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('[state]\nnamespace = "has spaces"\n')

    def run_bad() -> tuple[int, str]:
        code = main(["status", "--config", str(bad)])
        return code, capsys.readouterr().err

    code, err = await asyncio.to_thread(run_bad)
    assert code == 2 and "state.namespace" in err


async def test_show_a_finished_conversation_as_http_shows_it(
    store: ConversationStore, redis_url: str, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = time.time()
    await store.apply(request("fin-1"), ORIGIN, now=now - 600)
    await store.apply(response("fin-1"), ORIGIN, now=now - 300)
    await store.apply(request("fin-2"), ORIGIN, now=now - 120)
    await store.cancel("fin-2", by="admin", reason="wrong host", now=now - 60)
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "fin-1")
    fields = dict(line.split(": ", 1) for line in out.splitlines()[1:11])
    assert code == 0 and out.startswith("REQUEST fin-1: done\n")
    assert fields["owes reply"] == "-" and fields["deadline"] == "-"
    clock = r"\d\d:\d\d:\d\d( \S+)?"
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d {clock} \(10m( \d+s)? ago\)", fields["opened"])
    assert "None" not in out and str(int(now)) not in out  # no raw epoch seconds
    assert re.search(rf"^{clock} \(5m( \d+s)? ago\)\s+RESPONSE\s+Mantis\s+Lotbot\s", out, re.M)
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "fin-2")
    assert out.startswith("REQUEST fin-2: cancelled\n")
    cancel = r"\(1m( \d+s)? ago\)\s+CANCEL\s+admin\s+Lotbot, Mantis\s+1/5\s+cancelled\s"
    assert re.search(cancel, out), out
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "fin-1", "--json")
    shown = json.loads(out)
    assert shown["status"] == "done" and shown["owes_reply"] is None

"""`bpgw status`, `bpgw show` and `bpgw sweep --once` against a real server."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from test_state_helpers import ORIGIN, T0, clarify, request, response, store

from gateway.agents import AgentDirectory
from gateway.cli import main
from gateway.config import load_config, parse_address
from state.store import ConversationStore

__all__ = ["store"]


def _run(capsys: pytest.CaptureFixture[str], where: str, namespace: str,
         *argv: str) -> tuple[int, str]:
    """``bpgw ARGV`` on Redis URL ``where`` and ``namespace``, or, when ``where`` is
    ``--config``, with the config file ``namespace``."""
    store = ["--config", namespace] if where == "--config" else [
        "--redis-url", where, "--namespace", namespace]
    code = main([*argv, *store])
    return code, capsys.readouterr().out


async def test_status_show_sweep(store: ConversationStore, redis_url: str, namespace: str,
                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Heron is declared; Lotbot learned (tofu) as the gateway learns a sender; both are
    # counted under their name keys and shown as spelled.
    toml = tmp_path / "gw.toml"
    toml.write_text(f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
                    '[agents.Heron]\naddresses = ["chat:heron-room"]\n')
    config = load_config(toml, environ={})
    directory = AgentDirectory(config, store.redis, "{" + namespace + "}")
    learned = await directory.check_sender("Lotbot", "chat:u-lot", parse_address("chat:c-1"))
    assert learned.ok, learned
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(clarify("r1"), ORIGIN, now=T0)
    await store.apply(request("r2", to="heron"), ORIGIN, now=time.time() - 2)
    await store.apply(request("a-rather-long-request-id", to="HERON"), ORIGIN, now=time.time())
    code, out = await _to_thread(capsys, redis_url, namespace, "status", "--json")
    data = json.loads(out)
    assert code == 0 and data["counts"]["clarifying"] == 1 and data["counts"]["open"] == 2
    # Without the config Heron is not declared: learned names only, else the name key.
    assert data["load_by_agent"] == {"heron": 2, "Lotbot": 1}
    assert [c["request_id"] for c in data["oldest_open"]] == [
        "r1", "r2", "a-rather-long-request-id"]
    code, out = await _to_thread(capsys, "--config", str(toml), "status", "--json")
    assert json.loads(out)["load_by_agent"] == {"Heron": 2, "Lotbot": 1}
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "r1", "--json")
    shown = json.loads(out)
    assert code == 0 and [e["type"] for e in shown["history"]] == ["REQUEST", "CLARIFY"]
    code, out = await _to_thread(capsys, redis_url, namespace, "show", "nope")
    assert code == 1 and "no conversation nope" in out
    code, out = await _to_thread(capsys, redis_url, namespace, "sweep", "--once")
    assert code == 0 and "timed out: r1 (waiting on Lotbot)" in out and "claimed 1" in out
    code, out = await _to_thread(capsys, "--config", str(toml), "status")
    assert code == 0 and "timeout 1" in out
    table = out[out.index("oldest open:"):].splitlines()
    assert re.fullmatch(r"  RequestId +status +opened +waiting on +due +task", table[1])
    rows = [line for line in table if line.startswith(("  r2 ", "  a-rather"))]
    assert re.fullmatch(r"  r2 +open +\d+s ago +Heron +in 2\d*m \d+s +count the lots", rows[0])
    # Aligned: every column starts at the same place on each line.
    starts = [[m.start() for m in re.finditer(r"(?<=  )\S", line)] for line in [table[1], *rows]]
    assert starts[0] == starts[1] == starts[2], table
    load = out[out.index("open load by agent:"):].splitlines()
    assert [line.split() for line in load[1:]] == [["agent", "owes", "replies"], ["Heron", "2"]]


async def test_an_argument_that_is_not_utf8_is_a_clear_error(
    store: ConversationStore, redis_url: str, namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `bpgw show $'\xff'`: the shell's byte reaches Python as a lone surrogate.
    code = await asyncio.to_thread(
        main, ["show", "r\udcff", "--redis-url", redis_url, "--namespace", namespace])
    assert code == 2
    assert "not valid UTF-8 (it holds the bytes b'\\xff')" in capsys.readouterr().err


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

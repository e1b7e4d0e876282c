"""The gateway end to end over HTTP: a real aiohttp client against the real HTTP transport,
routing to and from an in-process transport, and ``bpgw run`` / ``bpgw demo`` as processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from mq9wire import Mq9Wire

from adapters.base import OutboundKind
from adapters.http import HttpAdapter
from adapters.mq9.embedded import server_info
from gateway.app import Gateway
from protocol import build_request, parse, render, reply_response

from gwkit import make_config, memory, running, sent_to
from servers import free_port

TOKENS = {"Lotbot": "tok-lotbot-1", "Mantis": "tok-mantis-1"}


def _http_config(redis_url: str, namespace: str, tmp_path: Path) -> Any:
    return make_config(
        redis_url,
        namespace,
        tmp_path,
        agents={
            "Lotbot": {"addresses": ["web:Lotbot"], "identities": ["web:Lotbot"]},
            "Mantis": {"addresses": ["side:mantis-room"], "identities": ["side:u-mantis"]},
        },
        transports={
            "web": {
                "kind": "http",
                "port": 0,
                "tokens": {"Lotbot": TOKENS["Lotbot"]},
                "operator_tokens": {"admin": "tok-admin-1"},
            },
            "side": {"kind": "memory"},
        },
        permissions={"read": ["*"], "operators": ["web:admin"]},
    )


async def test_http_agent_and_chat_agent_talk_through_the_gateway(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with running(_http_config(redis_url, namespace, tmp_path)) as gw:
        base = _url(gw)
        side = memory(gw, "side")
        auth = {"Authorization": f"Bearer {TOKENS['Lotbot']}"}
        req = build_request(sender="Lotbot", to="Mantis", task="check disk")
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{base}/v1/messages", json={"text": render(req)}, headers=auth
            ) as resp:
                body = await resp.json()
                assert resp.status == 200 and body["outcome"] == "accepted", body
            await gw.drain()  # delivery is asynchronous, through the outbox
            relayed = sent_to(side, "mantis-room", OutboundKind.PROTOCOL)
            assert [parse(o.text).messages[0] for o in relayed] == [req]

            answer = reply_response(req, sender="Mantis", status="done", result="42% used")
            d = await side.inject(render(answer), author_id="u-mantis", channel="mantis-room")
            assert d.outcome == "accepted"
            async with http.get(
                f"{base}/v1/agents/Lotbot/inbox", params={"wait": "5"}, headers=auth
            ) as resp:
                inbox = await resp.json()
            got = [parse(m["text"]).messages[0] for m in inbox["messages"]]
            assert got == [answer]

            async with http.get(f"{base}/v1/conversations/{req.request_id}", headers=auth) as resp:
                conv = await resp.json()
            assert conv["status"] == "done"
            assert [e["type"] for e in conv["history"]] == ["REQUEST", "RESPONSE"]
            assert [e["transport"] for e in conv["history"]] == ["web", "side"]

            async with http.post(
                f"{base}/v1/commands",
                json={"text": "/protocol status"},
                headers={"Authorization": "Bearer tok-admin-1"},
            ) as resp:
                status = await resp.json()
            assert status["ok"] and "done: 1" in json.dumps(status)

            # The store records no recipient for an operator's CANCEL: the HTTP view names
            # both parties, as /protocol show (and bpgw show) do.
            other = build_request(sender="Lotbot", to="Mantis", task="check memory")
            async with http.post(
                f"{base}/v1/messages", json={"text": render(other)}, headers=auth
            ) as resp:
                assert resp.status == 200, await resp.text()
            shown = []
            for text in (f"cancel {other.request_id} wrong host", f"show {other.request_id}"):
                async with http.post(f"{base}/v1/commands", json={"text": f"/protocol {text}"},
                                     headers={"Authorization": "Bearer tok-admin-1"}) as resp:
                    shown.append(await resp.json())
                assert shown[-1]["ok"], shown[-1]
            async with http.get(f"{base}/v1/conversations/{other.request_id}",
                                headers=auth) as resp:
                cancelled = await resp.json()
            assert [(e["type"], e["to"]) for e in cancelled["history"]] == [
                ("REQUEST", "Mantis"), ("CANCEL", "Lotbot, Mantis")]
            to = shown[1]["columns"].index("to")
            assert [row[to] for row in shown[1]["rows"]] == ["Mantis", "Lotbot, Mantis"]

            async with http.get(f"{base}/healthz") as resp:
                health = await resp.json()
            assert resp.status == 200 and health["transports"]["web"]["state"] == "up"


async def test_http_malformed_and_impersonation_are_4xx_with_reasons(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with running(_http_config(redis_url, namespace, tmp_path)) as gw:
        base = _url(gw)
        auth = {"Authorization": f"Bearer {TOKENS['Lotbot']}"}
        async with aiohttp.ClientSession() as http:
            bad = "```\n[REQUEST → @Mantis]\nFrom: Lotbot\nRequestId: r-1\n```"
            async with http.post(f"{base}/v1/messages", json={"text": bad}, headers=auth) as resp:
                body = await resp.json()
            assert resp.status == 422 and body["outcome"] == "malformed"
            assert body["errors"][0]["code"] == "missing_field"
            fake = build_request(sender="Mantis", to="Lotbot", task="pretend")
            async with http.post(
                f"{base}/v1/messages", json={"text": render(fake)}, headers=auth
            ) as resp:
                body = await resp.json()
            assert resp.status == 422 and "impersonation" in body["detail"]
            # The notices landed in Lotbot's own inbox (its HTTP address).
            await gw.drain()
            async with http.get(f"{base}/v1/agents/Lotbot/inbox", headers=auth) as resp:
                inbox = await resp.json()
            kinds = [m["kind"] for m in inbox["messages"]]
            assert kinds == ["notice", "notice"]


async def test_a_lone_surrogate_in_a_block_is_a_422_not_a_retry(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """JSON can carry "\\ud800"; no UTF-8 store can: the block is malformed (it used to
    reach Redis and fail there as a 503 the client would retry for ever)."""
    async with running(_http_config(redis_url, namespace, tmp_path)) as gw:
        auth = {"Authorization": f"Bearer {TOKENS['Lotbot']}",
                "Content-Type": "application/json"}
        text = render(build_request(sender="Lotbot", to="Mantis", task="check XX disk"))
        raw = json.dumps({"text": text}).replace("XX", "\\ud800").encode()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{_url(gw)}/v1/messages", data=raw, headers=auth) as resp:
                body = await resp.json()
        assert resp.status == 422 and body["outcome"] == "malformed", body
        assert body["errors"][0]["code"] == "bad_value" and "U+D800" in body["detail"]
        # A thread is stored as it is: one that is not valid Unicode is a 400.
        good = text.replace("XX", "the")
        raw = json.dumps({"text": good, "thread": "t-YY"}).replace("YY", "\\udc00").encode()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{_url(gw)}/v1/messages", data=raw, headers=auth) as resp:
                body = await resp.json()
        assert resp.status == 400 and "U+DC00" in body["error"]["message"], body


def _url(gw: Gateway) -> str:
    adapter = gw.adapters["web"]
    assert isinstance(adapter, HttpAdapter)
    return adapter.url


def _bpgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def _env() -> dict[str, str]:
    """The environment without BPGW_ overrides, running this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    return env


async def test_bpgw_run_on_embedded_defaults(tmp_path: Path) -> None:
    port = free_port()
    env = _env()
    env.pop("REDIS_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *_bpgw("run", "--data-dir", str(tmp_path / "data"), "--port", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for _ in range(600):  # a loaded machine starts Valkey and NATS slowly
                try:
                    async with http.get(f"{base}/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                if proc.returncode is not None:
                    # Say why: a start-up failure here has been seen once and not since.
                    out, err = await proc.communicate()
                    raise AssertionError(f"bpgw run exited {proc.returncode}:\n"
                                         f"{out.decode()[-2000:]}\n{err.decode()[-4000:]}")
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("bpgw run never answered /healthz")
            tokens = json.loads((tmp_path / "data" / "tokens.json").read_text())
            req = build_request(sender="Lotbot", to="Mantis", task="hello")
            async with http.post(
                f"{base}/v1/messages",
                json={"text": render(req)},
                headers={"Authorization": f"Bearer {tokens['Lotbot']}"},
            ) as resp:
                assert (await resp.json())["outcome"] == "accepted"

            async def mantis_reads(ack: str = "") -> list[Any]:
                async with http.get(
                    f"{base}/v1/agents/Mantis/inbox?wait=10&ack={ack}",
                    headers={"Authorization": f"Bearer {tokens['Mantis']}"},
                ) as resp:
                    messages = (await resp.json())["messages"]
                return [(m["id"], parse(m["text"]).messages[0]) for m in messages]

            ((first, got),) = await mantis_reads()
            assert got == req
            # Any mq9 client reaches the gateway on the embedded NATS (docs/mq9.md).
            nats_port = int((tmp_path / "data" / "nats" / "port").read_text())
            wire = await Mq9Wire.connect(f"nats://127.0.0.1:{nats_port}")
            try:
                assert (await wire.create("scout.inbox"))["error"] == ""
                scouting = build_request(sender="Scout", to="Mantis", task="look around")
                sent = await wire.send("bpgw.gateway", render(scouting),
                                       **{"mq9-reply-to": "scout.inbox"})
                assert sent["error"] == ""
            finally:
                await wire.close()
            assert [m for _, m in await mantis_reads(first)] == [scouting]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    banner = out.decode()
    assert f"http://127.0.0.1:{port}" in banner and "Lotbot" in banner
    assert (tmp_path / "data" / "valkey").exists()
    # The embedded AINET workspace: served, its path printed, the bridge joined it.
    workspace = (tmp_path / "data" / "ainet").resolve()
    assert f"AINET workspace {workspace} (as Device-" in banner
    joins = list((workspace / "session").glob("Device-*_to_BROADCAST_broadcast.txt"))
    assert len(joins) == 1 and "has joined AINET" in joins[0].read_text(encoding="utf-8")
    assert f"transport mq9: nats://127.0.0.1:{nats_port}" in banner
    assert server_info(nats_port) is None  # the embedded nats-server stopped with it


def test_bpgw_demo_completes(tmp_path: Path) -> None:
    done = subprocess.run(
        _bpgw("demo", "--json"),
        capture_output=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    conv = json.loads(done.stdout)
    assert conv["status"] == "done"
    assert [e["type"] for e in conv["history"]] == [
        "REQUEST",
        "CLARIFY",
        "RESPONSE",
        "HANDOFF",
        "RESPONSE",
    ]
    assert [e["status"] for e in conv["history"]] == [
        "open",
        "clarifying",
        "open",
        "handed_off",
        "done",
    ]
    # SecurityBot is an mq9 agent: the handoff crossed from HTTP to mq9 and back.
    assert [e["transport"] for e in conv["history"]][-2:] == ["http", "mq9"]


def test_bad_config_fails_fast_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[policy]\nundeclared_agents = "sometimes"\n')
    done = subprocess.run(
        _bpgw("run", "--config", str(path)), capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert b"policy.undeclared_agents" in done.stderr


def test_unreachable_redis_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(f'[state]\nredis_url = "redis://127.0.0.1:{free_port()}"\n')
    done = subprocess.run(
        _bpgw("run", "--config", str(path)), capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert b"cannot use the state store" in done.stderr and b"Traceback" not in done.stderr

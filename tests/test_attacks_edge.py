"""An attacker's-eye view of the gateway's edge: what one hostile agent can make it do.

Each test plays an attack from issue 7 against the real gateway (real aiohttp server,
real Redis/Valkey) and checks the bound that stops it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from adapters.base import HealthState, OutboundKind
from adapters.http import HttpAdapter
from gateway.app import Gateway
from protocol import build_request, render
from state.leases import Lease

from gwkit import make_config, memory, running, sent_to
from servers import PrivateValkey, free_port

TOKENS = {"dave": "tok-dave-123", "erin": "tok-erin-456"}


def edge_config(redis_url: str, namespace: str, tmp_path: Path, **policy: Any) -> Any:
    """gwkit's agents (Mantis on memory transport ``side``) plus HTTP transport ``web``,
    where dave and erin hold tokens and no [agents] entry (TOFU names)."""
    transports = {"chat": {"kind": "memory"}, "side": {"kind": "memory"},
                  "web": {"kind": "http", "port": 0, "tokens": TOKENS}}
    return make_config(redis_url, namespace, tmp_path, transports=transports, policy=policy)


@pytest.fixture
async def gw(redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
             ) -> AsyncIterator[Gateway]:
    async with running(
        edge_config(redis_url, namespace, tmp_path, pair_budget_messages=4,
                    max_blocks_per_message=3)
    ) as gateway:
        yield gateway


def url(gw: Gateway) -> str:
    adapter = gw.adapters["web"]
    assert isinstance(adapter, HttpAdapter)
    return adapter.url


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


async def post(http: aiohttp.ClientSession, gw: Gateway, who: str, text: str
               ) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url(gw)}/v1/messages", json={"text": text}, headers=auth(who)) as r:
        return r.status, await r.json()


async def test_blocks_past_the_per_message_cap_are_refused_and_reported(gw: Gateway) -> None:
    # Many REQUESTs to distinct recipients in one post: only the first few do any work.
    blocks = [build_request(sender="dave", to=f"Target{i}", task="t") for i in range(50)]
    async with aiohttp.ClientSession() as http:
        status, body = await post(http, gw, "dave", "\n\n".join(render(b) for b in blocks))
        assert status == 422 and body["outcome"] == "rejected"
        assert "too_many_blocks" in body["detail"] and "blocks 4-50 were refused" in body["detail"]
        opened = [b.request_id for b in blocks[:3]]
        assert body["request_ids"][:3] == opened
        for b in blocks:
            stored = await gw.store.get(b.request_id, with_history=False)
            assert (stored is not None) == (b.request_id in opened)
        await gw.drain()  # notices go out through the outbox
        async with http.get(f"{url(gw)}/v1/agents/dave/inbox", headers=auth("dave")) as r:
            notes = [m["text"] for m in (await r.json())["messages"] if m["kind"] == "notice"]
        assert any("at most 3 per message" in n for n in notes), notes


async def test_every_block_counts_against_the_pair_budget(gw: Gateway) -> None:
    side = memory(gw, "side")
    blocks = [build_request(sender="dave", to="Mantis", task=f"t{i}") for i in range(3)]
    async with aiohttp.ClientSession() as http:
        status, body = await post(http, gw, "dave", "\n\n".join(render(b) for b in blocks))
        assert status == 200 and body["outcome"] == "accepted"
        more = [build_request(sender="dave", to="Mantis", task=f"u{i}") for i in range(2)]
        status, body = await post(http, gw, "dave", "\n\n".join(render(b) for b in more))
    # Budget 4: the fourth block passes, the fifth trips it.
    assert status == 422 and "loop:" in body["detail"]
    await gw.drain()  # relays go out through the outbox
    assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 4


async def test_aliases_of_one_token_share_one_budget(gw: Gateway) -> None:
    side = memory(gw, "side")
    accepted = 0
    async with aiohttp.ClientSession() as http:
        for alias in ("Dave1", "Dave2"):
            for i in range(4):
                req = build_request(sender=alias, to="Mantis", task=f"{alias} {i}")
                status, body = await post(http, gw, "dave", render(req))
                if body["outcome"] == "accepted":
                    accepted += 1
                else:
                    assert status == 422 and "loop:" in body["detail"], body
    # Budget 4 per window for http:dave -> Mantis, however many names dave uses.
    assert accepted == 4
    await gw.drain()
    assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 4


# -- logs stay structured (item 15) ----------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
MALFORMED = (
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\n\r\n",
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00",
)
BANNER = ("bpgw gateway ", "  state: ", "  transport ")


async def test_malformed_requests_log_one_json_line_each(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "gw.toml"
    config.write_text(
        f'[gateway]\ndata_dir = "{tmp_path / "data"}"\nlog_format = "json"\n'
        f'[state]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
        f'[transports.web]\nkind = "http"\nport = {port}\n'
        f'[transports.web.tokens]\ndave = "{TOKENS["dave"]}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "run", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        cwd=tmp_path,
    )
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(30):
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        for payload in MALFORMED:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            answer = await asyncio.wait_for(reader.read(100), 5)
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer, answer
            writer.close()
    finally:
        proc.terminate()
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    records = [json.loads(line) for line in err.decode().splitlines()]  # each one JSON
    refused = [r for r in records if "malformed request" in r["msg"]]
    # One warning each, without a traceback (a first request that is not HTTP at all,
    # garbage or TLS, is logged at debug level).
    assert len(refused) == 3, records
    assert all(r["logger"] == "bpgw.adapters.http" and "exc" not in r
               and r["level"] == "warning" for r in refused), refused
    assert any("Content-Length" in r["msg"] for r in refused), refused
    for line in out.decode().splitlines():
        assert line.startswith(BANNER) or line == "bpgw: shutting down", line


# -- errors are the documented 4xx/503, never 500 (item 13) ----------------------------


async def test_deeply_nested_json_is_400(gw: Gateway) -> None:
    deep = "[" * 1000 + "]" * 1000
    inner = '{"text": ' + "[" * 500 + "]" * 500 + "}"
    async with aiohttp.ClientSession() as http:
        for path in ("/v1/messages", "/v1/commands"):
            for body in (deep, inner):
                async with http.post(f"{url(gw)}{path}", data=body, headers={
                        **auth("dave"), "Content-Type": "application/json"}) as r:
                    assert r.status == 400, (path, await r.text())
                    assert (await r.json())["error"]["code"] == "bad_request"


async def test_conversation_status_filter_is_checked(gw: Gateway) -> None:
    req = build_request(sender="dave", to="Mantis", task="t")
    async with aiohttp.ClientSession() as http:
        assert (await post(http, gw, "dave", render(req)))[0] == 200
        async with http.get(f"{url(gw)}/v1/conversations?status=bogus", headers=auth("dave")) as r:
            assert r.status == 400
            assert "unknown status 'bogus'" in (await r.json())["error"]["message"]
        for spelling in ("OPEN", "open", " Open"):
            async with http.get(f"{url(gw)}/v1/conversations", params={"status": spelling},
                                headers=auth("dave")) as r:
                assert r.status == 200
                found = [c["request_id"] for c in (await r.json())["conversations"]]
                assert found == [req.request_id]


async def _status_of(http: aiohttp.ClientSession, address: str, **kw: Any
                     ) -> tuple[int, dict[str, Any], str | None]:
    async with http.get(address, **kw) as r:
        return r.status, await r.json(), r.headers.get("Retry-After")


async def _healthz_until(http: aiohttp.ClientSession, gw: Gateway, wanted: int
                         ) -> tuple[dict[str, Any], str | None]:
    """Poll /healthz until it answers ``wanted`` (a result is reused for up to 1 s)."""
    async with asyncio.timeout(10):
        while True:
            status, health, retry = await _status_of(http, f"{url(gw)}/healthz")
            if status == wanted:
                return health, retry
            await asyncio.sleep(0.1)


@pytest.fixture
async def valkey() -> AsyncIterator[PrivateValkey]:
    """A Redis of this test's own, to stop or freeze."""
    server = PrivateValkey().start()
    try:
        yield server
    finally:
        server.close()


async def test_store_down_reads_are_503_with_retry_after(
    valkey: PrivateValkey, namespace: str, tmp_path: Path
) -> None:
    async with running(edge_config(valkey.url, namespace, tmp_path)) as gw, \
            aiohttp.ClientSession() as http:
        status, health, _ = await _status_of(http, f"{url(gw)}/healthz")
        assert status == 200 and health["failing"] == [], health
        valkey.stop()
        reads = ("/v1/conversations", "/v1/conversations?agent=dave", "/v1/conversations/r-1",
                 "/v1/agents/dave/inbox")
        for path in reads:
            status, body, retry = await _status_of(http, f"{url(gw)}{path}", headers=auth("dave"))
            assert (status, body["error"]["code"], retry) == (503, "unavailable", "1"), path
        health, retry = await _healthz_until(http, gw, 503)
        assert (retry, health["failing"]) == ("1", ["state_store"]), health
        [store] = [p for p in health["parts"] if p["name"] == "state_store"]
        assert not store["ok"] and "unreachable" in store["detail"]
        async with http.post(f"{url(gw)}/v1/messages", headers=auth("dave"), json={
                "text": render(build_request(sender="dave", to="Mantis", task="t"))}) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
        valkey.start()
        await _healthz_until(http, gw, 200)  # back by itself
        status, body, _ = await _status_of(http, f"{url(gw)}/v1/conversations",
                                           headers=auth("dave"))
        assert status == 200, body


async def _pid_of(redis_url: str) -> int:
    client: aioredis.Redis = aioredis.from_url(redis_url)
    try:
        return int((await client.info("server"))["process_id"])
    finally:
        await client.aclose()


async def test_healthz_turns_503_soon_after_the_store_freezes(
    valkey: PrivateValkey, namespace: str, tmp_path: Path
) -> None:
    pid = await _pid_of(valkey.url)
    async with running(edge_config(valkey.url, namespace, tmp_path)) as gw:
        async with aiohttp.ClientSession() as http:
            assert (await _status_of(http, f"{url(gw)}/healthz"))[0] == 200
            os.kill(pid, signal.SIGSTOP)
            try:
                frozen = time.monotonic()
                while True:
                    status, health, retry = await _status_of(http, f"{url(gw)}/healthz")
                    if status == 503:
                        break
                    await asyncio.sleep(0.1)
                waited = time.monotonic() - frozen
                # The check times out after 1 s and a result is reused for 1 s at most.
                assert waited < 4, waited
                assert health["failing"] == ["state_store"] and retry == "1", health
            finally:
                os.kill(pid, signal.SIGCONT)
            await _healthz_until(http, gw, 200)


async def test_healthz_names_a_down_transport_and_a_stalled_outbox(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    config = edge_config(redis_url, namespace, tmp_path)
    config = config.model_copy(update={
        "outbox": config.outbox.model_copy(update={"stall_seconds": 0.5}),
        "transports": {**config.transports, "chat": {"kind": "memory", "required": False}},
    })
    # A replica that holds the dispatch lease and then hangs: nothing is delivered.
    hung = Lease(redis_client, namespace, "outbox", "hung-replica", 60)
    assert await hung.acquire()
    async with running(config) as gw, aiohttp.ClientSession() as http:
        health = (await _status_of(http, f"{url(gw)}/healthz"))[1]
        assert health["failing"] == [], health
        memory(gw, "side").set_health(HealthState.DOWN, "lost its connection")
        memory(gw, "chat").set_health(HealthState.DOWN, "not needed")  # required = false
        req = build_request(sender="dave", to="Mantis", task="t")
        assert (await post(http, gw, "dave", render(req)))[0] == 200
        await asyncio.sleep(1.2)  # older than stall_seconds, and the cached check expired
        status, health, retry = await _status_of(http, f"{url(gw)}/healthz")
        assert (status, retry) == (503, "1")
        assert health["failing"] == ["transport side", "outbox"], health
        parts = {p["name"]: p for p in health["parts"]}
        assert "lost its connection" in parts["transport side"]["detail"]
        assert parts["transport chat"]["ok"] and "not required" in parts["transport chat"]["detail"]
        assert "oldest undelivered message" in parts["outbox"]["detail"]


# -- stored fields are bounded (item 8) ------------------------------------------------


async def test_oversize_thread_is_refused_and_nothing_is_stored(
        gw: Gateway, redis_client: Any) -> None:
    req = build_request(sender="dave", to="Mantis", task="t")
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{url(gw)}/v1/messages", headers=auth("dave"),
                                 json={"text": render(req), "thread": "x" * 200_000}) as r:
                body = await r.json()
                assert r.status == 422 and body["outcome"] == "rejected", body
                assert body["detail"].startswith("too_long: the thread is 200000 bytes"), body
        assert await gw.store.get(req.request_id) is None
        await gw.drain()
        async with http.get(f"{url(gw)}/v1/agents/dave/inbox", headers=auth("dave")) as r:
            notes = (await r.json())["messages"]
        assert notes and all(n["thread"] is None and "too_long" not in n["text"] for n in notes)
        assert "200000 bytes" in notes[0]["text"]
        # Within bounds, the same message goes through.
        async with http.post(f"{url(gw)}/v1/messages", headers=auth("dave"),
                             json={"text": render(req), "thread": "t" * 256}) as r:
            assert r.status == 200, await r.json()
    # Not one oversize thread was kept anywhere (state, journal, inboxes, counters).
    async for key in redis_client.scan_iter(match=f"*{gw.config.state.namespace}*"):
        assert await redis_client.memory_usage(key) < 10_000, key


# -- one name, one inbox, one budget, one index (identity leftovers) -------------------


async def test_an_inbox_is_read_under_any_spelling_of_its_name(gw: Gateway) -> None:
    web = gw.adapters["web"]
    assert isinstance(web, HttpAdapter)
    req = build_request(sender="Mantis", to="dave", task="t")
    await memory(gw, "side").inject(render(req), author_id="u-mantis", channel="mantis-room")
    await gw.drain()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url(gw)}/v1/agents/DAVE/inbox", headers=auth("dave")) as r:
            assert r.status == 200
            got = (await r.json())["messages"]
        assert any(req.request_id in m["text"] for m in got), got
        async with http.post(f"{url(gw)}/v1/agents/ｄａｖｅ/inbox/ack", headers=auth("dave"),
                             json={"id": got[-1]["id"]}) as r:
            assert r.status == 200
        async with http.get(f"{url(gw)}/v1/agents/dave/inbox", headers=auth("dave")) as r:
            assert (await r.json())["messages"] == []  # one inbox: acknowledged is gone
        async with http.get(f"{url(gw)}/v1/agents/DAVE/inbox", headers=auth("erin")) as r:
            assert r.status == 403


async def test_spellings_of_a_name_share_its_pair_budget(gw: Gateway) -> None:
    accepted = 0
    async with aiohttp.ClientSession() as http:
        for i, to in enumerate(("Mantis", "mantis", "MANTIS", "ｍａｎｔｉｓ", "Mantis", "mantis")):
            req = build_request(sender="dave", to=to, task=f"t{i}")
            _, body = await post(http, gw, "dave", render(req))
            accepted += body["outcome"] == "accepted"
    assert accepted == 4  # pair_budget_messages = 4 for dave -> Mantis, however spelt
    load = await gw.store.load_by_agent()
    assert load == {"mantis": 4}
    listed = await gw.conversations(status="open", agent="ＭＡＮＴＩＳ", offset=0, limit=10)
    assert len(listed) == 4


# -- slow and incomplete requests are closed (item 12) ---------------------------------

CAP = 64


@pytest.fixture
async def capped(redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
                 ) -> AsyncIterator[Gateway]:
    """The edge gateway with a small connection cap and one-second read timeouts."""
    config = edge_config(redis_url, namespace, tmp_path)
    web = {**config.transports["web"], "max_connections": CAP, "header_timeout_seconds": 1,
           "body_timeout_seconds": 1}
    async with running(config.model_copy(
            update={"transports": {**config.transports, "web": web}})) as gateway:
        yield gateway


async def _silent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # The writer is kept: a collected one would close its socket.
    return await asyncio.open_connection("127.0.0.1", port)


async def _trickle(port: int, head: bytes, stop: asyncio.Event) -> bytes:
    """Send ``head`` one byte every 0.2 s; what the server answered when it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for byte in head:
            writer.write(bytes([byte]))
            try:
                return await asyncio.wait_for(reader.read(), 0.2)  # until closed
            except TimeoutError:
                if stop.is_set():
                    return b"still open"
        return await asyncio.wait_for(reader.read(), 5)
    except (ConnectionError, OSError):
        return b""
    finally:
        writer.close()


async def _accepted(web: HttpAdapter, opened: int) -> None:
    """Wait until the server accepted ``opened`` connections; it never holds over CAP."""
    async with asyncio.timeout(10):
        while True:
            stats = web.stats()
            assert stats["connections"] <= CAP, stats
            if stats["connections_accepted"] + stats["connections_refused"] >= opened:
                return
            await asyncio.sleep(0.02)


async def test_slow_and_silent_connections_cannot_starve_the_server(capped: Gateway) -> None:
    web = capped.adapters["web"]
    assert isinstance(web, HttpAdapter)
    port = int(url(capped).rsplit(":", 1)[1])
    stop = asyncio.Event()
    body = json.dumps({"text": "x" * 200}).encode()
    post_head = (f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 f"{TOKENS['dave']}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode()
    # Trickling heads and trickling bodies, then far more silent sockets than the cap.
    heads = [asyncio.create_task(_trickle(port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 60,
                                          stop)) for _ in range(10)]
    bodies = []
    for _ in range(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post_head)
        bodies.append((reader, writer))
    silent = [await _silent(port) for _ in range(3 * CAP)]
    await _accepted(web, 3 * CAP + 15)
    no_pool = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=no_pool) as http:
        for _ in range(3):  # served every time, however many idle sockets are open
            status, health, _ = await _status_of(http, f"{url(capped)}/healthz")
            assert status == 200, health
            req = build_request(sender="dave", to="Mantis", task="still served")
            status, answer = await post(http, capped, "dave", render(req))
            assert status == 200 and answer["outcome"] == "accepted", answer
            silent += [await _silent(port) for _ in range(CAP)]
            await _accepted(web, len(silent) + 15)
    stats = web.stats()
    assert stats["connections_evicted"] >= 3 * CAP and stats["connections_refused"] == 0, stats
    # Bodies that never finish get 408 once body_timeout_seconds passes.
    for _, writer in bodies:
        writer.write(body[:10])
    for reader, writer in bodies:
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:60]
        writer.close()
    # Trickling heads and silent sockets are closed after header_timeout_seconds.
    closed = await asyncio.wait_for(asyncio.gather(*heads), 5)
    assert b"still open" not in closed
    assert all([await asyncio.wait_for(r.read(), 5) == b"" for r, _ in silent[-CAP // 2:]])
    for _, writer in silent:
        writer.close()
    async with asyncio.timeout(5):
        while True:  # every idle socket is closed within the timeout
            if not web.stats()["connections"]:
                break
            await asyncio.sleep(0.05)
    stop.set()


# -- the sender learns the real reason (item 14) ---------------------------------------


async def test_a_full_inbox_is_reported_to_the_sender_as_such(
        redis_url: str, namespace: str, tmp_path: Path, redis_client: Any) -> None:
    config = edge_config(redis_url, namespace, tmp_path)
    web = {**config.transports["web"], "inbox_max": 2}
    config = config.model_copy(update={"transports": {**config.transports, "web": web}})
    async with running(config) as gw, aiohttp.ClientSession() as http:
        details = []
        async with asyncio.timeout(15):
            while True:  # erin never reads: her inbox fills, then senders are told
                req = build_request(sender="dave", to="erin", task=f"t{len(details)}")
                status, body = await post(http, gw, "dave", render(req))
                assert status == 200 and body["outcome"] == "accepted", body
                assert "no known address" not in json.dumps(body), body
                details.append(body)
                if body["warnings"]:
                    break
                await gw.drain()
                await asyncio.sleep(0.2)  # the blocked view is refreshed every second
        [warning] = body["warnings"]
        assert warning["code"] == "inbox_full" and warning["agent"] == "erin", warning
        assert "inbox of erin is full" in warning["detail"] and "queued" in warning["detail"]
        assert len(details) > 2  # the first ones were simply delivered


async def test_oversize_transport_fields_of_any_transport_are_refused(gw: Gateway) -> None:
    chat = memory(gw, "chat")
    text = render(build_request(sender="Lotbot", to="Mantis", task="t"))
    for field, kw in (("author id", {"author_id": "u" * 300}),
                      ("native id", {"author_id": "u-lot", "native_id": "n" * 300}),
                      ("channel", {"author_id": "u-lot", "channel": "c" * 300})):
        d = await chat.inject(text, **kw)
        assert d.outcome == "rejected" and d.detail.startswith(f"too_long: the {field} is 300"), d
    assert (await chat.inject(text, author_id="u-lot")).outcome == "accepted"

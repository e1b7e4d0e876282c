"""GET /metrics from a real gateway: counters after traffic, access rules, bounded labels."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.http import HttpAdapter
from adapters.http.auth import MetricsAccess, TokenAuth
from gateway.app import Gateway
from gateway.cli import main
from protocol import build_request, render

from gwkit import make_config, memory, running
from servers import PrivateValkey

pytestmark = pytest.mark.redis

OPS = {"Authorization": "Bearer tok-ops-0001"}
WEB = {
    "kind": "http",
    "port": 0,
    "tokens": {"Lotbot": "tok-lotbot-01"},
    "operator_tokens": {"ops": "tok-ops-0001"},
}
MALFORMED = "```\n[REQUEST → @Mantis]\nFrom: @Lotbot\n```"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _url(gw: Gateway) -> str:
    adapter = gw.adapters["web"]
    assert isinstance(adapter, HttpAdapter)
    return adapter.url


async def _scrape(gw: Gateway, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of GET /metrics by sample name (parsed by prometheus_client)."""
    async with aiohttp.ClientSession() as http, http.get(
        f"{_url(gw)}/metrics", headers=headers or {}
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for got, v in samples[name] if all(got.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples[name])
    return found[0]


async def _until_dead_letters(gw: Gateway, n: int) -> None:
    async with asyncio.timeout(10):
        # The dispatcher's retry workers signal nothing a test could await.
        while sum((await gw.outbox.stats())["dead_letters"].values()) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_metrics_count_traffic_after_the_fact(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = make_config(
        redis_url,
        namespace,
        tmp_path,
        policy={"pair_budget_messages": 3},
        outbox={"max_attempts": 2, "backoff_base_seconds": 0.01, "backoff_max_seconds": 0.02},
        agents={"Ghost": {"addresses": ["side:nowhere"], "identities": ["side:u-ghost"]}},
        transports={
            "side": {"kind": "memory", "channels": ["mantis-room", "sec-room"]},
            "web": WEB,
        },
    )
    async with running(config) as gw:
        chat = memory(gw, "chat")
        for n in range(4):  # the 4th trips the pair budget
            text = render(build_request(sender="Lotbot", to="Mantis", task=f"job {n}"))
            await chat.inject(text, author_id="u-lot")
        await chat.inject(MALFORMED, author_id="u-lot")
        await chat.inject("hello there", author_id="u-lot")
        fake = render(build_request(sender="Mantis", to="Lotbot", task="x"))
        await chat.inject(fake, author_id="u-lot")  # impersonation
        ghost = render(build_request(sender="Lotbot", to="Ghost", task="boo"))
        await chat.inject(ghost, author_id="u-lot")  # side:nowhere fails: retried, then dead
        await _until_dead_letters(gw, 1)
        await gw.sweep_once(time.time() + 7200)  # every open conversation times out
        m = await _scrape(gw)
        # Status shows the outbox too: the operator command and `bpgw status`.
        status = await chat.command("status", author_id="op")
        assert ("dead letters", "side:nowhere: 1") in status.fields
        assert any(k == "outbox" and v.startswith("0 to dispatch") for k, v in status.fields)
        argv = ["status", "--redis-url", redis_url, "--namespace", namespace]
        code = await asyncio.to_thread(main, argv)
        out = capsys.readouterr().out
        assert code == 0 and "dead letters: side:nowhere: 1" in out, out
        code = await asyncio.to_thread(main, [*argv, "--json"])
        data = json.loads(capsys.readouterr().out)
        assert data["outbox"]["dead_letters"] == {"side:nowhere": 1}

    assert _value(m, "bpgw_messages_in_total", transport="chat", type="REQUEST") == 6
    assert _value(m, "bpgw_messages_in_total", transport="chat", type="malformed") == 1
    assert _value(m, "bpgw_messages_in_total", transport="chat", type="chat") == 1
    assert _value(m, "bpgw_dispositions_total", outcome="accepted") == 4
    assert _value(m, "bpgw_dispositions_total", outcome="rejected") == 2
    assert _value(m, "bpgw_dispositions_total", outcome="malformed") == 1
    assert _value(m, "bpgw_dispositions_total", outcome="ignored") == 1
    assert _value(m, "bpgw_parse_errors_total", code="missing_field") == 2
    assert _value(m, "bpgw_violations_total", kind="loop") == 1
    assert _value(m, "bpgw_violations_total", kind="impersonation") == 1
    # 3 relays to Mantis; 3 timeout RESPONSEs and notices were sent after the sweep.
    assert _value(m, "bpgw_messages_out_total", transport="side", kind="protocol") == 3
    assert _value(m, "bpgw_outbox_retries_total", transport="side", destination="side:nowhere") == 1
    assert _value(m, "bpgw_outbox_dead_lettered_total", transport="side",
                  destination="side:nowhere") == 1
    assert _value(m, "bpgw_outbox_dead_letters", transport="side", destination="side:nowhere") == 1
    assert _value(m, "bpgw_outbox_journal") == 0
    sent = sum(v for labels, v in m["bpgw_messages_out_total"])
    assert sum(v for _, v in m["bpgw_delivery_latency_seconds_count"]) == sent
    # Read from the store at scrape time: the four accepted conversations timed out.
    assert _value(m, "bpgw_conversations", status="timeout") == 4
    assert _value(m, "bpgw_conversations", status="open") == 0
    assert _value(m, "bpgw_sweep_items_total", job="timeout") == 4
    assert _value(m, "bpgw_sweep_duration_seconds_count", job="timeout") >= 1
    assert _value(m, "bpgw_transport_state", transport="web", state="up") == 1
    assert _value(m, "bpgw_transport_state", transport="web", state="down") == 0
    assert _value(m, "bpgw_outbox_dispatching") == 1
    assert _value(m, "bpgw_state_store_up") == 1


async def test_hostile_names_keep_label_cardinality_bounded(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    config = make_config(
        redis_url,
        namespace,
        tmp_path,
        gateway={"metrics_max_destinations": 20},
        outbox={"max_attempts": 1},
        transports={"web": WEB},
    )
    async with running(config) as gw:
        side = memory(gw, "side")
        await side.stop()  # every send on side fails from now on
        names = [f'evil-{i}-"}}{{\n# HELP x=\\' for i in range(1000)]

        async def hostile(name: str) -> None:  # its malformed post gets a notice there
            await side.inject(MALFORMED, author_id=name, channel=name)

        for start in range(0, len(names), 100):
            await asyncio.gather(*(hostile(n) for n in names[start : start + 100]))
        await _until_dead_letters(gw, 1000)
        m = await _scrape(gw)
    for family in ("bpgw_outbox_dead_lettered_total", "bpgw_outbox_dead_letters"):
        labels = {labels["destination"] for labels, _ in m[family]}
        assert len(labels) <= 21 and "other" in labels, (family, len(labels))
        # Every dead letter is counted, under its own name or under other.
        assert sum(v for _, v in m[family]) == 1000
    assert sum(len(samples) for samples in m.values()) < 400  # the whole exposition


async def test_metrics_access(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    web = {**WEB, "metrics_token": "tok-metrics-01"}
    async with running(make_config(redis_url, namespace, tmp_path, transports={"web": web})) as gw:
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer tok-lotbot-01"},
                            {"Authorization": "Bearer wrong-token"}):
                async with http.get(f"{_url(gw)}/metrics", headers=headers) as resp:
                    assert resp.status == 401
                    assert "metrics_token" in (await resp.json())["error"]["message"]
        assert "bpgw_state_store_up" in await _scrape(gw, OPS)
        assert "bpgw_state_store_up" in await _scrape(
            gw, {"Authorization": "Bearer tok-metrics-01"}
        )


def test_metrics_are_open_only_on_loopback_without_a_token() -> None:
    auth = TokenAuth({"bot": "tok-bot-0001"}, {"ops": "tok-ops-0001"})
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert MetricsAccess(None, auth, host).allows(None)
    for host in ("0.0.0.0", "192.168.1.5", "::", "gateway.example"):
        access = MetricsAccess(None, auth, host)
        assert not access.allows(None)
        assert not access.allows("Bearer tok-bot-0001")  # agents do not read metrics
        assert access.allows("Bearer tok-ops-0001")
    token = MetricsAccess("tok-scrape-01", auth, "127.0.0.1")
    assert not token.allows(None) and token.allows("Bearer tok-scrape-01")


async def test_metrics_answer_while_the_store_is_down(namespace: str, tmp_path: Path) -> None:
    server = PrivateValkey().start()
    try:
        config = make_config(server.url, namespace, tmp_path, transports={"web": WEB})
        async with running(config) as gw:
            text = render(build_request(sender="Lotbot", to="Mantis", task="before"))
            await memory(gw, "chat").inject(text, author_id="u-lot")
            before = await _scrape(gw)
            assert _value(before, "bpgw_conversations", status="open") == 1
            server.stop()
            await asyncio.sleep(1.1)  # past the scrape's reuse interval: it reads again
            during = await _scrape(gw)  # 200, from memory
            assert _value(during, "bpgw_state_store_up") == 0
            assert _value(during, "bpgw_conversations", status="open") == 1  # last known
            assert _value(during, "bpgw_dispositions_total", outcome="accepted") == 1
            server.start()
            await asyncio.sleep(1.1)
            after = await _scrape(gw)
            assert _value(after, "bpgw_state_store_up") == 1
    finally:
        server.close()

"""Operators and delivery warnings over HTTP, through a real aiohttp client: an operator
token is an operator (issue 8 item 13), a REQUEST to an agent without an address says so
machine-readably (item 12)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from adapters.http import HttpAdapter
from gateway.app import Gateway
from gateway.config import GatewayConfig
from protocol import build_request, render

from gwkit import running

AGENT = {"Authorization": "Bearer tok-lotbot-1"}
ADMIN = {"Authorization": "Bearer tok-admin-1"}


@asynccontextmanager
async def _gateway(
    redis_url: str, namespace: str, tmp_path: Path, **permissions: Any
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession, str]]:
    config = GatewayConfig.model_validate(
        {
            "gateway": {"data_dir": str(tmp_path), "log_format": "text"},
            "state": {"redis_url": redis_url, "namespace": namespace},
            "permissions": {"read": ["*"], "operators": [], **permissions},
            "transports": {
                "web": {
                    "kind": "http",
                    "port": 0,
                    "tokens": {"Lotbot": "tok-lotbot-1", "Mantis": "tok-mantis-1"},
                    "operator_tokens": {"admin": "tok-admin-1"},
                }
            },
        }
    )
    async with running(config) as gw, aiohttp.ClientSession() as http:
        adapter = gw.adapters["web"]
        assert isinstance(adapter, HttpAdapter)
        yield gw, http, adapter.url


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                auth: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, headers=auth) as resp:
        return resp.status, await resp.json()


async def _open_request(http: aiohttp.ClientSession, base: str) -> str:
    req = build_request(sender="Lotbot", to="Mantis", task="check disk")
    status, body = await _post(http, f"{base}/v1/messages", {"text": render(req)}, AGENT)
    assert status == 200 and body["outcome"] == "accepted", body
    return req.request_id


async def test_an_operator_token_is_an_operator(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with _gateway(redis_url, namespace, tmp_path) as (gw, http, base):
        rid = await _open_request(http, base)
        status, refused = await _post(
            http, f"{base}/v1/commands", {"text": f"/protocol cancel {rid}"}, AGENT
        )
        assert status == 200 and not refused["ok"] and "permission denied" in refused["title"]
        status, done = await _post(
            http, f"{base}/v1/commands", {"text": f'/protocol cancel {rid} "too slow"'}, ADMIN
        )
        assert status == 200 and done["ok"], done
        assert {"name": "reason", "value": "too slow"} in done["fields"]
        conv = await gw.store.get(rid)
        assert conv is not None and conv.status == "cancelled"


async def test_operator_credentials_can_be_switched_off(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with _gateway(redis_url, namespace, tmp_path, operator_credentials=False) as (
        _gw,
        http,
        base,
    ):
        rid = await _open_request(http, base)
        status, refused = await _post(
            http, f"{base}/v1/commands", {"command": "cancel", "args": [rid]}, ADMIN
        )
        assert status == 200 and not refused["ok"]
        assert refused["fields"] == [
            {"name": "why", "value": "web:admin is not among the configured operators"}
        ]
    listed = {"operator_credentials": False, "operators": ["web:admin"]}
    async with _gateway(redis_url, namespace, tmp_path, **listed) as (_gw, http, base):
        status, done = await _post(
            http, f"{base}/v1/commands", {"command": "cancel", "args": [rid]}, ADMIN
        )
        assert status == 200 and done["ok"], done


async def test_a_request_to_an_agent_without_an_address_warns(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with _gateway(redis_url, namespace, tmp_path) as (gw, http, base):
        req = build_request(sender="Lotbot", to="Nobody", task="anyone there?")
        status, body = await _post(http, f"{base}/v1/messages", {"text": render(req)}, AGENT)
        assert status == 200 and body["outcome"] == "accepted", body
        assert body["detail"].endswith("queued for delivery to 0 address(es)")
        [warning] = body["warnings"]
        assert warning["code"] == "no_address" and warning["agent"] == "Nobody"
        assert warning["request_id"] == req.request_id and warning["detail"]
        # The notice says so too, in the sender's inbox; the conversation is tracked.
        await gw.drain()
        async with http.get(f"{base}/v1/agents/Lotbot/inbox", headers=AGENT) as resp:
            inbox = await resp.json()
        [notice] = inbox["messages"]
        assert notice["kind"] == "notice" and "@Nobody has no known address" in notice["text"]
        assert (await gw.store.get(req.request_id)) is not None
        # A REQUEST to an agent with an inbox has no warning.
        ok = build_request(sender="Lotbot", to="Mantis", task="check disk")
        status, body = await _post(http, f"{base}/v1/messages", {"text": render(ok)}, AGENT)
        assert status == 200 and body["warnings"] == [], body
        # Several blocks in one message: each block's warning is kept.
        two = [build_request(sender="Lotbot", to=to, task="t") for to in ("Nobody", "Noone")]
        text = "\n".join(render(r) for r in two)
        status, body = await _post(http, f"{base}/v1/messages", {"text": text}, AGENT)
        assert status == 200 and body["outcome"] == "accepted", body
        warned = [(w["code"], w["agent"], w["request_id"]) for w in body["warnings"]]
        assert warned == [("no_address", r.to, r.request_id) for r in two], body


async def test_conversations_filters_over_http(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    async with _gateway(redis_url, namespace, tmp_path) as (_gw, http, base):
        first = await _open_request(http, base)
        await asyncio.sleep(0.01)  # creation times are kept to the millisecond
        second = await _open_request(http, base)
        _, done = await _post(http, f"{base}/v1/commands", {"text": f"cancel {second}"}, ADMIN)
        assert done["ok"], done

        async def ids(query: str) -> tuple[int, Any]:
            async with http.get(f"{base}/v1/conversations?{query}", headers=AGENT) as resp:
                body = await resp.json()
            if resp.status != 200:
                return resp.status, body["error"]
            return resp.status, [c["request_id"] for c in body["conversations"]]

        assert await ids("") == (200, [first, second])  # every status by default
        assert await ids("status=all") == await ids("status=") == (200, [first, second])
        assert await ids("status=active") == await ids("status=open") == (200, [first])
        assert await ids("status=finished") == await ids("status=cancelled") == (200, [second])
        # The requester is a party: the agent filter finds both, newest first.
        assert await ids("agent=Lotbot") == await ids("agent=%40lotbot") == (200, [second, first])
        assert await ids("agent=Mantis&status=cancelled") == (200, [second])
        code, error = await ids("status=opne")
        assert code == 400 and error["code"] == "bad_request"
        assert error["message"].startswith("unknown status 'opne'; use one of: all, active")
        code, error = await ids("offset=10000")
        assert code == 400 and "filter by one status" in error["message"]
        assert await ids("status=done&offset=10000") == (200, [])

"""Helpers for gateway tests: a config with two in-process transports and real Redis.

Lotbot lives on transport ``chat`` (channel ``general``), Mantis and SecurityBot on
transport ``side``; operator ``op`` may cancel. The gateway under test is the real one:
real pipeline, real Redis/Valkey state, real adapters (memory and, where asked, HTTP).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from adapters.base import Outbound, OutboundKind
from adapters.memory import MemoryAdapter
from gateway.app import Gateway
from gateway.config import GatewayConfig
from protocol import build_request, parse, render, reply_response


def make_config(redis_url: str, namespace: str, data_dir: Path, **overrides: Any) -> GatewayConfig:
    """The standard test config; ``overrides`` replace whole top-level sections' keys."""
    data: dict[str, Any] = {
        "gateway": {"data_dir": str(data_dir), "name": "bpgw", "log_format": "text"},
        "state": {
            "redis_url": redis_url,
            "namespace": namespace,
            "sweep_interval_seconds": 3600,
            "purge_interval_seconds": 3600,
        },
        "policy": {},
        "permissions": {"read": ["*"], "operators": ["chat:op"]},
        "agents": {
            "Lotbot": {"addresses": ["chat:main"], "identities": ["chat:u-lot"]},
            "Mantis": {"addresses": ["side:mantis-room"], "identities": ["side:u-mantis"]},
            "SecurityBot": {"addresses": ["side:sec-room"], "identities": ["side:u-sec"]},
        },
        "transports": {"chat": {"kind": "memory"}, "side": {"kind": "memory"}},
    }
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return GatewayConfig.model_validate(data)


@asynccontextmanager
async def running(config: GatewayConfig) -> AsyncIterator[Gateway]:
    """A started gateway, stopped afterwards."""
    gateway = Gateway(config)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


def memory(gateway: Gateway, name: str) -> MemoryAdapter:
    """The memory transport called ``name``."""
    adapter = gateway.adapters[name]
    assert isinstance(adapter, MemoryAdapter)
    return adapter


def sent_to(
    adapter: MemoryAdapter, channel: str, kind: OutboundKind | None = None
) -> list[Outbound]:
    """Everything ``adapter`` sent into ``channel`` (optionally of one kind)."""
    return [
        o for o in adapter.sent if o.address.channel == channel and (kind is None or o.kind is kind)
    ]


def notice_containing(text: str) -> Callable[[Outbound], bool]:
    """Predicate for ``wait_sent``: a notice whose text contains ``text``."""
    return lambda o: o.kind is OutboundKind.NOTICE and text in o.text


async def healthy(base: str, proc: asyncio.subprocess.Process, seconds: float = 30.0) -> bool:
    """Wait until the gateway process ``proc`` answers ``base/healthz`` with 200; False
    when it exits first or ``seconds`` pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession() as http:
        while proc.returncode is None and loop.time() < deadline:
            try:
                async with http.get(f"{base}/healthz") as resp:
                    if resp.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    return False


QUICK_RETRIES: dict[str, Any] = {
    "outbox": {"backoff_base_seconds": 0.05, "backoff_max_seconds": 0.2},
    "replicas": {"lease_seconds": 2},
}
"""Config sections for transport tests: fast outbox retries, short transport leases."""


async def wait_up(gateway: Gateway, name: str) -> None:
    """Until transport ``name`` is up (a lease-run one: once the lease keeper started it;
    the keeper polls every fifth of ``lease_seconds``)."""
    from adapters.base import HealthState

    await wait_state(gateway, name, HealthState.UP)


async def wait_state(gateway: Gateway, name: str, state: Any, within: float = 20.0) -> None:
    """Until transport ``name`` reports health ``state`` (a ``HealthState``)."""
    adapter = gateway.adapters[name]
    deadline = time.monotonic() + within
    while adapter.health().state is not state:
        if time.monotonic() > deadline:
            raise TimeoutError(f"transport {name} not {state}: {adapter.health()}")
        await asyncio.sleep(0.02)


def http_url(gateway: Gateway, transport: str) -> str:
    """The base URL of the gateway's http transport ``transport``."""
    from adapters.http import HttpAdapter

    adapter = gateway.adapters[transport]
    assert isinstance(adapter, HttpAdapter)
    return adapter.url


class HttpAgent:
    """An agent on the HTTP API (``docs/http-api.md``): posts text, long-polls its inbox,
    acknowledging what it read on the next poll."""

    def __init__(self, base: str, name: str, token: str, http: aiohttp.ClientSession) -> None:
        self.base = base
        self.name = name
        self.http = http
        self.auth = {"Authorization": f"Bearer {token}"}
        self.last: str | None = None

    async def post_text(self, text: str) -> dict[str, Any]:
        """``POST /v1/messages``; the disposition."""
        async with self.http.post(f"{self.base}/v1/messages", json={"text": text},
                                  headers=self.auth) as resp:
            body: dict[str, Any] = await resp.json()
            return body

    async def take(self, wait: float) -> list[str]:
        """One poll of the inbox (up to ``wait`` seconds): the texts, oldest first."""
        params = {"wait": str(wait), **({"ack": self.last} if self.last else {})}
        async with self.http.get(f"{self.base}/v1/agents/{self.name}/inbox", params=params,
                                 headers=self.auth) as resp:
            messages = (await resp.json())["messages"]
        if messages:
            self.last = messages[-1]["id"]
        return [m["text"] for m in messages]


def request_block(request_id: str, *, to: str, task: str = "check disk",
                  sender: str = "Peer") -> str:
    """A rendered REQUEST block from ``sender`` to ``to``."""
    return render(build_request(sender=sender, to=to, task=task, request_id=request_id))


def response_block(request: str, sender: str, result: str) -> str:
    """The RESPONSE block answering the block in ``request``."""
    return render(reply_response(parse(request).messages[0], sender=sender, status="success",
                                 result=result))

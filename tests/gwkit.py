"""Helpers for gateway tests: a config with two in-process transports and real Redis.

Lotbot lives on transport ``chat`` (channel ``general``), Mantis and SecurityBot on
transport ``side``; operator ``op`` may cancel. The gateway under test is the real one:
real pipeline, real Redis/Valkey state, real adapters (memory and, where asked, HTTP).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from adapters.base import Outbound, OutboundKind
from adapters.memory import MemoryAdapter
from gateway.app import Gateway
from gateway.config import GatewayConfig


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

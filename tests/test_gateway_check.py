"""The state store rows of `bpgw check` (gateway/check.py) against a private Valkey
whose configuration the test changes (never the machine's Redis)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.check import check_state
from gateway.config import GatewayConfig

from servers import PrivateValkey


def _config(url: str, data_dir: Path | None = None) -> GatewayConfig:
    data: dict[str, dict[str, str]] = {"state": {"redis_url": url}}
    if data_dir is not None:
        data["gateway"] = {"data_dir": str(data_dir)}
    return GatewayConfig.model_validate(data)


async def _set(url: str, **settings: str) -> None:
    client: aioredis.Redis = aioredis.from_url(url)
    try:
        for key, value in settings.items():
            await client.config_set(key.replace("_", "-"), value)
    finally:
        await client.aclose()


async def test_persistence_off_warns_and_evicting_memory_fails(valkey: PrivateValkey) -> None:
    await _set(valkey.url, appendonly="no", save="")
    rows = {row.check: row for row in await check_state(_config(valkey.url))}
    assert rows["state store"].ok and rows["state store"].detail.startswith("Valkey ")
    persistence = rows["state store: persistence"]
    assert persistence.ok and persistence.detail == "off" and "appendonly yes" in persistence.fix
    assert rows["state store: memory"].ok and "no maxmemory" in rows["state store: memory"].detail

    await _set(valkey.url, appendonly="yes", maxmemory="64mb", maxmemory_policy="allkeys-lru")
    rows = {row.check: row for row in await check_state(_config(valkey.url))}
    assert rows["state store: persistence"].detail == "append-only file on"
    assert not rows["state store: persistence"].fix
    memory = rows["state store: memory"]
    assert not memory.ok and "allkeys-lru evicts conversations" in memory.detail
    assert "noeviction" in memory.fix

    await _set(valkey.url, maxmemory_policy="noeviction")
    memory = {row.check: row for row in await check_state(_config(valkey.url))}[
        "state store: memory"]
    assert memory.ok and not memory.fix and "of 64.0 MiB (policy noeviction)" in memory.detail


async def test_embedded_store_without_data_creates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "not-yet"
    rows = await check_state(_config("embedded", data_dir))
    assert rows[0].ok and f"{data_dir / 'valkey'} is created on first run" in rows[0].detail
    assert not data_dir.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any folder")
async def test_embedded_store_in_a_folder_that_can_not_be_created(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        (row,) = await check_state(_config("embedded", locked / "data"))
    finally:
        locked.chmod(0o700)
    assert not row.ok and "can not be created" in row.detail and "--data-dir" in row.fix

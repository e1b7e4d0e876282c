"""Two gateway processes on one private Valkey: a single-connection transport runs on
exactly one of them, and when that process is killed (-9) the other takes it over within
15 seconds (default lease of 10 s)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servers import PrivateValkey, free_port

TESTS = Path(__file__).parent
TAKEOVER_LIMIT_SECONDS = 15.0


def _config(path: Path, redis_url: str, port: int) -> Path:
    path.write_text(
        f"""
[gateway]
data_dir = "{path.parent / "data"}"
log_format = "text"
adapter_modules = ["lease_kit"]

[state]
redis_url = "{redis_url}"
namespace = "failover"

[transports.web]
kind = "http"
port = {port}

[transports.solo]
kind = "solo"
""",
        encoding="utf-8",
    )
    return path


def _log_file(path: Path) -> Any:
    return path.open("wb")  # the child keeps its own descriptor


@pytest.fixture
async def replicas(valkey: PrivateValkey, tmp_path: Path) -> AsyncIterator[list[tuple[Any, str]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    started = []
    for n in range(2):
        folder = tmp_path / f"r{n}"
        folder.mkdir()
        port = free_port()
        log = _log_file(folder / "log")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            "run",
            "--config",
            str(_config(folder / "gw.toml", valkey.url, port)),
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
        )
        log.close()
        started.append((proc, f"http://127.0.0.1:{port}"))
    try:
        yield started
    finally:
        for proc, _ in started:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 20)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _solo_state(http: aiohttp.ClientSession, base: str) -> str:
    try:
        async with http.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return str((await resp.json())["transports"]["solo"]["state"])
    except (aiohttp.ClientError, TimeoutError):
        return "unreachable"


async def test_lease_holder_killed_the_other_takes_over(
    replicas: list[tuple[Any, str]],
) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 60
        while True:
            states = [await _solo_state(http, base) for _, base in replicas]
            if sorted(states) == ["standby", "up"]:
                break
            assert time.monotonic() < deadline, f"no single holder: {states}"
            await asyncio.sleep(0.2)
        for _ in range(10):  # a while later: still exactly one
            await asyncio.sleep(0.3)
            states = [await _solo_state(http, base) for _, base in replicas]
            assert sorted(states) == ["standby", "up"], states
        holder = states.index("up")
        proc, _ = replicas[holder]
        _, survivor = replicas[1 - holder]
        proc.kill()  # SIGKILL: no chance to release the lease
        killed_at = time.monotonic()
        await proc.wait()
        while await _solo_state(http, survivor) != "up":
            took = time.monotonic() - killed_at
            assert took < TAKEOVER_LIMIT_SECONDS, f"no takeover after {took:.1f}s"
            await asyncio.sleep(0.1)
        took = time.monotonic() - killed_at
        print(f"takeover after {took:.1f}s")
        assert took > 1.0  # it really waited for the dead holder's lease to expire

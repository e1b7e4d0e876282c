"""Inotify-style change events through ``watchfiles``, as a hint on top of polling.

Events only make the next poll sooner and tell the scanner which items to look at; the
poll itself stays the source of truth, because synced network folders often deliver no
events at all. When ``watchfiles`` is missing or the OS refuses a watch (inotify
limits), ``Watcher.active`` turns False and the bridge keeps polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(f"bpgw.{__name__}")


class Watcher:
    """Runs ``watchfiles.awatch`` on a folder and reports changed paths to ``on_paths``."""

    def __init__(self, root: Path, on_paths: Callable[[Iterable[str]], None]) -> None:
        self.root = root
        self.on_paths = on_paths
        self.active = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> bool:
        """Begin watching; False (and polling only) when watching is not possible here."""
        try:
            import watchfiles  # noqa: F401
        except ImportError:
            log.warning("watchfiles is not installed; AINET folder %s is polled only", self.root)
            return False
        self.active = True
        self._task = asyncio.create_task(self._run(), name=f"ainet-watch:{self.root}")
        return True

    async def _run(self) -> None:
        from watchfiles import awatch

        try:
            async for changes in awatch(self.root, stop_event=self._stop, debounce=50, step=20,
                                        ignore_permission_denied=True):
                self.on_paths(path for _, path in changes)
        except (OSError, RuntimeError) as exc:
            log.warning("watching %s failed (%s); polling only", self.root, exc)
        finally:
            self.active = False

    async def stop(self) -> None:
        """Stop watching; safe to call twice."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

"""Find new or changed message files in the workspace cheaply (blocking: call off-loop).

What is watched: ``session/`` and ``tasks/`` (for new entries), every
``tasks/task-*/conversation/`` folder (new turn files; turns are never rewritten) and
every ``session/*.txt`` file (AINET rewrites a pair's file in place, which changes no
folder's mtime).

The per-poll cost does not grow with old files: a folder is listed again only when its
mtime changed (or is too recent to trust, like git's "racy" index entries), and watched
items that have not changed for ``hot_seconds`` go into a cold rotation of which only
``cold_per_poll`` are checked per poll. Items named by a watcher event (``mark_dirty``)
or by the bridge's own writes are checked at the next poll.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from adapters.ainet.fsio import TEMP_PREFIX
from adapters.ainet.workspace import CONVERSATION, SESSION, STATUS_FILE, TASKS, turn_number
from protocol.text import lone_surrogate

log = logging.getLogger("bpgw.adapters.ainet")

RACY_NS = 2_000_000_000
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class Candidate:
    """A file that is new or changed since it was last handed out."""

    rel: str
    path: Path
    size: int
    mtime_ns: int


@dataclass
class _Item:
    path: Path
    rel: str
    is_folder: bool
    sig: tuple[int, int] | None = None  # (mtime_ns, size) when last looked at
    listed_at_ns: int = 0
    changed_at: float = 0.0
    names: set[str] = field(default_factory=set)  # folder entries already handed out


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class Scanner:
    """Change detection over the AINET layout with a bounded cost per poll."""

    def __init__(self, root: Path, *, hot_seconds: float = 60.0, cold_per_poll: int = 64,
                 max_items: int = 100_000) -> None:
        self.root = root.resolve()
        self.hot_seconds = hot_seconds
        self.cold_per_poll = cold_per_poll
        self.max_items = max_items
        self._items: dict[str, _Item] = {}
        self._hot: set[str] = set()
        self._cold: deque[str] = deque()
        self._dirty: set[str] = set()
        self.checks = 0  # items looked at in the last poll (for the benchmark and tests)
        for rel in (SESSION, TASKS):
            self._add(rel, is_folder=True)

    def _add(self, rel: str, *, is_folder: bool) -> None:
        if rel in self._items or len(self._items) >= self.max_items:
            return
        self._items[rel] = _Item(self.root / rel, rel, is_folder)
        self._hot.add(rel)

    def mark_dirty(self, paths: Iterable[str]) -> None:
        """Check the items at or above these absolute paths at the next poll (watch events)."""
        for raw in paths:
            try:
                rel = Path(raw).resolve().relative_to(self.root).as_posix()
            except ValueError:
                continue
            while rel and rel != ".":
                if rel in self._items:
                    self._dirty.add(rel)
                    break
                rel = rel.rpartition("/")[0]

    def note_handled(self, rel: str, size: int, mtime_ns: int) -> None:
        """The bridge wrote or ingested ``rel`` at this stat: don't hand it out again."""
        folder, _, name = rel.rpartition("/")
        item = self._items.get(rel)
        if item is not None:
            item.sig = (mtime_ns, size)
        parent = self._items.get(folder)
        if parent is not None:
            parent.names.add(name)

    def poll(self) -> list[Candidate]:
        """Look at hot, dirty and a slice of cold items; return new or changed files."""
        batch = self._hot | self._dirty
        self._dirty.clear()
        for _ in range(min(self.cold_per_poll, len(self._cold))):
            batch.add(self._cold.popleft())
        found: list[Candidate] = []
        cool_before = time.time() - self.hot_seconds
        for rel in sorted(batch):
            item = self._items.get(rel)
            if item is None:
                continue
            self._check(item, found)
            if item.sig is None and item.changed_at and not item.is_folder:
                self._forget(item)  # a session file that was deleted
            elif item.changed_at < cool_before:
                self._hot.discard(rel)
                self._cold.append(rel)
            else:
                self._hot.add(rel)
        self.checks = len(batch)
        return found

    def _forget(self, item: _Item) -> None:
        del self._items[item.rel]
        self._hot.discard(item.rel)
        folder, _, name = item.rel.rpartition("/")
        parent = self._items.get(folder)
        if parent is not None:
            parent.names.discard(name)

    def _check(self, item: _Item, found: list[Candidate]) -> None:
        sig = _stat(item.path)
        if sig != item.sig:
            # First sight of an old item: it has been quiet since its mtime, not since now.
            item.changed_at = sig[0] / 1e9 if item.sig is None and sig else time.time()
        if not item.is_folder:
            if sig != item.sig and sig is not None:
                found.append(Candidate(item.rel, item.path, sig[1], sig[0]))
        elif sig is not None and (sig != item.sig or item.listed_at_ns - sig[0] < RACY_NS):
            item.listed_at_ns = time.time_ns()
            self._list(item, found)
        item.sig = sig

    def _add_and_check(self, rel: str, is_folder: bool, parent: _Item,
                       found: list[Candidate]) -> None:
        """Track a newly listed item and look at it in this same poll."""
        self._add(rel, is_folder=is_folder)
        parent.names.add(rel.split("/")[1])
        item = self._items.get(rel)
        if item is not None:
            self._check(item, found)

    def _list(self, folder: _Item, found: list[Candidate]) -> None:
        # Listed through a descriptor opened without following a final symbolic link, so a
        # link planted where a folder should be can't make us list a folder outside.
        try:
            fd = os.open(folder.path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
        except OSError:
            return
        try:
            with os.scandir(fd) as entries:
                self._take(folder, entries, found)
        finally:
            os.close(fd)

    def _take(self, folder: _Item, entries: Iterator[os.DirEntry[str]],
              found: list[Candidate]) -> None:
        for entry in entries:
            name = entry.name
            if name in folder.names or name.startswith((".", TEMP_PREFIX)):
                continue
            if lone_surrogate(name) is not None:
                # Bytes that are not UTF-8 (os.fsdecode keeps them as lone surrogates):
                # such a name can be neither recorded nor answered. Skipped, and told once
                # (its name stays in the listed names while the folder is tracked).
                folder.names.add(name)
                log.warning("ainet: skipped %s/%r: its name is not valid UTF-8", folder.rel,
                            os.fsencode(name))
                continue
            rel = f"{folder.rel}/{name}"
            if folder.rel == TASKS:
                if name.startswith("task-") and entry.is_dir(follow_symlinks=False):
                    self._add_and_check(f"{rel}/{CONVERSATION}", True, folder, found)
            elif folder.rel == SESSION:
                if (name.endswith(".txt") and name != STATUS_FILE
                        and entry.is_file(follow_symlinks=False)):
                    self._add_and_check(rel, False, folder, found)
            elif turn_number(name) is not None and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                folder.names.add(name)
                found.append(Candidate(rel, folder.path / name, st.st_size, st.st_mtime_ns))

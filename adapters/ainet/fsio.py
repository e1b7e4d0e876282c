"""File primitives for a shared folder other programs write too (blocking: call off-loop).

- ``write_atomic`` replaces a file through a temporary file and a rename in the same folder,
  so a reader sees the old or the new content, never a mix.
- ``create_exclusive`` creates a file only when the name is free and never overwrites:
  the content goes to a temporary file which is then hard-linked to the final name (link
  fails when the name exists, and the file appears complete). Where the file system has
  no hard links (some synced or FAT-like folders) it falls back to ``O_CREAT|O_EXCL`` and
  writes in place; readers then see a growing file, which the inbox tolerates.
- ``read_bounded`` reads at most a limit, never through a symbolic link.
- ``inside`` builds a path from checked components and proves it stays in the root.

Temporary files start with ``.bpgw-`` and end in ``.tmp``; listings skip dot-files.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from adapters.ainet.names import UnsafeNameError, check_component

TEMP_PREFIX = ".bpgw-"
TEMP_SUFFIX = ".tmp"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ENOSYS, errno.EMLINK}


def inside(root: Path, *parts: str) -> Path:
    """``root/part/...`` after checking every part; raise ``UnsafeNameError`` otherwise.

    ``root`` must already be resolved. The result is also compared against ``root`` as a
    second line of defence.
    """
    path = root
    for part in parts:
        path = path / check_component(part, "a path component")
    if os.path.commonpath([root, path]) != str(root):
        raise UnsafeNameError(f"{path} is outside the workspace")
    return path


def _temp_name() -> str:
    return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}"


def _write_temp(folder: Path, data: bytes) -> Path:
    temp = folder / _temp_name()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    return temp


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (replaces)."""
    temp = _write_temp(path.parent, data)
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless the name exists; False when it does."""
    return create_first_free(path.parent, data, (path.name,)) is not None


def create_first_free(folder: Path, data: bytes, names: Iterable[str]) -> str | None:
    """Create the first of ``names`` that is free in ``folder``; None when none was.

    The content is written once to a temporary file and hard-linked under each candidate
    in turn, so racing writers each get a distinct name and nothing is ever overwritten.
    """
    temp = _write_temp(folder, data)
    links = True
    try:
        for name in names:
            if links:
                try:
                    os.link(temp, folder / name, follow_symlinks=False)
                    return name
                except FileExistsError:
                    continue
                except OSError as exc:
                    if exc.errno not in _NO_LINKS:
                        raise
                    links = False
            if _create_in_place(folder / name, data):
                return name
        return None
    finally:
        temp.unlink(missing_ok=True)


def _create_in_place(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    return True


def read_bounded(path: Path, limit: int) -> bytes | None:
    """Up to ``limit + 1`` bytes of the regular file ``path``; None when it is not one.

    Reading one byte past the limit lets the caller tell "too large" from "at the limit".
    Symbolic links are refused (``O_NOFOLLOW``), so a link can't point the reader outside.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def ensure_folder(path: Path) -> None:
    """Create ``path`` (and parents) unless it exists; refuse a symbolic link in its place."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise UnsafeNameError(f"{path} is not a plain folder")

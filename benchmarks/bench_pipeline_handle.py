"""The gateway's message path without its I/O, counted exactly: ``Pipeline.handle`` of
bench_e2e's REQUEST, its store round trip faked; one JSON object per line.

bench_gateway_path.py counts the whole hot path, whose batches (and so its count) move by
about 1% from run to run with the host's pace. This counts the part that does not wait:
the gateway (bench_e2e's config, on a private Valkey) handles one message through the real
store first, then ``--messages`` times the same envelope with the store's script call
answered at once with the record the client wrote (what apply.lua answers a message that
opens a conversation with), so no ``handle`` suspends and each is driven by hand. Under
callgrind, collecting only inside the loop, the total over ``--messages`` is the
instructions per message, the same to a few hundred from run to run:

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=map_next \\
        python benchmarks/bench_pipeline_handle.py --messages 1000
    # (the loop is the only map over the messages; name the interpreter itself, not a
    # shell shim such as pyenv's)

Without valgrind it reports the CPU µs per ``handle`` (noisy on a busy VM).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_e2e import RECIPIENT, Load, write_config

from _common import emit, free_port, private_valkey, repo_on_path

REPO = repo_on_path()

from adapters.base import Disposition, Envelope  # noqa: E402
from gateway.agents import _Cache  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.cli.run_cmds import GC_YOUNG_THRESHOLD  # noqa: E402
from gateway.config import load_config  # noqa: E402
from state.frozen import maker  # noqa: E402

SENDER = "S00"


async def _measure(tmp: Path, messages: int) -> float:
    tokens = {name: f"tok-{name}-0123456789" for name in (SENDER, RECIPIENT)}
    with private_valkey(tmp) as valkey:
        config = tmp / "gateway.toml"
        write_config(config, data_dir=tmp / "data", namespace="handle", port=free_port(),
                     redis_url=f"redis://127.0.0.1:{valkey.port}", tokens=tokens)
        gateway = Gateway(load_config(config))
        await gateway.start()
        try:
            return await _run(gateway, tokens, messages)
        finally:
            await gateway.stop()


async def _run(gateway: Gateway, tokens: dict[str, str], messages: int) -> float:
    _, text, _ = Load([], tokens, [SENDER], []).next_post()
    caller = gateway.adapters["http"]._auth.identify(f"Bearer {tokens[SENDER]}")
    make = maker(Envelope)

    def envelope() -> Envelope:
        return make(transport="http", channel=caller.name, author=caller.author, text=text,
                    thread=None, native_id="0123456789abcdef0000000000000001")

    # The directory's memory lasts seconds; valgrind's pace must not make it look up
    # names in Redis (a suspended handle) half way through.
    for cache in vars(gateway._directory).values():
        if isinstance(cache, _Cache):
            cache._seconds = float("inf")
    first = await gateway.pipeline.handle(envelope())  # through the real store
    if first.outcome != "accepted":
        raise RuntimeError(f"the warm-up message was not accepted: {first}")

    async def answered(*, keys: list[str], args: list[Any]) -> Any:
        return args[3]  # the new record the client wrote, as apply.lua answers it

    store = gateway._store
    store._apply_one = answered
    pipeline = gateway.pipeline

    def handle(_: int) -> Disposition:
        step = pipeline.handle(envelope())
        try:
            step.send(None)
        except StopIteration as done:
            return done.value
        step.close()
        raise RuntimeError("handle waited for something: nothing to count")

    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    cpu = time.process_time()
    list(map(handle, range(messages)))  # the only map over the messages (see above)
    return (time.process_time() - cpu) / messages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000, help="handles counted")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bpgw-bench-handle-") as folder:
        per_message = asyncio.run(_measure(Path(folder), args.messages))
    emit("pipeline_handle_cpu_per_message", 1e6 * per_message, "us", messages=args.messages,
         note="CPU of Pipeline.handle with the store's round trip faked; for A/B, count "
         "instructions under callgrind instead (see the docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

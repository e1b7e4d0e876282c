"""Protocol parser/renderer benchmark: one JSON object per line (name, value, unit, target).

Run: ``python benchmarks/bench_protocol.py``. Each figure is the best of several timed runs
(time.perf_counter) of enough iterations to last about 0.2 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol import parse, render

from _common import emit

REQUEST = """```
[REQUEST → @Mantis]
From: Lotbot
RequestId: lotbot-8f2d4e
Task: Check disk usage on build-01
Context: nightly audit
Depth: 1/5
Priority: normal
```"""

_RESULT_LINE = "/dev/sda1 91% used, 12 GiB free, mounted on /var/lib/build"
RESPONSE_4K = (
    "```\n[RESPONSE → @Lotbot]\nFrom: Mantis\nRequestId: lotbot-8f2d4e\nStatus: done\nResult: "
    + "\n  ".join([_RESULT_LINE] * (4096 // (len(_RESULT_LINE) + 3)))
    + "\nDepth: 2/5\n```"
)
CHAT = ("Hi Mantis, could you look at build-01 when you have a minute? " * 4)[:200]
BIG_LIMIT = 1 << 24  # large enough that the parser really reads the adversarial blocks


def adversarial(size: int) -> dict[str, str]:
    """Inputs of about ``size`` bytes built to punish backtracking or quadratic code."""
    header = "```\n[REQUEST → @a]\n"
    return {
        "one_long_line_no_newline": "```" + "x" * (size - 3),
        "key_spaces_cr": header + "Key:" + " " * (size - 40) + "x\ry\n```",
        "many_empty_keys": header + "A:\n" * ((size - 30) // 3) + "```",
    }


def best_seconds_per_op(func: Callable[[], object], runs: int = 5) -> float:
    """Best (smallest) time per call over ``runs`` runs of a calibrated iteration count."""
    iterations = 1
    while True:
        start = time.perf_counter()
        for _ in range(iterations):
            func()
        elapsed = time.perf_counter() - start
        if elapsed >= 0.2:
            break
        iterations *= 2
    best = elapsed / iterations
    for _ in range(runs - 1):
        start = time.perf_counter()
        for _ in range(iterations):
            func()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def throughput(name: str, func: Callable[[], object], target: str | None = None) -> None:
    seconds = best_seconds_per_op(func)
    emit(f"{name}_ops", 1 / seconds, "ops/s", target, passed=_passes(1 / seconds, target))
    emit(f"{name}_latency", seconds * 1e6, "us/op")


def _passes(value: float, target: str | None) -> bool | None:
    if target is None:
        return None
    operator, number = target.split(" ", 1)
    limit = float(number.replace(",", ""))
    return value >= limit if operator == ">=" else value <= limit


def main() -> None:
    assert parse(REQUEST).messages and parse(RESPONSE_4K).messages
    throughput("parse_request_7_lines", lambda: parse(REQUEST), ">= 100000")
    throughput("parse_response_4kb_result", lambda: parse(RESPONSE_4K))
    throughput("parse_chat_200b_no_fence", lambda: parse(CHAT), ">= 2000000")
    (request,) = parse(REQUEST).messages
    throughput("render_request_7_lines", lambda: render(request))

    small, large = adversarial(16 * 1024), adversarial(64 * 1024)
    for case in small:
        for limit_name, limit in (("default_limit", 65536), ("big_limit", BIG_LIMIT)):
            times = {}
            for size_name, text in (("16kb", small[case]), ("64kb", large[case])):
                # More runs than the throughput cases: the ratio of two ms-scale timings is
                # sensitive to one noisy run.
                seconds = best_seconds_per_op(
                    lambda t=text, m=limit: parse(t, max_block_bytes=m), runs=9
                )
                times[size_name] = seconds
                target = "<= 10" if size_name == "64kb" else None
                ms = seconds * 1e3
                outcome = parse(text, max_block_bytes=limit)
                emit(
                    f"parse_adversarial_{case}_{size_name}_{limit_name}",
                    ms,
                    "ms/parse",
                    target,
                    passed=_passes(ms, target),
                    errors=sorted({error.code for error in outcome.errors}),
                )
            ratio = times["64kb"] / times["16kb"]
            emit(
                f"parse_adversarial_{case}_{limit_name}_ratio_64kb_16kb",
                ratio,
                "ratio",
                "<= 4.5",
                passed=_passes(ratio, "<= 4.5"),
            )


if __name__ == "__main__":
    main()

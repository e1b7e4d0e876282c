"""Running ``bpgw`` as a real subprocess (``python -m gateway.cli`` from this checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a ``bpgw`` subprocess: this checkout first on the path, no
    ``BPGW_*`` overrides leaking in from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    return {**env, "PYTHONPATH": str(ROOT), **(extra or {})}


def bpgw(
    *args: str,
    stdin: str | bytes = b"",
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``bpgw ARGS`` to completion; stdout and stderr as text."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        input=data,
        capture_output=True,
        cwd=cwd,
        env=cli_env(env),
        timeout=timeout,
        check=False,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )

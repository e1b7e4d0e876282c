"""Gateways as real subprocesses (``python -m gateway.cli run``) for fault tests.

A test writes a config with ``write_config`` (a dict of TOML tables), starts one or more
``GatewayProcess``es on it, and talks to them over HTTP with the client helpers here:
``Poster`` (POST /v1/messages, retrying what was not answered 2xx) and ``InboxReader``
(long-polls an inbox, acknowledges, counts by message id). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from protocol import Message, parse, render

from gwkit import healthy

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def scaled(count: int) -> int:
    """``count`` times ``BPGW_FAULT_SCALE`` (default 1: the issue's numbers), at least 1.

    Lets a slow machine run the fault tests smaller, or a soak run them bigger.
    """
    return max(1, round(count * float(os.environ.get("BPGW_FAULT_SCALE", "1"))))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _tables(prefix: str, data: Mapping[str, Any]) -> Iterable[str]:
    scalars = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    if prefix and (scalars or not tables):
        yield f"[{prefix}]"
    for key, value in scalars.items():
        yield f"{key} = {_toml_value(value)}"
    for key, value in tables.items():
        yield from _tables(f"{prefix}.{key}" if prefix else key, value)


def write_config(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` (nested dicts = tables) as the TOML config file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(_tables("", data)) + "\n", encoding="utf-8")
    return path


def two_transports(ports: tuple[int, int], tokens: Mapping[str, str], **side: Any
                   ) -> dict[str, Any]:
    """Config tables: Lotbot posts on http transport ``web``, Mantis reads its inbox on
    another http transport ``side`` (``side`` options added), so messages cross transports.
    """
    return {
        "agents": {
            "Lotbot": {"addresses": ["web:Lotbot"], "identities": ["web:Lotbot"]},
            "Mantis": {"addresses": ["side:Mantis"], "identities": ["side:Mantis"]},
        },
        "transports": {
            "web": {"kind": "http", "port": ports[0], "tokens": {"Lotbot": tokens["Lotbot"]}},
            "side": {"kind": "http", "port": ports[1], "tokens": {"Mantis": tokens["Mantis"]},
                     **side},
        },
    }


class GatewayProcess:
    """One ``bpgw run`` process on ``config``, answering HTTP at ``base``."""

    def __init__(self, config: Path, base: str) -> None:
        self.config = config
        self.base = base
        self.log = config.parent / "gateway.log"
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc is not None and self.proc.returncode is None

    async def start(self, *, ready_within: float = 30.0) -> GatewayProcess:
        """Start it and wait until ``/healthz`` answers 200."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
        # This checkout's code whatever is installed, and test-only transport kinds.
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "run", "--config", str(self.config),
                stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env, cwd=self.config.parent,
            )
        assert await healthy(self.base, self.proc, ready_within), f"not healthy: {self.tail()}"
        return self

    async def health(self, http: aiohttp.ClientSession) -> tuple[int, dict[str, str], Any]:
        """(status, headers, body) of ``GET /healthz``; status 0 when nothing answered."""
        try:
            async with http.get(f"{self.base}/healthz",
                                timeout=aiohttp.ClientTimeout(total=3)) as resp:
                return resp.status, dict(resp.headers), await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return 0, {}, None

    async def health_status(self, http: aiohttp.ClientSession) -> int:
        """Just the status of ``GET /healthz`` (0 when nothing answered)."""
        return (await self.health(http))[0]

    def kill(self) -> None:
        """``kill -9``: no chance to clean up."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self, within: float = 20.0) -> None:
        """SIGTERM, then SIGKILL when it does not exit within ``within`` seconds."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), within)
            except TimeoutError:
                self.proc.kill()
        await self.proc.wait()

    def tail(self, chars: int = 3000) -> str:
        """The end of the process's log (for assertion messages)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def bearer(token: str) -> dict[str, str]:
    """The Authorization header of ``token``."""
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Poster:
    """Posts messages over HTTP; remembers which got a 2xx and what else was answered."""

    http: aiohttp.ClientSession
    ok: set[str] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)

    async def post(self, base: str, token: str, msg: Message) -> bool:
        """POST ``msg``; True when the gateway answered 2xx (accepted or already accepted).

        A 503 must carry Retry-After; anything but 2xx/503 or no answer fails the test
        unless it is a connection error (the gateway is down).
        """
        try:
            async with self.http.post(
                f"{base}/v1/messages", json={"text": render(msg)}, headers=bearer(token),
                timeout=aiohttp.ClientTimeout(total=15),
            ) as resp:
                body = await resp.json()
                self.answers[f"{resp.status}:{body.get('outcome')}"] += 1
                if resp.status == 200:
                    assert body["outcome"] in ("accepted", "duplicate"), body
                    self.ok.add(msg.request_id)
                    return True
                assert resp.status == 503, (resp.status, body)
                assert resp.headers.get("Retry-After"), "a 503 without Retry-After"
                return False
        except (aiohttp.ClientError, TimeoutError):
            self.answers["no answer"] += 1
            return False


@dataclass
class InboxReader:
    """Reads one agent's inbox to the end, acknowledging, counting by message id."""

    http: aiohttp.ClientSession
    agent: str
    token: str
    ids: Counter[str] = field(default_factory=Counter)
    messages: list[dict[str, Any]] = field(default_factory=list)
    _ack: str = ""

    async def poll(self, base: str, wait: float = 1.0) -> int:
        """One long-poll (acknowledging what the previous one returned); how many came."""
        params = {"wait": str(wait), "max": "1000", **({"ack": self._ack} if self._ack else {})}
        try:
            async with self.http.get(
                f"{base}/v1/agents/{self.agent}/inbox", params=params,
                headers=bearer(self.token), timeout=aiohttp.ClientTimeout(total=wait + 10),
            ) as resp:
                if resp.status != 200:
                    return 0
                got = (await resp.json())["messages"]
        except (aiohttp.ClientError, TimeoutError):
            return 0
        for m in got:
            self.ids[m["id"]] += 1
            self.messages.append(m)
        if got:
            self._ack = got[-1]["id"]
        return len(got)

    async def read_until(self, bases: list[str], count: int, within: float) -> None:
        """Poll (round-robin over ``bases``) until ``count`` distinct messages came or time
        is up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        turn = 0
        while len(self.ids) < count and loop.time() < deadline:
            await self.poll(bases[turn % len(bases)])
            turn += 1
        await self.poll(bases[0], wait=0.5)  # anything extra (a double) shows up too

    def stored(self) -> dict[str, set[str]]:
        """Per RequestId of a protocol message, the inbox message ids it came under: one
        each when it was stored once (however often it was handed out again)."""
        found: dict[str, set[str]] = {}
        for m in self.messages:
            if m["kind"] == "protocol":
                found.setdefault(parse(m["text"]).messages[0].request_id, set()).add(m["id"])
        return found

    def protocol_ids(self, kind: str = "protocol") -> Counter[str]:
        """How many times each RequestId arrived as a message of ``kind``."""
        counts: Counter[str] = Counter()
        for m in self.messages:
            if m["kind"] == kind:
                counts[parse(m["text"]).messages[0].request_id if kind == "protocol"
                       else m["request_id"]] += 1
        return counts

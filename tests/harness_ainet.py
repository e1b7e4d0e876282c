"""Contract harness of the ``ainet`` transport: agent ``Peer`` is a plain AINET agent
(``ainet_peer``, written from the v0.3 rules alone) on a temporary shared folder; its
channel is its agent id. What the gateway "posted" to it are the bridge's conversation
turns addressed to it; what it posts are its own turns to the bridge.

The folder is no chat room: the bridge never hands its own files to the gateway (they
are filtered before, see tests/test_ainet_bridge.py), so the two echo checks are skipped.
AINET has no message length limit of its own (the bridge bounds files by
``max_message_bytes``), so ``max_length`` is None.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from adapters.ainet import AinetAdapter
from adapters.base import Address, HealthState, Outbound, OutboundKind
from gateway.app import Gateway

from ainet_peer import PlainAgent, conv, read_message
from contract_harness import TRANSPORT, Harness, Posted, register_harness

ME = "Device-contract01/网关"
PEER = "Device-peerC0NT/Peer"
SPOOL_MAX = 3


class AinetHarness:
    """Plays agent ``Peer`` on the shared folder."""

    kind = "ainet"
    channel = PEER
    peer = PEER
    max_length = None
    echoes_own_posts = False

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._agent = PlainAgent(folder / "shared", PEER)
        self._adapter: AinetAdapter | None = None

    def options(self) -> dict[str, Any]:
        return {"workspace": str(self._folder / "shared"), "create_workspace": True,
                "state_dir": str(self._folder / "state"), "agent_id": ME,
                "discovery": "poll", "poll_interval_seconds": 0.05, "settle_seconds": 0.0,
                "max_spool_per_slot": SPOOL_MAX, "agents": {PEER: "Peer"}}

    def peer_agent(self) -> dict[str, Any]:
        return {}  # the transport's ``agents`` option makes Peer an agent at t:<PEER>

    async def connected(self, gateway: Gateway) -> None:
        adapter = gateway.adapters[TRANSPORT]
        assert isinstance(adapter, AinetAdapter)
        assert adapter.health().state is HealthState.UP
        self._adapter = adapter

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        assert not files, "an AINET message file carries text only"
        self._agent.next_turn("contract", ME, text)

    async def posted(self) -> list[Posted]:
        turns = [(p.stat().st_mtime_ns, p) for p in
                 (self._folder / "shared" / "tasks").glob(f"task-*/conversation/*-{conv(ME)}.txt")]
        found = []
        for _, path in sorted(turns):
            message = read_message(path)
            if message["TO"] == PEER:
                found.append(Posted(message["Content"]))
        return found

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        assert self._adapter is not None
        # Peer never answers: its session slot stays taken and the spool fills up.
        for n in range(SPOOL_MAX + 1):
            await self._adapter.send(Outbound(Address(TRANSPORT, PEER), f"filler {n}",
                                              kind=OutboundKind.NOTICE))
        return "inbox_full", 5.0


@register_harness("ainet")
@asynccontextmanager
async def ainet_harness() -> AsyncIterator[Harness]:
    """No emulator needed: the platform is a folder; the harness is a plain AINET agent."""
    folder = Path(tempfile.mkdtemp(prefix="bpgw-contract-ainet-"))
    try:
        yield AinetHarness(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

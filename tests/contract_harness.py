"""Harnesses for the shared transport contract suite (tests/test_transport_contract.py).

Every transport runs the same contract checks against its real library and its emulator.
To add a transport, write ``tests/harness_<kind>.py`` with a class implementing
``Harness`` (a chat platform's may build on ``ChatHarness``) and register it::

    register_emulated("telegram", TelegramEmulator, TelegramHarness)

(the emulator on 127.0.0.1 runs for one test and the harness drives it), or register any
factory of an async context manager yielding a ``Harness`` with ``register_harness``.
``load_harnesses`` imports every ``harness_*.py`` beside this file, so the suite picks it
up without further edits. The suite runs a real gateway on real Redis with the transport
under test as ``t`` and a memory transport ``side``; agent ``Peer`` is another bot on the
platform (its identity ``t:<peer>``, its address ``t:<channel>``), ``Mantis`` lives on
``side``.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.app import Gateway

from gwkit import wait_up

TRANSPORT = "t"
"""The name of the transport under test in the suite's config."""


@dataclass(frozen=True)
class Posted:
    """One message as the platform shows it: its text and attached files (name, content)."""

    text: str
    files: tuple[tuple[str, str], ...] = ()

    def whole(self) -> str:
        """The text followed by every file's content: what a reader of the message sees."""
        return "\n".join([self.text, *(content for _, content in self.files)])


class Harness(Protocol):
    """Drives one transport's platform (its emulator) for the contract suite."""

    kind: str
    # The channel the gateway posts in and ``Peer`` posts from.
    channel: str
    # The platform's native id of ``Peer``, another bot.
    peer: str
    # The platform's message length limit the transport must honour (None: no limit).
    max_length: int | None
    # Whether the platform shows the gateway's own posts back to it (chat platforms do;
    # inbox transports do not, and the two echo checks are skipped for them).
    echoes_own_posts: bool

    def options(self) -> dict[str, Any]:
        """The transport's options (``[transports.t]``), pointing at the emulator."""

    def peer_agent(self) -> dict[str, Any]:
        """``[agents.Peer]`` for this platform (empty when the transport's own config
        declares Peer, like an HTTP token)."""

    async def connected(self, gateway: Gateway) -> None:
        """Return once the started gateway's transport ``t`` is up and reachable."""

    async def post(self, text: str, files: tuple[tuple[str, str], ...] = ()) -> None:
        """``Peer`` posts ``text`` (with files) in ``channel``."""

    async def posted(self) -> list[Posted]:
        """What the gateway posted in ``channel`` so far, oldest first."""

    async def block(self, gateway: Gateway) -> tuple[str, float]:
        """Make deliveries into ``channel`` fail as the platform does when it refuses
        (a 429, a full inbox); the ``DeliveryError`` code and least retry-after expected."""


class ChatHarness:
    """What chat-platform harnesses share: ``Peer`` is another bot posting in ``channel``
    (its identity and address on transport ``t``), connected once ``t`` is up."""

    channel: str
    peer: str

    def peer_agent(self) -> dict[str, Any]:
        return {"addresses": [f"{TRANSPORT}:{self.channel}"],
                "identities": [f"{TRANSPORT}:{self.peer}"]}

    async def connected(self, gateway: Gateway) -> None:
        await wait_up(gateway, TRANSPORT)


HarnessFactory = Callable[[], AbstractAsyncContextManager[Harness]]

HARNESSES: dict[str, HarnessFactory] = {}


def register_harness(name: str) -> Callable[[HarnessFactory], HarnessFactory]:
    """Register a harness factory under ``name`` (the suite's parameter id)."""

    def decorate(factory: HarnessFactory) -> HarnessFactory:
        HARNESSES[name] = factory
        return factory

    return decorate


def register_emulated(
    name: str, emulator: Callable[[], AbstractAsyncContextManager[Any]],
    harness: Callable[[Any], Harness],
) -> None:
    """Register ``harness(emu)`` for a platform whose emulator runs for one test
    (``async with emulator() as emu``)."""

    @asynccontextmanager
    async def factory() -> AsyncIterator[Harness]:
        async with emulator() as emu:
            yield harness(emu)

    HARNESSES[name] = factory


def load_harnesses() -> Mapping[str, HarnessFactory]:
    """Import every ``tests/harness_*.py`` (each registers itself) and return the registry."""
    for path in sorted(Path(__file__).parent.glob("harness_*.py")):
        importlib.import_module(path.stem)
    return HARNESSES

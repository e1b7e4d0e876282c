"""Transport kind ``memory``: an in-process transport for tests and ``bpgw demo``.

Nothing leaves the process: ``inject`` plays a native message into the gateway,
``command`` runs an operator command, and everything the gateway sends is kept in
``sent`` (one ``Outbound`` per chunk, as a platform would show it), where ``wait_sent``
waits for it without polling.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adapters.base import (
    Adapter,
    Author,
    Capabilities,
    CommandRequest,
    CommandResult,
    CommitHook,
    DeliveryError,
    Disposition,
    Envelope,
    GatewaySink,
    HealthState,
    Outbound,
    Receipt,
    register_adapter,
)
from adapters.options import load_options

SentPredicate = Callable[[Outbound], bool]


class MemorySettings(BaseModel):
    """Options of one ``memory`` transport."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The channels that exist; None means any channel name is accepted.
    channels: list[str] | None = Field(default=None, min_length=1)
    # Split outbound text longer than this (None: never split).
    max_message_length: int | None = Field(default=None, ge=1)


@register_adapter("memory")
class MemoryAdapter(Adapter):
    """An in-process transport whose traffic tests drive and inspect directly."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings = load_options(MemorySettings, name, options)
        self.capabilities = Capabilities(
            max_message_length=self.settings.max_message_length, threads=True
        )
        self.channels = frozenset(self.settings.channels or ())
        self.sent: list[Outbound] = []
        # Native ids of each ``sent`` entry, index for index (a platform's message ids).
        self.sent_ids: list[str] = []
        self.received: list[Envelope] = []
        self._claimed: set[int] = set()
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(4)
        self._sink: GatewaySink | None = None

    def _new_id(self) -> str:
        # Unique across instances: a restarted gateway must not reuse a claimed id.
        return f"{self.name}-{self._id_prefix}-{next(self._ids)}"

    def _check_channel(self, channel: str, error: type[Exception] = ValueError) -> None:
        if self.channels and channel not in self.channels:
            known = ", ".join(sorted(self.channels))
            raise error(f"memory transport {self.name} has no channel {channel!r} (has: {known})")

    @property
    def sink(self) -> GatewaySink:
        """The gateway this transport feeds (set by ``start``)."""
        if self._sink is None:
            raise RuntimeError(f"memory transport {self.name} has not been started")
        return self._sink

    async def start(self, sink: GatewaySink) -> None:
        """Remember the gateway; the transport is up at once."""
        self._sink = sink
        self.set_health(HealthState.UP)

    async def stop(self) -> None:
        """Mark the transport down; ``sent`` stays for inspection. Safe to call twice."""
        self.set_health(HealthState.DOWN, "stopped")

    async def send(self, message: Outbound) -> Receipt:
        """Record ``message`` in ``sent``, split per ``max_message_length``.

        Returns one native id per chunk; raises ``DeliveryError`` for a channel not
        in ``channels`` or when the transport is stopped.
        """
        if self.health().state is HealthState.DOWN:
            raise DeliveryError(f"memory transport {self.name} is stopped")
        self._check_channel(message.address.channel, DeliveryError)
        ids = []
        async with self._changed:
            for chunk in self.split_text(message.text):
                self.sent.append(replace(message, text=chunk))
                ids.append(self._new_id())
                self.sent_ids.append(ids[-1])
            self._changed.notify_all()
        return Receipt(tuple(ids))

    async def inject(
        self,
        text: str,
        *,
        author_id: str,
        display_name: str = "",
        is_bot: bool = True,
        is_self: bool = False,
        channel: str = "main",
        thread: str | None = None,
        native_id: str | None = None,
        on_commit: CommitHook | None = None,
    ) -> Disposition:
        """Play one native message into the gateway and return what it did with it,
        once the messages it caused have been dispatched.

        ``is_self`` marks the gateway's own post; ``native_id`` replays a message the
        platform already knows (an echo of something sent); ``on_commit`` is the
        envelope's commit hook. Raises ``ValueError`` for a
        channel not in ``channels``.
        """
        self._check_channel(channel)
        envelope = Envelope(
            transport=self.name,
            channel=channel,
            author=Author(id=author_id, display_name=display_name, is_bot=is_bot, is_self=is_self),
            text=text,
            thread=thread,
            native_id=native_id or self._new_id(),
            on_commit=on_commit,
        )
        self.received.append(envelope)
        disposition = await self.sink.on_envelope(envelope)
        # What the message caused goes out through the outbox: wait for it, so a test
        # sees the relays in ``sent`` when this returns.
        await self.sink.drain()
        return disposition

    async def command(
        self,
        name: str,
        *args: str,
        author_id: str,
        channel: str = "main",
        roles: tuple[str, ...] = (),
    ) -> CommandResult:
        """Run operator command ``name`` as ``author_id`` (a human) and return its result."""
        self._check_channel(channel)
        request = CommandRequest(
            transport=self.name,
            channel=channel,
            author=Author(id=author_id, display_name=author_id, is_bot=False),
            name=name,
            args=args,
            roles=tuple(roles),
        )
        result = await self.sink.on_command(request)
        await self.sink.drain()
        return result

    def _claim(self, predicate: SentPredicate | None) -> Outbound | None:
        for index, message in enumerate(self.sent):
            if index not in self._claimed and (predicate is None or predicate(message)):
                self._claimed.add(index)
                return message
        return None

    async def wait_sent(
        self,
        predicate: SentPredicate | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109 - the documented test-helper signature
    ) -> Outbound:
        """The oldest sent message matching ``predicate`` not yet returned by this method.

        Messages sent before the call count, so a reply sent while ``inject`` ran is
        not missed; each message is returned at most once. Waits (without polling) up
        to ``timeout`` seconds, then raises ``TimeoutError``.
        """
        try:
            async with asyncio.timeout(timeout), self._changed:
                while (found := self._claim(predicate)) is None:
                    await self._changed.wait()
                return found
        except TimeoutError:
            raise TimeoutError(
                f"no matching message sent on {self.name} within {timeout}s "
                f"({len(self.sent)} sent in all)"
            ) from None

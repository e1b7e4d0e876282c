"""The ``memory`` transport, driven through a recording test double of the gateway."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapters.base import (
    Address,
    CommandRequest,
    CommandResult,
    ConfigError,
    DeliveryError,
    Disposition,
    Envelope,
    HealthState,
    Outbound,
    create_adapter,
)
from adapters.memory import MemoryAdapter


class EchoSink:
    """Records envelopes and commands; answers each envelope by sending it back."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.commands: list[CommandRequest] = []
        self.adapter: MemoryAdapter | None = None

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        self.envelopes.append(envelope)
        if self.adapter is not None:
            await self.adapter.send(Outbound(envelope.address, f"echo: {envelope.text}"))
        return Disposition("accepted", request_ids=("r1",))

    async def on_command(self, command: CommandRequest) -> CommandResult:
        self.commands.append(command)
        return CommandResult(title=command.name, ok=False)

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        return []

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        return None

    def health(self) -> dict[str, Any]:
        return {}

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        return True


async def started(options: dict[str, Any] | None = None, *, echo: bool = False) -> MemoryAdapter:
    adapter = create_adapter("memory", "mem", options or {})
    assert isinstance(adapter, MemoryAdapter)
    sink = EchoSink()
    if echo:
        sink.adapter = adapter
    await adapter.start(sink)
    return adapter


def out(text: str, channel: str = "main") -> Outbound:
    return Outbound(Address("mem", channel), text)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"max_message_length": 0}, "transports.mem.max_message_length"),
        ({"channels": []}, "transports.mem.channels"),
        ({"colour": 1}, "transports.mem.colour"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        create_adapter("memory", "mem", options)


async def test_inject_builds_envelope_and_returns_disposition() -> None:
    adapter = await started()
    disposition = await adapter.inject(
        "hello", author_id="u1", display_name="Ann", is_bot=False, channel="c", thread="t"
    )
    assert disposition.outcome == "accepted"
    [envelope] = adapter.received
    assert (envelope.transport, envelope.channel, envelope.thread, envelope.text) == (
        "mem",
        "c",
        "t",
        "hello",
    )
    assert envelope.author.id == "u1" and envelope.author.display_name == "Ann"
    assert not envelope.author.is_bot
    await adapter.inject("again", author_id="u1")
    assert adapter.received[0].native_id != adapter.received[1].native_id


async def test_wait_sent_sees_reply_sent_during_inject() -> None:
    adapter = await started(echo=True)
    await adapter.inject("ping", author_id="bot")
    sent = await adapter.wait_sent(timeout=1)
    assert sent.text == "echo: ping"
    with pytest.raises(TimeoutError, match="1 sent in all"):
        await adapter.wait_sent(timeout=0.1)


async def test_wait_sent_waits_for_a_later_matching_message() -> None:
    adapter = await started()
    await adapter.send(out("other"))

    async def later() -> None:
        await asyncio.sleep(0.1)
        await adapter.send(out("wanted"))

    task = asyncio.create_task(later())
    found = await adapter.wait_sent(lambda m: m.text.startswith("want"), timeout=2)
    await task
    assert found.text == "wanted"
    # The skipped message is still there for a wait without predicate.
    assert (await adapter.wait_sent(timeout=0.1)).text == "other"


async def test_send_splits_by_max_message_length() -> None:
    adapter = await started({"max_message_length": 10})
    receipt = await adapter.send(out("line one\nline two\nthree"))
    assert len(receipt.native_ids) == len(set(receipt.native_ids)) == 3
    assert [m.text for m in adapter.sent] == ["line one\n", "line two\n", "three"]
    short = await adapter.send(out("short"))
    assert len(short.native_ids) == 1


async def test_channels_restrict_send_and_inject() -> None:
    adapter = await started({"channels": ["main", "ops"]})
    await adapter.send(out("fine", "ops"))
    with pytest.raises(DeliveryError, match="no channel 'elsewhere'"):
        await adapter.send(out("nope", "elsewhere"))
    with pytest.raises(ValueError, match="no channel"):
        await adapter.inject("x", author_id="u", channel="elsewhere")


async def test_command_reaches_sink() -> None:
    adapter = await started()
    result = await adapter.command("cancel", "r1", "late", author_id="op", roles=("admin",))
    assert result.title == "cancel" and not result.ok
    sink = adapter.sink
    assert isinstance(sink, EchoSink)
    [command] = sink.commands
    assert (command.transport, command.channel, command.args, command.roles) == (
        "mem",
        "main",
        ("r1", "late"),
        ("admin",),
    )
    assert command.author.id == "op" and not command.author.is_bot


async def test_lifecycle() -> None:
    adapter = MemoryAdapter("mem")
    with pytest.raises(RuntimeError):
        await adapter.inject("x", author_id="u")
    await adapter.start(EchoSink())
    assert adapter.health().state is HealthState.UP
    await adapter.stop()
    await adapter.stop()
    assert adapter.health().state is HealthState.DOWN
    with pytest.raises(DeliveryError, match="stopped"):
        await adapter.send(out("late"))

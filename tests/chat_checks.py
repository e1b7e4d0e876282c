"""Delivery checks every chat transport's end-to-end tests run against its emulator.

The platform differs (how its emulator refuses, how a posted message looks); what the
transport must do does not: a refusal becomes the right ``DeliveryError`` for the outbox,
a split message retried after a part failed does not post its earlier parts twice, a
refused token leaves the transport down, the readiness probe names a refused token
and an unreachable API, and every option is documented.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.base import Adapter, Address, DeliveryError, HealthState, Outbound


class SinkWithoutCursors:
    """Enough of a gateway for a transport that never gets to read a message."""

    def cursors(self, transport: str) -> Any:
        return None


async def refusals_are_classified(
    adapter: Adapter, channel: str, *, rate_limit: Callable[[float], None],
    not_a_channel: str, unknown: str,
) -> None:
    """A long 429 is ``rate_limited`` with its retry-after; an address that is no channel
    id is ``bad_address``; a channel the platform does not know is ``not_found``."""
    transport = adapter.name
    rate_limit(120.0)
    with pytest.raises(DeliveryError) as refused:
        await adapter.send(Outbound(Address(transport, channel), "later"))
    assert refused.value.code == "rate_limited" and refused.value.retry_after == 120.0
    for where, code in ((not_a_channel, "bad_address"), (unknown, "not_found")):
        with pytest.raises(DeliveryError) as failed:
            await adapter.send(Outbound(Address(transport, where), "x"))
        assert failed.value.code == code, (where, failed.value)


async def retried_parts_are_posted_once(
    adapter: Adapter, channel: str, text: str, *, refuse_second_part: Callable[[], None],
    posted: Callable[[], list[tuple[str, str]]],
) -> None:
    """``text`` (three parts) fails at its second part, then is retried by the outbox:
    three posts in all, in order, and the receipt names each. ``posted()`` lists the
    bot's posts in ``channel`` as (native id, text)."""
    out = Outbound(Address(adapter.name, channel), text, id="1700000000000-1")
    refuse_second_part()
    with pytest.raises(DeliveryError):
        await adapter.send(out)
    assert len(posted()) == 1
    receipt = await adapter.send(out)  # the outbox's retry
    found = posted()
    assert [native for native, _ in found] == list(receipt.native_ids) and len(found) == 3
    assert "".join(body for _, body in found) == text


async def probe_reports_refusals(make: Callable[..., Adapter], *, token: str, api_base_url: str,
                                 refused: str) -> None:
    """``make(**options)`` builds the transport against its emulator: with a refused
    ``token`` its probe fails with ``refused`` in its detail and a fix; with an
    ``api_base_url`` nothing answers at, it says it cannot reach it."""
    [no] = await make(token=token).probe()
    assert not no.ok and refused in no.detail and no.fix, no
    [down] = await make(api_base_url=api_base_url).probe()
    assert not down.ok and "cannot reach" in down.detail, down


async def refused_token_leaves_it_down(adapter: Adapter, error: type[BaseException]) -> None:
    """``start`` with a token the platform refuses raises ``error``; health is ``down``
    naming the token; ``stop`` afterwards is safe."""
    with pytest.raises(error):
        await adapter.start(None)  # type: ignore[arg-type]
    assert adapter.health().state is HealthState.DOWN
    assert "token" in adapter.health().detail
    await adapter.stop()


def options_are_documented(model: type[BaseModel], page: str) -> None:
    """Every option of ``model`` has a commented example in config.example.toml and a row
    in the table of ``docs/<page>``."""
    root = Path(__file__).resolve().parent.parent
    example = (root / "config.example.toml").read_text(encoding="utf-8")
    docs = (root / "docs" / page).read_text(encoding="utf-8")
    for key in model.model_fields:
        assert re.search(rf"^# {key} = ", example, re.M), f"{key} not in config.example.toml"
        assert f"| `{key}` |" in docs, f"{key} not in docs/{page}"

"""Every stored field of a conversation is bounded (issue 7 item 8): oversize
transport-supplied fields are refused, never cut, and a record's size has a ceiling."""

from __future__ import annotations

import pytest
from test_state_helpers import ORIGIN, T0, request, response, store

from protocol.models import REQUEST_ID_MAX_LEN, Depth, Handoff, Request
from protocol.names import NAME_MAX_LEN
from state.records import ORIGIN_MAX_BYTES, Origin, Outcome
from state.store import ConversationStore

__all__ = ["store"]


@pytest.mark.parametrize("field", sorted(ORIGIN_MAX_BYTES))
async def test_a_field_over_its_bound_is_refused_and_nothing_is_stored(
        store: ConversationStore, field: str) -> None:
    limit = ORIGIN_MAX_BYTES[field]
    fields = {"transport": "t", "channel": "c", "thread": None, "native_id": None}
    fits = Origin(**{**fields, field: "界" * (limit // 3)})  # 3 bytes a character
    over = Origin(**{**fields, field: "界" * (limit // 3 + 1)})
    result = await store.apply(request("r-over"), over, now=T0)
    assert result.outcome is Outcome.TOO_LONG and result.conversation is None
    assert f"{field.replace('_', ' ')} is {len(over.__dict__[field].encode())} bytes" in (
        result.reason)
    assert await store.get("r-over") is None
    assert await store.load_by_agent() == {}
    [bulk] = await store.apply_many([request("r-bulk")], over, now=T0)
    assert bulk.outcome is Outcome.TOO_LONG and await store.get("r-bulk") is None
    assert (await store.apply(request("r-fits"), fits, now=T0)).outcome is Outcome.APPLIED


async def test_orphan_responses_per_unknown_id_are_bounded(store: ConversationStore) -> None:
    outcomes = []
    for i in range(200):
        answer = response("ghost", result=f"{i} " + "x" * 50)
        outcomes.append((await store.apply(answer, ORIGIN, now=T0)).outcome)
    kept = outcomes.count(Outcome.ORPHAN)
    assert 0 < kept < 200 and set(outcomes[kept:]) == {Outcome.TOO_LONG}
    assert await store.redis.strlen(store.keys.orphan("ghost")) < 16384 + 1024


async def test_a_conversation_with_every_field_at_its_bound_stays_small(
        store: ConversationStore) -> None:
    biggest = Origin(**{f: "x" * n for f, n in ORIGIN_MAX_BYTES.items()})
    name = "名" * NAME_MAX_LEN
    req = Request(request_id="r" * REQUEST_ID_MAX_LEN, sender=name, to=name[:-1] + "字",
                  task="任" * 10_000, trace_id="t" * 128, depth=Depth(current=1, max=50))
    assert (await store.apply(req, biggest, now=T0)).outcome is Outcome.APPLIED
    key = store.keys.conv(req.request_id)
    opened = await store.redis.strlen(key)
    # Header (names and their keys of 128 CJK characters, the parties' keys, the task's
    # summary, transport fields) and one event: bounded however large the message and its
    # transport fields are.
    assert opened < 5632, opened
    # The largest later step: a HANDOFF to a third such name adds an event and a party.
    third = name[:-1] + "人"
    moved = Handoff(request_id=req.request_id, sender=req.to, to=third, task="任" * 10_000,
                    reason="因" * 10_000, depth=Depth(current=2, max=50), trace_id="t" * 128)
    assert (await store.apply(moved, biggest, now=T0)).outcome is Outcome.APPLIED
    step = await store.redis.strlen(key) - opened
    assert step < 2048, step

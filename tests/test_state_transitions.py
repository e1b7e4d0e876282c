"""Every transition of the conversation state machine, and every illegal one, on a real server."""

from __future__ import annotations

import pytest
from test_state_helpers import (
    ORIGIN,
    T0,
    broadcast,
    clarify,
    drop_namespace,
    handoff,
    request,
    response,
    store,
)

import state.store
from protocol.models import Status
from state.records import ConvStatus, Origin, Outcome
from state.settings import StateSettings
from state.store import ConversationStore

__all__ = ["store"]


async def test_request_opens_with_deadline_and_origin(store: ConversationStore) -> None:
    res = await store.apply(request("r1", trace_id="tr-9"), ORIGIN, now=T0)
    assert res.outcome is Outcome.APPLIED and res.reason == "" and res.previous_status is None
    conv = await store.get("r1")
    assert conv is not None
    assert (conv.status, conv.requester, conv.assignee, conv.kind) == (
        ConvStatus.OPEN, "Lotbot", "Mantis", "REQUEST")
    assert conv.deadline == T0 + 1800 and conv.trace_id == "tr-9"
    assert conv.origin == ORIGIN and conv.owes_reply == "Mantis"
    assert [e.type for e in conv.history] == ["REQUEST"]
    assert conv.history[0].excerpt == "count the lots"
    assert await store.counts() == {**dict.fromkeys(await store.counts(), 0), "open": 1}
    assert await store.load_by_agent() == {"mantis": 1}


async def test_clarify_answer_handoff_done(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    res = await store.apply(clarify("r1"), ORIGIN, now=T0 + 10)
    assert res.outcome is Outcome.APPLIED and res.previous_status is ConvStatus.OPEN
    conv = res.conversation
    assert conv is not None and conv.status is ConvStatus.CLARIFYING
    assert conv.deadline == T0 + 10 + 600 and conv.owes_reply == "Lotbot"
    assert await store.load_by_agent() == {"lotbot": 1}

    res = await store.apply(response("r1", sender="Lotbot", to="Mantis", depth=3,
                                     status=None, result="site A"), ORIGIN, now=T0 + 20)
    conv = res.conversation
    assert conv is not None and conv.status is ConvStatus.OPEN and conv.assignee == "Mantis"
    assert conv.deadline == T0 + 20 + 1800
    assert await store.load_by_agent() == {"mantis": 1}

    res = await store.apply(handoff("r1", depth=4), ORIGIN, now=T0 + 30)
    conv = res.conversation
    assert conv is not None and conv.status is ConvStatus.HANDED_OFF
    assert conv.assignee == "Heron" and conv.deadline == T0 + 30 + 1800
    assert await store.load_by_agent() == {"heron": 1}

    res = await store.apply(response("r1", sender="Heron", depth=5), ORIGIN, now=T0 + 40)
    conv = res.conversation
    assert conv is not None and conv.status is ConvStatus.DONE and conv.deadline is None
    assert res.previous_status is ConvStatus.HANDED_OFF
    full = await store.get("r1")
    assert full is not None
    assert [(e.type, e.sender, e.status, e.depth_current) for e in full.history] == [
        ("REQUEST", "Lotbot", "open", 1), ("CLARIFY", "Mantis", "clarifying", 2),
        ("RESPONSE", "Lotbot", "open", 3), ("HANDOFF", "Mantis", "handed_off", 4),
        ("RESPONSE", "Heron", "done", 5)]
    counts = await store.counts()
    assert counts["done"] == 1 and counts["open"] == 0 and await store.load_by_agent() == {}


@pytest.mark.parametrize(("status", "expected"), [
    (Status.DONE, ConvStatus.DONE), (Status.PARTIAL, ConvStatus.PARTIAL),
    (Status.FAILED, ConvStatus.FAILED), (Status.CANCELLED, ConvStatus.CANCELLED),
    (None, ConvStatus.DONE)])
async def test_response_status_is_terminal(store: ConversationStore, status: Status | None,
                                           expected: ConvStatus) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    res = await store.apply(response("r1", status=status), ORIGIN, now=T0 + 1)
    assert res.conversation is not None and res.conversation.status is expected
    assert (await store.counts())[str(expected)] == 1
    assert [c.request_id for c in await store.list(status=str(expected))] == ["r1"]


async def test_handoff_while_clarifying_and_clarify_after_handoff(
        store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(clarify("r1"), ORIGIN, now=T0)
    res = await store.apply(handoff("r1", depth=3), ORIGIN, now=T0)
    assert res.conversation is not None and res.conversation.status is ConvStatus.HANDED_OFF
    res = await store.apply(clarify("r1", sender="Heron", depth=4), ORIGIN, now=T0)
    assert res.outcome is Outcome.APPLIED
    assert res.conversation is not None and res.conversation.owes_reply == "Lotbot"


async def test_request_to_all_is_taken_by_first_clarifier(store: ConversationStore) -> None:
    await store.apply(request("r1", to="all"), ORIGIN, now=T0)
    assert await store.load_by_agent() == {"all": 1}
    res = await store.apply(clarify("r1", sender="Kite"), ORIGIN, now=T0)
    assert res.conversation is not None and res.conversation.assignee == "Kite"
    await store.apply(response("r1", sender="Lotbot", to="Kite", depth=3), ORIGIN, now=T0)
    assert await store.load_by_agent() == {"kite": 1}


async def test_broadcast_is_short_lived_and_owed_by_nobody(store: ConversationStore) -> None:
    res = await store.apply(broadcast("b1"), ORIGIN, now=T0)
    assert res.outcome is Outcome.APPLIED
    conv = res.conversation
    assert conv is not None and conv.kind == "BROADCAST" and conv.deadline == T0 + 300
    counts = await store.counts()
    assert counts["broadcast"] == 1 and counts["open"] == 0
    assert await store.load_by_agent() == {} and await store.oldest_open() == []
    reply = await store.apply(response("b1", sender="Mantis", to="Ops"), ORIGIN, now=T0)
    assert reply.outcome is Outcome.ILLEGAL and "BROADCAST" in reply.reason
    assert await store.claim_due(now=T0 + 301) == []  # expired silently, no notice
    assert await store.get("b1") is None and (await store.counts())["broadcast"] == 0


async def test_terminal_never_moves_back(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(response("r1"), ORIGIN, now=T0)
    for msg in (clarify("r1", depth=3), handoff("r1", depth=3),
                response("r1", depth=3, status=Status.FAILED)):
        res = await store.apply(msg, ORIGIN, now=T0 + 1)
        assert res.outcome is Outcome.ILLEGAL
        assert res.reason.startswith("conversation r1 is already done;")
        assert res.conversation is not None and res.conversation.status is ConvStatus.DONE
    cancel = await store.cancel("r1", by="op", reason="stop", now=T0 + 2)
    assert cancel.outcome is Outcome.ILLEGAL
    conv = await store.get("r1")
    assert conv is not None and len(conv.history) == 2 and conv.updated_at == T0


async def test_illegal_senders_and_states(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    res = await store.apply(clarify("r1", sender="Heron"), ORIGIN, now=T0)
    assert res.outcome is Outcome.ILLEGAL and "only Mantis" in res.reason
    res = await store.apply(handoff("r1", sender="Heron", to="Kite"), ORIGIN, now=T0)
    assert res.outcome is Outcome.ILLEGAL and "only Mantis" in res.reason
    await store.apply(clarify("r1"), ORIGIN, now=T0)
    res = await store.apply(clarify("r1", depth=3, question="and when?"), ORIGIN, now=T0)
    assert res.outcome is Outcome.ILLEGAL and "already waits for Lotbot" in res.reason
    for msg in (clarify("nope"), handoff("nope")):
        res = await store.apply(msg, ORIGIN, now=T0)
        assert res.outcome is Outcome.ILLEGAL and res.conversation is None
        assert "no conversation nope is known" in res.reason
    conv = await store.get("r1")
    assert conv is not None and len(conv.history) == 2


async def test_only_the_parties_may_answer(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    # A bystander's answer is refused, even at a wrong depth (never a depth violation).
    for depth in (2, 4):
        res = await store.apply(response("r1", sender="Heron", depth=depth), ORIGIN, now=T0)
        assert res.outcome is Outcome.ILLEGAL and "Heron is neither" in res.reason
    # After a HANDOFF the old holder may not answer either; the new one and the
    # requester may.
    await store.apply(handoff("r1"), ORIGIN, now=T0)
    res = await store.apply(response("r1", depth=3), ORIGIN, now=T0)
    assert res.outcome is Outcome.ILLEGAL
    res = await store.apply(response("r1", sender="Lotbot", to="Heron", depth=3,
                                     status=Status.CANCELLED), ORIGIN, now=T0)
    assert res.outcome is Outcome.APPLIED and res.conversation is not None
    assert res.conversation.status is ConvStatus.CANCELLED


async def test_conflicting_request_and_broadcast(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    for msg in (request("r1", task="something else"), broadcast("r1")):
        res = await store.apply(msg, ORIGIN, now=T0)
        assert res.outcome is Outcome.CONFLICT and "fresh RequestId" in res.reason
    conv = await store.get("r1")
    assert conv is not None and conv.task == "count the lots" and len(conv.history) == 1


@pytest.mark.parametrize("depth", [1, 3, 4])
async def test_depth_must_advance_by_one(store: ConversationStore, depth: int) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    res = await store.apply(clarify("r1", depth=depth), ORIGIN, now=T0)
    assert res.outcome is Outcome.DEPTH and "must carry depth 2/5" in res.reason
    assert (await store.counts())["open"] == 1


async def test_depth_max_must_match(store: ConversationStore) -> None:
    from protocol.models import Clarify, Depth

    await store.apply(request("r1"), ORIGIN, now=T0)
    msg = Clarify(request_id="r1", sender="Mantis", to="Lotbot", question="q",
                  depth=Depth(current=2, max=9))
    res = await store.apply(msg, ORIGIN, now=T0)
    assert res.outcome is Outcome.DEPTH and "not 2/9" in res.reason


async def test_orphan_response_is_kept_and_visible(store: ConversationStore) -> None:
    res = await store.apply(response("ghost", sender="Kite"), ORIGIN, now=T0)
    assert res.outcome is Outcome.ORPHAN and "orphan" in res.reason and res.conversation is None
    again = await store.apply(response("ghost", sender="Kite"), ORIGIN, now=T0)
    assert again.outcome is Outcome.DUPLICATE
    [(rid, events)] = await store.orphans()
    assert rid == "ghost" and [e.sender for e in events] == ["Kite"]
    assert (await store.counts())["orphan"] == 1
    assert await store.purge_expired(now=T0 + 8 * 86400) == 0
    assert await store.orphans() == [] and (await store.counts())["orphan"] == 0


async def test_cancel_records_who_and_why(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    await store.apply(clarify("r1"), ORIGIN, now=T0)
    res = await store.cancel("r1", by="alice", reason="customer withdrew", now=T0 + 5)
    assert res.outcome is Outcome.APPLIED and res.previous_status is ConvStatus.CLARIFYING
    conv = await store.get("r1")
    assert conv is not None and conv.status is ConvStatus.CANCELLED
    last = conv.history[-1]
    assert (last.type, last.sender, last.excerpt, last.at) == (
        "CANCEL", "alice", "customer withdrew", T0 + 5)
    assert await store.load_by_agent() == {} and (await store.counts())["cancelled"] == 1
    unknown = await store.cancel("nope", by="alice", reason="x")
    assert unknown.outcome is Outcome.ILLEGAL and "cannot be closed" in unknown.reason


async def test_idempotent_replay_changes_nothing(store: ConversationStore) -> None:
    other = Origin(transport="mq9", channel="box-1", native_id="m-77")
    msgs = [request("r1"), clarify("r1"), response("r1", sender="Lotbot", to="Mantis",
                                                    depth=3), response("r1", depth=4)]
    for msg in msgs:
        assert (await store.apply(msg, ORIGIN, now=T0)).outcome is Outcome.APPLIED
    before = await store.get("r1")
    counts = await store.counts()
    for msg in msgs:  # the same messages again, through another transport, later
        res = await store.apply(msg, other, now=T0 + 99)
        assert res.outcome is Outcome.DUPLICATE and "nothing changed" in res.reason
    assert await store.get("r1") == before and await store.counts() == counts


async def test_purge_removes_only_old_terminal(store: ConversationStore) -> None:
    await store.apply(request("old"), ORIGIN, now=T0)
    await store.apply(response("old"), ORIGIN, now=T0)
    await store.apply(request("new"), ORIGIN, now=T0)
    await store.apply(response("new"), ORIGIN, now=T0 + 86400)
    await store.apply(request("live"), ORIGIN, now=T0)
    assert await store.purge_expired(now=T0 + 7 * 86400 + 1) == 1
    assert await store.get("old") is None and await store.get("new") is not None
    assert await store.get("live") is not None
    assert (await store.counts())["done"] == 1


async def test_gateway_close_to_failed(store: ConversationStore) -> None:
    await store.apply(request("r1"), ORIGIN, now=T0)
    res = await store.close("r1", status=ConvStatus.FAILED, by="bpgw", reason="depth limit",
                            now=T0 + 1)
    assert res.outcome is Outcome.APPLIED and res.conversation is not None
    assert res.conversation.status is ConvStatus.FAILED
    assert (res.conversation.history[-1].type, res.conversation.history[-1].sender) == (
        "CLOSE", "bpgw")
    with pytest.raises(ValueError, match="terminal"):
        await store.close("r1", status=ConvStatus.OPEN, by="bpgw", reason="x")


@pytest.mark.parametrize("now", [T0, T0 + 0.001, T0 + 12.5, 1_799_999_999.999, 86_400.25,
                                 100.0, 0.0004, 9_999_999_999.9996, 10_000_000_000.25])
async def test_a_new_record_written_by_the_client_is_the_one_the_script_writes(
        store: ConversationStore, monkeypatch: pytest.MonkeyPatch, now: float) -> None:
    """The store writes the record of a REQUEST or BROADCAST that opens a conversation
    itself (apply.lua stores it instead of encoding one): byte for byte what the script's
    encode writes, for names, texts and origins JSON escapes (``/``, DEL, quotes, control
    characters, non-ASCII) and a broadcast."""
    origins = [ORIGIN, Origin(transport="tg/x", channel='c"h\\1', thread="t/\x7f",
                              native_id="n\x7f/é")]
    msgs = [
        request("plain"),
        request("lower", sender="lotbot", to="mantis", trace_id="tr/1"),
        request("unicode", sender="Ünï", to="ÉCOLE", task='a/b "c" \\ d\x7f\te ✓ 😀'),
        request("ß-key", sender="Straße", to="STRASSE", depth=3),
        request("self", sender="Lotbot", to="lotbot"),
        broadcast("news", message="deploy /now\x7f"),
    ]
    script = ConversationStore(store.redis, StateSettings(namespace=store.settings.namespace
                                                          + "-script"))
    try:
        for origin in origins:
            for msg in msgs:
                rid = f"{msg.request_id}-{origins.index(origin)}"
                msg = msg.model_copy(update={"request_id": rid})
                ours = await store.apply(msg, origin, now=now)
                with monkeypatch.context() as patch:  # the script encodes
                    patch.setattr(state.store, "_OPENS", frozenset())
                    theirs = await script.apply(msg, origin, now=now)
                assert ours.outcome is theirs.outcome is Outcome.APPLIED
                stored = await store.redis.get(store.keys.conv(rid))
                assert stored == await store.redis.get(script.keys.conv(rid))
                assert ours.conversation == theirs.conversation
    finally:
        await drop_namespace(store.redis, script.settings.namespace)


@pytest.mark.parametrize("task", [
    "count the lots", "x", "", " lead", "trail ", "two  spaces", "tab\there", "nl\nx",
    "fs\x1cx", "us\x1fx", "del\x7fx", "nbsp\xa0x", "ideo\u3000x", "arrow → x", "  ", " ",
    "a " * 300, "é  é", "\x85nel",
])
def test_a_task_is_stored_with_its_white_space_collapsed(task: str) -> None:
    """The task summary and excerpt stored for a REQUEST are its text with every run of
    white space one space and none at either end (str.split's white space), whatever
    the task holds (the usual one, printable ASCII, is taken as it is)."""
    msg = request("r1")
    fields = {**msg.__dict__, "task": task}  # (any text: past the model's own cleaning)
    collapsed = " ".join(task.split())
    summary, excerpt, priority = state.store._message_text(msg, fields)
    assert summary == state.store._cut(collapsed, state.store.TASK_CHARS)
    assert excerpt == state.store._cut(collapsed, state.store.EXCERPT_CHARS)
    assert priority == "normal"

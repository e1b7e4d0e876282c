"""Plain AINET messages <-> bot-protocol: every row of the mapping table (adapters/ainet/
mapping.py, docs/ainet.md "What the bridge reads and writes")."""

from __future__ import annotations

from datetime import datetime

import pytest

from adapters.ainet.mapping import (
    ConvView,
    Refusal,
    Settled,
    closes,
    follow_up,
    is_join,
    mention,
    opening,
    slot_kind,
    status_of,
)
from adapters.ainet.message import AinetMessage, AinetStatus, AinetType
from adapters.ainet.workspace import SlotKind
from protocol import (
    MessageType,
    Status,
    answer_clarify,
    build_broadcast,
    build_request,
    reply_clarify,
    reply_response,
)

ME = "Device-bridgeAB12/网关"
PEER = "Device-ABC123/智能体A"


def plain(content: str, *, to: str = ME, kind: AinetType = AinetType.PRIVATE,
          done: bool = False) -> AinetMessage:
    return AinetMessage(PEER, to, kind, datetime(2026, 3, 29, 11, 35), content,
                        AinetStatus.DONE if done else AinetStatus.PENDING)


def conv(status: str = "open", *, requester: str = "Lotbot", assignee: str = PEER,
         kind: str = "REQUEST", depth: int = 1) -> ConvView:
    return ConvView("lotbot-r1", "t" * 32, kind, requester, assignee, status, depth, 5)


def test_openings() -> None:
    request = opening(plain("@Lotbot 请检查磁盘\nand more"), PEER, None, request_id="x-1")
    assert not isinstance(request, Refusal | Settled)
    assert (request.type, request.sender, request.to, request.request_id) == (
        MessageType.REQUEST, PEER, "Lotbot", "x-1")
    assert request.task == "请检查磁盘\nand more"  # type: ignore[union-attr]
    fallback = opening(plain("no mention"), PEER, "Mantis")
    assert not isinstance(fallback, Refusal | Settled) and fallback.to == "Mantis"
    nobody = opening(plain("no mention"), PEER, None)
    assert isinstance(nobody, Refusal) and "@Name" in nobody.reason
    task = opening(plain("translate the manual", to="TASK", kind=AinetType.TASK), PEER, None)
    assert not isinstance(task, Refusal | Settled) and task.is_broadcast
    named_task = opening(plain("@Mantis translate", to="TASK", kind=AinetType.TASK), PEER, None)
    assert not isinstance(named_task, Refusal | Settled) and named_task.to == "Mantis"
    news = opening(plain("@Lotbot lunch", to="BROADCAST", kind=AinetType.BROADCAST), PEER, None)
    assert not isinstance(news, Refusal | Settled) and news.type is MessageType.BROADCAST
    assert isinstance(opening(plain("@Lotbot   "), PEER, None), Refusal)


@pytest.mark.parametrize(("text", "name", "rest"), [
    ("@Lotbot hi", "Lotbot", "hi"),
    ("  @Lotbot\nhi", "Lotbot", "hi"),
    ("@Device-X/智能体B hi", "Device-X/智能体B", "hi"),
    ("hi @Lotbot", None, "hi @Lotbot"),
    ("@\u200bLotbot hi", None, "@\u200bLotbot hi"),  # an invisible character: no name
])
def test_mention(text: str, name: str | None, rest: str) -> None:
    assert mention(text) == (name, rest)


def test_the_assignee_answers_or_asks() -> None:
    done = follow_up(plain("LGTM", done=True), PEER, conv(), fresh_id="x")
    assert not isinstance(done, Refusal | Settled)
    assert (done.type, done.to, done.status, done.result, done.depth.current) == (  # type: ignore[union-attr]
        MessageType.RESPONSE, "Lotbot", Status.DONE, "LGTM", 2)
    asked = follow_up(plain("which version?"), PEER, conv("handed_off"), fresh_id="x")
    assert not isinstance(asked, Refusal | Settled) and asked.type is MessageType.CLARIFY
    at_limit = follow_up(plain("partly"), PEER, conv(depth=4), fresh_id="x")
    assert not isinstance(at_limit, Refusal | Settled)
    assert at_limit.status is Status.PARTIAL and at_limit.depth.current == 5  # type: ignore[union-attr]
    waiting = follow_up(plain("again?"), PEER, conv("clarifying"), fresh_id="x")
    assert isinstance(waiting, Refusal) and "not answered" in waiting.reason
    late = follow_up(plain("done after all", done=True), PEER, conv("clarifying"), fresh_id="x")
    assert not isinstance(late, Refusal | Settled) and late.status is Status.DONE  # type: ignore[union-attr]


def test_the_requester_answers_or_closes() -> None:
    mine = conv("clarifying", requester=PEER, assignee="Lotbot")
    answer = follow_up(plain("build-02"), PEER, mine, fresh_id="x")
    assert not isinstance(answer, Refusal | Settled)
    assert (answer.type, answer.to, answer.status) == (MessageType.RESPONSE, "Lotbot", None)  # type: ignore[union-attr]
    open_one = conv("open", requester=PEER, assignee="Lotbot")
    closing = follow_up(plain("never mind", done=True), PEER, open_one, fresh_id="x")
    assert not isinstance(closing, Refusal | Settled) and closing.status is Status.DONE  # type: ignore[union-attr]
    nudge = follow_up(plain("any news?"), PEER, open_one, fresh_id="x")
    assert isinstance(nudge, Refusal) and "owes the reply" in nudge.reason


def test_broadcasts_closed_conversations_and_strangers() -> None:
    reply = follow_up(plain("noted"), PEER, conv("done", kind="BROADCAST", requester="Lotbot",
                                                 assignee="all"), fresh_id="peer-2")
    assert not isinstance(reply, Refusal | Settled)
    assert (reply.type, reply.to, reply.request_id) == (MessageType.REQUEST, "Lotbot", "peer-2")
    assert reply.context == "reply to BROADCAST lotbot-r1"  # type: ignore[union-attr]
    thanks = follow_up(plain("Thanks!", done=True), PEER, conv("done"), fresh_id="x")
    assert isinstance(thanks, Settled)
    more = follow_up(plain("one more thing"), PEER, conv("timeout"), fresh_id="x")
    assert isinstance(more, Refusal) and "closed (timeout)" in more.reason
    stranger = follow_up(plain("me too"), "Device-Z/other", conv(), fresh_id="x")
    assert isinstance(stranger, Refusal) and "not a party" in stranger.reason


def test_outbound_status_and_slot_kind() -> None:
    request = build_request(sender="Lotbot", to=PEER, task="t")
    clarify = reply_clarify(request, sender=PEER, question="q")
    answer = answer_clarify(clarify, sender="Lotbot", result="a")
    done = reply_response(request, sender=PEER, status="done", result="r")
    news = build_broadcast(sender="Lotbot", message="m")
    assert [status_of(m) for m in (request, clarify, answer, done, news, None)] == [
        AinetStatus.PENDING, AinetStatus.PENDING, AinetStatus.PENDING, AinetStatus.DONE,
        AinetStatus.PENDING, AinetStatus.PENDING]
    assert closes(done) and not closes(answer)
    assert [slot_kind(m) for m in (request, clarify, answer, done, news, None)] == [
        SlotKind.REQUEST, SlotKind.RESPONSE, SlotKind.RESPONSE, SlotKind.RESPONSE,
        SlotKind.BROADCAST, SlotKind.RESPONSE]


def test_join_announcements() -> None:
    join = plain(f"AI Agent {PEER} has joined AINET(AI-Net) collaboration network.",
                 to="BROADCAST", kind=AinetType.BROADCAST)
    assert is_join(join)
    assert not is_join(plain("AI Agent X has joined AINET", to=ME))  # not a broadcast
    assert not is_join(plain("Lunch is served", to="BROADCAST", kind=AinetType.BROADCAST))

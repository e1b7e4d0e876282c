"""Every pipeline branch end to end: real gateway, real Redis/Valkey, in-process transports."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from adapters.base import OutboundKind
from protocol import (
    Clarify,
    Depth,
    MessageType,
    Request,
    build_request,
    generate_keypair,
    load_private_key,
    parse,
    render,
    reply_clarify,
    reply_handoff,
    reply_response,
    sign,
)
from state.records import ConvStatus

from gwkit import make_config, memory, running, sent_to

pytestmark = pytest.mark.asyncio


@pytest.fixture
def cfg_args(redis_url: str, namespace: str, tmp_path: Path) -> tuple[str, str, Path]:
    return redis_url, namespace, tmp_path


def _request(**kw: object) -> object:
    base: dict[str, object] = {"sender": "Lotbot", "to": "Mantis", "task": "check disk"}
    base.update(kw)
    return build_request(**base)  # type: ignore[arg-type]


def _clarify_at_limit(req: Request) -> Clarify:
    """A CLARIFY one hop after ``req`` that lands at current == max."""
    return Clarify(
        to=req.sender,
        sender=req.to,
        request_id=req.request_id,
        trace_id=req.trace_id,
        depth=req.depth.next(),
        question="which?",
    )


async def test_ordinary_chat_is_ignored_and_nothing_is_sent(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        d = await chat.inject("hello everyone, lunch?", author_id="u-lot")
        assert d.outcome == "ignored"
        d = await chat.inject("```python\nprint('hi')\n```", author_id="u-lot")
        assert d.outcome == "ignored"
        assert chat.sent == [] and memory(gw, "side").sent == []


async def test_request_is_routed_to_the_other_transport_and_tracked(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        d = await chat.inject(render(req), author_id="u-lot")
        assert d.outcome == "accepted", d
        relayed = sent_to(side, "mantis-room", OutboundKind.PROTOCOL)
        assert len(relayed) == 1
        assert relayed[0].recipient == "Mantis"
        assert parse(relayed[0].text).messages == [req]
        # Already visible where it was posted: not echoed back into chat:main.
        assert sent_to(chat, "main", OutboundKind.PROTOCOL) == []
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.OPEN
        assert conv.origin.transport == "chat" and conv.origin.channel == "main"


async def test_full_conversation_goes_back_into_the_origin_thread(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        await chat.inject(render(req), author_id="u-lot", thread="t-42")
        clar = reply_clarify(req, sender="Mantis", question="which host?")
        assert (
            await side.inject(render(clar), author_id="u-mantis", channel="mantis-room")
        ).outcome == "accepted"
        back = sent_to(chat, "main", OutboundKind.PROTOCOL)
        assert len(back) == 1 and back[0].address.thread == "t-42"
        hand = reply_handoff(clar, sender="Mantis", to="SecurityBot", task="check build-01")
        # Mantis hands off (depth 3/5) while the CLARIFY is open: the state machine decides.
        d = await side.inject(render(hand), author_id="u-mantis", channel="mantis-room")
        conv = await gw.store.get(req.request_id)
        assert conv is not None
        if d.outcome == "accepted":
            assert conv.assignee == "SecurityBot"
            assert len(sent_to(side, "sec-room", OutboundKind.PROTOCOL)) == 1
        else:
            assert d.outcome == "rejected" and conv.assignee == "Mantis"


async def test_malformed_block_gets_an_error_reply_and_nothing_else(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        text = "```\n[REQUEST → @Mantis]\nFrom: Lotbot\nRequestId: lot-1\nDepth: 1/5\n```"
        d = await chat.inject(text, author_id="u-lot", thread="th")
        assert d.outcome == "malformed"
        assert d.errors and d.errors[0]["code"] == "missing_field"
        notes = sent_to(chat, "main", OutboundKind.NOTICE)
        assert len(notes) == 1
        assert "missing_field" in notes[0].text and "task" in notes[0].text.lower()
        assert notes[0].address.thread == "th"
        assert side.sent == []
        assert await gw.store.get("lot-1") is None


async def test_hostile_block_with_thousands_of_errors_gets_a_bounded_answer(
    cfg_args, redis_client
) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        hostile = "```\n[REQUEST → @Mantis]\n" + "From: x\n" * 5000 + "```"
        d = await chat.inject(hostile, author_id="u-lot")
        assert d.outcome == "malformed"
        assert 1 <= len(d.errors) <= 100 and "more errors" in d.detail
        [note] = sent_to(chat, "main", OutboundKind.NOTICE)
        assert "duplicate_field" in note.text and "more errors" in note.text
        assert len(note.text) < 4000


async def test_impersonation_is_rejected_counted_and_not_relayed(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        d = await chat.inject(render(req), author_id="u-evil")
        assert d.outcome == "rejected" and "impersonation" in d.detail
        assert side.sent == []
        assert any(
            "may not speak as @Lotbot" in n.text for n in sent_to(chat, "main", OutboundKind.NOTICE)
        )
        assert await gw.store.get(req.request_id) is None
        status = await chat.command("status", author_id="u-lot")
        assert "impersonation: 1" in dict(status.fields)["violations (last hour)"]


async def test_tofu_binds_first_identity_for_undeclared_agents(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        first = build_request(sender="Newbie", to="Mantis", task="hi")
        assert (await chat.inject(render(first), author_id="u-new")).outcome == "accepted"
        second = build_request(sender="Newbie", to="Mantis", task="again")
        d = await chat.inject(render(second), author_id="u-other", channel="elsewhere")
        assert d.outcome == "rejected" and "impersonation" in d.detail
        # The impersonator did not move where replies to Newbie go.
        reply = reply_response(first, sender="Mantis", status="done", result="ok")
        await memory(gw, "side").inject(render(reply), author_id="u-mantis", channel="mantis-room")
        assert [o.address.channel for o in chat.sent if o.kind is OutboundKind.PROTOCOL] == ["main"]


async def test_pin_policy_rejects_undeclared_agents(cfg_args, redis_client) -> None:
    config = make_config(*cfg_args, policy={"undeclared_agents": "pin"})
    async with running(config) as gw:
        chat = memory(gw, "chat")
        d = await chat.inject(
            render(build_request(sender="Newbie", to="Mantis", task="x")), author_id="u-new"
        )
        assert d.outcome == "rejected" and "undeclared" in d.detail


async def test_signatures_are_required_for_agents_with_a_key(cfg_args, redis_client) -> None:
    private_pem, public_pem = generate_keypair()
    other_private, _ = generate_keypair()
    agents = {
        "Lotbot": {
            "addresses": ["chat:main"],
            "identities": ["chat:u-lot"],
            "public_key": public_pem.decode(),
        },
        "Mantis": {"addresses": ["side:mantis-room"], "identities": ["side:u-mantis"]},
    }
    async with running(make_config(*cfg_args, agents=agents)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        unsigned = _request()
        d = await chat.inject(render(unsigned), author_id="u-lot")
        assert d.outcome == "rejected" and "signature" in d.detail
        forged = sign(_request(), load_private_key(other_private))
        d = await chat.inject(render(forged), author_id="u-lot")
        assert d.outcome == "rejected" and "does not verify" in d.detail
        good = sign(_request(), load_private_key(private_pem))
        d = await chat.inject(render(good), author_id="u-lot")
        assert d.outcome == "accepted", d
        assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 1


async def test_depth_at_limit_is_a_violation_and_the_gateway_closes(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request(depth=Depth(current=1, max=2))
        await chat.inject(render(req), author_id="u-lot")
        # A misbehaving agent writes the block by hand: the builder would refuse it.
        clar = _clarify_at_limit(req)
        d = await side.inject(render(clar), author_id="u-mantis", channel="mantis-room")
        assert d.outcome == "rejected" and d.detail.startswith("depth")
        # Not relayed to Lotbot as a CLARIFY; Lotbot gets the gateway's failed RESPONSE.
        to_lot = [parse(o.text).messages[0] for o in sent_to(chat, "main", OutboundKind.PROTOCOL)]
        assert [m.type for m in to_lot] == [MessageType.RESPONSE]
        assert to_lot[0].sender == "bpgw" and str(to_lot[0].status) == "failed"
        assert to_lot[0].request_id == req.request_id and to_lot[0].trace_id == req.trace_id
        assert any(
            "depth" in n.text.lower() for n in sent_to(side, "mantis-room", OutboundKind.NOTICE)
        )
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.FAILED


async def test_a_bystander_cannot_end_or_break_a_conversation(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request(depth=Depth(current=1, max=2))
        await chat.inject(render(req), author_id="u-lot")
        # SecurityBot (a real, authenticated agent) is not a party to this conversation.
        answer = reply_response(req, sender="SecurityBot", status="done", result="mine")
        d = await side.inject(render(answer), author_id="u-sec", channel="sec-room")
        assert d.outcome == "rejected" and "neither" in d.detail
        at_limit = Clarify(
            to="Lotbot",
            sender="SecurityBot",
            request_id=req.request_id,
            depth=Depth(current=2, max=2),
            question="?",
        )
        d = await side.inject(render(at_limit), author_id="u-sec", channel="sec-room")
        assert d.outcome == "rejected" and d.detail.startswith("depth")
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.OPEN


async def test_skipped_depth_is_a_violation(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        await chat.inject(render(req), author_id="u-lot")
        wrong = reply_response(req, sender="Mantis", status="done", result="ok").model_copy(
            update={"depth": Depth(current=4, max=5)}
        )
        d = await side.inject(render(wrong), author_id="u-mantis", channel="mantis-room")
        assert d.outcome == "rejected" and d.detail.startswith("depth")
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.FAILED


async def test_depth_violation_can_leave_the_conversation_open(cfg_args, redis_client) -> None:
    config = make_config(*cfg_args, policy={"close_on_depth_violation": False})
    async with running(config) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request(depth=Depth(current=1, max=2))
        await chat.inject(render(req), author_id="u-lot")
        clar = _clarify_at_limit(req)
        assert (
            await side.inject(render(clar), author_id="u-mantis", channel="mantis-room")
        ).outcome == "rejected"
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.OPEN


async def test_duplicate_through_two_transports_counts_once(cfg_args, redis_client) -> None:
    agents = {
        "Lotbot": {"addresses": ["chat:main"], "identities": ["chat:u-lot", "side:u-lot"]},
        "Mantis": {"addresses": ["side:mantis-room"], "identities": ["side:u-mantis"]},
    }
    async with running(make_config(*cfg_args, agents=agents)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        assert (await chat.inject(render(req), author_id="u-lot")).outcome == "accepted"
        d = await side.inject(render(req), author_id="u-lot", channel="elsewhere")
        assert d.outcome == "duplicate"
        assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 1
        conv = await gw.store.get(req.request_id)
        assert conv is not None and len(conv.history) == 1


async def test_pair_budget_stops_a_ping_pong_with_one_notice(cfg_args, redis_client) -> None:
    config = make_config(
        *cfg_args,
        policy={
            "pair_budget_messages": 3,
            "pair_budget_window_seconds": 60,
            "pair_cooldown_seconds": 60,
        },
    )
    async with running(config) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        outcomes = []
        for _ in range(5):
            d = await chat.inject(render(_request()), author_id="u-lot")
            outcomes.append(d.outcome)
        assert outcomes == ["accepted"] * 3 + ["rejected"] * 2
        assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 3
        loop_notes = [n for n in sent_to(chat, "main", OutboundKind.NOTICE) if "exceeded" in n.text]
        assert len(loop_notes) == 1


async def test_broadcast_storm_from_one_agent_is_bounded(cfg_args, redis_client) -> None:
    from protocol import build_broadcast

    config = make_config(*cfg_args, policy={"pair_budget_messages": 2})
    async with running(config) as gw:
        chat = memory(gw, "chat")
        outcomes = [
            (
                await chat.inject(
                    render(build_broadcast(sender="Lotbot", message=f"n{i}")), author_id="u-lot"
                )
            ).outcome
            for i in range(4)
        ]
        assert outcomes == ["accepted", "accepted", "rejected", "rejected"]


async def test_own_echoes_and_self_messages_are_dropped(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        await chat.inject(render(req), author_id="u-lot")
        relayed = sent_to(side, "mantis-room", OutboundKind.PROTOCOL)[0]
        d = await side.inject(
            relayed.text, author_id="bpgw-bot", is_self=True, channel="mantis-room"
        )
        assert d.outcome == "dropped"
        # The platform shows our relayed post again under the id we were given for it.
        echo = await side.inject(
            relayed.text, author_id="u-mantis", channel="mantis-room", native_id=side.sent_ids[0]
        )
        assert echo.outcome == "dropped"
        assert len(side.sent) == 1 and len(chat.sent) == 0


async def test_timeout_posts_notice_in_origin_thread_and_fails_requester(
    cfg_args, redis_client
) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        req = _request()
        await chat.inject(render(req), author_id="u-lot", thread="t-9")
        await gw.sweep_once(now=time.time() + 1801)
        notes = [n for n in sent_to(chat, "main", OutboundKind.NOTICE) if "timed out" in n.text]
        assert len(notes) == 1 and notes[0].address.thread == "t-9"
        assert "@Mantis" in notes[0].text and "after 30m" in notes[0].text
        responses = [
            parse(o.text).messages[0] for o in sent_to(chat, "main", OutboundKind.PROTOCOL)
        ]
        assert len(responses) == 1
        resp = responses[0]
        assert resp.type is MessageType.RESPONSE and str(resp.status) == "failed"
        assert resp.to == "Lotbot" and "Mantis" in (resp.result or "")
        assert req.trace_id and req.trace_id in (resp.result or "")
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.TIMEOUT


async def test_timeout_while_clarifying_names_the_requester(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        await chat.inject(render(req), author_id="u-lot")
        clar = reply_clarify(req, sender="Mantis", question="which host?")
        await side.inject(render(clar), author_id="u-mantis", channel="mantis-room")
        await gw.sweep_once(now=time.time() + 601)  # the CLARIFY timeout is 10 min
        notes = [n for n in sent_to(chat, "main", OutboundKind.NOTICE) if "timed out" in n.text]
        assert len(notes) == 1
        assert "no answer from @Lotbot after 10m" in notes[0].text


async def test_operator_cancel_tells_both_parties_and_others_are_refused(
    cfg_args, redis_client
) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        await chat.inject(render(req), author_id="u-lot")
        refused = await chat.command("cancel", req.request_id, author_id="u-lot")
        assert not refused.ok and "permission" in refused.title
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.OPEN
        done = await chat.command("cancel", req.request_id, "wrong", "host", author_id="op")
        assert done.ok, done
        conv = await gw.store.get(req.request_id)
        assert conv is not None and conv.status is ConvStatus.CANCELLED
        to_lot = [parse(o.text).messages[0] for o in sent_to(chat, "main", OutboundKind.PROTOCOL)]
        to_mantis = [
            parse(o.text).messages[0] for o in sent_to(side, "mantis-room", OutboundKind.PROTOCOL)
        ][1:]
        for msgs, who in ((to_lot, "Lotbot"), (to_mantis, "Mantis")):
            assert len(msgs) == 1 and msgs[0].to == who
            assert str(msgs[0].status) == "cancelled" and "wrong host" in (msgs[0].result or "")
        again = await chat.command("cancel", req.request_id, author_id="op")
        assert not again.ok


async def test_broadcast_reaches_every_agent_but_the_sender(cfg_args, redis_client) -> None:
    from protocol import build_broadcast

    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        b = build_broadcast(sender="Lotbot", message="maintenance at 02:00")
        assert (await chat.inject(render(b), author_id="u-lot")).outcome == "accepted"
        rooms = sorted(o.address.channel for o in side.sent if o.kind is OutboundKind.PROTOCOL)
        assert rooms == ["mantis-room", "sec-room"]
        assert sent_to(chat, "main", OutboundKind.PROTOCOL) == []


async def test_mirrors_get_a_copy_of_all_traffic(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args, mirrors=["side:audit"])) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        await chat.inject(render(_request()), author_id="u-lot")
        assert len(sent_to(side, "audit", OutboundKind.PROTOCOL)) == 1


async def test_unknown_recipient_gets_a_notice_but_is_tracked(cfg_args, redis_client) -> None:
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        req = build_request(sender="Lotbot", to="Ghost", task="boo")
        d = await chat.inject(render(req), author_id="u-lot")
        assert d.outcome == "accepted"
        assert any("no known address" in n.text for n in sent_to(chat, "main", OutboundKind.NOTICE))
        assert await gw.store.get(req.request_id) is not None


async def test_store_outage_is_an_error_disposition_not_a_crash(
    namespace: str, tmp_path: Path
) -> None:
    from servers import PrivateValkey

    server = PrivateValkey().start()
    try:
        async with running(make_config(server.url, namespace, tmp_path)) as gw:
            chat = memory(gw, "chat")
            assert (await chat.inject(render(_request()), author_id="u-lot")).outcome == "accepted"
            server.stop()
            d = await chat.inject(render(_request()), author_id="u-lot")
            assert d.outcome == "error"
            await gw.sweep_once()  # the sweeper notices the store is gone
            health = gw.health()
            assert health["status"] == "degraded"
            assert health["state_store"].startswith("unreachable")
            result = await chat.command("status", author_id="u-lot")
            assert not result.ok
    finally:
        server.close()


async def test_operator_registered_key_makes_an_agent_sign(cfg_args, redis_client) -> None:
    private_pem, _ = generate_keypair()
    private = load_private_key(private_pem)
    raw_public = (
        base64.urlsafe_b64encode(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
        .decode()
        .rstrip("=")
    )
    async with running(make_config(*cfg_args)) as gw:
        chat = memory(gw, "chat")
        refused = await chat.command("key", "Lotbot", raw_public, author_id="u-lot")
        assert not refused.ok and "permission" in refused.title
        bad = await chat.command("key", "Lotbot", "not-a-key", author_id="op")
        assert not bad.ok
        done = await chat.command("key", "@Lotbot", raw_public, author_id="op")
        assert done.ok and dict(done.fields)["KeyId"]
        d = await chat.inject(render(_request()), author_id="u-lot")
        assert d.outcome == "rejected" and "must sign" in d.detail
        d = await chat.inject(render(sign(_request(), private)), author_id="u-lot")
        assert d.outcome == "accepted", d
        agents = await chat.command("agents", author_id="x")
        assert {r[0]: r[4] for r in agents.rows}["@Lotbot"] == dict(done.fields)["KeyId"]
        removed = await chat.command("key", "Lotbot", "remove", author_id="op")
        assert removed.ok
        assert (await chat.inject(render(_request()), author_id="u-lot")).outcome == "accepted"


async def test_one_chat_message_with_two_blocks_and_one_bad(cfg_args, redis_client) -> None:
    from protocol import build_broadcast

    async with running(make_config(*cfg_args)) as gw:
        chat, side = memory(gw, "chat"), memory(gw, "side")
        req = _request()
        note = build_broadcast(sender="Lotbot", message="deploy at noon")
        bad = "```\n[CLARIFY → @Lotbot]\nFrom: Lotbot\nRequestId: x-1\n```"
        text = f"Two things:\n{render(req)}\nand\n{render(note)}\nand\n{bad}"
        d = await chat.inject(text, author_id="u-lot")
        # The malformed block is answered; the two good ones still went through.
        assert d.outcome == "malformed" and set(d.request_ids) == {req.request_id, note.request_id}
        assert len(sent_to(side, "mantis-room", OutboundKind.PROTOCOL)) == 2
        assert await gw.store.get(req.request_id) is not None
        [notice] = sent_to(chat, "main", OutboundKind.NOTICE)
        assert "block 3" in notice.text and "question" in notice.text.lower()

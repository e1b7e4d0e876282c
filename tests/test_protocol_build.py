"""Builders, reply helpers, ids and the depth rule (wire-format.md section 5)."""

from __future__ import annotations

import re

import pytest

from protocol import (
    BuildError,
    Depth,
    DepthLimitError,
    MessageType,
    Priority,
    Status,
    answer_clarify,
    build_broadcast,
    build_clarify,
    build_handoff,
    build_request,
    build_response,
    check_depth_for_send,
    fingerprint,
    fingerprint_and_render,
    is_depth_violation,
    new_request_id,
    new_trace_id,
    parse,
    render,
    reply_clarify,
    reply_handoff,
    reply_response,
    sub_request,
)


def test_build_request_defaults() -> None:
    msg = build_request(sender="Lotbot", to="@Mantis", task="check disk")
    assert (msg.to, msg.sender, msg.depth, msg.priority) == (
        "Mantis",
        "Lotbot",
        Depth(),
        Priority.NORMAL,
    )
    assert re.fullmatch(r"lotbot-[0-9a-f]{12}", msg.request_id)
    assert msg.trace_id is not None and re.fullmatch(r"[0-9a-f]{32}", msg.trace_id)
    assert parse(render(msg)).messages == [msg]


def test_ids() -> None:
    assert new_request_id("Device-ABC123/智能体A").startswith("device-abc123-a-")
    assert new_request_id("智能体").startswith("agent-")
    assert new_request_id("  ").startswith("agent-")
    assert new_request_id("x") != new_request_id("x")
    assert new_trace_id() != new_trace_id()


def test_build_each_type_renders_and_parses() -> None:
    built = [
        build_request(
            sender="a", to="b", task="t", priority="HIGH", callback="cb", meta=[("X-K", "v")]
        ),
        build_response(sender="b", to="a", request_id="r", status="success", result="ok"),
        build_clarify(sender="b", to="a", request_id="r", question="which?"),
        build_handoff(sender="b", to="c", request_id="r", task="t", reason="busy", depth="2/5"),
        build_broadcast(sender="a", message="hello", subject="s", urgency="critical"),
    ]
    assert [m.type for m in built] == list(MessageType)
    assert built[1].status is Status.DONE
    assert built[4].to == "all"
    text = "\n".join(render(m) for m in built)
    assert parse(text).messages == built


def test_build_errors_are_readable() -> None:
    with pytest.raises(BuildError, match="sender"):
        build_request(sender="two words", to="b", task="t")
    with pytest.raises(BuildError, match="task"):
        build_request(sender="a", to="b", task="   ")
    with pytest.raises(BuildError, match="Status or a Result"):
        build_response(sender="a", to="b", request_id="r")
    with pytest.raises(BuildError, match="request_id"):
        build_clarify(sender="a", to="b", question="q")
    with pytest.raises(BuildError, match="Priority"):
        build_request(sender="a", to="b", task="t", priority="asap")
    with pytest.raises(BuildError, match="Status"):
        build_response(sender="a", to="b", request_id="r", status="maybe")
    with pytest.raises(BuildError, match="Depth"):
        build_request(sender="a", to="b", task="t", depth="9/5")
    with pytest.raises(BuildError, match="meta key"):
        build_request(sender="a", to="b", task="t", meta=[("Task", "x")])


@pytest.mark.parametrize("kind", ["request", "clarify", "handoff"])
def test_depth_limit_refuses_all_but_response(kind: str) -> None:
    with pytest.raises(DepthLimitError, match="only a RESPONSE"):
        if kind == "request":
            build_request(sender="a", to="b", task="t", depth="5/5")
        elif kind == "clarify":
            build_clarify(sender="a", to="b", request_id="r", question="q", depth="5/5")
        else:
            build_handoff(sender="a", to="b", request_id="r", task="t", depth="5/5")
    assert build_response(
        sender="a", to="b", request_id="r", status="done", depth="5/5"
    ).depth.at_limit


def test_check_depth_for_send_and_violation() -> None:
    (violating,) = parse(
        "```\n[REQUEST → @b]\nFrom: a\nRequestId: r\nTask: t\nDepth: 3/3\n```"
    ).messages
    assert is_depth_violation(violating)
    with pytest.raises(DepthLimitError):
        check_depth_for_send(violating)
    fine = build_request(sender="a", to="b", task="t", depth="2/3")
    assert not is_depth_violation(fine)
    check_depth_for_send(fine)
    # A RESPONSE to a violating message stays at the limit instead of overflowing it.
    answer = reply_response(violating, sender="b", status="failed", result="depth used up")
    assert answer.depth == Depth(current=3, max=3)


def test_reply_chain_carries_ids_and_depth() -> None:
    request = build_request(
        sender="Lotbot", to="Mantis", task="audit", depth="1/5", priority="high", callback="cb-1"
    )
    clarify = reply_clarify(request, sender="Mantis", question="which host?")
    assert (clarify.to, clarify.request_id, clarify.trace_id, clarify.depth) == (
        "Lotbot",
        request.request_id,
        request.trace_id,
        Depth(current=2, max=5),
    )
    answer = answer_clarify(clarify, sender="Lotbot", result="build-01")
    assert (answer.to, answer.status, answer.result, answer.depth.current) == (
        "Mantis",
        None,
        "build-01",
        3,
    )
    handoff = reply_handoff(
        answer, sender="Mantis", to="Clawcos", task="audit build-01", reason="no root"
    )
    assert handoff.to == "Clawcos" and handoff.depth == Depth(current=4, max=5)
    assert handoff.request_id == request.request_id and handoff.trace_id == request.trace_id
    with pytest.raises(DepthLimitError):
        reply_clarify(handoff, sender="Clawcos", question="?")
    done = reply_response(handoff, sender="Clawcos", status="done", result="ok", next_action="none")
    assert (done.to, done.depth.current, done.status) == ("Mantis", 5, Status.DONE)


def test_reply_handoff_keeps_priority_and_callback() -> None:
    request = build_request(sender="a", to="b", task="t", priority="critical", callback="cb-9")
    handoff = reply_handoff(request, sender="b", to="c", task="t2")
    assert (handoff.priority, handoff.callback) == (Priority.CRITICAL, "cb-9")


def test_sub_request() -> None:
    parent = build_request(sender="a", to="b", task="t", priority="low", depth="2/5")
    child = sub_request(parent, sender="b", to="c", task="part")
    assert child.request_id != parent.request_id and child.request_id.startswith("b-")
    assert (child.trace_id, child.depth, child.priority) == (
        parent.trace_id,
        Depth(current=3, max=5),
        Priority.LOW,
    )
    at_edge = build_request(sender="a", to="b", task="t", depth="4/5")
    with pytest.raises(DepthLimitError):
        sub_request(at_edge, sender="b", to="c", task="part")


def test_fingerprint() -> None:
    msg = build_request(sender="a", to="b", task="t", request_id="r", trace_id="tr")
    same = parse(render(msg).replace("\n", "\r\n")).messages[0]
    assert fingerprint(msg) == fingerprint(same)
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint(msg))
    assert fingerprint(msg) != fingerprint(msg.model_copy(update={"task": "u"}))
    assert fingerprint(msg) != fingerprint(
        msg.model_copy(update={"depth": Depth(current=2, max=5)})
    )
    signed = msg.model_copy(update={"key_id": "k", "signature": "ed25519:abc"})
    assert fingerprint(signed) == fingerprint(msg)
    # Stored fingerprints (idempotency) must not change from one release to the next.
    assert fingerprint(msg) == (
        "ea7368e8843b2f025a0104222058c0de489986ab730c94f3bebbf49ab3a9ea27"
    )


@pytest.mark.parametrize("signed", [False, True])
def test_fingerprint_and_render(signed: bool) -> None:
    msg = build_request(sender="a", to="b", task="t\n```x", request_id="r", trace_id="tr",
                        meta=[("X-Run", "7")])
    if signed:
        msg = msg.model_copy(update={"key_id": "k", "signature": "ed25519:abc"})
    assert fingerprint_and_render(msg) == (fingerprint(msg), render(msg))

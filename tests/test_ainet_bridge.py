"""The AINET bridge end to end: a real gateway on real Redis, the ``ainet`` transport on a
temporary folder, Lotbot on the HTTP API, and a plain AINET agent (``ainet_peer``, written
from the v0.3 rules alone) on the same folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from protocol import (
    MessageType,
    Status,
    build_request,
    parse,
    reply_clarify,
    reply_response,
)

from ainet_kit import ME, PEER, Chat, bridge_config, chat_and_bridge, eventually, ingested
from ainet_peer import PlainAgent, conv, read_message
from gwkit import running


def _session(root: Path, name: str) -> Path:
    return root / "session" / name


async def test_join_and_a_plain_private_request_answered_from_chat(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (gw, chat):
        joined = read_message(_session(root, f"{conv(ME)}_to_BROADCAST_broadcast.txt"))
        assert joined["FROM"] == ME and joined["TYPE"] == "BROADCAST"
        assert joined["Content"] == f"AI Agent {ME} has joined AINET(AI-Net) collaboration network."
        assert (root / "session" / "status.txt").read_text() == "PENDING"

        peer = PlainAgent(root, PEER)
        peer.join()
        peer.request(ME, "@Lotbot 请检查 build-01 的磁盘")
        request = await chat.one()  # the join is presence only: the request comes first
        assert request.type is MessageType.REQUEST
        assert (request.sender, request.to) == (PEER, "Lotbot")
        assert request.task == "请检查 build-01 的磁盘"  # type: ignore[union-attr]

        await chat.post(reply_response(request, sender="Lotbot", status="done",
                                       result="/var is at 91%"))
        answer = _session(root, f"{conv(ME)}_to_{conv(PEER)}_response.txt")
        await eventually(answer.exists)
        got = read_message(answer)
        assert (got["FROM"], got["TO"], got["Status"]) == (ME, PEER, "DONE")
        [block] = parse(got["Content"]).messages
        assert block.type is MessageType.RESPONSE and block.request_id == request.request_id
        assert peer.status() == "DONE"
        # The same answer is turn 001 of the conversation's task folder.
        turns = peer.conversation(request.request_id)
        assert [name for name, _ in turns] == [f"001-{conv(ME)}.txt"]
        assert (root / "tasks" / f"task-{request.request_id}" / "status.txt").read_text() == "DONE"
        assert (await gw.conversation(request.request_id) or {})["status"] == "done"
        # Nothing the bridge wrote came back in.
        await ingested(gw, f"session/{conv(ME)}_to_{conv(PEER)}_response.txt")
        assert await chat.receive(wait=0.2) == []


async def test_a_chat_request_answered_by_the_ainet_agent(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (_gw, chat):
        peer = PlainAgent(root, PEER)
        ask = build_request(sender="Lotbot", to=PEER, task="Review PR 7, please")
        await chat.post(ask)
        slot = _session(root, f"{conv(ME)}_to_{conv(PEER)}_request.txt")
        await eventually(slot.exists)
        assert [m["Content"] for m in peer.inbox() if m["FROM"] == ME][-1].startswith("```")
        [(first, turn)] = peer.conversation(ask.request_id)
        assert first == f"001-{conv(ME)}.txt" and turn["TO"] == PEER
        assert parse(turn["Content"]).messages == [ask]

        # The agent answers in the conversation folder, in plain words.
        peer.next_turn(ask.request_id, ME, "LGTM, two nits inline.", status="DONE")
        answer = await chat.one()
        assert answer.type is MessageType.RESPONSE and answer.request_id == ask.request_id
        assert (answer.sender, answer.status, answer.result) == (  # type: ignore[union-attr]
            PEER, Status.DONE, "LGTM, two nits inline.")

        # A second request to the same agent, answered the single-exchange way: the
        # earlier request file is the bridge's own and was answered, so it is replaced.
        again = build_request(sender="Lotbot", to=PEER, task="And PR 8?")
        await chat.post(again)
        await eventually(lambda: again.request_id in slot.read_text(encoding="utf-8"))
        peer.respond(ME, "PR 8 is fine too.")
        answer = await chat.one()
        assert (answer.request_id, answer.status) == (again.request_id, Status.DONE)  # type: ignore[union-attr]
        await eventually(lambda: peer.status() == "IDLE")  # the bridge read the reply


async def test_a_five_turn_conversation_and_a_restart_in_the_middle(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """The seed's v0.3 example: five numbered turns in the agent's own task folder, the
    last one the requester's DONE thank-you; the gateway restarts between turns 2 and 3."""
    root = tmp_path / "shared"
    peer = PlainAgent(root, PEER)
    config = bridge_config(redis_url, namespace, tmp_path)
    async with aiohttp.ClientSession() as http:
        async with running(config) as gw:
            chat = Chat(gw, http)
            peer.next_turn("review-1", ME, "@Lotbot can you review the release notes?")
            request = await chat.one()
            assert request.type is MessageType.REQUEST and request.sender == PEER
            await chat.post(reply_clarify(request, sender="Lotbot", question="Which version?"))
            await eventually(lambda: len(peer.conversation("review-1")) == 2)
        # The gateway is down while the agent writes its next turn.
        peer.next_turn("review-1", ME, "Version 2.4, the draft in docs/.")
        async with running(config) as gw:
            chat = Chat(gw, http)
            answer = await chat.one()  # turn 3 arrives once; turn 1 does not again
            assert answer.type is MessageType.RESPONSE and answer.status is None  # type: ignore[union-attr]
            assert answer.result == "Version 2.4, the draft in docs/."  # type: ignore[union-attr]
            await chat.post(reply_response(answer, sender="Lotbot", status="done",
                                           result="Reviewed: 3 typos fixed."))
            await eventually(lambda: len(peer.conversation("review-1")) == 4)
            thanks = peer.next_turn("review-1", ME, "Thanks! Task completed.", status="DONE")
            await ingested(gw, thanks.relative_to(root).as_posix())
            assert await chat.receive(wait=0.2) == []  # a closing thank-you, recorded only
            conversation = await gw.conversation(request.request_id) or {}
    turns = peer.conversation("review-1")
    assert [name for name, _ in turns] == [
        f"{n:03d}-{conv(who)}.txt" for n, who in enumerate((PEER, ME, PEER, ME, PEER), 1)]
    assert [m["Status"] for _, m in turns] == ["PENDING", "PENDING", "PENDING", "DONE", "DONE"]
    assert parse(turns[3][1]["Content"]).messages[0].request_id == request.request_id
    assert [e["type"] for e in conversation["history"]] == [
        "REQUEST", "CLARIFY", "RESPONSE", "RESPONSE"]
    assert conversation["status"] == "done"
    assert (root / "tasks" / "task-review-1" / "status.txt").read_text() == "DONE"
    assert not (root / "tasks" / f"task-{request.request_id}").exists()  # all in review-1


def test_bpgw_demo_includes_a_plain_ainet_agent(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "demo"], capture_output=True,
                          env=env, cwd=tmp_path, timeout=120, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "AINET agent Device-demo0001/Auditor joined" in out
    assert re.search(r"Auditor -> SecurityBot answered in task-securitybot-[0-9a-f]+/"
                     r"002-Device-demo0001-Auditor\.txt", out), out
    assert "as the gateway tracked it: done" in out

"""The AINET bridge end to end: a real gateway on real Redis, the ``ainet`` transport on a
temporary folder, Lotbot on the HTTP API, and a plain AINET agent (``ainet_peer``, written
from the v0.3 rules alone) on the same folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.ainet.settings import AinetSettings
from adapters.base import (
    Address,
    ConfigError,
    DeliveryError,
    Disposition,
    HealthState,
    Outbound,
    create_adapter,
)
from gateway.config import AgentSection
from protocol import (
    MessageType,
    Status,
    build_broadcast,
    build_request,
    parse,
    render,
    reply_clarify,
    reply_response,
)

from ainet_kit import (
    ME,
    PEER,
    Chat,
    bridge,
    bridge_config,
    chat_and_bridge,
    eventually,
    ingested,
    watch_is_live,
)
from ainet_peer import PlainAgent, conv, read_message
from gwkit import memory, running
from servers import PrivateValkey


def _session(root: Path, name: str) -> Path:
    return root / "session" / name


def _write_raw(path: bytes, data: bytes) -> None:
    """Write a file whose name is raw bytes (not necessarily UTF-8)."""
    with open(path, "wb") as f:
        f.write(data)


async def _stop_ends_the_loop(adapter: Any, loop_task: asyncio.Task[Any]) -> None:
    """``adapter.stop()`` ends its poll loop within 10 s (the loop is cancelled after the
    check either way, so a failing test does not leave it polling)."""
    stopping = asyncio.ensure_future(adapter.stop())
    await asyncio.wait([stopping], timeout=10)  # (no cancel of its own on timeout)
    stuck = not loop_task.done()
    loop_task.cancel()
    await stopping
    assert not stuck, "the poll loop outlived stop()"


def _files(folder: Path, pattern: str) -> list[Path]:
    return [p for p in folder.rglob(pattern) if p.is_file()]


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
        await eventually(lambda: peer.status() == "DONE")  # written right after the file
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
            # Acknowledge the REQUEST: unacknowledged, it would come back after the inbox's
            # visibility timeout, which a slow run can reach.
            assert await chat.receive(wait=0.1) == []
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
    # Where the state lives: the embedded Valkey and its (temporary) data folder.
    assert re.search(r"^state in the embedded Valkey at redis://127\.0\.0\.1:\d+ .*, data in "
                     r"/\S+/valkey \(removed when the demo ends\)$", out, re.M), out


async def test_half_written_and_malformed_files(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    # The grace is wide against the 0.3 s the test takes to finish the half-written file:
    # the bridge runs on the test's own loop, which a loaded machine can stall.
    config = bridge_config(redis_url, namespace, tmp_path, grace_period_seconds=2.0)
    async with chat_and_bridge(config) as (_gw, chat):
        peer = PlainAgent(root, PEER)
        # Half written (a sync client still copying it): completed within the grace period.
        text = peer.text(ME, "@Lotbot finish this sentence", kind="PRIVATE")
        request = _session(root, f"{conv(PEER)}_to_{conv(ME)}_request.txt")
        request.write_text(text[: len(text) // 2], encoding="utf-8")
        await asyncio.sleep(0.3)
        request.write_text(text, encoding="utf-8")
        got = await chat.one()
        assert got.task == "finish this sentence"  # type: ignore[union-attr]
        error = _session(root, f"{conv(ME)}_to_{conv(PEER)}_response.txt")
        assert not error.exists()

        # Malformed for longer than the grace period: an error reply, the file kept.
        broken = root / "tasks" / "task-x1" / "conversation" / f"001-{conv(PEER)}.txt"
        broken.parent.mkdir(parents=True)
        broken.write_text(f"=== Message ===\nFROM: {PEER}\nTO: {ME}\nTIME: yesterday\n"
                          "【Content】\nhello\n【Status】PENDING\n", encoding="utf-8")
        reply_path = broken.parent / f"002-{conv(ME)}.txt"
        await eventually(reply_path.exists)
        reply = read_message(reply_path)
        assert reply["TO"] == PEER and "bad_time" in reply["Content"]
        assert "tasks/task-x1/conversation/001-" in reply["Content"]
        assert broken.exists()
        # Not even an AINET file (no sender to answer): an error reply to everyone.
        junk = _session(root, "notes.txt")
        junk.write_bytes(b"\xff\xfe binary junk")
        everyone = _session(root, f"{conv(ME)}_to_BROADCAST_response.txt")
        await eventually(everyone.exists)
        assert "not_utf8" in read_message(everyone)["Content"] and junk.exists()
        # A plain request naming nobody: answered with how to fix it.
        peer.next_turn("x2", ME, "no mention here")
        fix = root / "tasks" / "task-x2" / "conversation" / f"002-{conv(ME)}.txt"
        await eventually(fix.exists)
        assert "@Name" in read_message(fix)["Content"]
        # A malformed bot-protocol block: the gateway's notice is the next turn there.
        peer.next_turn("x3", ME, f"```\n[REQUEST → @Lotbot]\nFrom: {PEER}\nTask: no id\n```")
        notice = root / "tasks" / "task-x3" / "conversation" / f"002-{conv(ME)}.txt"
        await eventually(notice.exists)
        assert "RequestId" in read_message(notice)["Content"]
        assert await chat.receive(wait=0.2) == []


async def test_hostile_names_never_leave_the_workspace(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    config = bridge_config(redis_url, namespace, tmp_path, grace_period_seconds=0.3)
    async with chat_and_bridge(config) as (gw, chat):
        peer = PlainAgent(root, PEER)
        # A RequestId that would climb out of tasks/: no task folder, the session file only.
        sneaky = build_request(sender="Lotbot", to=PEER, task="escape?",
                               request_id="lotbot-../../../escaped")
        await chat.post(sneaky)
        slot = _session(root, f"{conv(ME)}_to_{conv(PEER)}_request.txt")
        await eventually(slot.exists)
        assert parse(read_message(slot)["Content"]).messages == [sneaky]
        assert not _files(tmp_path, "escaped*") and not _files(root / "tasks", "task-lotbot-*")
        # A task folder whose name can't be written back to: the answer goes to session/.
        odd = peer.next_turn("with space", ME, "@Lotbot odd folder")
        asked = await chat.one()
        await chat.post(reply_response(asked, sender="Lotbot", status="done", result="ok"))
        answer = _session(root, f"{conv(ME)}_to_{conv(PEER)}_response.txt")
        await eventually(answer.exists)
        assert parse(read_message(answer)["Content"]).messages[0].request_id == asked.request_id
        assert os.listdir(odd.parent) == [odd.name]
        # A FROM that is a path: refused with an error reply, nothing written under it.
        forged = _session(root, "evil_to_BROADCAST_broadcast.txt")
        forged.write_text(PlainAgent(root, "../../etc/passwd").text(
            "BROADCAST", "hi", kind="BROADCAST"), encoding="utf-8")
        everyone = _session(root, f"{conv(ME)}_to_BROADCAST_response.txt")
        await eventually(everyone.exists)
        assert "bad_field" in read_message(everyone)["Content"]
        # An agent address that is not an AINET id is a delivery error, not a file.
        with pytest.raises(DeliveryError) as refused:
            await bridge(gw).send(Outbound(Address("ainet", "../../etc"), "x",
                                           recipient="Evil", id="1-0"))
        assert refused.value.code == "bad_address"
    # Outside the workspace the bridge wrote only its local state folder.
    outside = set(_files(tmp_path, "*")) - set(_files(root, "*"))
    assert outside <= set(_files(tmp_path / "bridge-state", "*")), outside


async def test_broadcasts_are_written_once_and_never_echoed(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    other = "Device-GHI789/智能体C"
    config = bridge_config(redis_url, namespace, tmp_path, agents={PEER: "", other: ""})
    async with chat_and_bridge(config) as (gw, chat):
        peer = PlainAgent(root, PEER)
        news = build_broadcast(sender="Lotbot", message="Deploy freeze at 18:00")
        await chat.post(news)  # delivered to ainet:PEER and ainet:other: written once
        folder = root / "tasks" / f"task-{news.request_id}" / "conversation"
        await eventually(lambda: folder.is_dir() and os.listdir(folder))
        await gw.drain()
        [(_, turn)] = peer.conversation(news.request_id)
        assert turn["TO"] == "BROADCAST" and "Deploy freeze" in turn["Content"]
        # The join still holds the broadcast slot (nobody answered it): the broadcast waits
        # in the spool, and takes the slot once an agent writes to the bridge.
        slot = _session(root, f"{conv(ME)}_to_BROADCAST_broadcast.txt")
        assert "has joined" in read_message(slot)["Content"]
        # An agent's reply to the broadcast becomes a REQUEST to the broadcaster.
        peer.next_turn(news.request_id, ME, "Noted, my deploy is done already.")
        reply = await chat.one()
        assert reply.type is MessageType.REQUEST and reply.to == "Lotbot"
        assert reply.context == f"reply to BROADCAST {news.request_id}"  # type: ignore[union-attr]
        peer.respond(ME, "Also noted in session/.")
        await eventually(lambda: "Deploy freeze" in slot.read_text(encoding="utf-8"))
        await chat.receive(wait=0.5)
        # An AINET agent's own BROADCAST reaches chat but is not written back to the folder.
        (root / "session" / f"{conv(PEER)}_to_BROADCAST_broadcast.txt").write_text(
            peer.text("BROADCAST", "Lunch is served", kind="BROADCAST"), encoding="utf-8")
        heard = await chat.one()
        assert heard.is_broadcast and heard.sender == PEER
        await gw.drain()
        mine = [p for p in root.rglob("*.txt") if conv(ME) in p.name]
        assert not [p for p in mine if "Lunch is served" in p.read_text(encoding="utf-8")]


async def test_two_writers_race_for_the_next_turn_number(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """The bridge's relays (through send) and a plain agent (open(..., 'x')) each create 500
    turns in one conversation at once: 1,000 files, every message present exactly once."""
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (gw, _chat):
        adapter = bridge(gw)
        peer = PlainAgent(root, PEER)
        third = "Device-XYZ999/other"  # the agent's turns are for someone else

        def agent_writes() -> None:
            for i in range(500):
                peer.next_turn("race-1", third, f"agent {i}")

        async def bridge_writes() -> None:
            await asyncio.gather(*(adapter.send(Outbound(
                Address("ainet", "mirror"), f"bridge {i}", request_id="race-1", id=f"{i}-0"))
                for i in range(500)))

        await asyncio.gather(asyncio.to_thread(agent_writes), bridge_writes())
        turns = peer.conversation("race-1")
    contents = sorted(m["Content"] for _, m in turns)
    assert len(turns) == 1000
    wanted = [f"agent {i}" for i in range(500)] + [f"bridge {i}" for i in range(500)]
    assert contents == sorted(wanted)


async def test_polling_and_watching(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    root = tmp_path / "shared"
    polling = bridge_config(redis_url, namespace, tmp_path)
    async with chat_and_bridge(polling) as (gw, chat):
        assert bridge(gw).health().detail.startswith(f"polling {root.resolve()} as {ME}")
        PlainAgent(root, PEER).request(ME, "@Lotbot polled")
        assert (await chat.one()).task == "polled"  # type: ignore[union-attr]
    # Watch mode with a poll interval far longer than the test: the event brings the file.
    watching = bridge_config(redis_url, namespace, tmp_path, discovery="watch",
                             poll_interval_seconds=600)
    async with chat_and_bridge(watching) as (gw, chat):
        assert bridge(gw).health().detail.startswith("watching")
        assert bridge(gw)._watcher is not None
        await watch_is_live(bridge(gw)._watcher, root)
        PlainAgent(root, PEER).next_turn("w1", ME, "@Lotbot watched")
        assert (await chat.one()).task == "watched"  # type: ignore[union-attr]
        assert gw.health()["transports"]["ainet"]["state"] == "up"


async def test_probe_owned_names_and_options(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    adapter = create_adapter("ainet", "ainet", {"workspace": str(shared),
                                                "state_dir": str(tmp_path / "st"),
                                                "agents": {PEER: "Reviewer"}})
    [workspace, state, events] = await adapter.probe()
    assert not workspace.ok and "not a folder" in workspace.detail and workspace.fix
    assert state.ok and "will be created" in state.detail and events.ok
    assert not (tmp_path / "st").exists()  # a probe creates nothing
    shared.mkdir()
    assert all(p.ok for p in await adapter.probe())
    assert not list(shared.iterdir())  # the probe file is removed again
    shared.chmod(0o500)
    try:
        if os.geteuid() != 0:  # root writes anywhere
            assert not (await adapter.probe())[0].ok
    finally:
        shared.chmod(0o700)
    [owned] = adapter.owned_names()
    assert (owned.name, owned.identity, str(owned.address)) == (
        "Reviewer", f"ainet:{PEER}", f"ainet:{PEER}")
    for bad in ({"workspace": "x", "agents": {"no-slash": ""}},
                {"workspace": "x", "agent_id": "../x/y"},
                {"workspace": "x", "default_recipient": "has space"},
                {"workspace": "x", "discovery": "sometimes"}):
        with pytest.raises(ConfigError, match=r"transports\.ainet\."):
            create_adapter("ainet", "ainet", bad)


async def test_relative_folders_work(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``bpgw run`` without --data-dir uses ./.bpgw: relative workspace and state folders."""
    monkeypatch.chdir(tmp_path)
    real = await asyncio.to_thread(os.path.realpath, tmp_path)
    config = bridge_config(redis_url, namespace, tmp_path, workspace="rel/shared",
                           state_dir="rel/state")
    async with chat_and_bridge(config) as (gw, chat):
        assert str(bridge(gw).workspace.root) == os.path.join(real, "rel", "shared")
        PlainAgent(tmp_path / "rel" / "shared", PEER).request(ME, "@Lotbot relative")
        assert (await chat.one()).task == "relative"  # type: ignore[union-attr]
    assert (tmp_path / "rel" / "state" / "locks").is_dir()


def test_config_example_documents_every_option() -> None:
    text = (Path(__file__).resolve().parent.parent / "config.example.toml").read_text("utf-8")
    for key in AinetSettings.model_fields:
        assert re.search(rf"^# {key} = ", text, re.M) or re.search(
            rf"^# \[transports\.ainet\.{key}\]", text, re.M), f"[transports.ainet] {key}"


async def test_a_block_too_large_for_a_file_is_refused_before_writing(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    config = bridge_config(redis_url, namespace, tmp_path, max_message_bytes=4096)
    async with chat_and_bridge(config) as (gw, _chat):
        big = build_request(sender="Lotbot", to=PEER, task="z" * 5000, request_id="lotbot-big")
        with pytest.raises(DeliveryError) as refused:
            await bridge(gw).send(Outbound(Address("ainet", PEER), render(big),
                                           recipient=PEER, request_id="lotbot-big", id="9-0"))
        assert refused.value.code == "too_large"
        assert not _files(tmp_path / "shared" / "tasks", "*lotbot-big*")


async def test_a_session_only_agent_answers_a_clarify(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """An agent that only knows session/ files: its next request file answers the
    bridge's CLARIFY (the bridge's response slot names the conversation)."""
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (gw, chat):
        peer = PlainAgent(root, PEER)
        peer.request(ME, "@Lotbot rotate the logs")
        request = await chat.one()
        await chat.post(reply_clarify(request, sender="Lotbot", question="Which host?"))
        response = _session(root, f"{conv(ME)}_to_{conv(PEER)}_response.txt")
        await eventually(response.exists)
        assert parse(read_message(response)["Content"]).messages[0].type is MessageType.CLARIFY
        peer.request(ME, "build-02")
        answer = await chat.one()
        assert (answer.type, answer.request_id, answer.result) == (  # type: ignore[union-attr]
            MessageType.RESPONSE, request.request_id, "build-02")
        await chat.post(reply_response(answer, sender="Lotbot", status="done", result="rotated"))
        await eventually(lambda: "rotated" in response.read_text(encoding="utf-8"))
        assert (await gw.conversation(request.request_id) or {})["status"] == "done"


async def test_mirrored_conversations_are_written_as_turns(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """``mirrors = ["ainet:mirror"]``: a chat-only conversation appears in the folder as
    turns of its task folder (TO the recipient or BROADCAST), without session files."""
    config = bridge_config(redis_url, namespace, tmp_path).model_copy(update={
        "mirrors": ["ainet:mirror"]})
    config = config.model_copy(update={"transports": {
        **config.transports, "side": {"kind": "memory"}}, "agents": {
        **config.agents, "Mantis": AgentSection(addresses=["side:mantis-room"],
                                                identities=["side:u-mantis"])}})
    root = tmp_path / "shared"
    async with chat_and_bridge(config) as (gw, chat):
        ask = build_request(sender="Lotbot", to="Mantis", task="check disk")
        await chat.post(ask)
        answer = reply_response(ask, sender="Mantis", status="done", result="fine")
        await memory(gw, "side").inject(render(answer), author_id="u-mantis",
                                        channel="mantis-room")
        await gw.drain()
        turns = await eventually(lambda: len(PlainAgent(root, PEER).conversation(
            ask.request_id)) == 2 and PlainAgent(root, PEER).conversation(ask.request_id))
        assert [parse(m["Content"]).messages[0] for _, m in turns] == [ask, answer]
        assert {m["TO"] for _, m in turns} == {"BROADCAST"}
        assert [m["Status"] for _, m in turns] == ["PENDING", "DONE"]
        assert sorted(p.name for p in (root / "session").iterdir()) == [
            f"{conv(ME)}_to_BROADCAST_broadcast.txt", "status.txt"]


async def test_a_turn_not_taken_holds_back_the_later_turns(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn the gateway could not take (``busy``: another replica has it) is tried
    again at the next poll, and the later turns of its conversation wait for it: the
    turns reach the gateway in order (another conversation does not wait)."""
    root = tmp_path / "shared"
    peer = PlainAgent(root, PEER)
    peer.next_turn("hold-1", ME, "@Lotbot first question")
    peer.next_turn("hold-1", ME, "Never mind, solved.", status="DONE")
    peer.next_turn("other-1", ME, "@Lotbot another question")
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (gw, chat):
        real, handed = gw.on_envelopes, []

        async def busy_once(envelopes: Any, *, ordered: bool = True) -> list[Disposition]:
            rels = [(e.native_id or "").partition("@")[0] for e in envelopes]
            handed.extend(rels)
            first = f"tasks/task-hold-1/conversation/001-{conv(PEER)}.txt"
            if handed.count(first) == 1 and first in rels:
                at = rels.index(first)
                rest = await real([e for i, e in enumerate(envelopes) if i != at],
                                  ordered=ordered)
                rest.insert(at, Disposition("busy", "another replica has it"))
                return rest
            return await real(envelopes, ordered=ordered)

        monkeypatch.setattr(gw, "on_envelopes", busy_once)
        assert (await chat.one()).task == "another question"  # (not held back)
        request = await chat.one()
        assert request.task == "first question"
        answer = await chat.one()
        assert answer.type is MessageType.RESPONSE and answer.request_id == request.request_id
    assert [rel.rpartition("/")[2][:3] for rel in handed if "hold-1" in rel] == [
        "001", "001", "002"]


async def test_a_redis_outage_degrades_health_and_loses_nothing(tmp_path: Path) -> None:
    """Redis stops while an agent writes a request: the transport reports degraded, the
    file is not marked, and once Redis is back it arrives (once)."""
    valkey = await asyncio.to_thread(PrivateValkey(tmp_path / "valkey", appendonly=True).start)
    root = tmp_path / "shared"
    try:
        config = bridge_config(valkey.url, "ainet-outage", tmp_path)
        async with chat_and_bridge(config) as (gw, chat):
            peer = PlainAgent(root, PEER)
            peer.request(ME, "@Lotbot before")
            assert (await chat.one()).task == "before"  # type: ignore[union-attr]
            await asyncio.to_thread(valkey.stop)
            during = peer.next_turn("outage", ME, "@Lotbot during the outage")
            state = await eventually(lambda: bridge(gw).health().state is HealthState.DEGRADED
                                     and bridge(gw).health())
            assert "poll failed" in state.detail
            await asyncio.to_thread(valkey.start)
            await ingested(gw, during.relative_to(root).as_posix())
            assert (await chat.one()).task == "during the outage"  # type: ignore[union-attr]
            await eventually(lambda: bridge(gw).health().state is HealthState.UP)
            assert await chat.receive(wait=0.3) == []
    finally:
        await asyncio.to_thread(valkey.close)


async def test_stop_is_not_lost_when_a_wake_up_comes_at_the_same_moment(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any
) -> None:
    """A poll wake-up landing in the same loop turn as stop's cancel (a busy folder on a
    loaded machine): the poll loop ends all the same, it does not keep polling forever."""
    config = bridge_config(redis_url, namespace, tmp_path, poll_interval_seconds=600)
    async with chat_and_bridge(config) as (gw, _chat):
        adapter = bridge(gw)
        loop_task = adapter._loop_task
        assert loop_task is not None
        await ingested(gw, f"session/{conv(ME)}_to_BROADCAST_broadcast.txt")  # polled once
        await asyncio.sleep(0.1)  # the loop is now waiting for its next poll
        adapter._on_paths([])  # a wake-up, and the cancel right behind it
        await _stop_ends_the_loop(adapter, loop_task)


async def test_a_send_cancelled_mid_write_is_still_recorded(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outbox cancels its sends when the gateway stops. A turn already being written
    (a thread can't be stopped) is recorded all the same, so the delivery repeated after
    the restart does not write it twice (it did: a CLARIFY twice in a conversation)."""
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (gw, _chat):
        adapter = bridge(gw)
        writer = adapter._writer
        assert writer is not None
        real_write, slow_disk = writer.write, threading.Event()

        def slow_write(plan: Any) -> Any:
            outcome = real_write(plan)
            slow_disk.wait(10)  # written, the record not made yet
            return outcome

        monkeypatch.setattr(writer, "write", slow_write)
        out = Outbound(Address("ainet", "mirror"), "once only", request_id="cut-1", id="7-0")
        sending = asyncio.create_task(adapter.send(out))
        folder = root / "tasks" / "task-cut-1" / "conversation"
        await eventually(lambda: folder.is_dir() and os.listdir(folder))
        sending.cancel()  # what the outbox's stop does
        slow_disk.set()
        with pytest.raises(asyncio.CancelledError):
            await sending
        monkeypatch.setattr(writer, "write", real_write)
        await adapter.send(out)  # the outbox's retry after the restart
        assert [m["Content"] for _, m in PlainAgent(root, PEER).conversation("cut-1")] == [
            "once only"]


async def test_stop_ends_the_poll_loop_even_when_a_cancel_is_dropped(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 3.11, asyncio.wait_for inside a library (redis-py's socket writes) now and then
    drops a cancel; the poll loop ends at stop() all the same."""
    config = bridge_config(redis_url, namespace, tmp_path, poll_interval_seconds=600)
    async with chat_and_bridge(config) as (gw, _chat):
        adapter = bridge(gw)
        loop_task = adapter._loop_task
        assert loop_task is not None
        polling = asyncio.Event()

        async def poll_dropping_a_cancel() -> int:
            polling.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.5)
            return 0

        monkeypatch.setattr(adapter, "poll_once", poll_dropping_a_cancel)
        adapter._on_paths([])
        await asyncio.wait_for(polling.wait(), 10)
        await _stop_ends_the_loop(adapter, loop_task)


async def test_names_that_are_not_utf8_are_skipped_and_the_rest_flows(
    redis_url: str, namespace: str, tmp_path: Path, redis_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A synced folder can hold names in another encoding: one such file used to make
    every poll fail (the name could not be stored), so nothing was ingested any more."""
    root = tmp_path / "shared"
    async with chat_and_bridge(bridge_config(redis_url, namespace, tmp_path)) as (_gw, chat):
        peer = PlainAgent(root, PEER)
        junk = peer.text(ME, "@Lotbot from a bad name", kind="PRIVATE").encode()
        me = os.fsencode(conv(ME))
        (root / "tasks" / "task-zz" / "conversation").mkdir(parents=True)
        for raw in (os.fsencode(root / "session") + b"/Device-x\xff_to_" + me + b"_request.txt",
                    os.fsencode(root / "tasks" / "task-zz" / "conversation") + b"/001-\xfe.txt"):
            _write_raw(raw, junk)
        os.makedirs(os.fsencode(root / "tasks") + b"/task-\xff/conversation")
        peer.request(ME, "@Lotbot after the junk")
        got = await chat.one()
        assert got.task == "after the junk"  # type: ignore[union-attr]
        assert await chat.receive(wait=0.3) == []
    skipped = [r.getMessage() for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    # The two files and the task folder, each once however many polls ran.
    assert len(skipped) == 3 and all("\\x" in m for m in skipped), skipped


"""The workspace layout, against a plain AINET agent written from the seed's rules."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from adapters.ainet.message import AinetMessage, AinetStatus, AinetType, parse
from adapters.ainet.names import UnsafeNameError
from adapters.ainet.workspace import LayoutError, SessionState, SlotKind, Workspace, digest_of

from ainet_peer import PlainAgent, conv, read_message

ME = "Device-bridgeAB12/网关"
PEER = "Device-ABC123/智能体A"


def workspace(tmp_path: Path, **kw: int) -> Workspace:
    ws = Workspace(tmp_path / "shared", ME, state_dir=tmp_path / "local", **kw)
    ws.prepare()
    return ws


def message(to: str, content: str, kind: AinetType = AinetType.PRIVATE,
            status: AinetStatus = AinetStatus.PENDING, sender: str = ME) -> AinetMessage:
    return AinetMessage(sender, to, kind, datetime.now().replace(microsecond=0), content, status)


def test_prepare_and_join_are_read_by_a_plain_agent(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    assert (ws.session / "status.txt").read_text() == "IDLE"
    joined = message("BROADCAST", f"AI Agent {ME} has joined AINET(AI-Net) collaboration "
                     "network.", AinetType.BROADCAST)
    written = ws.post_session(joined, SlotKind.BROADCAST)
    assert written is not None
    assert written.rel == f"session/{conv(ME)}_to_BROADCAST_broadcast.txt"
    assert ws.advance_session(SessionState.PENDING) == [SessionState.PENDING]
    peer = PlainAgent(ws.root, PEER)
    [seen] = peer.inbox()
    assert seen["FROM"] == ME and seen["TYPE"] == "BROADCAST" and "has joined" in seen["Content"]
    assert peer.status() == "PENDING"
    assert written.digest == digest_of((ws.root / written.rel).read_bytes())


def test_prepare_keeps_an_existing_status(tmp_path: Path) -> None:
    (tmp_path / "shared" / "session").mkdir(parents=True)
    (tmp_path / "shared" / "session" / "status.txt").write_text("DONE")
    assert workspace(tmp_path).session_state() is SessionState.DONE


def test_session_status_machine(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    assert ws.advance_session(SessionState.DONE) == [SessionState.PENDING, SessionState.DONE]
    assert ws.advance_session(SessionState.PENDING) == [SessionState.IDLE, SessionState.PENDING]
    assert ws.advance_session(SessionState.PENDING) == []
    # PENDING -> IDLE would claim DONE on the way: someone's request is still open.
    assert ws.advance_session(SessionState.IDLE) == []
    assert ws.session_state() is SessionState.PENDING
    (ws.session / "status.txt").write_text("garbage")
    assert ws.session_state() is None
    assert ws.advance_session(SessionState.IDLE) == [SessionState.IDLE]


def test_second_request_to_the_same_agent_is_spooled_not_overwritten(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    peer = PlainAgent(ws.root, PEER)
    first = ws.post_session(message(PEER, "first request"), SlotKind.REQUEST)
    assert first is not None
    assert ws.post_session(message(PEER, "second request"), SlotKind.REQUEST) is None
    assert ws.post_session(message(PEER, "third request"), SlotKind.REQUEST) is None
    slot = ws.root / first.rel
    assert read_message(slot)["Content"] == "first request"
    assert ws.pump_spool() == []  # not answered yet: nothing moves
    # The peer answers (a newer file from it to us): the slot frees for the next one.
    os.utime(slot, ns=(1, 1))
    peer.respond(ME, "answer one")
    [moved] = ws.pump_spool()
    assert moved.rel == first.rel and read_message(slot)["Content"] == "second request"
    os.utime(slot, ns=(2, 2))
    peer.respond(ME, "answer two")
    ws.pump_spool()
    assert read_message(slot)["Content"] == "third request"
    assert ws.pump_spool() == []
    assert os.listdir(ws.spool_dir / slot.name) == []


def test_a_slot_someone_else_wrote_is_never_replaced(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    slot = ws.session / f"{conv(ME)}_to_{conv(PEER)}_request.txt"
    slot.write_text("not a message at all")
    os.utime(slot, ns=(1, 1))
    PlainAgent(ws.root, PEER).respond(ME, "newer file from the peer")
    assert ws.post_session(message(PEER, "mine"), SlotKind.REQUEST) is None
    assert ws.pump_spool() == []
    assert slot.read_text() == "not a message at all"


def test_spool_is_bounded(tmp_path: Path) -> None:
    ws = workspace(tmp_path, max_spool=2)
    ws.post_session(message(PEER, "in the slot"), SlotKind.REQUEST)
    ws.post_session(message(PEER, "spooled 1"), SlotKind.REQUEST)
    ws.post_session(message(PEER, "spooled 2"), SlotKind.REQUEST)
    with pytest.raises(LayoutError, match="2 messages waiting"):
        ws.post_session(message(PEER, "one too many"), SlotKind.REQUEST)


def test_conversation_turns_interleave_with_a_plain_agent(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    folder = ws.open_task("req-1", {"request_id": "req-1", "created_by": ME})
    assert json.loads((folder / "config.json").read_text())["created_by"] == ME
    assert (folder / "status.txt").read_text() == "PENDING"
    assert (folder / "input").is_dir() and (folder / "output").is_dir()
    peer = PlainAgent(ws.root, PEER)
    for turn in range(5):
        ws.add_turn("req-1", message(PEER, f"bridge turn {turn}"))
        peer.next_turn("req-1", ME, f"peer turn {turn}", "DONE" if turn == 4 else "PENDING")
    ws.set_task_status("req-1", "DONE")
    turns = peer.conversation("req-1")
    assert [name for name, _ in turns][:3] == [
        f"001-{conv(ME)}.txt", f"002-{conv(PEER)}.txt", f"003-{conv(ME)}.txt"]
    assert [m["Content"] for _, m in turns][-2:] == ["bridge turn 4", "peer turn 4"]
    assert turns[-1][1]["Status"] == "DONE"
    assert (folder / "status.txt").read_text() == "DONE"
    # A second open keeps what is there.
    ws.open_task("req-1", {"other": 1})
    assert "other" not in json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("request_id", ["../escape", "a/b", "..", "/etc", "x\x00y", "r" * 200])
def test_hostile_request_ids_never_touch_the_disk(tmp_path: Path, request_id: str) -> None:
    ws = workspace(tmp_path)
    before = sorted(p.as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeNameError):
        ws.add_turn(request_id, message(PEER, "x"))
    with pytest.raises(UnsafeNameError):
        ws.open_task(request_id, {})
    assert sorted(p.as_posix() for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("planted", ["task-t1", "task-t1/conversation", "task-t1/output"])
def test_a_link_planted_in_a_task_folder_is_never_followed(tmp_path: Path,
                                                           planted: str) -> None:
    """A symbolic link where the task folder or one of its sub-folders goes (pointing
    outside the workspace) makes the bridge refuse to open the task, creating nothing
    through it."""
    ws = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = ws.tasks / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeNameError, match="symbolic link"):
        ws.open_task("t1", {"request_id": "t1"})  # (the writer opens a task before a turn)
    assert os.listdir(outside) == []


def test_the_bridge_writes_only_as_itself(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with pytest.raises(LayoutError, match="writes only as"):
        ws.add_turn("r", message(ME, "forged", sender=PEER))


def _race(args: tuple[str, int, int]) -> list[str]:
    root, writer, count = args
    local = Path(root).parent / "local"
    ws = Workspace(Path(root), f"Device-W{writer:02d}/writer", state_dir=local)
    return [ws.add_turn("race", AinetMessage(
        ws.agent_id, PEER, AinetType.PRIVATE, datetime(2026, 1, 1), f"{writer}:{i}")).rel
        for i in range(count)]


def _check_race(root: Path, results: list[list[str]], total: int) -> None:
    written = [rel for batch in results for rel in batch]
    assert len(written) == len(set(written)) == total
    folder = root / "tasks" / "task-race" / "conversation"
    names = sorted(os.listdir(folder))
    assert len(names) == total
    assert sorted(int(n.split("-")[0]) for n in names) == list(range(1, total + 1))
    contents = set()
    for name in names:
        msg = parse((folder / name).read_bytes())
        assert isinstance(msg, AinetMessage) and name.endswith(conv(msg.sender) + ".txt")
        contents.add(msg.content)
    assert len(contents) == total  # every message is there once: none lost, none overwritten


def test_thousand_concurrent_creates_from_threads_lose_nothing(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    ws.open_task("race", {})
    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(_race, [(str(ws.root), w, 50) for w in range(20)]))
    _check_race(ws.root, results, 1000)


def test_thousand_concurrent_creates_from_processes_lose_nothing(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    ws.open_task("race", {})
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_race, [(str(ws.root), w, 125) for w in range(8)])
    _check_race(ws.root, results, 1000)

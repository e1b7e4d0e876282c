"""Inbound discovery on a real folder with the ingest record on real Redis/Valkey."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from adapters.ainet.discovery import Scanner
from adapters.ainet.inbox import Arrival, Inbox
from adapters.ainet.ledger import IngestRecord, RedisIngestLedger
from adapters.ainet.message import AinetMessage, AinetType
from adapters.ainet.watch import Watcher
from adapters.ainet.workspace import SlotKind, Workspace

from ainet_kit import eventually, watch_is_live
from ainet_peer import PlainAgent, conv

ME = "Device-bridgeAB12/网关"
PEER = "Device-ABC123/智能体A"


def make_inbox(root: Path, client: aioredis.Redis, namespace: str, **kw: float) -> Inbox:
    ledger = RedisIngestLedger(client, namespace, "ainet-test")
    scanner = Scanner(root, hot_seconds=kw.pop("hot_seconds", 60.0),
                      cold_per_poll=int(kw.pop("cold_per_poll", 64)))
    return Inbox(scanner, ME, ledger, grace_seconds=kw.pop("grace", 30.0),
                 settle_seconds=kw.pop("settle", 0.0))


def workspace(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "shared", ME, state_dir=tmp_path / "local")
    ws.prepare()
    return ws


async def drain(inbox: Inbox, polls: int = 3) -> list[Arrival]:
    got: list[Arrival] = []
    for _ in range(polls):
        batch = await inbox.poll()
        await inbox.ack(batch)
        got += batch
    return got


async def test_ledger_round_trip_and_bound(redis_client: aioredis.Redis, namespace: str) -> None:
    ledger = RedisIngestLedger(redis_client, namespace, "t", max_entries=100)
    recs = [IngestRecord(f"tasks/task-x/conversation/{i:03d}-a.txt", "d" * 64, i, i * 10)
            for i in range(150)]
    await ledger.record(recs[:120])
    await ledger.record(recs[120:])
    assert await ledger.count() == 100
    found = await ledger.lookup([r.path for r in recs])
    assert found[:50] == [None] * 50 and found[50:] == recs[50:]
    assert ledger.records_key.startswith("{" + namespace + ":ainet:t}")
    with pytest.raises(ValueError, match="hash tag"):
        RedisIngestLedger(redis_client, namespace, "bad}name")


async def test_plain_agent_messages_arrive_once(tmp_path: Path, redis_client: aioredis.Redis,
                                                namespace: str) -> None:
    ws = workspace(tmp_path)
    inbox = make_inbox(ws.root, redis_client, namespace)
    peer = PlainAgent(ws.root, PEER)
    peer.join()
    peer.request(ME, "请帮我审查这段代码")
    peer.next_turn("t1", ME, "turn one")
    got = await drain(inbox)
    assert sorted(a.rel for a in got) == sorted([
        f"session/{conv(PEER)}_to_BROADCAST_broadcast.txt",
        f"session/{conv(PEER)}_to_{conv(ME)}_request.txt",
        f"tasks/task-t1/conversation/001-{conv(PEER)}.txt"])
    assert all(a.message is not None and a.message.sender == PEER for a in got)
    assert await drain(inbox) == []
    # The peer sends a second request in the same single-exchange file: a new arrival.
    peer.request(ME, "second request")
    [again] = await drain(inbox)
    assert again.message is not None and again.message.content == "second request"


async def test_own_files_are_never_ingested(tmp_path: Path, redis_client: aioredis.Redis,
                                            namespace: str) -> None:
    ws = workspace(tmp_path)
    inbox = make_inbox(ws.root, redis_client, namespace)
    msg = AinetMessage(ME, PEER, AinetType.PRIVATE, datetime(2026, 1, 1), "from the bridge")
    written = [ws.add_turn("t2", msg)]
    await inbox.note_written(written)
    session = ws.post_session(msg, SlotKind.REQUEST)
    assert session is not None
    # Not recorded (as after a crash between write and record): FROM still says it's ours.
    assert await drain(inbox) == []
    # A file that merely claims to be from us in a peer's name is not ours: FROM decides.
    PlainAgent(ws.root, PEER).next_turn("t2", ME, "peer reply")
    [reply] = await drain(inbox)
    assert reply.message is not None and reply.message.sender == PEER


async def test_half_written_file_is_retried_until_complete(tmp_path: Path,
                                                           redis_client: aioredis.Redis,
                                                           namespace: str) -> None:
    ws = workspace(tmp_path)
    inbox = make_inbox(ws.root, redis_client, namespace, settle=3600.0)
    text = PlainAgent(ws.root, PEER).text(ME, "a long message " * 50, kind=None)
    folder = ws.root / "tasks" / "task-h" / "conversation"
    folder.mkdir(parents=True)
    path = folder / f"001-{conv(PEER)}.txt"
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    assert await drain(inbox) == []
    assert inbox.pending == 1
    path.write_text(text, encoding="utf-8")
    # Complete and parseable, but it must look the same twice before it counts.
    first = await inbox.poll()
    second = await inbox.poll()
    got = first + second
    assert len(got) == 1 and got[0].message is not None
    assert got[0].message.content.startswith("a long message")
    await inbox.ack(got)
    assert inbox.pending == 0 and path.exists()


async def test_malformed_file_errors_after_grace_and_stays(tmp_path: Path,
                                                           redis_client: aioredis.Redis,
                                                           namespace: str) -> None:
    ws = workspace(tmp_path)
    inbox = make_inbox(ws.root, redis_client, namespace, grace=0.3)
    bad = ws.session / f"{conv(PEER)}_to_{conv(ME)}_request.txt"
    bad.write_text("hello, this is not an AINET message")
    assert await inbox.poll() == []
    await asyncio.sleep(0.35)
    [arrival] = await inbox.poll()
    assert arrival.message is None and arrival.error is not None
    assert arrival.error.code == "no_header"
    await inbox.ack([arrival])
    assert bad.exists() and await drain(inbox) == []


async def test_restart_mid_conversation_neither_misses_nor_repeats(
        tmp_path: Path, redis_client: aioredis.Redis, namespace: str) -> None:
    ws = workspace(tmp_path)
    peer = PlainAgent(ws.root, PEER)
    first = make_inbox(ws.root, redis_client, namespace)
    for turn in range(3):
        peer.next_turn("r", ME, f"turn {turn}")
    batch = await first.poll()
    assert len(batch) == 3
    await first.ack(batch[:2])  # the third was not committed when we "crashed"
    peer.next_turn("r", ME, "written while the bridge was down")
    second = make_inbox(ws.root, redis_client, namespace)
    got = await drain(second)
    contents = sorted(a.message.content for a in got if a.message)
    assert contents == sorted([batch[2].message.content if batch[2].message else "",
                               "written while the bridge was down"])


async def test_hostile_entries_are_not_followed(tmp_path: Path, redis_client: aioredis.Redis,
                                                namespace: str) -> None:
    ws = workspace(tmp_path)
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "001-x.txt").write_text(PlainAgent(ws.root, PEER).text(ME, "secret", kind=None))
    (ws.root / "tasks" / "task-evil").mkdir()
    (ws.root / "tasks" / "task-evil" / "conversation").symlink_to(outside)
    (ws.session / f"{conv(PEER)}_to_{conv(ME)}_request.txt").symlink_to(outside / "001-x.txt")
    (ws.root / "tasks" / "task-ok" / "conversation").mkdir(parents=True)
    for name in ["001-..txt", ".002-hidden.txt", "notes.md", "003-\u202e.txt"]:
        (ws.root / "tasks" / "task-ok" / "conversation" / name).write_text("x")
    inbox = make_inbox(ws.root, redis_client, namespace, grace=0.0)
    got = await drain(inbox)
    assert all(a.message is None for a in got)  # nothing from outside the workspace
    assert sorted(a.rel.rsplit("/", 1)[1] for a in got) == ["001-..txt", "003-\u202e.txt"]


async def test_polling_cost_does_not_grow_with_old_conversations(
        tmp_path: Path, redis_client: aioredis.Redis, namespace: str) -> None:
    ws = workspace(tmp_path)
    peer = PlainAgent(ws.root, PEER)
    for task in range(200):
        peer.next_turn(f"old{task}", ME, "old")
    inbox = make_inbox(ws.root, redis_client, namespace, hot_seconds=0.0, cold_per_poll=8)
    assert len(await drain(inbox, polls=1)) == 200
    await asyncio.sleep(0.01)
    await inbox.poll()
    assert inbox.scanner.checks <= 2 + 8 + 200  # one full pass while everything is hot
    await inbox.poll()
    assert inbox.scanner.checks <= 2 + 8  # session/, tasks/ and a slice of cold folders
    # A new turn in an old (cold) conversation is still found within the rotation.
    peer.next_turn("old7", ME, "late reply")
    got: list[Arrival] = []
    for _ in range(200 // 8 + 2):
        got += await drain(inbox, polls=1)
    assert [a.message.content for a in got if a.message] == ["late reply"]


async def test_watch_events_make_items_dirty(tmp_path: Path, redis_client: aioredis.Redis,
                                             namespace: str) -> None:
    ws = workspace(tmp_path)
    inbox = make_inbox(ws.root, redis_client, namespace, hot_seconds=0.0, cold_per_poll=1)
    peer = PlainAgent(ws.root, PEER)
    for task in range(20):
        peer.next_turn(f"w{task}", ME, "old")
    await drain(inbox, polls=2)
    reported: list[str] = []

    def on_paths(paths: Iterable[str]) -> None:
        paths = list(paths)
        inbox.scanner.mark_dirty(paths)
        reported.extend(paths)

    watcher = Watcher(ws.root, on_paths)
    assert watcher.start()
    try:
        await watch_is_live(watcher, ws.root)
        turn = peer.next_turn("w13", ME, "event-driven")
        await eventually(lambda: str(turn) in reported, within=30)
        [arrival] = await drain(inbox, polls=1)
        assert arrival.message is not None and arrival.message.content == "event-driven"
    finally:
        await watcher.stop()
        await watcher.stop()
    assert not watcher.active


def test_scanner_ignores_unreadable_roots(tmp_path: Path) -> None:
    scanner = Scanner(tmp_path / "missing")
    assert scanner.poll() == []
    os.makedirs(tmp_path / "missing" / "session")
    assert scanner.poll() == []

"""The telegram transport across a ``kill -9``: a real ``bpgw run`` process polling the
emulator (tests/telegram_emulator.py), Mantis on its HTTP transport, real Redis.

The emulator holds the gateway where the test wants the kill to land:

- before the commit (the update's document download hangs): the update was fetched but
  not confirmed, so after the restart Telegram delivers it again and it is processed once;
- after the commit, before Telegram is told (the next ``getUpdates`` hangs): the restarted
  gateway resumes after the committed update (the cursor store), not processing it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from protocol import build_request, parse, render

from gwkit import HttpAgent
from gwproc import GatewayProcess, write_config
from harness_telegram import telegram_options
from servers import free_port
from telegram_emulator import OPS, TOPIC, USERS, TelegramEmulator

MANTIS_TOKEN = "tok-mantis-telegram-restart"


@pytest.fixture
async def emulator() -> AsyncIterator[TelegramEmulator]:
    async with TelegramEmulator() as emu:
        yield emu


def config(tmp_path: Path, redis_url: str, namespace: str, emulator: TelegramEmulator,
           port: int) -> Path:
    return write_config(tmp_path / "gw.toml", {
        "gateway": {"data_dir": str(tmp_path / "data"), "log_level": "WARNING"},
        "state": {"redis_url": redis_url, "namespace": namespace,
                  "sweep_interval_seconds": 3600},
        "outbox": {"lease_seconds": 1},
        "replicas": {"lease_seconds": 1},  # the killed replica's poller lease lapses soon
        "agents": {
            "Peer": {"addresses": [f"tg:{OPS}#{TOPIC}"],
                     "identities": [f"tg:{USERS['peer']['id']}"]},
            "Mantis": {"addresses": ["api:Mantis"], "identities": ["api:Mantis"]},
        },
        "transports": {
            "tg": {"kind": "telegram", **telegram_options(emulator)},
            "api": {"kind": "http", "port": port, "tokens": {"Mantis": MANTIS_TOKEN}},
        },
    })


async def inbox(base: str, seconds: float, quiet: float = 1.0) -> list[str]:
    """What Mantis's inbox gets within ``seconds``, reading on for ``quiet`` seconds after
    the first message (a copy would show up then); acknowledged as read."""
    texts: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession() as http:
        mantis = HttpAgent(base, "Mantis", MANTIS_TOKEN, http)
        while (left := deadline - loop.time()) > 0:
            got = await mantis.take(min(1.0, left))
            if got and not texts:
                deadline = min(deadline, loop.time() + quiet)
            texts += got
        await mantis.take(0)  # acknowledge the last
    return texts


async def crash_once(
    tmp_path: Path, redis_url: str, namespace: str, emulator: TelegramEmulator,
    post: Callable[[], Awaitable[int]], killable: Callable[[], Awaitable[object]],
    hold: asyncio.Event,
) -> tuple[int, list[str]]:
    """Start the gateway, ``post`` an update, kill -9 once ``killable`` returns, release
    ``hold``, restart; the update id and what Mantis then received (within a few seconds)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    path = config(tmp_path, redis_url, namespace, emulator, port)
    gateway = await GatewayProcess(path, base).start()
    try:
        update_id = await post()
        async with asyncio.timeout(20):
            await killable()
        gateway.kill()
        await gateway.stop()
        hold.set()
        gateway = await GatewayProcess(path, base).start()
        received = await inbox(base, 6.0)
        await emulator.wait_for(lambda: not emulator.updates, timeout=10)  # confirmed
        return update_id, received
    finally:
        await gateway.stop()


async def post_request(emulator: TelegramEmulator, request_id: str, *, as_file: bool) -> int:
    text = render(build_request(sender="Peer", to="Mantis", task="rotate the keys",
                                request_id=request_id))
    if as_file:
        bare = text.removeprefix("```\n").removesuffix("\n```")
        await emulator.post("peer", "[REQUEST → @Mantis]", thread=TOPIC,
                            document=(f"{request_id}.txt", bare))
    else:
        await emulator.post("peer", text, thread=TOPIC)
    return int(emulator.updates[-1]["update_id"])


async def test_killed_before_commit_is_delivered_again_and_processed_once(
    redis_url: str, namespace: str, tmp_path: Path, emulator: TelegramEmulator
) -> None:
    emulator.files_served.clear()  # the gateway hangs reading the document: no commit

    async def fetched_and_stuck() -> None:
        await emulator.wait_for(lambda: emulator.file_requests >= 1, timeout=20)

    update_id, received = await crash_once(
        tmp_path, redis_url, namespace, emulator,
        lambda: post_request(emulator, "peer-crash1", as_file=True), fetched_and_stuck,
        emulator.files_served)
    assert emulator.fetched[update_id] == 2  # delivered again after the restart
    assert [m.request_id for t in received for m in parse(t).messages] == ["peer-crash1"]


async def test_killed_after_commit_before_confirming_is_not_processed_twice(
    redis_url: str, namespace: str, tmp_path: Path, emulator: TelegramEmulator
) -> None:

    async def committed_and_polling() -> None:
        await emulator.wait_for(lambda: emulator.polls_waiting >= 1, timeout=20)

    async def post() -> int:
        # The poll confirming the update (its offset past it) hangs: Telegram is not told.
        emulator.hold_confirming = emulator.next_update_id
        emulator.polls_answered.clear()
        return await post_request(emulator, "peer-crash2", as_file=False)

    update_id, received = await crash_once(
        tmp_path, redis_url, namespace, emulator, post, committed_and_polling,
        emulator.polls_answered)
    assert emulator.fetched[update_id] == 1  # resumed after it: the cursor store
    assert [m.request_id for t in received for m in parse(t).messages] == ["peer-crash2"]

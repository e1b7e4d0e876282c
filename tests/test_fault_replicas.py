"""Fault test: two gateway processes on one private Valkey, 10,000 messages and 2,000
timeouts, and the replica holding a single-connection transport's lease killed (-9) while
the timeouts fall due in the middle of the stream.

Every message is processed once and delivered once (counted by id on the reading side),
every timeout notice is posted once (those the killed replica had claimed but not posted
too), the single-connection transport runs on exactly one replica and the other takes it
over within 15 s of the holder dying.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from protocol import Message, build_request, parse, reply_response
from state.settings import StateSettings
from state.store import ConversationStore

from gwproc import GatewayProcess, InboxReader, Poster, scaled, two_transports, write_config
from servers import PrivateValkey, free_port

TOKENS = {"Lotbot": "tok-lotbot-replicas", "Mantis": "tok-mantis-replicas"}
UNANSWERED = scaled(2000)  # REQUESTs nobody answers: each times out
ANSWERED = scaled(4000)  # REQUEST + RESPONSE pairs
MESSAGES = UNANSWERED + 2 * ANSWERED  # 10,000 posts
TIMEOUT_SECONDS = 12.0
CONCURRENCY = 16
TAKEOVER_LIMIT_SECONDS = 15.0  # default lease of 10 s

# Bounded by the waits inside; a loaded machine may need more than the default 120 s.
# A private server of its own: nothing to gain from CI's second pass on the machine's Redis.
pytestmark = pytest.mark.timeout(240)


def _config(folder: Path, redis_url: str, ports: tuple[int, int]) -> Path:
    tables = two_transports(ports, TOKENS)
    tables["transports"]["solo"] = {"kind": "solo"}  # one connection per credential
    return write_config(folder / "gw.toml", {
        "gateway": {"data_dir": str(folder / "data"), "log_level": "WARNING",
                    "adapter_modules": ["lease_kit"]},
        "state": {"redis_url": redis_url, "namespace": "replicas",
                  "sweep_interval_seconds": 1, "timeouts": {"REQUEST": TIMEOUT_SECONDS}},
        "policy": {"pair_budget_messages": 1_000_000},
        # A dead dispatcher's outbox is taken over within seconds.
        "outbox": {"lease_seconds": 3},
        **tables,
    })


async def _solo_state(gw: GatewayProcess, http: aiohttp.ClientSession) -> str:
    status, _, body = await gw.health(http)
    if not status:
        return "unreachable"
    return str(body["transports"]["solo"]["state"])


async def test_two_replicas_10000_messages_2000_timeouts_lease_holder_killed(
    valkey: PrivateValkey, tmp_path: Path
) -> None:
    gws: list[GatewayProcess] = []
    sides: list[str] = []
    for n in range(2):
        ports = (free_port(), free_port())
        config = _config(tmp_path / f"r{n}", valkey.url, ports)
        gws.append(GatewayProcess(config, f"http://127.0.0.1:{ports[0]}"))
        sides.append(f"http://127.0.0.1:{ports[1]}")
    unanswered = [build_request(sender="Lotbot", to="Mantis", task=f"t{i}")
                  for i in range(UNANSWERED)]
    answered = [build_request(sender="Lotbot", to="Mantis", task=f"a{i}")
                for i in range(ANSWERED)]
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(gw.start() for gw in gws))
        try:
            await _run(http, gws, sides, unanswered, answered, valkey)
        finally:
            await asyncio.gather(*(gw.stop() for gw in gws))


async def _run(http: aiohttp.ClientSession, gws: list[GatewayProcess], sides: list[str],
               unanswered: list[Message], answered: list[Message],
               valkey: PrivateValkey) -> None:
    async with asyncio.timeout(60):
        while sorted(states := [await _solo_state(gw, http) for gw in gws]) != [  # noqa: ASYNC110
                "standby", "up"]:
            await asyncio.sleep(0.2)
    for _ in range(5):  # a while later: still exactly one
        await asyncio.sleep(0.3)
        states = [await _solo_state(gw, http) for gw in gws]
        assert sorted(states) == ["standby", "up"], states
    holder = states.index("up")
    poster = Poster(http)
    alive = [0, 1]

    async def post(i: int, token: str, msg: Message, side: bool) -> None:
        """POST on replica ``i`` (the other one once it is dead) until a 2xx."""
        async with asyncio.timeout(60):
            while True:
                r = alive[i % len(alive)]
                base = sides[r] if side else gws[r].base
                if await poster.post(base, token, msg):
                    return
                await asyncio.sleep(0.2)

    async def stream(jobs: list[tuple[Message, Message | None]]) -> None:
        queue: asyncio.Queue[tuple[int, tuple[Message, Message | None]]] = asyncio.Queue()
        for job in enumerate(jobs):
            queue.put_nowait(job)

        async def client() -> None:
            while not queue.empty():
                i, (req, answer) = queue.get_nowait()
                await post(i, TOKENS["Lotbot"], req, side=False)
                if answer is not None:
                    await post(i + 1, TOKENS["Mantis"], answer, side=True)

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))

    # First the REQUESTs nobody will answer, then the answered pairs: the timeouts fall
    # due while the pairs stream, and the lease holder is killed right then.
    await stream([(req, None) for req in unanswered])
    due_at = time.monotonic() + TIMEOUT_SECONDS
    pairs = [(req, reply_response(req, sender="Mantis", status="done", result="ok"))
             for req in answered]

    async def kill_when_due() -> float:
        await asyncio.sleep(max(0.0, due_at - time.monotonic()) + 0.3)
        gws[holder].kill()
        alive.remove(holder)
        killed_at = time.monotonic()
        survivor = gws[alive[0]]
        while await _solo_state(survivor, http) != "up":
            took = time.monotonic() - killed_at
            assert took < TAKEOVER_LIMIT_SECONDS, f"no takeover after {took:.1f}s"
            await asyncio.sleep(0.1)
        return time.monotonic() - killed_at

    took, _ = await asyncio.gather(kill_when_due(), stream(pairs))
    assert took > 1.0  # it really waited for the dead holder's lease to expire
    assert len(poster.ok) == MESSAGES - len(answered), poster.answers  # one id per pair
    survivor = alive[0]

    mantis = InboxReader(http, "Mantis", TOKENS["Mantis"])
    lotbot = InboxReader(http, "Lotbot", TOKENS["Lotbot"])
    # Mantis: every REQUEST. Lotbot: every RESPONSE, and per timeout a notice and a failed
    # RESPONSE from the gateway.
    await asyncio.gather(
        mantis.read_until([sides[survivor]], UNANSWERED + ANSWERED, within=90),
        lotbot.read_until([gws[survivor].base], ANSWERED + 2 * UNANSWERED, within=90),
    )
    for reader in (mantis, lotbot):
        assert max(reader.ids.values()) == 1, reader.agent  # no message id twice
    requests = mantis.protocol_ids()
    assert set(requests) == {m.request_id for m in [*unanswered, *answered]}
    assert max(requests.values()) == 1
    responses: Counter[tuple[str, str]] = Counter()
    for m in lotbot.messages:
        if m["kind"] == "protocol":
            msg = parse(m["text"]).messages[0]
            responses[(msg.request_id, f"{msg.sender}:{msg.status}")] += 1
    notices = lotbot.protocol_ids("notice")
    timed_out = {m.request_id for m in unanswered}
    assert set(notices) == timed_out, (len(notices), len(timed_out))
    assert max(notices.values()) == 1
    assert responses == Counter(
        {(m.request_id, "Mantis:done"): 1 for m in answered}
        | {(rid, "bpgw:failed"): 1 for rid in timed_out}
    )
    client = aioredis.from_url(valkey.url, decode_responses=True)
    try:
        store = ConversationStore(client, StateSettings(redis_url=valkey.url,
                                                        namespace="replicas"))
        counts = await store.counts()
        assert counts["timeout"] == UNANSWERED and counts["open"] == 0, counts
    finally:
        await client.aclose()

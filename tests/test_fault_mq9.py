"""Fault tests: ``kill -9`` the gateway (a real ``bpgw run`` process) between its FETCH of
an mq9 message and the ACK; after a restart the message has been processed exactly once.

The mq9 service runs in this process on a private nats-server, with its ACK or FETCH
answers observed, so the kill lands where the test wants it:

- after the commit, before the ACK (the service withholds ACK replies): the redelivered
  message is recognised and acknowledged, not processed again;
- before the commit (the gateway's Redis is stopped, so nothing can commit): the message
  is fetched again after the restart and processed then.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mq9wire import Mq9Wire
from nats.aio.msg import Msg

from adapters.mq9 import Mq9Service, ServiceSettings
from protocol import Request, build_request, parse, render

from servers import PrivateNats, PrivateValkey, free_port

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parent.parent
LOT_TOKEN = "tok-lotbot-mq9-fault"
AGENT_BOX = "worker.fault"


class ObservedService(Mq9Service):
    """The service, telling the test when the gateway fetched a message or ACKs, and
    leaving ACKs unanswered while ``withhold_acks`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.withhold_acks = False
        self.ack_seen = asyncio.Event()
        self.fetched = asyncio.Event()

    async def _ack(self, address: str, msg: Msg) -> bytes | None:
        self.ack_seen.set()
        if self.withhold_acks:
            return None  # no reply: the gateway's ACK times out
        return await super()._ack(address, msg)

    async def _fetch(self, address: str, msg: Msg) -> bytes:
        body = await super()._fetch(address, msg)
        if b'"msg_id"' in body:
            self.fetched.set()
        return body


@pytest.fixture
def nats_server() -> Iterator[PrivateNats]:
    server = PrivateNats().start()
    try:
        yield server
    finally:
        server.close()


@asynccontextmanager
async def observed(url: str) -> AsyncIterator[ObservedService]:
    import nats

    nc = await nats.connect(url)
    service = ObservedService(nc, ServiceSettings())
    await service.start()
    await nc.flush()
    try:
        yield service
    finally:
        await service.stop()
        await nc.close()


def _config(tmp_path: Path, redis_url: str, namespace: str, nats_url: str, port: int,
            gw_box: str) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(f"""
[gateway]
data_dir = "{tmp_path / 'data'}"
log_level = "WARNING"
[state]
redis_url = "{redis_url}"
namespace = "{namespace}"
sweep_interval_seconds = 3600
[outbox]
lease_seconds = 1  # the killed replica's outbox lease lapses soon
[agents.Lotbot]
addresses = ["web:Lotbot"]
identities = ["web:Lotbot"]
[agents.Worker]
addresses = ["mq9:{AGENT_BOX}"]
identities = ["mq9:{AGENT_BOX}"]
[transports.web]
kind = "http"
port = {port}
[transports.web.tokens]
Lotbot = "{LOT_TOKEN}"
[transports.mq9]
kind = "mq9"
nats_url = "{nats_url}"
mailbox = "{gw_box}"
fetch_wait_ms = 200
request_timeout_seconds = 1
retry_seconds = 0.2
""")
    return path


async def _start(config: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPGW_")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, whatever is installed
    log = os.open(config.parent / "gw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "run", "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env, cwd=config.parent)
    finally:
        os.close(log)  # the child keeps its own copy


async def _kill(proc: Any) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


async def _lotbot_inbox(base: str, seconds: float) -> list[str]:
    """Every message Lotbot's inbox shows within ``seconds`` (acknowledging as it reads)."""
    auth = {"Authorization": f"Bearer {LOT_TOKEN}"}
    texts: list[str] = []
    ack = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        while (left := deadline - loop.time()) > 0:
            params = {"wait": f"{min(left, 2):.1f}", **({"ack": ack} if ack else {})}
            try:
                async with http.get(f"{base}/v1/agents/Lotbot/inbox", params=params,
                                    headers=auth) as resp:
                    got = (await resp.json())["messages"] if resp.status == 200 else []
            except aiohttp.ClientError:
                got = []  # the gateway is (re)starting
                await asyncio.sleep(0.1)
            texts += [m["text"] for m in got]
            if got:
                ack = got[-1]["id"]
    return texts


async def _ok(reply: Awaitable[dict[str, Any]]) -> bool:
    return not (await reply)["error"]


async def _empty(reply: Awaitable[dict[str, Any]]) -> bool:
    return not (await reply)["messages"]


async def _healthy(base: str) -> bool:
    """Whether the gateway at ``base`` answers /healthz with 200 (fully started)."""
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    """Poll ``check`` until it holds (TimeoutError after ``seconds``)."""
    for _ in range(int(seconds * 10)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("condition not reached")


Step = Callable[[], Awaitable[None]]


async def _crash_once(config: Path, port: int, nats_url: str, gw_box: str, req: Request, *,
                      arm: Step, killable: Step, rearm: Step) -> list[str]:
    """Start the gateway, ``arm`` the fault, send ``req`` from the mq9 agent, kill -9 the
    gateway once ``killable`` returns, ``rearm``, restart it; what Lotbot then received."""
    wire = await Mq9Wire.connect(nats_url)
    proc = await _start(config)
    try:
        await wire.create(AGENT_BOX, ttl=0)
        await _until(lambda: _ok(wire.fetch(gw_box)))  # the gateway made its mailbox
        # ... and finished starting: its mailbox comes before the parts that start on
        # Redis, so a fault armed earlier could fail the start instead (seen once).
        await _until(lambda: _healthy(f"http://127.0.0.1:{port}"))
        await arm()
        await wire.send(gw_box, render(req), **{"mq9-reply-to": AGENT_BOX})
        async with asyncio.timeout(20):
            await killable()
        await _kill(proc)
        await rearm()
        proc = await _start(config)
        await _until(lambda: _empty(wire.fetch(gw_box, group_name="bpgw")))  # all ACKed
        return await _lotbot_inbox(f"http://127.0.0.1:{port}", 3.0)
    finally:
        if proc.returncode is None:
            await _kill(proc)
        await wire.close()


async def test_killed_after_commit_before_ack_is_not_processed_twice(
    redis_url: str, namespace: str, tmp_path: Path, nats_server: PrivateNats
) -> None:
    gw_box, port = f"gw.{uuid.uuid4().hex[:8]}", free_port()
    config = _config(tmp_path, redis_url, namespace, nats_server.url, port, gw_box)
    req = build_request(sender="Worker", to="Lotbot", task="rotate the keys")
    async with observed(nats_server.url) as service:

        async def withhold() -> None:
            service.withhold_acks = True

        async def answer() -> None:
            service.withhold_acks = False

        # ack_seen: the gateway committed the message and is acknowledging it.
        texts = await _crash_once(config, port, nats_server.url, gw_box, req, arm=withhold,
                                  killable=service.ack_seen.wait, rearm=answer)
    assert [parse(t).messages[0] for t in texts] == [req]


async def test_killed_before_commit_is_processed_after_restart(
    namespace: str, tmp_path: Path, nats_server: PrivateNats
) -> None:
    valkey = PrivateValkey(tmp_path / "valkey", appendonly=True).start()
    gw_box, port = f"gw.{uuid.uuid4().hex[:8]}", free_port()
    config = _config(tmp_path, valkey.url, namespace, nats_server.url, port, gw_box)
    req = build_request(sender="Worker", to="Lotbot", task="renew the certificate")

    async def stop_redis() -> None:
        await asyncio.to_thread(valkey.stop)  # nothing can commit now

    async def start_redis() -> None:
        await asyncio.to_thread(valkey.start)

    try:
        async with observed(nats_server.url) as service:

            async def fetched_and_failing() -> None:
                await service.fetched.wait()
                await asyncio.sleep(0.3)  # the gateway is trying to process it

            texts = await _crash_once(config, port, nats_server.url, gw_box, req, arm=stop_redis,
                                      killable=fetched_and_failing, rearm=start_redis)
    finally:
        valkey.close()
    assert [parse(t).messages[0] for t in texts] == [req]

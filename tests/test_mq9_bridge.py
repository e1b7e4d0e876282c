"""The mq9 bridge end to end against a real nats-server: an HTTP agent and an mq9 agent
(a plain wire client, tests/mq9wire.py) talk through a real gateway on real Redis.

The gateway runs the mq9 service itself (``serve = true``) on the session's NATS server;
every test uses mailboxes and agent names of its own, and deletes them afterwards (with
``NATS_URL`` that server is shared). The service needs nats-server 2.11 or newer: on an
older ``NATS_URL`` server the tests that run it are skipped, and the one that checks the
refusal runs instead.
"""

from __future__ import annotations

import asyncio
import tomllib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from mq9wire import Mq9Wire
from nats.aio.client import ServerVersion
from nats.js.errors import NotFoundError

from adapters.base import Address, Outbound, Receipt
from adapters.http import HttpAdapter
from adapters.mq9 import BridgeSettings, Mq9Bridge, ServiceSettings, start_service, stop_service
from adapters.mq9.acking import ack_plan
from adapters.mq9.client import Fetched
from adapters.mq9.names import Names
from adapters.mq9.store import UnsupportedServer, server_problem
from gateway.app import Gateway
from protocol import Priority, build_request, parse, render, reply_response

from gwkit import make_config, running
from servers import PrivateNats, free_port

pytestmark = pytest.mark.nats

LOT_TOKEN = "tok-lotbot-mq9"
REPLY_TO = "mq9-reply-to"


def uid() -> str:
    return uuid.uuid4().hex[:10]


def bridge_config(redis_url: str, namespace: str, tmp_path: Path, nats_url: str,
                  gw_box: str, agents: dict[str, Any], **mq9: Any) -> Any:
    return make_config(
        redis_url, namespace, tmp_path,
        agents={"Lotbot": {"addresses": ["web:Lotbot"], "identities": ["web:Lotbot"]},
                **agents},
        transports={
            "web": {"kind": "http", "port": 0, "tokens": {"Lotbot": LOT_TOKEN}},
            "mq9": {"kind": "mq9", "nats_url": nats_url, "serve": True, "mailbox": gw_box,
                    "agent_name": f"bpgw-{gw_box}", "fetch_wait_ms": 200, **mq9},
        },
    )


async def nats_problem(url: str) -> str | None:
    """Why the server at ``url`` cannot hold the mq9 service's storage, or None."""
    nc = await nats.connect(url)
    try:
        return server_problem(nc.connected_server_version)
    finally:
        await nc.close()


@pytest.fixture
async def mq9_url(nats_url: str) -> str:
    """The session's NATS server, for a test that runs the mq9 service on it (skipped
    when that server is too old for the service)."""
    problem = await nats_problem(nats_url)
    if problem is not None:
        pytest.skip(f"{nats_url}: {problem}")
    return nats_url


class Owned:
    """The mailboxes and agent names one test makes: deleted after it (``wire``), since
    the session's NATS server may be shared and live on."""

    def __init__(self) -> None:
        self.boxes: list[str] = []
        self.agents: list[str] = []

    def box(self, prefix: str) -> str:
        """A new mailbox name of this test's own."""
        name = f"{prefix}.{uid()}"
        self.boxes.append(name)
        return name

    def agent(self, prefix: str) -> str:
        """A new agent name of this test's own."""
        name = f"{prefix}-{uid()}"
        self.agents.append(name)
        return name


@pytest.fixture
def owned() -> Owned:
    return Owned()


@pytest.fixture
async def wire(mq9_url: str, owned: Owned) -> AsyncIterator[Mq9Wire]:
    """A wire client, with a service instance of the test's own answering it (the same
    JetStream state as the gateway's instance, so it still answers once that stopped);
    afterwards the instance deletes what the test made (``owned``)."""
    service = await start_service(mq9_url)
    client = await Mq9Wire.connect(mq9_url)
    try:
        yield client
    finally:
        await client.close()
        for box in owned.boxes:
            await service.storage.delete_mailbox(box)
        for agent in owned.agents:
            await service.storage.unregister(agent)
        await stop_service(service)


async def post(base: str, text: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(
        f"{base}/v1/messages", json={"text": text},
        headers={"Authorization": f"Bearer {LOT_TOKEN}"},
    ) as resp:
        body: dict[str, Any] = await resp.json()
    return body


async def inbox(base: str, wait: float = 5.0) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(
        f"{base}/v1/agents/Lotbot/inbox", params={"wait": str(wait)},
        headers={"Authorization": f"Bearer {LOT_TOKEN}"},
    ) as resp:
        body = await resp.json()
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def base_url(gw: Gateway) -> str:
    web = gw.adapters["web"]
    assert isinstance(web, HttpAdapter)
    return web.url


async def fetch_one(wire: Mq9Wire, box: str, group: str = "agent") -> dict[str, Any]:
    body = {"group_name": group, "config": {"max_wait_ms": 10_000}}
    reply = await wire.raw(f"MSG.FETCH.{box}", body, wait=15)
    assert reply["error"] == "" and len(reply["messages"]) == 1, reply
    message: dict[str, Any] = reply["messages"][0]
    return message


async def unacknowledged(wire: Mq9Wire, box: str) -> list[dict[str, Any]]:
    """What the gateway's group still has in ``box`` once its ACKs have had up to 2.5 s
    to land (they go out after the commit, the last batch's asynchronously)."""
    for _ in range(50):
        left: list[dict[str, Any]] = (await wire.fetch(box, group_name="bpgw"))["messages"]
        if not left:
            break
        await asyncio.sleep(0.05)
    return left

async def test_round_trip_http_request_to_mq9_agent_and_its_response_back(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str, wire: Mq9Wire, owned: Owned
) -> None:
    gw_box, agent_box = owned.box("gw"), owned.box("worker")
    agents = {"Worker": {"addresses": [f"mq9:{agent_box}"], "identities": [f"mq9:{agent_box}"]}}
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, gw_box, agents)
    async with running(config) as gw:
        assert (await wire.create(agent_box, ttl=0))["error"] == ""
        bridge = gw.adapters["mq9"]
        assert isinstance(bridge, Mq9Bridge) and bridge.health().state == "up"
        found = await wire.raw("AGENT.DISCOVER", {"text": f"bpgw-{gw_box}"})
        assert [a["mailbox"] for a in found["agents"]] == [gw_box]

        req = build_request(sender="Lotbot", to="Worker", task="check disk",
                            priority=Priority.HIGH)
        assert (await post(base_url(gw), render(req)))["outcome"] == "accepted"
        got = await fetch_one(wire, agent_box)
        assert parse(got["payload"]).messages == [req]
        assert got["priority"] == "urgent"
        header = got["header"]
        assert header["mq9-tags"] == "REQUEST" and header[REPLY_TO] == gw_box
        assert 1700 <= int(header["mq9-ttl"]) <= 1800  # the REQUEST timeout is 1800 s
        assert header["bpgw-id"]
        assert (await wire.ack(agent_box, "agent", got["msg_id"]))["error"] == ""

        answer = reply_response(req, sender="Worker", status="done", result="31% used")
        sent = await wire.send(gw_box, render(answer), **{REPLY_TO: agent_box})
        assert sent["error"] == ""
        received = await inbox(base_url(gw))
        assert [parse(m["text"]).messages[0] for m in received] == [answer]

        conv = await gw.conversation(req.request_id)
        assert conv is not None and conv["status"] == "done"
        assert [e["transport"] for e in conv["history"]] == ["web", "mq9"]
        # The gateway acknowledged what it committed (right after the commit): its group
        # has nothing left.
        assert await unacknowledged(wire, gw_box) == []
    gone = await wire.raw("AGENT.DISCOVER", {"text": f"bpgw-{gw_box}"})
    assert gone["agents"] == []  # UNREGISTERed on shutdown


async def test_agent_known_by_name_is_found_with_discover(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str, wire: Mq9Wire, owned: Owned
) -> None:
    gw_box, name, agent_box = owned.box("gw"), owned.agent("finder"), owned.box("finder")
    agents = {"Finder": {"addresses": [f"mq9:@{name}"]}}
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, gw_box, agents)
    card = {"name": name, "mailbox": agent_box, "payload": "finds things"}
    async with running(config) as gw:
        assert (await wire.create(agent_box, ttl=0))["error"] == ""
        assert (await wire.raw("AGENT.REGISTER", card))["error"] == ""
        req = build_request(sender="Lotbot", to="Finder", task="find the logs",
                            priority=Priority.CRITICAL)
        assert (await post(base_url(gw), render(req)))["outcome"] == "accepted"
        got = await fetch_one(wire, agent_box)
        assert parse(got["payload"]).messages == [req]
        assert got["priority"] == "critical"


async def test_a_backlog_in_small_batches_is_processed_once_and_in_order(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str, wire: Mq9Wire, owned: Owned
) -> None:
    """Batches of 4 from a backlog (the next one fetched while one is processed, when
    that is exact), urgent messages among them: each processed once, the normal ones in
    the order sent, and the gateway's group acknowledged to the end."""
    gw_box, scout_box = owned.box("gw"), owned.box("scout")
    agents = {"Scout": {"addresses": [f"mq9:{scout_box}"], "identities": [f"mq9:{scout_box}"]}}
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, gw_box, agents,
                           fetch_batch=4)
    async with running(config) as gw:
        assert (await wire.create(scout_box, ttl=0))["error"] == ""
        sent: list[str] = []
        for i in range(18):  # within the pair budget (20 a minute)
            urgent = i in (5, 6, 13)
            task = f"{'urgent' if urgent else 'job'} {i}"
            req = build_request(sender="Scout", to="Lotbot", task=task)
            headers = {REPLY_TO: scout_box, **({"mq9-priority": "urgent"} if urgent else {})}
            assert (await wire.send(gw_box, render(req), **headers))["error"] == ""
            sent.append(task)
        got: list[str] = []
        for _ in range(40):
            got += [parse(m["text"]).messages[0].task for m in await inbox(base_url(gw), 1)]
            if len(got) >= len(sent):
                break
        await asyncio.sleep(0.3)  # a message processed twice would be there by now
        got += [parse(m["text"]).messages[0].task for m in await inbox(base_url(gw), 0.1)]
        assert sorted(got) == sorted(sent)
        assert [t for t in got if t.startswith("job")] == [t for t in sent if t.startswith("job")]
        assert await unacknowledged(wire, gw_box) == []


async def test_a_batch_keeps_each_conversation_in_order(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str, wire: Mq9Wire, owned: Owned
) -> None:
    """One mailbox, several conversations: each conversation's messages are stored in
    order, and a message of no conversation after everything before it, before the rest."""
    gw_box, agent_box = owned.box("gw"), owned.box("order")
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, gw_box, {})
    convs = ["c0", "c1", "c2"]
    texts = [(f"{c}-{i}", c) for i in range(5) for c in convs]
    texts.insert(7, ("alone", None))
    async with running(config) as gw:
        assert (await wire.create(agent_box, ttl=0))["error"] == ""
        bridge = gw.adapters["mq9"]
        out = await bridge.send_batch([
            Outbound(Address("mq9", agent_box), text, request_id=conv, id=f"1-{n}")
            for n, (text, conv) in enumerate(texts)])
        assert all(isinstance(o, Receipt) for o in out) and len(out) == len(texts)
        reply = await wire.fetch(agent_box, config={"num_msgs": 100})
        stored = [m["payload"] for m in reply["messages"]]
    assert sorted(stored) == sorted(t for t, _ in texts)
    for c in convs:
        assert [t for t in stored if t.startswith(c)] == [f"{c}-{i}" for i in range(5)]
    alone = stored.index("alone")
    assert set(stored[:alone]) == {t for t, _ in texts[:7]}


async def test_undeclared_mq9_agent_gets_an_identity_and_replies_reach_it(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str, wire: Mq9Wire, owned: Owned
) -> None:
    """No ``[agents]`` entry: the reply mailbox is the identity (TOFU binds it) and the
    address replies go to; a message without one is refused, the next still passes."""
    gw_box, agent_box = owned.box("gw"), owned.box("helper")
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, gw_box, {})
    async with running(config) as gw:
        assert (await wire.create(agent_box, ttl=0))["error"] == ""
        bridge = gw.adapters["mq9"]
        assert isinstance(bridge, Mq9Bridge)
        req = build_request(sender="Helper", to="Lotbot", task="review my patch")
        assert (await wire.send(gw_box, render(req)))["error"] == ""  # no mq9-reply-to
        assert (await wire.send(gw_box, render(req), **{REPLY_TO: agent_box}))["error"] == ""
        received = await inbox(base_url(gw))
        assert [parse(m["text"]).messages[0] for m in received] == [req]
        assert bridge.dropped == 1
        learned = await gw.directory.learned("Helper")
        assert learned is not None and learned.identity == f"mq9:{agent_box}"

        answer = reply_response(req, sender="Lotbot", status="done", result="looks good")
        assert (await post(base_url(gw), render(answer)))["outcome"] == "accepted"
        got = await fetch_one(wire, agent_box)
        assert parse(got["payload"]).messages == [answer]
        assert got["header"]["mq9-tags"] == "RESPONSE" and "mq9-ttl" not in got["header"]


async def eventually(check: Callable[[], bool], seconds: float = 20.0) -> None:
    """Poll ``check`` until it holds (AssertionError after ``seconds``)."""
    for _ in range(int(seconds * 20)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


async def test_nats_restart_degrades_then_recovers(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The NATS server goes away and comes back: health says so, the connection comes
    back by itself, and messages flow again (nothing stored is lost)."""
    server = PrivateNats().start()
    gw_box, agent_box = f"gw.{uid()}", f"worker.{uid()}"
    agents = {"Worker": {"addresses": [f"mq9:{agent_box}"], "identities": [f"mq9:{agent_box}"]}}
    config = bridge_config(redis_url, namespace, tmp_path, server.url, gw_box, agents,
                           request_timeout_seconds=1, retry_seconds=0.2)
    try:
        async with running(config) as gw:
            bridge = gw.adapters["mq9"]
            assert isinstance(bridge, Mq9Bridge) and bridge.health().state == "up"
            await asyncio.to_thread(server.stop)
            await eventually(lambda: bridge.health().state == "down")
            assert gw.health()["status"] == "degraded"
            await asyncio.to_thread(server.start)
            await eventually(lambda: bridge.health().state == "up")
            assert bridge.stats()["reconnects"] >= 1
            wire = await Mq9Wire.connect(server.url)
            try:
                assert (await wire.create(agent_box, ttl=0))["error"] == ""
                req = build_request(sender="Worker", to="Lotbot", task="after the restart")
                sent = await wire.send(gw_box, render(req), **{REPLY_TO: agent_box})
                assert sent["error"] == ""
            finally:
                await wire.close()
            received = await inbox(base_url(gw))
            assert [parse(m["text"]).messages[0] for m in received] == [req]
            assert bridge.stats()["received"] == 1
    finally:
        server.close()


async def test_gateway_starts_while_nats_is_down_and_connects_later(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    server = PrivateNats()  # its port is chosen, nothing listens yet
    config = bridge_config(redis_url, namespace, tmp_path, server.url, f"gw.{uid()}", {},
                           request_timeout_seconds=0.5, retry_seconds=0.2)
    try:
        async with running(config) as gw:
            bridge = gw.adapters["mq9"]
            assert bridge.health().state == "down" and "cannot reach" in bridge.health().detail
            assert gw.adapters["web"].health().state == "up"  # the rest of the gateway runs
            await asyncio.to_thread(server.start)
            await eventually(lambda: bridge.health().state == "up")
    finally:
        server.close()


async def test_probe_connects_and_asks(mq9_url: str) -> None:
    up = Mq9Bridge("mq9", {"nats_url": mq9_url, "serve": True})
    assert [p.ok for p in await up.probe()] == [True]
    down = Mq9Bridge("mq9", {"nats_url": f"nats://127.0.0.1:{free_port()}"})
    (probe,) = await down.probe()
    assert not probe.ok and "cannot connect" in probe.detail and probe.fix


async def test_a_too_old_nats_server_is_refused_before_anything_is_stored(
    redis_url: str, namespace: str, tmp_path: Path, nats_url: str
) -> None:
    """A server older than 2.11 takes the service's streams but drops their metadata and
    has no batched direct get: the service refuses it with the reason (creating nothing),
    and the gateway's health and ``bpgw check`` probe say so. Needs such a server as
    ``NATS_URL`` (a private one is always new enough)."""
    if await nats_problem(nats_url) is None:
        pytest.skip(f"{nats_url} is new enough for the mq9 service")
    settings = ServiceSettings(namespace=f"t{uid()}")
    with pytest.raises(UnsupportedServer, match=r"nats-server 2\.\d+\.\d+ is too old .* 2\.11 or"):
        await start_service(nats_url, settings)
    nc = await nats.connect(nats_url)
    try:
        with pytest.raises(NotFoundError):
            await nc.jetstream().stream_info(Names(settings.namespace).delayed_stream)
    finally:
        await nc.close()
    (probe,) = await Mq9Bridge("mq9", {"nats_url": nats_url, "serve": True}).probe()
    assert not probe.ok and "too old" in probe.detail and "upgrade" in probe.fix
    config = bridge_config(redis_url, namespace, tmp_path, nats_url, f"gw.{uid()}", {},
                           request_timeout_seconds=0.5)
    async with running(config) as gw:
        health = gw.adapters["mq9"].health()
        assert health.state == "down" and "2.11 or newer" in health.detail, health


def test_server_versions_the_service_takes() -> None:
    for version in ("2.11.0", "2.11.0-RC.1", "2.15.1", "3.0.0"):
        assert server_problem(ServerVersion(version)) is None, version
    assert "nats-server 2.10.22 is too old" in str(server_problem(ServerVersion("2.10.22")))
    assert "nats-server 2.9.10 is too old" in str(server_problem(ServerVersion("2.9.10")))
    assert "of unknown version" in str(server_problem(ServerVersion("nightly")))


def _fetched(*items: tuple[int, str]) -> list[Fetched]:
    return [Fetched(i, "", lane, {}, 0) for i, lane in items]


def test_ack_plan_is_safe_for_broker_and_service() -> None:
    batch = _fetched((5, "critical"), (3, "urgent"), (0, "normal"), (1, "normal"))
    everything = {0, 1, 3, 5}
    # Complete batch: each lane's last, smallest first (the broker ends at the largest).
    assert ack_plan(batch, everything, full=False) == [1, 3, 5]
    # Full batch ending in normal: nothing past the last fetched normal message.
    assert ack_plan(batch, everything, full=True) == [1]
    # An uncommitted message holds back every id from its own on.
    assert ack_plan(batch, {1, 3, 5}, full=False) == []
    assert ack_plan(batch, {0, 3, 5}, full=False) == [0]
    # Full batch of urgent messages only: per lane (the service never skips a lane).
    assert ack_plan(_fetched((7, "critical"), (8, "urgent")), {7, 8}, full=True) == [7, 8]
    assert ack_plan([], set(), full=False) == []


async def test_bad_options_name_the_key() -> None:
    from adapters.base import ConfigError

    with pytest.raises(ConfigError, match=r"transports\.m\.mailbox"):
        Mq9Bridge("m", {"mailbox": "Bad_Box"})
    with pytest.raises(ConfigError, match=r"transports\.m\.nats_url"):
        Mq9Bridge("m", {"nats_url": "http://x"})


async def test_send_refuses_an_invalid_address() -> None:
    from adapters.base import Address, DeliveryError

    bridge = Mq9Bridge("m", {"nats_url": "nats://127.0.0.1:1"})
    with pytest.raises(DeliveryError, match="invalid mail_address"):
        await bridge.send(Outbound(Address("m", "Not-A-Box"), "hi"))


def test_config_example_documents_and_validates_every_option() -> None:
    text = (Path(__file__).resolve().parent.parent / "config.example.toml").read_text("utf-8")
    block = text[text.index("# [transports.mq9]"):]
    block = block[:block.index("\n\n")]
    options = tomllib.loads("\n".join(line[2:] for line in block.splitlines()))
    section = options["transports"]["mq9"]
    assert section.pop("kind") == "mq9"
    assert set(section) == set(BridgeSettings.model_fields)
    BridgeSettings.model_validate(section)

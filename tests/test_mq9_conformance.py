"""mq9 conformance: the service answers every ``$mq9.AI.*`` subject as the broker does.

The client side speaks only the wire protocol (tests/mq9wire.py); the service runs through
its public start function (or ``python -m gateway.cli mq9 serve``) on a private
nats-server with JetStream, so the real ``$mq9.AI.*`` subjects are this module's alone.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mq9wire import Mq9Wire, ids, payloads
from nats.aio.client import Client

from adapters.mq9 import Mq9Service, ServiceSettings, start_service, stop_service
from adapters.mq9.connection import Mq9Connection, parse_header_lines, parser_replaced
from adapters.mq9.names import LANES, Lane

from servers import PrivateNats

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parent.parent
SEMANTIC_ERROR = (
    "agent search is not enabled in this build (missing the 'vector-search' feature)"
)


@pytest.fixture(scope="module")
def mq9_nats() -> Iterator[str]:
    """A nats-server of this module's own: nothing else answers ``$mq9.AI.*`` on it."""
    server = PrivateNats().start()
    try:
        yield server.url
    finally:
        server.close()


def unique(prefix: str = "box") -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


Starter = Callable[..., Any]


@pytest.fixture
async def services(mq9_nats: str) -> AsyncIterator[Starter]:
    """Start service instances on this test's own namespace; all stopped afterwards."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    started: list[Mq9Service] = []

    async def start(**options: Any) -> Mq9Service:
        options.setdefault("namespace", namespace)
        options.setdefault("sweep_interval_seconds", 0.5)
        service = await start_service(mq9_nats, ServiceSettings(**options))
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in started:
            if service.nc.is_connected:
                await stop_service(service)


@pytest.fixture
async def service(services: Starter) -> Mq9Service:
    result: Mq9Service = await services()
    return result


@pytest.fixture
async def mq9(mq9_nats: str, service: Mq9Service) -> AsyncIterator[Mq9Wire]:
    client = await Mq9Wire.connect(mq9_nats)
    try:
        yield client
    finally:
        await client.close()


async def mailbox(mq9: Mq9Wire, **fields: Any) -> str:
    name = unique()
    reply = await mq9.create(name, **fields)
    assert reply == {"error": "", "mail_address": name}
    return name


# ----- MAILBOX.CREATE


async def test_create_named_generated_and_duplicate(mq9: Mq9Wire) -> None:
    name = unique()
    assert await mq9.create(name, ttl=3600, desc="inbox") == {"error": "", "mail_address": name}
    assert await mq9.create(name) == {"error": f"mailbox {name} already exists"}
    generated = await mq9.raw("MAILBOX.CREATE", b"")  # empty body allowed
    assert generated["error"] == ""
    address = generated["mail_address"]
    assert len(address) == 20 and address.isalnum() and address == address.lower()
    assert (await mq9.create())["mail_address"] != address  # {} also generates a new one


@pytest.mark.parametrize("bad", [
    "Upper.case", "has-hyphen", ".leading", "trailing.", "double..dot", "under_score",
    "sp ace", "x" * 129, "star*", "gt>",
])
async def test_create_rejects_invalid_names(mq9: Mq9Wire, bad: str) -> None:
    reply = await mq9.create(bad)
    assert reply["error"].startswith("invalid mail_address"), reply
    assert "mail_address" not in reply


async def test_create_accepts_edge_names(mq9: Mq9Wire) -> None:
    longest = "a" * 118 + uuid.uuid4().hex[:10]
    assert (await mq9.create(longest))["mail_address"] == longest
    digits = "9" + uuid.uuid4().hex[:10].replace("a", "1")
    assert (await mq9.create(f"{digits}.x.y"))["error"] == ""


async def test_create_bad_bodies(mq9: Mq9Wire) -> None:
    assert (await mq9.raw("MAILBOX.CREATE", b"{nope"))["error"].startswith("invalid request")
    assert (await mq9.raw("MAILBOX.CREATE", [1, 2]))["error"].startswith("invalid request")
    assert (await mq9.create(unique(), ttl=-5))["error"].startswith("invalid request")
    assert (await mq9.create(unique(), ttl="soon"))["error"].startswith("invalid request")


async def test_mailbox_ttl_expiry_and_reuse(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9, ttl=1)
    forever = await mailbox(mq9, ttl=0)
    assert (await mq9.send(name, "before"))["msg_id"] == 0
    await asyncio.sleep(1.3)
    assert await mq9.send(name, "late") == {"error": f"mailbox {name} does not exist"}
    assert (await mq9.fetch(name))["error"] == f"mailbox {name} does not exist"
    # The sweeper (every 0.5 s here) deletes it from storage; until then the name is
    # taken. Bounded generously: a loaded machine may run the sweep late.
    await asyncio.sleep(0.8)
    taken = {"error": f"mailbox {name} already exists"}
    for _ in range(200):
        if (created := await mq9.create(name, ttl=60)) != taken:
            break
        await asyncio.sleep(0.1)
    assert created == {"error": "", "mail_address": name}
    assert ids(await mq9.query(name)) == []  # nothing of the old mailbox survives
    assert (await mq9.send(name, "new"))["msg_id"] == 0
    assert (await mq9.send(forever, "still here"))["error"] == ""  # ttl 0 never expires


# ----- SEND and FETCH


async def test_send_ids_and_unknown_mailbox(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    assert [(await mq9.send(name, f"m{i}"))["msg_id"] for i in range(3)] == [0, 1, 2]
    assert await mq9.send("no.such.box", "x") == {"error": "mailbox no.such.box does not exist"}
    assert await mq9.send("BAD-name", "x") == {"error": "mailbox BAD-name does not exist"}


async def test_fetch_message_fields(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    before = int(time.time())
    await mq9.send(name, '{"task":"analyze"}', mq9_tags="a, b", custom="1")
    [msg] = (await mq9.fetch(name))["messages"]
    assert set(msg) == {"msg_id", "payload", "priority", "header", "create_time"}
    assert msg["msg_id"] == 0 and msg["payload"] == '{"task":"analyze"}'
    assert msg["priority"] == "normal"
    assert msg["header"] == {"mq9-tags": "a, b", "custom": "1"}
    assert before <= msg["create_time"] <= int(time.time()) + 1


async def test_priority_order_fifo_within_lane(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    sent = ["normal", "urgent", "critical", "normal", "critical", "urgent", "bogus"]
    for i, priority in enumerate(sent):
        await mq9.send(name, f"m{i}", mq9_priority=priority)
    reply = await mq9.fetch(name)
    assert ids(reply) == [2, 4, 1, 5, 0, 3, 6]
    assert [m["priority"] for m in reply["messages"]] == [
        "critical", "critical", "urgent", "urgent", "normal", "normal", "normal"]
    assert ids(await mq9.fetch(name, config={"num_msgs": 3})) == [2, 4, 1]


async def test_key_compaction_across_lanes(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    await mq9.send(name, "running 10", mq9_key="task.status")
    await mq9.send(name, "other")
    await mq9.send(name, "running 60", mq9_key="task.status", mq9_priority="critical")
    await mq9.send(name, "done", mq9_key="task.status")
    assert payloads(await mq9.fetch(name)) == ["other", "done"]
    assert payloads(await mq9.query(name, key="task.status")) == ["done"]
    assert ids(await mq9.query(name)) == [1, 3]


async def test_delay_invisible_until_due(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    assert await mq9.send(name, "later", mq9_delay="1") == {"error": "", "msg_id": -1}
    assert (await mq9.send(name, "now"))["msg_id"] == 0
    assert payloads(await mq9.fetch(name)) == ["now"]
    assert payloads(await mq9.query(name)) == ["now"]
    await asyncio.sleep(0.9)
    assert payloads(await mq9.fetch(name, deliver="from_id", from_id=1,
                                    config={"max_wait_ms": 3000})) == ["later"]
    reply = await mq9.fetch(name)
    assert payloads(reply) == ["now", "later"]
    assert ids(reply)[1] >= 1  # a stored offset once due


async def test_message_ttl_expiry(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    await mq9.send(name, "short", mq9_ttl="1")
    await mq9.send(name, "long", mq9_ttl="3600")
    await mq9.send(name, "plain")
    assert payloads(await mq9.fetch(name)) == ["short", "long", "plain"]
    await asyncio.sleep(2.2)
    assert payloads(await mq9.fetch(name)) == ["long", "plain"]
    assert payloads(await mq9.query(name)) == ["long", "plain"]


async def test_stateful_fetch_and_ack(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    for i in range(4):
        await mq9.send(name, f"m{i}")
    first = ids(await mq9.fetch(name, group_name="w", config={"num_msgs": 2}))
    assert first == [0, 1]
    # FETCH alone never moves the offset.
    assert ids(await mq9.fetch(name, group_name="w", config={"num_msgs": 2})) == [0, 1]
    assert await mq9.ack(name, "w", 1) == {"error": ""}
    assert ids(await mq9.fetch(name, group_name="w")) == [2, 3]
    # Other groups, the group named "" and stateless reads are independent.
    assert ids(await mq9.fetch(name, group_name="other")) == [0, 1, 2, 3]
    assert await mq9.ack(name, "", 2) == {"error": ""}
    assert ids(await mq9.fetch(name, group_name="")) == [3]
    assert ids(await mq9.fetch(name, group_name=None)) == [0, 1, 2, 3]
    assert ids(await mq9.fetch(name)) == [0, 1, 2, 3]
    # force_deliver restarts from deliver; the stored offset is still there afterwards.
    assert ids(await mq9.fetch(name, group_name="w", force_deliver=True)) == [0, 1, 2, 3]
    assert ids(await mq9.fetch(name, group_name="w")) == [2, 3]
    assert ids(await mq9.fetch(name, group_name="w", force_deliver=True,
                               deliver="from_id", from_id=3)) == [3]


async def test_deliver_policies(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    empty = await mailbox(mq9)
    assert ids(await mq9.fetch(empty, deliver="latest")) == []
    for i in range(3):
        await mq9.send(name, f"m{i}")
    await asyncio.sleep(1.1)
    cut = int(time.time())
    for i in range(3, 5):
        await mq9.send(name, f"m{i}")
    assert ids(await mq9.fetch(name, deliver="earliest")) == [0, 1, 2, 3, 4]
    assert ids(await mq9.fetch(name, deliver="latest")) == [4]  # last stored, inclusive
    assert ids(await mq9.fetch(name, group_name="g", deliver="latest")) == [4]
    assert ids(await mq9.fetch(name, deliver="from_id", from_id=2)) == [2, 3, 4]
    assert ids(await mq9.fetch(name, deliver="from_time", from_time=cut)) == [3, 4]
    assert ids(await mq9.fetch(name, deliver="from_time", from_time=cut + 3600)) == []
    bad = await mq9.fetch(name, deliver="sometime")
    assert bad["error"].startswith("invalid request")


async def test_fetch_long_wait(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    started = time.monotonic()
    assert ids(await mq9.fetch(name, config={"max_wait_ms": 300})) == []
    assert time.monotonic() - started >= 0.25

    async def send_soon() -> None:
        await asyncio.sleep(0.2)
        await mq9.send(name, "arrived")

    sender = asyncio.create_task(send_soon())
    started = time.monotonic()
    reply = await mq9.fetch(name, config={"max_wait_ms": 3000})
    await sender
    assert payloads(reply) == ["arrived"]
    assert time.monotonic() - started < 2.5
    # The broker's default wait is 500 ms when config gives none.
    started = time.monotonic()
    assert ids(await mq9.raw(f"MSG.FETCH.{name}", {"deliver": "from_id", "from_id": 9})) == []
    assert time.monotonic() - started >= 0.4


async def test_fetch_errors(mq9: Mq9Wire) -> None:
    assert (await mq9.fetch("no.box"))["error"] == "mailbox no.box does not exist"
    name = await mailbox(mq9)
    assert (await mq9.raw(f"MSG.FETCH.{name}", b"not json"))["error"].startswith(
        "invalid request")
    assert (await mq9.raw(f"MSG.FETCH.{name}", b""))["error"].startswith("invalid request")
    assert (await mq9.fetch(name, config={"num_msgs": "many"}))["error"].startswith(
        "invalid request")


# ----- ACK


async def test_ack_errors(mq9: Mq9Wire) -> None:
    assert await mq9.ack("no.box", "g", 0) == {"error": "mailbox not found: no.box"}
    name = await mailbox(mq9)
    missing = await mq9.raw(f"MSG.ACK.{name}", {"mail_address": name, "msg_id": 0})
    assert missing["error"].startswith("invalid request")
    negative = await mq9.raw(f"MSG.ACK.{name}",
                             {"group_name": "g", "mail_address": name, "msg_id": -1})
    assert negative["error"].startswith("invalid request")


async def test_ack_never_skips_unfetched_lower_priority(mq9: Mq9Wire) -> None:
    """The broker moves every lane on ACK and loses n0/n1 here; the service does not."""
    name = await mailbox(mq9)
    await mq9.send(name, "n0")
    await mq9.send(name, "n1")
    await mq9.send(name, "c2", mq9_priority="critical")
    assert ids(await mq9.fetch(name, group_name="g", config={"num_msgs": 1})) == [2]
    assert await mq9.ack(name, "g", 2) == {"error": ""}
    assert ids(await mq9.fetch(name, group_name="g")) == [0, 1]
    await mq9.send(name, "c3", mq9_priority="critical")
    # Acking a normal message covers the critical ones before it, not c3 after it.
    assert ids(await mq9.fetch(name, group_name="g")) == [3, 0, 1]
    assert await mq9.ack(name, "g", 1) == {"error": ""}
    assert ids(await mq9.fetch(name, group_name="g")) == [3]
    assert await mq9.ack(name, "g", 3) == {"error": ""}
    assert ids(await mq9.fetch(name, group_name="g")) == []


# ----- QUERY


async def test_query_filters_and_order(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    await mq9.send(name, "a", mq9_tags="billing, ops")
    await mq9.send(name, "b", mq9_priority="critical", mq9_tags="ops")
    await mq9.send(name, "c", mq9_key="k1", mq9_tags="billing")
    await asyncio.sleep(1.1)
    since = int(time.time())
    await mq9.send(name, "d", mq9_tags="other")
    assert ids(await mq9.raw(f"MSG.QUERY.{name}", b"")) == [0, 1, 2, 3]  # msg_id order
    assert payloads(await mq9.query(name, tags=["billing"])) == ["a", "c"]
    assert payloads(await mq9.query(name, tags=["ops", "other"])) == ["a", "b", "d"]
    assert payloads(await mq9.query(name, since=since)) == ["d"]
    # One filter applies: key before tags before since.
    assert payloads(await mq9.query(name, key="k1", tags=["ops"], since=since)) == ["c"]
    assert payloads(await mq9.query(name, tags=["ops"], since=since)) == ["a", "b"]
    assert payloads(await mq9.query(name, key="nope")) == []
    assert payloads(await mq9.query(name, limit=2)) == ["a", "b"]
    # QUERY does not touch group offsets.
    assert ids(await mq9.fetch(name, group_name="g")) == [1, 0, 2, 3]


async def test_query_limit_default_and_cap(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    await asyncio.gather(*(mq9.send(name, f"m{i}") for i in range(120)))
    assert len(ids(await mq9.query(name))) == 100
    assert ids(await mq9.query(name, limit=500)) == list(range(100))
    assert len(ids(await mq9.query(name, limit=7))) == 7
    assert ids(await mq9.query("no.box")) == []


# ----- DELETE


async def test_delete(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    for i in range(3):
        await mq9.send(name, f"m{i}")
    assert await mq9.delete(name, 1) == {"error": "", "deleted": True}
    assert ids(await mq9.fetch(name)) == [0, 2]
    assert await mq9.delete(name, 1) == {"error": "message not found"}
    assert await mq9.delete(name, 99) == {"error": "message not found"}
    assert await mq9.delete(name, "x1") == {"error": "invalid msg_id: x1"}
    assert await mq9.delete(name, "-1") == {"error": "invalid msg_id: -1"}
    assert (await mq9.delete("no.box", 0))["error"] == "mailbox no.box does not exist"
    assert (await mq9.send(name, "m3"))["msg_id"] == 3  # ids are never reused


# ----- agents


async def test_agent_lifecycle(mq9: Mq9Wire) -> None:
    assert await mq9.raw("AGENT.REGISTER", {
        "name": "agent.translator", "mailbox": "agent.translator",
        "payload": "Multilingual translation; EN/ZH/JA/KO"}) == {"error": ""}
    card = {"name": "summarizer", "description": "Summarises long reports",
            "url": "https://agents.example/summarizer", "skills": [{"id": "sum"}]}
    assert await mq9.raw("AGENT.REGISTER", card) == {"error": ""}
    found = await mq9.raw("AGENT.DISCOVER", {"text": "translation"})
    assert found == {"error": "", "agents": [{
        "name": "agent.translator", "mailbox": "agent.translator",
        "payload": "Multilingual translation; EN/ZH/JA/KO"}]}
    assert [a["name"] for a in (await mq9.raw("AGENT.DISCOVER", {"text": "REPORTS"}))[
        "agents"]] == ["summarizer"]
    assert await mq9.raw("AGENT.REPORT", {"name": "summarizer", "report_info": "running"}) \
        == {"error": ""}
    everyone = (await mq9.raw("AGENT.DISCOVER", b""))["agents"]
    assert [a["name"] for a in everyone] == ["agent.translator", "summarizer"]
    assert everyone[1]["report_info"] == "running"
    assert await mq9.raw("AGENT.UNREGISTER", {"name": "agent.translator"}) == {"error": ""}
    assert await mq9.raw("AGENT.UNREGISTER", {"name": "never.seen"}) == {"error": ""}
    assert [a["name"] for a in (await mq9.raw("AGENT.DISCOVER", {}))["agents"]] == [
        "summarizer"]
    assert await mq9.raw("AGENT.REPORT", {"name": "never.seen"}) == {"error": ""}


async def test_agent_errors(mq9: Mq9Wire) -> None:
    assert await mq9.raw("AGENT.REGISTER", b"") == {"error": "payload must not be empty"}
    assert await mq9.raw("AGENT.REGISTER", {"payload": "x"}) == {
        "error": "agent name must not be empty"}
    assert await mq9.raw("AGENT.UNREGISTER", {}) == {"error": "agent name must not be empty"}
    assert await mq9.raw("AGENT.UNREGISTER", {"name": ""}) == {
        "error": "agent name must not be empty"}
    assert await mq9.raw("AGENT.DISCOVER", {"semantic": "translate Chinese"}) == {
        "error": SEMANTIC_ERROR}
    assert (await mq9.raw("AGENT.REGISTER", b"{oops"))["error"].startswith("invalid request")


async def test_discover_paging(mq9: Mq9Wire) -> None:
    for i in range(25):
        await mq9.raw("AGENT.REGISTER", {"name": f"worker{i:02d}", "payload": "does work"})
    await mq9.raw("AGENT.REGISTER", {"name": "idle", "payload": "nothing"})
    first = [a["name"] for a in (await mq9.raw("AGENT.DISCOVER", {"text": "work"}))["agents"]]
    assert first == [f"worker{i:02d}" for i in range(20)]  # limit 20 by default
    second = await mq9.raw("AGENT.DISCOVER", {"text": "work", "page": 2})
    assert [a["name"] for a in second["agents"]] == [f"worker{i:02d}" for i in range(20, 25)]
    page = await mq9.raw("AGENT.DISCOVER", {"text": "does work", "limit": 10, "page": 3})
    assert [a["name"] for a in page["agents"]] == [f"worker{i:02d}" for i in range(20, 25)]
    assert (await mq9.raw("AGENT.DISCOVER", {"text": "work", "page": 9}))["agents"] == []


# ----- bad input, unknown subjects, bounds


async def test_unknown_subjects_get_no_reply(mq9: Mq9Wire) -> None:
    name = await mailbox(mq9)
    for subject in ("NOPE", "MAILBOX.DELETE", "MSG.SEND", "MSG.PEEK." + name, "AGENT"):
        assert await mq9.no_reply(subject), subject
    assert (await mq9.send(name, "still alive"))["msg_id"] == 0


async def test_bad_input_never_breaks_the_service(services: Starter, mq9_nats: str) -> None:
    await services(max_payload_bytes=1024)
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        big = await mq9.send(name, b"x" * 2000)
        assert big == {"error": "payload too large: 2000 bytes (limit 1024)"}
        assert (await mq9.send(name, "x", mq9_delay="soon"))["error"].startswith(
            "invalid mq9-delay")
        assert (await mq9.send(name, "x", mq9_ttl="-3"))["error"].startswith("invalid mq9-ttl")
        assert (await mq9.send(name, "x", mq9_key="k" * 300))["error"].startswith("mq9-key")
        # NATS's own headers from a sender are ignored: no rollup can wipe the mailbox.
        await mq9.send(name, "keep me")
        assert (await mq9.send(name, "y", **{"Nats-Rollup": "all"}))["error"] == ""
        assert payloads(await mq9.query(name)) == ["keep me", "y"]
        for junk in (b"\xff\xfe", b"[]", b"null", b'"s"', b"{" * 5000):
            for subject in ("MAILBOX.CREATE", f"MSG.FETCH.{name}", f"MSG.ACK.{name}",
                            f"MSG.QUERY.{name}", "AGENT.REGISTER", "AGENT.DISCOVER"):
                reply = await mq9.raw(subject, junk)
                assert reply["error"], (subject, junk, reply)
        await mq9.send(name, b"\xff\xfebinary")
        assert payloads(await mq9.query(name))[-1] == "\ufffd\ufffdbinary"
        assert (await mq9.send(name, "after"))["msg_id"] == 3
    finally:
        await mq9.close()


async def test_bounds(services: Starter, mq9_nats: str) -> None:
    await services(max_mailboxes=2, max_messages_per_mailbox=3, max_agents=2)
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        await mailbox(mq9)
        assert (await mq9.create(unique()))["error"] == "too many mailboxes (limit 2)"
        for i in range(3):
            assert (await mq9.send(name, f"m{i}"))["msg_id"] == i
        assert (await mq9.send(name, "m3"))["error"] == f"mailbox {name} is full"
        for i in range(2):
            assert await mq9.raw("AGENT.REGISTER", {"name": f"a{i}"}) == {"error": ""}
        assert (await mq9.raw("AGENT.REGISTER", {"name": "a2"}))["error"] == (
            "agent registry is full")
        assert await mq9.raw("AGENT.UNREGISTER", {"name": "a0"}) == {"error": ""}
        assert await mq9.raw("AGENT.REGISTER", {"name": "a2"}) == {"error": ""}
    finally:
        await mq9.close()


async def test_base64_payload_option(services: Starter, mq9_nats: str) -> None:
    await services(payload_encoding="base64")
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        await mq9.send(name, b"\x00\xffraw")
        assert [base64.b64decode(p) for p in payloads(await mq9.fetch(name))] == [
            b"\x00\xffraw"]
        assert [base64.b64decode(p) for p in payloads(await mq9.query(name))] == [
            b"\x00\xffraw"]
    finally:
        await mq9.close()


HEADER_BLOCKS = [
    b"", b"\r\n", b"a: b\r\n\r\n", b"mq9-reply-to: x.y\r\nbpgw-id: 1-2\r\nmq9-tags: a, b\r\n",
    b"Name:Value\r\nName2:\tv2 \r\n", b"no colon\r\n: empty name\r\n", b"k: v: w\r\n",
    b"bad name: x\r\n\tlead: y\r\n\x1csep: z\r\nok: 1\r\n", b"caf\xc3\xa9: x\r\nk: \xff\xfe\r\n",
    b"dup: 1\r\ndup: 2\r\n", b"Nats-Sequence: 7\r\nNats-Time-Stamp: 2026-01-01T00:00:00Z\r\n",
    b"k: caf\xc3\xa9 \r\n  spaced  :  v  \r\nx\x85y: 1\r\nv\x0bt: 2\r\n",
]


@pytest.mark.parametrize("raw", HEADER_BLOCKS)
def test_header_parsing_is_the_librarys(raw: bytes) -> None:
    """The service's header parser answers exactly what nats-py's own does (while nats-py
    has the parser it replaces; else the library's runs and this compares nothing)."""
    if not parser_replaced:
        assert Mq9Connection._parse_header_lines is Client._parse_header_lines
        return
    assert parse_header_lines(raw) == Client._parse_header_lines(raw)
    assert Mq9Connection._parse_header_lines(raw) == parse_header_lines(raw)


# ----- several instances, restarts


async def test_two_instances_share_the_work(services: Starter, mq9_nats: str) -> None:
    first = await services()
    await services()
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        replies = await asyncio.gather(*(mq9.send(name, f"m{i}") for i in range(200)))
        assert sorted(r["msg_id"] for r in replies) == list(range(200))
        acks = await asyncio.gather(*(mq9.ack(name, "g", i) for i in range(0, 200, 7)))
        assert all(a == {"error": ""} for a in acks), acks
        assert ids(await mq9.fetch(name, group_name="g", config={"num_msgs": 5})) == [
            197, 198, 199]
        await stop_service(first)  # the other instance answers alone, from the same state
        assert (await mq9.create(name))["error"] == f"mailbox {name} already exists"
        assert ids(await mq9.fetch(name, group_name="g")) == [197, 198, 199]
    finally:
        await mq9.close()


async def test_stopping_an_instance_loses_no_request(services: Starter, mq9_nats: str) -> None:
    """Requests in flight while one of two instances stops are all answered: the server
    stops routing to it before it stops, and what it was given it answers."""
    first = await services()
    await services()
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        sends = [asyncio.create_task(mq9.send(name, f"m{i}")) for i in range(300)]
        await asyncio.sleep(0.005)  # some sent, some still to go when the stop starts
        await stop_service(first)
        replies = await asyncio.gather(*sends)
        assert sorted(r["msg_id"] for r in replies) == list(range(300))
    finally:
        await mq9.close()


async def test_ack_hints_of_one_instance_never_undo_another(services: Starter,
                                                            mq9_nats: str) -> None:
    """An instance sets a group's offsets from the entry it last saw; when another
    instance moved them since, the set fails and the entry is read: offsets never go back."""
    first, second = await services(), await services()
    mq9 = await Mq9Wire.connect(mq9_nats)
    try:
        name = await mailbox(mq9)
        for i in range(8):
            await mq9.send(name, f"m{i}")
        a, b = first.storage, second.storage
        meta_a, meta_b = await a.mailbox(name), await b.mailbox(name)
        assert meta_a is not None and meta_b is not None
        await a.advance(meta_a, "g", LANES, 2)  # first remembers what it wrote
        await b.advance(meta_b, "g", LANES, 6)  # second moves past it
        await a.advance(meta_a, "g", LANES, 4)  # first's entry is old: read, nothing to do
        assert await b.offsets(meta_b, "g") == dict.fromkeys(LANES, 6)
        await a.advance(meta_a, "g", (Lane.CRITICAL,), 8)  # set from the entry just read
        assert await b.offsets(meta_b, "g") == {Lane.CRITICAL: 8, Lane.URGENT: 6,
                                                Lane.NORMAL: 6}
        assert ids(await mq9.fetch(name, group_name="g")) == [6, 7]
    finally:
        await mq9.close()


def _serve(url: str, namespace: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "mq9", "serve", "--nats", url,
         "--namespace", namespace, "--sweep-interval", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


async def _until_answering(mq9: Mq9Wire) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not await mq9.no_reply("AGENT.DISCOVER", b"{}", wait=0.5):
            return
    raise AssertionError("the mq9 service did not start")


async def test_cli_service_killed_and_restarted_keeps_everything(mq9_nats: str) -> None:
    namespace = f"t{uuid.uuid4().hex[:10]}"
    mq9 = await Mq9Wire.connect(mq9_nats)
    proc = _serve(mq9_nats, namespace)
    try:
        await _until_answering(mq9)
        name = await mailbox(mq9)
        for i in range(5):
            await mq9.send(name, f"m{i}", mq9_priority="urgent" if i == 4 else "normal")
        await mq9.send(name, "later", mq9_delay="1")
        assert ids(await mq9.fetch(name, group_name="w", config={"num_msgs": 3})) == [4, 0, 1]
        assert await mq9.ack(name, "w", 1) == {"error": ""}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc = _serve(mq9_nats, namespace)
        await _until_answering(mq9)
        assert await mq9.create(name) == {"error": f"mailbox {name} already exists"}
        # The delayed message, sent before the kill, is moved when due (by either instance).
        assert payloads(await mq9.fetch(name, deliver="from_id", from_id=5,
                                        config={"max_wait_ms": 3000})) == ["later"]
        # u4 has a larger id than the acked n1, so it comes again (as from the broker).
        assert payloads(await mq9.fetch(name, group_name="w")) == ["m4", "m2", "m3", "later"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        await mq9.close()


async def test_cli_rejects_bad_options() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "mq9", "serve", "--nats",
        "nats://127.0.0.1:1", "--namespace", "Bad Name", cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"namespace" in err

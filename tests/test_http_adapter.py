"""The ``http`` transport against a real aiohttp server on a free port.

The gateway is replaced by ``RecordingSink``, a small test double of our own
``GatewaySink`` that records what it is handed and answers with canned results.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from http_wire import ALICE, BOB, OPS

from adapters import base as base_module
from adapters.base import (
    JSON_TEXT_MAX_CHARS,
    JSON_TEXTS_MAX,
    Address,
    CommandRequest,
    CommandResult,
    ConfigError,
    DeliveryError,
    Disposition,
    Envelope,
    HealthState,
    Outbound,
    OutboundKind,
    Receipt,
    WebRequest,
    WebResponse,
    WebRoute,
    create_adapter,
    json_text,
)
from adapters.http import HttpAdapter
from adapters.http.auth import Caller, TokenAuth
from adapters.http.inbox import entry_bytes, entry_json, inbox_body
from adapters.http.server import answer_json
from adapters.http.wire import ApiError, MessageBody, message_fields, parse_as, read_body


class RecordingSink:
    """Records envelopes and commands; answers with a settable disposition."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.commands: list[CommandRequest] = []
        self.disposition = Disposition("accepted", request_ids=("req-1",))
        self.listed: list[dict[str, Any]] = []
        self.health_report: dict[str, Any] = {"status": "ok", "transports": {"api": "up"}}

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        self.envelopes.append(envelope)
        return self.disposition

    async def on_command(self, command: CommandRequest) -> CommandResult:
        self.commands.append(command)
        return CommandResult(
            title=f"ran {command.name}", fields=(("args", " ".join(command.args)),)
        )

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        self.listed.append({"status": status, "agent": agent, "offset": offset, "limit": limit})
        return [{"request_id": "req-1", "status": status or "open"}]

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        return {"request_id": request_id, "history": []} if request_id == "req-1" else None

    def health(self) -> dict[str, Any]:
        return self.health_report

    async def check_health(self) -> dict[str, Any]:
        return self.health_report

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        return True


OPTIONS: dict[str, Any] = {
    "port": 0,
    "tokens": {"alice": ALICE, "bob": BOB},
    "operator_tokens": {"ops": OPS},
    "max_body_bytes": 1024,
    "inbox_max": 3,
    "long_poll_max_seconds": 2,
}


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


def make_transport(redis: aioredis.Redis, namespace: str, **options: Any) -> HttpAdapter:
    transport = create_adapter("http", "api", {**OPTIONS, **options})
    assert isinstance(transport, HttpAdapter)
    transport.use_redis(redis, namespace)
    return transport


@contextlib.asynccontextmanager
async def started(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str, **options: Any
) -> AsyncIterator[HttpAdapter]:
    """A running ``make_transport(redis, namespace, **options)``, stopped on the way out."""
    transport = make_transport(redis, namespace, **options)
    await transport.start(sink)
    try:
        yield transport
    finally:
        await transport.stop()


@pytest.fixture
async def adapter(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> AsyncIterator[HttpAdapter]:
    async with started(sink, redis, namespace) as transport:
        yield transport


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def api(adapter: HttpAdapter, client: aiohttp.ClientSession) -> Api:
    return Api(client, adapter.url)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def notice(channel: str, text: str, **kw: Any) -> Outbound:
    return Outbound(Address("api", channel), text, kind=OutboundKind.NOTICE, **kw)


class Api:
    """A real aiohttp client bound to one running transport; answers (status, JSON)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def request(
        self, method: str, path: str, token: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = {**(auth(token) if token else {}), **kw.pop("headers", {})}
        async with self.session.request(method, self.base + path, headers=headers, **kw) as resp:
            assert resp.content_type == "application/json"
            return resp.status, await resp.json()

    async def get(self, path: str, token: str | None = None, **kw: Any) -> tuple[int, Any]:
        return await self.request("GET", path, token, **kw)

    async def post(self, path: str, token: str | None = None, **kw: Any) -> tuple[int, Any]:
        return await self.request("POST", path, token, **kw)


def assert_error(status: int, body: Any, expected: int, code: str) -> None:
    assert status == expected, body
    assert body["error"]["code"] == code
    assert body["error"]["message"]


# -- configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"port": 70000}, "transports.api.port"),
        ({"tokens": {"a": "short"}}, "transports.api.tokens.a"),
        (
            {"tokens": {"a": ALICE}, "operator_tokens": {"o": ALICE}},
            "transports.api.operator_tokens",
        ),
        ({"colour": "red"}, "transports.api.colour"),
        ({"inbox_max": 0}, "transports.api.inbox_max"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        create_adapter("http", "api", options)


def test_capabilities_and_url_before_start() -> None:
    transport = HttpAdapter("api", {})
    assert transport.capabilities.threads and not transport.capabilities.native_commands
    assert transport.capabilities.max_message_length is None
    with pytest.raises(RuntimeError):
        _ = transport.url


# -- posting messages ----------------------------------------------------------------


async def test_post_json_message(adapter: HttpAdapter, sink: RecordingSink, api: Api) -> None:
    status, body = await api.post("/v1/messages", ALICE, json={"text": "hello", "thread": "t1"})
    assert status == 200
    assert body["outcome"] == "accepted" and body["request_ids"] == ["req-1"]
    [envelope] = sink.envelopes
    assert envelope.native_id == body["native_id"]
    assert (envelope.transport, envelope.channel, envelope.text, envelope.thread) == (
        "api",
        "alice",
        "hello",
        "t1",
    )
    assert envelope.author.id == "alice" and envelope.author.is_bot


async def test_post_plain_text_and_refusal_is_422(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    sink.disposition = Disposition("malformed", detail="no header", errors=({"code": "x"},))
    status, body = await api.post(
        "/v1/messages",
        BOB,
        data="REQUEST to bob",
        headers={"Content-Type": "text/plain; charset=utf-8"},
    )
    assert status == 422
    assert body["outcome"] == "malformed" and body["errors"] == [{"code": "x"}]
    assert sink.envelopes[0].text == "REQUEST to bob"
    assert sink.envelopes[0].author.id == "bob"


async def test_processing_error_is_503_so_the_agent_retries(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    sink.disposition = Disposition("error", detail="state store unreachable")
    async with api.session.post(
        api.base + "/v1/messages", json={"text": "hello"}, headers=auth(ALICE)
    ) as resp:
        status, body = resp.status, await resp.json()
        assert resp.headers["Retry-After"] == "1"
    assert status == 503
    assert body["outcome"] == "error" and "unreachable" in body["detail"]


async def test_native_ids_are_unique(adapter: HttpAdapter, api: Api) -> None:
    ids = set()
    for _ in range(3):
        _, body = await api.post("/v1/messages", ALICE, json={"text": "x"})
        ids.add(body["native_id"])
    assert len(ids) == 3


@pytest.mark.parametrize(
    ("headers", "expected", "code"),
    [
        ({}, 401, "unauthorized"),
        (auth("wrong-token-xyz"), 401, "unauthorized"),
        ({"Authorization": f"Basic {ALICE}"}, 401, "unauthorized"),
        (auth(OPS), 403, "forbidden"),
    ],
)
async def test_post_message_token_errors(
    adapter: HttpAdapter,
    sink: RecordingSink,
    api: Api,
    headers: dict[str, str],
    expected: int,
    code: str,
) -> None:
    status, body = await api.post("/v1/messages", json={"text": "x"}, headers=headers)
    assert_error(status, body, expected, code)
    assert sink.envelopes == []


@pytest.mark.parametrize(
    "disposition",
    [
        Disposition("accepted", "applied; queued", ("req-1",)),
        Disposition("ignored", 'no "block" \\ \u2028 \U0001f600'),
        Disposition("duplicate", "", ("a", "b\n")),
        Disposition("malformed", "bad", errors=({"code": "bad_header", "line": 1},)),
        Disposition("accepted", "x", ("r",), warnings=({"code": "no_address"},)),
    ],
)
def test_the_answer_to_a_post_is_the_json_of_the_disposition(disposition: Disposition) -> None:
    assert json.loads(answer_json("n-1", disposition)) == {
        "native_id": "n-1", **disposition.to_dict()
    }


@pytest.mark.parametrize(
    "data",
    [
        {"text": "hi"}, {"text": "hi", "thread": "t1"}, {"text": "hi", "thread": None},
        {"text": ""}, {"text": "hi", "thread": ""}, {"text": 5}, {"text": None}, {},
        {"thread": "t1"}, {"text": "hi", "extra": 1}, {"text": "hi", "thread": 7},
        {"text": ["hi"]}, ["text"], "text", None, {"text": "hi", "thread": "t", "x": None},
    ],
)
def test_message_fields_agree_with_the_model(data: Any) -> None:
    """The hand-checked usual body and MessageBody accept, and refuse, the same bodies."""
    try:
        body = parse_as(MessageBody, data)
    except ApiError as refused:
        with pytest.raises(ApiError) as caught:
            message_fields(data)
        assert (caught.value.status, caught.value.message) == (400, refused.message)
    else:
        assert message_fields(data) == (body.text, body.thread)


@pytest.mark.parametrize(
    ("kwargs", "expected", "code"),
    [
        (
            {"data": "{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "bad_request",
        ),
        ({"json": ["text"]}, 400, "bad_request"),
        ({"json": {"text": 5}}, 400, "bad_request"),
        ({"json": {"text": "x", "extra": 1}}, 400, "bad_request"),
        ({"json": {"text": ""}}, 400, "bad_request"),
        ({"data": b"\xff\xfe", "headers": {"Content-Type": "text/plain"}}, 400, "bad_request"),
        (
            {"data": "x=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
            415,
            "unsupported_media_type",
        ),
        ({"json": {"text": "x" * 2000}}, 413, "payload_too_large"),
    ],
)
async def test_post_message_bad_input(
    adapter: HttpAdapter,
    sink: RecordingSink,
    api: Api,
    kwargs: dict[str, Any],
    expected: int,
    code: str,
) -> None:
    status, body = await api.post("/v1/messages", ALICE, **kwargs)
    assert_error(status, body, expected, code)
    assert sink.envelopes == []


async def test_chunked_and_compressed_bodies_are_read_whole(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    """A body without Content-Length, and a gzip-compressed one, read as they were sent."""
    async def chunks() -> AsyncIterator[bytes]:
        for part in (b'{"text": "chun', b'ked"}'):
            yield part

    headers = {"Content-Type": "application/json"}
    status, _ = await api.post("/v1/messages", ALICE, data=chunks(), headers=headers)
    assert status == 200
    packed = gzip.compress(json.dumps({"text": "packed " * 50}).encode())
    status, _ = await api.post(
        "/v1/messages", ALICE, data=packed, headers={**headers, "Content-Encoding": "gzip"}
    )
    assert status == 200
    assert [e.text for e in sink.envelopes] == ["chunked", "packed " * 50]


async def test_chunked_oversize_body_is_413(adapter: HttpAdapter, api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 512

    status, body = await api.post(
        "/v1/messages", ALICE, data=chunks(), headers={"Content-Type": "text/plain"}
    )
    assert_error(status, body, 413, "payload_too_large")
    # The same body arriving whole with the head (one write) is refused as well.
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body_bytes = b"y" * 2048
    writer.write(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        + f"Authorization: Bearer {ALICE}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + f"{len(body_bytes):x}\r\n".encode() + body_bytes + b"\r\n0\r\n\r\n"
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")


async def test_unknown_route_and_method(adapter: HttpAdapter, api: Api) -> None:
    status, body = await api.get("/v1/nothing", ALICE)
    assert_error(status, body, 404, "not_found")
    async with api.session.delete(f"{api.base}/v1/messages", headers=auth(ALICE)) as resp:
        assert resp.status == 405 and "POST" in resp.headers["Allow"]
        assert (await resp.json())["error"]["code"] == "method_not_allowed"


def test_token_auth_reads_every_spelling_of_the_header() -> None:
    auth_ = TokenAuth({"alice": "tok-alice-1", "pad": " tok-pad-1"}, {"ops": "tok-ops-1"})
    alice, ops = Caller("alice", is_operator=False), Caller("ops", is_operator=True)
    for header in ("Bearer tok-alice-1", "bearer tok-alice-1", "BEARER   tok-alice-1  "):
        assert auth_.identify(header) == alice
    assert auth_.identify("Bearer tok-ops-1") == ops
    for header in (None, "", "Bearer", "Bearer ", "Basic tok-alice-1", "Bearer tok-alice-",
                   "Bearer tok-alice-1x", "Bearertok-alice-1", "tok-alice-1"):
        assert auth_.identify(header) is None
    # A configured token with a leading blank can not be presented (the header is read
    # stripped), however the header is written.
    assert auth_.identify("Bearer  tok-pad-1") is None
    assert auth_.identify("Bearer tok-pad-1") is None


def test_webhook_routes_may_not_clash(redis: aioredis.Redis, namespace: str) -> None:
    async def hook(request: WebRequest) -> WebResponse:
        return WebResponse(200)

    transport = make_transport(redis, namespace)
    for path in ("/v1/hook", "/healthz", "/metrics"):
        with pytest.raises(ConfigError, match="clashes with the HTTP API"):
            transport.serve_routes([WebRoute(path, hook, transport="tg")])
    with pytest.raises(ConfigError, match=r"tg2: POST /hook is served for another transport"):
        transport.serve_routes(
            [WebRoute("/hook", hook, transport="tg"), WebRoute("/hook", hook, transport="tg2")]
        )


@pytest.mark.parametrize(
    ("head", "status", "code", "allow"),
    [
        (b"OPTIONS * HTTP/1.1", 404, "not_found", None),  # a target no path pattern matches
        (b"GET /a%0Ab HTTP/1.1", 404, "not_found", None),  # a decoded newline in the path
        (b"GET /v1/messages/ HTTP/1.1", 404, "not_found", None),
        (b"GET /v1/conversations/ HTTP/1.1", 404, "not_found", None),
        (b"PUT /v1/agents/bob/inbox HTTP/1.1", 405, "method_not_allowed", "GET,HEAD"),
        (b"POST /healthz HTTP/1.1", 405, "method_not_allowed", "GET,HEAD"),
        (b"DELETE /v1/commands HTTP/1.1", 405, "method_not_allowed", "POST"),
        (b"PUT /hook HTTP/1.1", 405, "method_not_allowed", "POST"),
        (b"GET /v1/agents/a%7Bb/inbox HTTP/1.1", 404, "not_found", None),  # no { in a name
        # An expectation the server does not know, on any target, before routing.
        (b"POST /v1/messages HTTP/1.1\r\nExpect: 200-ok", 417, "expectation_failed", None),
        (b"GET /nothing HTTP/1.1\r\nExpect: 200-ok", 417, "expectation_failed", None),
    ],
)
async def test_any_target_and_method_is_answered_in_the_error_shape(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str,
    head: bytes, status: int, code: str, allow: str | None
) -> None:
    async def hook(request: WebRequest) -> WebResponse:
        return WebResponse(200)

    adapter = make_transport(redis, namespace)
    adapter.serve_routes([WebRoute("/hook", hook, transport="tg")])
    await adapter.start(sink)
    try:
        host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await adapter.stop()
    top, _, body = answer.partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 %d " % status)
    assert json.loads(body)["error"]["code"] == code
    assert (allow is None) == (b"\r\nAllow: " not in top)
    if allow is not None:
        assert b"\r\nAllow: " + allow.encode() + b"\r\n" in top


@pytest.mark.parametrize(
    ("target", "expect", "status"),
    [
        ("/v1/messages?x=1", False, 200),
        ("/v1/%6Dessages", False, 200),  # decoded as aiohttp's router decoded it
        ("http://x/v1/messages", False, 200),  # absolute form
        ("/v1/messages", True, 200),  # Expect: 100-continue is answered first
        ("/v1%2Fmessages", False, 404),  # an encoded slash is not a path separator
        ("/V1/messages", False, 404),
    ],
)
async def test_a_post_is_routed_by_its_decoded_path_whatever_the_target_form(
    adapter: HttpAdapter, sink: RecordingSink, target: str, expect: bool, status: int
) -> None:
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
            "Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n")
    writer.write((head + ("Expect: 100-continue\r\n" if expect else "") + "\r\nhi").encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    if expect:
        assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        answer = answer.partition(b"\r\n\r\n")[2]
    top, _, body = answer.partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 %d " % status)
    if status == 200:
        assert json.loads(body)["outcome"] == "accepted"
        assert [e.text for e in sink.envelopes] == ["hi"]
    else:
        assert json.loads(body)["error"]["code"] == "not_found" and not sink.envelopes


async def test_sink_failure_is_a_logged_503_never_500(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    async def broken(envelope: Envelope) -> Disposition:
        raise RuntimeError("bug")

    sink.on_envelope = broken  # type: ignore[method-assign]
    async with api.session.post(f"{api.base}/v1/messages", json={"text": "x"},
                                headers=auth(ALICE)) as resp:
        body = await resp.json()
        assert resp.headers["Retry-After"] == "1"
    assert_error(resp.status, body, 503, "unavailable")
    assert "bug" not in body["error"]["message"]


# -- inboxes -------------------------------------------------------------------------


async def test_send_lands_in_inbox_with_fields(adapter: HttpAdapter, api: Api) -> None:
    receipt = await adapter.send(
        Outbound(
            Address("api", "alice", "t9"),
            "RESPONSE",
            request_id="req-7",
            trace_id="tr-1",
            reply_to="n-1",
        )
    )
    status, body = await api.get("/v1/agents/alice/inbox", ALICE)
    assert status == 200
    [message] = body["messages"]
    assert message["id"] == receipt.native_ids[0]
    assert {
        k: message[k] for k in ("text", "kind", "request_id", "trace_id", "reply_to", "thread")
    } == {
        "text": "RESPONSE",
        "kind": "protocol",
        "request_id": "req-7",
        "trace_id": "tr-1",
        "reply_to": "n-1",
        "thread": "t9",
    }
    assert message["at"] <= time.time()
    _, again = await api.get("/v1/agents/alice/inbox", ALICE)
    assert again == {"messages": []}


async def test_recipient_overrides_channel(adapter: HttpAdapter, api: Api) -> None:
    await adapter.send(notice("alice", "for bob", recipient="bob"))
    _, body = await api.get("/v1/agents/bob/inbox", BOB)
    assert [m["text"] for m in body["messages"]] == ["for bob"]
    assert body["messages"][0]["kind"] == "notice"


async def test_long_poll_returns_when_message_arrives(adapter: HttpAdapter, api: Api) -> None:
    async def later() -> None:
        await asyncio.sleep(0.2)
        await adapter.send(notice("alice", "ping"))

    started = time.monotonic()
    sender = asyncio.create_task(later())
    status, body = await api.get("/v1/agents/alice/inbox?wait=10", ALICE)
    await sender
    elapsed = time.monotonic() - started
    assert status == 200 and [m["text"] for m in body["messages"]] == ["ping"]
    assert 0.15 < elapsed < 1.5


async def test_long_poll_times_out_empty_capped_by_max_seconds(
    adapter: HttpAdapter, api: Api
) -> None:
    started = time.monotonic()
    status, body = await api.get("/v1/agents/alice/inbox?wait=0.3", ALICE)
    assert status == 200 and body == {"messages": []}
    assert 0.25 < time.monotonic() - started < 1.5
    started = time.monotonic()
    await api.get("/v1/agents/alice/inbox?wait=600", ALICE)
    assert 1.9 < time.monotonic() - started < 3.5  # long_poll_max_seconds is 2


async def test_inbox_max_pops_oldest_first(adapter: HttpAdapter, api: Api) -> None:
    for text in ("one", "two", "three"):
        await adapter.send(notice("alice", text))
    _, first = await api.get("/v1/agents/alice/inbox?max=2", ALICE)
    _, second = await api.get("/v1/agents/alice/inbox?max=2", OPS)
    assert [m["text"] for m in first["messages"]] == ["one", "two"]
    assert [m["text"] for m in second["messages"]] == ["three"]


async def test_vanished_poller_does_not_lose_messages(adapter: HttpAdapter) -> None:
    url = f"{adapter.url}/v1/agents/alice/inbox?wait=5"
    async with aiohttp.ClientSession() as doomed:
        poll = asyncio.create_task(doomed.get(url, headers=auth(ALICE)))
        await asyncio.sleep(0.2)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
    await asyncio.sleep(0.1)
    await adapter.send(notice("alice", "kept"))
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as client:
        _, body = await Api(client, adapter.url).get("/v1/agents/alice/inbox", ALICE)
    assert [m["text"] for m in body["messages"]] == ["kept"]


def _serving_tasks() -> list[asyncio.Task[Any]]:
    """The server's tasks answering a connection's requests."""
    return [t for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "") == "HttpConnection._serve"]


async def test_a_long_poll_whose_client_left_ends_without_a_trace(
    adapter: HttpAdapter, api: Api
) -> None:
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /v1/agents/alice/inbox?wait=30 HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {ALICE}\r\n\r\n".encode())
    await writer.drain()
    for _ in range(1000):  # until the long-poll waits
        if tasks := _serving_tasks():
            break
        await asyncio.sleep(0.01)
    writer.close()
    await adapter.send(notice("alice", "kept"))  # wakes it: its reader is gone
    _, pending = await asyncio.wait(tasks, timeout=10)
    assert tasks and not pending
    _, body = await api.get("/v1/agents/alice/inbox", ALICE)
    assert [m["text"] for m in body["messages"]] == ["kept"]


async def test_pipelined_requests_are_answered_in_order(adapter: HttpAdapter) -> None:
    """Many requests written at once (more than the server reads ahead), answered in
    the order sent; the last one closes the connection."""
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    targets = [f"/v1/conversations/{'req-1' if i % 3 else f'nope-{i}'}" for i in range(60)]
    heads = [f"GET {t} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n" for t in targets]
    heads[-1] += "Connection: close\r\n"
    body = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n" \
           "Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
    writer.write(("\r\n".join(heads[:30]) + "\r\n" + body + "\r\n".join(heads[30:])
                  + "\r\n").encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    got = []
    while answer:
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got.append((int(head.split(b" ")[1]), json.loads(rest[:length])))
        answer = rest[length:]
    expected = [(200 if i % 3 else 404) for i in range(30)] + [200] \
        + [(200 if i % 3 else 404) for i in range(30, 60)]
    assert [status for status, _ in got] == expected
    assert got[30][1]["outcome"] == "accepted"
    assert got[31 + 3][1]["error"]["message"] == "no conversation nope-33"


async def test_a_large_answer_reaches_a_slow_reader_whole(
    adapter: HttpAdapter, sink: RecordingSink
) -> None:
    """An answer larger than the socket buffers, read slowly, then the next one."""
    page = [{"request_id": f"req-{i}", "task": "x" * 1000} for i in range(3000)]

    async def conversations(**kw: Any) -> list[dict[str, Any]]:
        return page

    sink.conversations = conversations  # type: ignore[method-assign]
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), limit=2**16)
    request = f"GET /v1/conversations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
    writer.write((request + "\r\n" + request + "Connection: close\r\n\r\n").encode())
    received = bytearray()
    while chunk := await asyncio.wait_for(reader.read(65536), 10):
        received += chunk
        await asyncio.sleep(0.001)
    writer.close()
    expected = json.dumps({"conversations": page}).encode()
    first, _, rest = bytes(received).partition(b"\r\n\r\n")
    assert b"\r\nContent-Length: %d\r\n" % len(expected) in first
    assert rest[:len(expected)] == expected
    second, _, rest = rest[len(expected):].partition(b"\r\n\r\n")
    assert second.startswith(b"HTTP/1.1 200 OK") and rest == expected


async def test_a_half_closed_long_poll_is_answered_and_takes_nothing(
    adapter: HttpAdapter, api: Api
) -> None:
    """A long-poll whose client half-closes after sending it is answered, then the
    connection closes; empty, as a full close looks the same to the server: a message
    arriving meanwhile is left for the next poll."""
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /v1/agents/alice/inbox?wait=30 HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {ALICE}\r\n\r\n".encode())
    writer.write_eof()
    await asyncio.sleep(0.2)
    await adapter.send(notice("alice", "kept"))
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nConnection: close\r\n" in answer
    assert answer.endswith(b'\r\n\r\n{"messages":[]}')
    _, body = await api.get("/v1/agents/alice/inbox", ALICE)
    assert [m["text"] for m in body["messages"]] == ["kept"]


async def test_a_half_closed_client_that_reads_no_answer_is_disconnected(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    """Requests whose answers outgrow the socket buffers, then a half-close, and no
    answer read: the server answers on after the EOF, but aborts the connection
    ``header_timeout_seconds`` (1 s) after its answers stop draining."""
    page = [{"request_id": f"req-{i}", "task": "x" * 1000} for i in range(3000)]

    async def conversations(**kw: Any) -> list[dict[str, Any]]:
        return page

    sink.conversations = conversations  # type: ignore[method-assign]
    async with started(sink, redis, namespace, header_timeout_seconds=1) as adapter:
        assert adapter._server is not None
        host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        _, writer = await asyncio.open_connection(sock=sock)
        request = f"GET /v1/conversations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}"
        writer.write(f"{request}\r\n\r\n".encode() * 3)
        writer.write_eof()
        for _ in range(1000):  # until the server holds it
            if adapter._server.connections:
                break
            await asyncio.sleep(0.01)
        [conn] = adapter._server.connections
        started_at = time.monotonic()
        for _ in range(1000):
            if not adapter._server.connections:
                break
            await asyncio.sleep(0.01)
        took = time.monotonic() - started_at
        held = len(adapter._server.connections)
        writer.transport.abort()
    assert conn.ended  # (the EOF was seen: the half-close is what is tested)
    assert held == 0
    assert took < 5


@pytest.mark.parametrize(
    ("path", "token", "expected", "code"),
    [
        ("/v1/agents/bob/inbox", ALICE, 403, "forbidden"),
        ("/v1/agents/alice/inbox", "nope-nope-nope", 401, "unauthorized"),
        ("/v1/agents/ghost/inbox", OPS, 404, "not_found"),
        ("/v1/agents/alice/inbox?wait=soon", ALICE, 400, "bad_request"),
        ("/v1/agents/alice/inbox?wait=-1", ALICE, 400, "bad_request"),
        ("/v1/agents/alice/inbox?wait=nan", ALICE, 400, "bad_request"),
        ("/v1/agents/alice/inbox?max=0", ALICE, 400, "bad_request"),
        ("/v1/agents/alice/inbox?max=1.5", ALICE, 400, "bad_request"),
    ],
)
async def test_inbox_errors(
    adapter: HttpAdapter,
    api: Api,
    path: str,
    token: str,
    expected: int,
    code: str,
) -> None:
    status, body = await api.get(path, token)
    assert_error(status, body, expected, code)


async def test_unconfigured_agent_inbox_is_operator_only(adapter: HttpAdapter, api: Api) -> None:
    await adapter.send(notice("ghost", "boo"))
    status, body = await api.get("/v1/agents/ghost/inbox", ALICE)
    assert_error(status, body, 403, "forbidden")
    _, body = await api.get("/v1/agents/ghost/inbox", OPS)
    assert [m["text"] for m in body["messages"]] == ["boo"]


async def test_full_inbox_raises_delivery_error(adapter: HttpAdapter, api: Api) -> None:
    for n in range(3):
        await adapter.send(notice("bob", f"m{n}"))
    with pytest.raises(DeliveryError, match="inbox of bob is full") as full:
        await adapter.send(notice("bob", "one too many"))
    assert full.value.code == "inbox_full" and full.value.retry_after
    # Acknowledging makes room again.
    _, body = await api.get("/v1/agents/bob/inbox?max=1", BOB)
    status, acked = await api.post(
        "/v1/agents/bob/inbox/ack", BOB, json={"id": body["messages"][0]["id"]}
    )
    assert status == 200 and acked == {"acked": body["messages"][0]["id"]}
    await adapter.send(notice("bob", "fits now"))


async def test_the_count_kept_with_the_inbox_follows_acks_also_in_an_older_inbox(
    adapter: HttpAdapter, api: Api, redis: aioredis.Redis
) -> None:
    """The messages waiting are counted in the inbox's hash (no XLEN per delivery), and an
    ack of the last message handed out needs no read of it; an inbox written before
    either (no count, no offset of the last one handed out) still works."""
    meta = adapter._inboxes._keys("bob")[1]
    for n in range(3):
        await adapter.send(notice("bob", f"m{n}"))
    assert await redis.hget(meta, "n") == "3"
    _, body = await api.get("/v1/agents/bob/inbox?max=2", BOB)
    ids = [m["id"] for m in body["messages"]]
    _, body = await api.get(f"/v1/agents/bob/inbox?ack={ids[1]}", BOB)  # the last handed out
    assert [m["text"] for m in body["messages"]] == ["m2"]
    assert await redis.hget(meta, "n") == "1"
    await redis.hdel(meta, "n", "oo")  # as an earlier version left it
    last = body["messages"][0]["id"]
    status, _ = await api.post("/v1/agents/bob/inbox/ack", BOB, json={"id": last})
    assert status == 200
    for n in range(3):  # room for inbox_max (3) again, and no more
        await adapter.send(notice("bob", f"again {n}"))
    assert await redis.hget(meta, "n") == "3"
    with pytest.raises(DeliveryError, match="holds 3 messages"):
        await adapter.send(notice("bob", "one too many"))


async def test_stored_messages_are_served_as_stored_also_in_the_older_form(
    adapter: HttpAdapter, api: Api, redis: aioredis.Redis
) -> None:
    """A poll hands the stored JSON on as it is: any text survives the round trip, and
    an entry stored by an earlier version (a JSON array, not an object) still reads."""
    hostile = 'quote " backslash \\ nul \x00 line\nsep \u2028 emoji \U0001f600 ```'
    await adapter.send(notice("bob", hostile))
    stream = adapter._inboxes._keys("bob")[0]
    body = '["older", "notice", "req-0", null, null, "t1", 1700000000.25]'
    await redis.xadd(stream, {"o": str(len(body)), "b": body})
    _, got = await api.get("/v1/agents/bob/inbox", BOB)
    first, older = got["messages"]
    assert first["text"] == hostile and first["kind"] == "notice"
    assert {k: older[k] for k in older if k != "id"} == {
        "text": "older", "kind": "notice", "request_id": "req-0", "trace_id": None,
        "reply_to": None, "thread": "t1", "at": 1700000000.25,
    }


def test_an_entry_as_bytes_is_its_json_in_utf8() -> None:
    """A poll's entries, made from the stored bytes, are what the JSON of the decoded
    entry encodes to; an older (array) body is converted as before."""
    body = inbox_body('quote " nul \x00 → \U0001f600', "notice", request_id="r", at=1.5)
    assert entry_bytes(b"17-0", body.encode()) == entry_json("17-0", body).encode()
    older = '["older", "notice", null, null, null, null, 2.0]'
    assert entry_bytes(b"18-1", older.encode()) == entry_json("18-1", older).encode()
    with pytest.raises(ValueError, match="without a body"):
        entry_bytes(b"19-0", None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "entry_id", [b"17-0", b"1735000000000-12", b"1-2-3", b"-1", b"1-", b"-", b"17", b"",
                 b"a-1", b"1-b", b'1"-2', b"1-2\n", b" 1-2", b"1 -2", b"\xd9\xa1-2"])
def test_an_entry_id_other_than_a_stream_ids_is_quoted_as_json(entry_id: bytes) -> None:
    """An entry's bytes take its id as it is only when it is a stream id (digits, "-",
    digits); any other id is JSON-encoded as entry_json does (the id never breaks the
    object, whatever bytes it holds)."""
    body = inbox_body("text", "notice", at=1.5)
    made = entry_bytes(entry_id, body.encode())
    assert made == entry_json(entry_id.decode(), body).encode()
    assert json.loads(made)["id"] == entry_id.decode()


class _Body:
    """Just what read_body reads of a request: its headers, length and body."""

    def __init__(self, raw: bytes) -> None:
        self.headers = {"content-type": "application/json"}
        self.content_length = len(raw)
        self._raw = raw

    async def body(self, within: float) -> bytes:
        return self._raw


@pytest.mark.parametrize("text", [
    '{"text": "a → b"}', '{}', '{"a": 1}', ' {"a": 1}', '{"a": 1} ', '{"a": 1}\n',
    '{"a": 1}{"b": 2}', '{"a": 1}x}', '{"a": }', '{', '}', '{]}', '{"a": NaN}',
    '{"a": [1, 2.50, -0, 1e400, null, true]}', '{"a": "\\ud800"}', '{"a": 1, "a": 2}',
    '\ufeff{}', '[1]', '"text"', '', '{"a": "\x00"}', '{' * 100000 + '}' * 100000,
])
async def test_a_json_body_decodes_as_json_loads_decodes_it(text: str) -> None:
    """A JSON body is decoded to what json.loads gives, or refused with json.loads's own
    words (the usual object body is decoded without its look for white space)."""
    request: Any = _Body(text.encode("utf-8", "surrogatepass"))
    try:
        expected: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(ApiError, match=re.escape(f"body is not valid JSON: {exc}")):
            await read_body(request, 1 << 30, 1.0)
        return
    except RecursionError:
        with pytest.raises(ApiError, match="nested too deeply"):
            await read_body(request, 1 << 30, 1.0)
        return
    got = await read_body(request, 1 << 30, 1.0)
    assert json.dumps(got) == json.dumps(expected)  # (NaN == NaN is False: compare text)


async def test_a_batch_is_stored_in_order_up_to_a_full_inbox(
    adapter: HttpAdapter, api: Api
) -> None:
    """send_batch stores in one round trip what send would one by one: a journal id
    already taken answers its first inbox id, and a full inbox ends the batch."""
    first = await adapter.send(notice("bob", "m0", id="1700000000000-1"))
    results = await adapter.send_batch([
        notice("bob", "m0", id="1700000000000-1"),  # replayed: not stored twice
        notice("bob", "m1", id="1700000000000-2"),
        notice("bob", "m2", id="1700000000000-3"),
        notice("bob", "m3", id="1700000000000-4"),  # inbox_max 3: full
        notice("bob", "m4", id="1700000000000-5"),  # not tried after it
    ])
    assert [type(r).__name__ for r in results] == ["Receipt"] * 3 + ["DeliveryError"]
    assert results[0] == Receipt(("1700000000000-1",)) and first != results[0]
    full = results[3]
    assert isinstance(full, DeliveryError) and full.code == "inbox_full"
    _, body = await api.get("/v1/agents/bob/inbox", BOB)
    assert [m["text"] for m in body["messages"]] == ["m0", "m1", "m2"]
    assert [m["id"] for m in body["messages"][1:]] == [
        r.native_ids[0] for r in results[1:3] if isinstance(r, Receipt)
    ]


async def test_inbox_is_bounded_in_bytes(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    async with started(sink, redis, namespace, inbox_max=1000,
                       inbox_max_bytes=4096) as transport:
        await transport.send(notice("bob", "x" * 3000))
        with pytest.raises(DeliveryError, match="bytes"):
            await transport.send(notice("bob", "y" * 3000))
        await transport.send(notice("bob", "small"))  # room by bytes for a small one


async def test_ack_removes_and_unacknowledged_messages_come_back(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str, client: aiohttp.ClientSession
) -> None:
    async with started(sink, redis, namespace,
                       inbox_visibility_seconds=0.5) as transport:
        api = Api(client, transport.url)
        for text in ("one", "two", "three"):
            await transport.send(notice("alice", text))
        _, first = await api.get("/v1/agents/alice/inbox?max=2", ALICE)
        assert [m["text"] for m in first["messages"]] == ["one", "two"]
        # Ack the first; the second stays in flight and comes back after the timeout.
        ack = first["messages"][0]["id"]
        _, nxt = await api.get(f"/v1/agents/alice/inbox?ack={ack}", ALICE)
        assert [m["text"] for m in nxt["messages"]] == ["three"]
        _, empty = await api.get("/v1/agents/alice/inbox", ALICE)
        assert empty == {"messages": []}
        _, again = await api.get("/v1/agents/alice/inbox?wait=3", ALICE)
        assert [m["text"] for m in again["messages"]] == ["two", "three"]
        assert again["messages"][0]["id"] == first["messages"][1]["id"]  # a stable id
        last = again["messages"][-1]["id"]
        _, done = await api.get(f"/v1/agents/alice/inbox?ack={last}&wait=0.7", ALICE)
        assert done == {"messages": []}
        status, body = await api.get("/v1/agents/alice/inbox?ack=bogus", ALICE)
        assert_error(status, body, 400, "bad_request")


async def test_a_batch_whose_answer_was_lost_comes_back_after_a_later_ack(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str, client: aiohttp.ClientSession
) -> None:
    """ack= is cumulative: acknowledging a later batch must not remove an earlier one whose
    answer never reached the reader (found by the frozen-Redis fault test)."""
    async with started(sink, redis, namespace,
                       inbox_visibility_seconds=0.5) as transport:
        api = Api(client, transport.url)
        for text in ("one", "two", "three"):
            await transport.send(notice("alice", text))
        _, lost = await api.get("/v1/agents/alice/inbox?max=1", ALICE)  # never arrives
        assert [m["text"] for m in lost["messages"]] == ["one"]
        _, got = await api.get("/v1/agents/alice/inbox?max=1", ALICE)
        assert [m["text"] for m in got["messages"]] == ["two"]
        seen: list[str] = []
        ack = got["messages"][0]["id"]
        for _ in range(3):  # acknowledging what it got; "one" must come back at least once
            _, more = await api.get(f"/v1/agents/alice/inbox?ack={ack}&wait=1", ALICE)
            seen += [m["text"] for m in more["messages"]]
            ack = more["messages"][-1]["id"] if more["messages"] else ack
        assert "one" in seen, seen


async def test_inbox_is_shared_by_replicas_and_stores_a_journal_id_once(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str, client: aiohttp.ClientSession
) -> None:
    one, two = make_transport(redis, namespace), make_transport(redis, namespace)
    await one.start(sink)
    await two.start(sink)
    try:
        poll = asyncio.create_task(
            Api(client, two.url).get("/v1/agents/alice/inbox?wait=10", ALICE)
        )
        await asyncio.sleep(0.2)
        out = Outbound(Address("api", "alice"), "hello", id="1700000000000-5")
        first = await one.send(out)
        again = await one.send(out)  # a replayed delivery after a crash
        status, body = await poll
        assert status == 200 and [m["text"] for m in body["messages"]] == ["hello"]
        assert first.native_ids == (body["messages"][0]["id"],)
        assert again.native_ids == ("1700000000000-5",)
        _, rest = await Api(client, one.url).get(
            f"/v1/agents/alice/inbox?ack={body['messages'][0]['id']}", ALICE
        )
        assert rest == {"messages": []}
    finally:
        await one.stop()
        await two.stop()


# -- commands, conversations, health ---------------------------------------------------


async def test_command_json_form(adapter: HttpAdapter, sink: RecordingSink, api: Api) -> None:
    status, body = await api.post(
        "/v1/commands", OPS, json={"command": "status", "args": ["x", "y"]}
    )
    assert status == 200
    assert body["title"] == "ran status" and body["ok"] is True
    assert body["fields"] == [{"name": "args", "value": "x y"}]
    [command] = sink.commands
    assert (command.transport, command.channel, command.name, command.args) == (
        "api",
        "ops",
        "status",
        ("x", "y"),
    )
    assert command.author.id == "ops" and not command.author.is_bot
    assert command.roles == ("operator",)


async def test_command_text_form_from_agent(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    status, _ = await api.post(
        "/v1/commands", ALICE, json={"text": '/protocol cancel req-1 "too slow"'}
    )
    assert status == 200
    [command] = sink.commands
    assert (command.name, command.args, command.roles) == ("cancel", ("req-1", "too slow"), ())
    assert command.author.is_bot


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"command": "a", "text": "/protocol a"},
        {"text": "/protocol"},
        {"text": 'status "unclosed'},
        {"command": "two words"},
        {"text": "status", "args": ["x"]},
    ],
)
async def test_command_bad_shapes(
    adapter: HttpAdapter,
    sink: RecordingSink,
    api: Api,
    payload: dict[str, Any],
) -> None:
    status, body = await api.post("/v1/commands", OPS, json=payload)
    assert_error(status, body, 400, "bad_request")
    assert sink.commands == []


async def test_conversations(adapter: HttpAdapter, sink: RecordingSink, api: Api) -> None:
    status, body = await api.get("/v1/conversations?status=open&agent=bob&offset=5&limit=2", ALICE)
    assert status == 200 and body == {"conversations": [{"request_id": "req-1", "status": "open"}]}
    assert sink.listed == [{"status": "open", "agent": "bob", "offset": 5, "limit": 2}]
    await api.get("/v1/conversations", OPS)
    assert sink.listed[-1] == {"status": None, "agent": None, "offset": 0, "limit": 50}

    status, body = await api.get("/v1/conversations?limit=x", OPS)
    assert_error(status, body, 400, "bad_request")
    status, body = await api.get("/v1/conversations")
    assert_error(status, body, 401, "unauthorized")


async def test_one_conversation_and_404(adapter: HttpAdapter, api: Api) -> None:
    status, body = await api.get("/v1/conversations/req-1", BOB)
    assert status == 200 and body["request_id"] == "req-1"
    status, body = await api.get("/v1/conversations/req-404", BOB)
    assert_error(status, body, 404, "not_found")


async def test_healthz_needs_no_token(adapter: HttpAdapter, api: Api) -> None:
    status, body = await api.get("/healthz")
    assert status == 200 and body["status"] == "ok"
    assert adapter.health().state is HealthState.UP


async def test_healthz_is_503_while_the_gateway_is_degraded(
    adapter: HttpAdapter, sink: RecordingSink, api: Api
) -> None:
    sink.health_report = {"status": "degraded", "state_store": "unreachable: refused"}
    async with api.session.get(f"{api.base}/healthz") as resp:
        body = await resp.json()
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    assert body["state_store"].startswith("unreachable")


# -- lifecycle -----------------------------------------------------------------------


async def _waiting_poll(transport: HttpAdapter, api: Api) -> asyncio.Task[Any]:
    """alice's long-poll of 30 s, once it waits on the server."""
    poll = asyncio.create_task(api.get("/v1/agents/alice/inbox?wait=30", ALICE))
    deadline = time.monotonic() + 20
    while not transport._inboxes._waiting:
        assert time.monotonic() < deadline, "the long poll never started waiting"
        await asyncio.sleep(0.001)
    return poll


async def test_stop_twice_and_pollers_return(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    transport = make_transport(redis, namespace)
    await transport.start(sink)
    async with aiohttp.ClientSession() as client:
        api = Api(client, transport.url)
        poll = await _waiting_poll(transport, api)
        started = time.monotonic()
        await transport.stop()
        await transport.stop()
        status, body = await poll
    assert status == 200 and body == {"messages": []}
    assert time.monotonic() - started < 15  # at once, not at the end of its 30 s wait
    assert transport.health().state is HealthState.DOWN
    with pytest.raises(RuntimeError):
        _ = transport.url


async def test_a_poll_arriving_at_stop_does_not_wait(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    """A long-poll that reaches its wait after the inboxes were woken for a stop (it
    was still reading the inbox then) returns empty instead of blocking for its 30 s."""
    transport = make_transport(redis, namespace)
    await transport.start(sink)
    try:
        transport._inboxes.wake_all()
        assert await asyncio.wait_for(transport._inboxes.take("alice", 10, 30.0), 10) == []
    finally:
        await transport.stop()


async def test_stop_answers_waiting_polls_at_once_every_time(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    """Stop after stop, each waiting long-poll is answered when stop returns. (A read
    cancelled while its connection opens could go on blocking, about once in a hundred
    stops, holding stop and its poll for seconds: the poll no longer waits on it.)"""
    async with aiohttp.ClientSession() as client:
        for _ in range(25):
            transport = make_transport(redis, namespace)
            await transport.start(sink)
            api = Api(client, transport.url)
            poll = await _waiting_poll(transport, api)
            started = time.monotonic()
            await transport.stop()
            assert await asyncio.wait_for(poll, 10) == (200, {"messages": []})
            # Not a timing target: the blocked case took 2 s or more, a stop takes ms.
            assert time.monotonic() - started < 1.5


async def test_port_in_use_reports_down(
    adapter: HttpAdapter, sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    port = int(adapter.url.rsplit(":", 1)[1])
    clash = make_transport(redis, namespace, port=port)
    with pytest.raises(OSError):
        await clash.start(sink)
    assert clash.health().state is HealthState.DOWN
    await clash.stop()


async def test_two_pollers_share_one_message(adapter: HttpAdapter, api: Api) -> None:
    async def poll() -> list[str]:
        _, body = await api.get("/v1/agents/alice/inbox?wait=1", ALICE)
        return [m["text"] for m in body["messages"]]

    polls = [asyncio.create_task(poll()) for _ in range(2)]
    await asyncio.sleep(0.2)
    await adapter.send(notice("alice", "only one"))
    results = await asyncio.gather(*polls)
    assert sorted(results) == [[], ["only one"]]


async def test_401_names_the_scheme(api: Api) -> None:
    async with api.session.get(f"{api.base}/v1/conversations") as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_restart_keeps_queued_messages(
    sink: RecordingSink, redis: aioredis.Redis, namespace: str
) -> None:
    transport = make_transport(redis, namespace)
    await transport.start(sink)
    await transport.stop()
    await transport.send(notice("alice", "while down"))
    await transport.start(sink)
    try:
        async with aiohttp.ClientSession() as client:
            _, body = await Api(client, transport.url).get("/v1/agents/alice/inbox", ALICE)
        assert [m["text"] for m in body["messages"]] == ["while down"]
        assert transport.health().state is HealthState.UP
    finally:
        await transport.stop()


def test_json_text_is_the_json_string_of_any_text_remembered_within_bounds() -> None:
    """json_text writes what json.dumps(ensure_ascii=False) does, remembers at most
    JSON_TEXTS_MAX texts (then starts again) and none over JSON_TEXT_MAX_CHARS."""
    texts = ['quote " \\ nul \x00 → \U0001f600 \u2028', "", "x" * (JSON_TEXT_MAX_CHARS + 1)]
    for text in texts:
        assert json_text(text) == json.dumps(text, ensure_ascii=False)
        assert json_text(text) == json.dumps(text, ensure_ascii=False)  # (remembered)
    assert texts[2] not in base_module._json_texts
    for i in range(JSON_TEXTS_MAX + 5):
        json_text(f"t{i}")
    assert 0 < len(base_module._json_texts) <= JSON_TEXTS_MAX

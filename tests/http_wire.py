"""Raw-socket exchanges with the ``http`` transport, for a byte-for-byte record of its
answers (tests/test_http_wire.py compares them with tests/vectors/http_wire.json).

Each case is a list of writes (with pauses between them) on a fresh connection; the
answer is every byte the server sends until it closes the connection (an idle one is
closed after ``header_timeout_seconds``, 1 s here). ``normalize`` masks what varies from
run to run: the ``Date`` header's value and the native ids minted per post.

Run as a script to record the answers of whichever code ``PYTHONPATH`` points at::

    PYTHONPATH=/path/to/tree python tests/http_wire.py > answers.json
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import sys
import uuid
import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from adapters.base import (
    CommandRequest,
    CommandResult,
    Disposition,
    Envelope,
    WebRequest,
    WebResponse,
    WebRoute,
    create_adapter,
)
from adapters.http import HttpAdapter

ALICE = "alice-token-123"
BOB = "bob-token-4567"
OPS = "operator-token-89"
OPTIONS: dict[str, Any] = {
    "port": 0,
    "tokens": {"alice": ALICE, "bob": BOB},
    "operator_tokens": {"ops": OPS},
    "max_body_bytes": 1024,
    "long_poll_max_seconds": 2,
    "header_timeout_seconds": 1,
    "body_timeout_seconds": 1,
    "metrics_token": "metrics-token-1",
}
PAUSE = b"<pause>"
"""A write of its own in a case: wait a little before the next write."""
EOF = b"<eof>"
"""A write of its own in a case: half-close the connection (the client sends no more,
and reads on)."""


class WireSink:
    """A gateway stand-in answering every call the same way."""

    async def on_envelope(self, envelope: Envelope) -> Disposition:
        """Accept anything but a text saying ``refuse``."""
        if envelope.text == "refuse":
            return Disposition("rejected", detail="policy: no", request_ids=("req-2",))
        if envelope.text == "fail":
            raise RuntimeError("a bug")
        return Disposition("accepted", detail="ok", request_ids=("req-1",))

    async def on_command(self, command: CommandRequest) -> CommandResult:
        """Echo the command."""
        args = " ".join(command.args)
        return CommandResult(title=f"ran {command.name}", fields=(("args", args),))

    async def conversations(
        self, *, status: str | None, agent: str | None, offset: int, limit: int
    ) -> list[dict[str, Any]]:
        """One conversation, saying the filters."""
        return [{"request_id": "req-1", "status": status, "agent": agent, "offset": offset,
                 "limit": limit}]

    async def conversation(self, request_id: str) -> dict[str, Any] | None:
        """``req-1`` and ``a/b`` exist."""
        if request_id in ("req-1", "a/b"):
            return {"request_id": request_id, "history": []}
        return None

    def health(self) -> dict[str, Any]:
        """Always ok."""
        return {"status": "ok"}

    async def check_health(self) -> dict[str, Any]:
        """Always ok."""
        return {"status": "ok"}

    async def metrics(self) -> tuple[bytes, str]:
        """A one-line exposition."""
        return b"bpgw_up 1\n", "text/plain; version=0.0.4; charset=utf-8"

    async def drain(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """Nothing to drain."""
        return True


async def _hook(request: WebRequest) -> WebResponse:
    """A webhook echoing what it got."""
    return WebResponse(
        200 if request.header("x-secret") == "s" else 401,
        {"body": request.body.decode("utf-8", "replace"), "secret": request.header("X-SECRET")},
        {"X-Hook": "yes"},
    )


@asynccontextmanager
async def serving(redis: Any, namespace: str, **options: Any) -> AsyncIterator[HttpAdapter]:
    """A running transport (with a ``/hook`` webhook) answering for ``WireSink``, with
    ``OPTIONS`` but for ``options``."""
    transport = create_adapter("http", "api", {**OPTIONS, **options})
    assert isinstance(transport, HttpAdapter)
    transport.use_redis(redis, namespace)
    transport.serve_routes([WebRoute("/hook", _hook, transport="tg")])
    await transport.start(WireSink())  # type: ignore[arg-type]
    try:
        yield transport
    finally:
        await transport.stop()


def _post(target: str, body: bytes, *, token: str | None = ALICE,
          ctype: str | None = "application/json", extra: str = "", close: bool = True,
          version: str = "1.1") -> bytes:
    head = f"POST {target} HTTP/{version}\r\nHost: x\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    if ctype is not None:
        head += f"Content-Type: {ctype}\r\n"
    head += f"Content-Length: {len(body)}\r\n{extra}"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


def _get(target: str, *, token: str | None = ALICE, method: str = "GET", extra: str = "",
         close: bool = True, version: str = "1.1") -> bytes:
    head = f"{method} {target} HTTP/{version}\r\nHost: x\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    head += extra
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n"


def _chunked(target: str, parts: Sequence[bytes], *, pause: bool = False,
             ctype: str = "text/plain") -> list[bytes]:
    head = (f"POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
            f"Content-Type: {ctype}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    out = [head.encode()]
    for part in parts:
        if pause:
            out.append(PAUSE)
        out.append(b"%x\r\n%s\r\n" % (len(part), part))
    if pause:
        out.append(PAUSE)
    out.append(b"0\r\n\r\n")
    return out if pause else [b"".join(out)]


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


MSG = b'{"text": "hello"}'
CASES: dict[str, list[bytes]] = {
    # -- POST /v1/messages
    "post_json": [_post("/v1/messages", MSG)],
    "post_json_charset": [_post("/v1/messages", MSG, ctype="application/json; charset=utf-8")],
    "post_json_thread": [_post("/v1/messages", b'{"text": "hi", "thread": "t1"}')],
    "post_text": [_post("/v1/messages", b"hello", ctype="text/plain")],
    "post_text_latin1": [_post("/v1/messages", b"h\xe9", ctype="text/plain; charset=latin-1")],
    "post_refused_422": [_post("/v1/messages", b"refuse", ctype="text/plain")],
    "post_sink_bug_503": [_post("/v1/messages", b"fail", ctype="text/plain")],
    "post_no_token": [_post("/v1/messages", MSG, token=None)],
    "post_bad_token": [_post("/v1/messages", MSG, token="nope-nope-nope")],
    "post_operator_403": [_post("/v1/messages", MSG, token=OPS)],
    "post_bad_json": [_post("/v1/messages", b'{"text": ')],
    "post_not_object": [_post("/v1/messages", b'[1]')],
    "post_extra_key": [_post("/v1/messages", b'{"text": "a", "x": 1}')],
    "post_empty_text": [_post("/v1/messages", b'{"text": ""}')],
    "post_deep_json": [_post("/v1/messages", b"[" * 900 + b"]" * 900)],
    "post_no_ctype": [_post("/v1/messages", MSG, ctype=None)],
    "post_form_415": [_post("/v1/messages", b"a=b", ctype="application/x-www-form-urlencoded")],
    "post_bad_utf8": [_post("/v1/messages", b'{"text": "\xff"}')],
    "post_bad_charset": [_post("/v1/messages", b"x", ctype="text/plain; charset=nope")],
    "post_empty_body": [_post("/v1/messages", b"")],
    "post_lone_surrogate_thread": [_post("/v1/messages", b'{"text": "a", "thread": "\\ud800"}')],
    "post_too_large_cl": [_post("/v1/messages", b"x" * 2000, ctype="text/plain")],
    "post_exactly_max": [_post("/v1/messages", b'{"text": "' + b"x" * 1010 + b'"}')],
    "post_too_large_cl_head_only": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nContent-Length: 5000\r\n\r\n"],
    "post_gzip": [_post("/v1/messages", gzip.compress(MSG), extra="Content-Encoding: gzip\r\n")],
    "post_keepalive_then_close": [
        _post("/v1/messages", MSG, close=False)
        + _post("/v1/messages", b"two", ctype="text/plain")],
    "post_body_in_pieces": [
        _post("/v1/messages", MSG)[:-5], PAUSE, _post("/v1/messages", MSG)[-5:]],
    "post_body_never_ends_408": [_post("/v1/messages", MSG)[:-5]],
    "post_gzip_bad": [_post("/v1/messages", b"not gzip", extra="Content-Encoding: gzip\r\n")],
    "post_gzip_bomb": [_post("/v1/messages", gzip.compress(b'{"text": "' + b"x" * 50000 + b'"}'),
                             extra="Content-Encoding: gzip\r\n")],
    "post_deflate": [_post("/v1/messages", zlib.compress(MSG),
                           extra="Content-Encoding: deflate\r\n")],
    "post_deflate_raw": [_post("/v1/messages", _raw_deflate(MSG),
                               extra="Content-Encoding: DEFLATE\r\n")],
    "post_br": [_post("/v1/messages", MSG, extra="Content-Encoding: br\r\n")],
    "post_other_encoding": [_post("/v1/messages", MSG, extra="Content-Encoding: foo\r\n")],
    "post_identity_encoding": [_post("/v1/messages", MSG, extra="Content-Encoding: identity\r\n")],
    "post_gzip_as_text": _chunked("/v1/messages", [gzip.compress(b"zip")]),
    "no_host_11": [b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"],
    "no_host_10": [b"GET /healthz HTTP/1.0\r\n\r\n"],
    "post_http10": [_post("/v1/messages", MSG, close=False, version="1.0")],
    "post_http10_keepalive": [
        _post("/v1/messages", MSG, close=False, version="1.0",
              extra="Connection: keep-alive\r\n")],
    # -- chunked bodies
    "chunked_one_write": _chunked("/v1/messages", [b"hel", b"lo"]),
    "chunked_trickled": _chunked("/v1/messages", [b"hel", b"lo"], pause=True),
    "chunked_json": _chunked("/v1/messages", [b'{"text"', b': "x"}'], ctype="application/json"),
    "chunked_oversize_one_write": _chunked("/v1/messages", [b"y" * 600, b"y" * 600]),
    "chunked_oversize_trickled": _chunked("/v1/messages", [b"y" * 600, b"y" * 600], pause=True),
    "chunked_exactly_max": _chunked("/v1/messages", [b"y" * 512, b"y" * 512]),
    "chunked_bad_size": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nab\r\n0\r\n\r\n"],
    "chunked_and_length": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n2\r\nab\r\n0\r\n\r\n"],
    # -- Expect
    "expect_continue": [_post("/v1/messages", MSG, extra="Expect: 100-continue\r\n")],
    "expect_continue_case": [_post("/v1/messages", MSG, extra="Expect: 100-Continue\r\n")],
    "expect_unknown_417": [_post("/v1/messages", MSG, extra="Expect: 200-ok\r\n")],
    "expect_get_unknown": [_get("/nothing", extra="Expect: x\r\n")],
    "expect_http10_ignored": [_post("/v1/messages", MSG, extra="Expect: x\r\n", version="1.0")],
    "expect_continue_head_only": [
        _post("/v1/messages", MSG, extra="Expect: 100-continue\r\n")[:-len(MSG)], PAUSE, MSG],
    # -- GET routes, HEAD
    "healthz": [_get("/healthz", token=None)],
    "healthz_head": [_get("/healthz", token=None, method="HEAD")],
    "healthz_post_405": [_post("/healthz", b"")],
    "metrics_no_token": [_get("/metrics", token=None)],
    "metrics_token": [_get("/metrics", token="metrics-token-1")],
    "metrics_agent_401": [_get("/metrics")],
    "metrics_head": [_get("/metrics", method="HEAD", token=OPS)],
    "conversations": [_get("/v1/conversations?status=open&agent=bob&offset=2&limit=5")],
    "conversations_pct": [_get("/v1/conversations?agent=b%C3%B6b&status=a+b")],
    "conversations_bad_limit": [_get("/v1/conversations?limit=0")],
    "conversations_bad_offset": [_get("/v1/conversations?offset=x")],
    "conversations_no_token": [_get("/v1/conversations", token=None)],
    "conversations_head": [_get("/v1/conversations", method="HEAD")],
    "conversation_one": [_get("/v1/conversations/req-1")],
    "conversation_404": [_get("/v1/conversations/nope")],
    "conversation_slash": [_get("/v1/conversations/a%2Fb")],
    "conversation_pct": [_get("/v1/conversations/req%2D1")],
    "conversation_trailing_slash": [_get("/v1/conversations/")],
    "inbox_own": [_get("/v1/agents/alice/inbox")],
    "inbox_own_case": [_get("/v1/agents/ALICE/inbox?max=5&wait=0")],
    "inbox_head": [_get("/v1/agents/alice/inbox", method="HEAD")],
    "inbox_other_403": [_get("/v1/agents/bob/inbox")],
    "inbox_unknown_ops_404": [_get("/v1/agents/nobody/inbox", token=OPS)],
    "inbox_bad_wait": [_get("/v1/agents/alice/inbox?wait=nan")],
    "inbox_bad_max": [_get("/v1/agents/alice/inbox?max=5000")],
    "inbox_bad_ack": [_get("/v1/agents/alice/inbox?ack=x")],
    "inbox_wait": [_get("/v1/agents/alice/inbox?wait=0.3")],
    "inbox_brace_404": [_get("/v1/agents/a%7Bb/inbox")],
    "inbox_put_405": [_get("/v1/agents/alice/inbox", method="PUT")],
    "ack_good": [_post("/v1/agents/alice/inbox/ack", b'{"id": "1735000000000-0"}')],
    "ack_bad": [_post("/v1/agents/alice/inbox/ack", b'{"id": "nope"}')],
    "ack_get_405": [_get("/v1/agents/alice/inbox/ack")],
    "command_json": [_post("/v1/commands", b'{"command": "status", "args": ["x"]}')],
    "command_text": [_post("/v1/commands", b"/protocol show 'a b'", ctype="text/plain")],
    "command_bad": [_post("/v1/commands", b'{"command": "a", "text": "b"}')],
    "command_delete_405": [_get("/v1/commands", method="DELETE")],
    # -- routing
    "unknown_404": [_get("/v1/nothing")],
    "root_404": [_get("/")],
    "options_star": [_get("*", method="OPTIONS")],
    "absolute_form": [_post("http://x/v1/messages", MSG)],
    "pct_path": [_post("/v1/%6Dessages", MSG)],
    "pct_slash_404": [_post("/v1%2Fmessages", MSG)],
    "upper_path_404": [_post("/V1/messages", MSG)],
    "trailing_slash_404": [_get("/v1/messages/")],
    "query_on_post": [_post("/v1/messages?x=1&y", MSG)],
    "dot_segments": [_get("/v1/../healthz", token=None)],
    "double_slash": [_get("//healthz", token=None)],
    "pct_newline": [_get("/a%0Ab")],
    "pct_invalid": [_get("/a%zzb")],
    "pct_utf8_bad": [_get("/v1/conversations/%ff")],
    "odd_method": [_get("/healthz", method="PURGE")],
    "custom_method": [_get("/healthz", method="FOO")],
    "lower_method": [_get("/healthz", method="get")],
    "webhook": [_post("/hook", b"payload", ctype="text/plain", extra="X-Secret: s\r\n")],
    "webhook_401": [_post("/hook", b"payload", ctype="text/plain")],
    "webhook_too_large": [_post("/hook", b"x" * 2000, ctype="text/plain")],
    "webhook_get_405": [_get("/hook")],
    "webhook_gzip": [_post("/hook", gzip.compress(b"zipped"), extra="Content-Encoding: gzip\r\n"
                           "X-Secret: s\r\n")],
    "query_odd": [_get("/v1/conversations?agent=%ff&status=a%zz&limit=5&limit=7&=x&offset")],
    "query_fragment": [_get("/v1/conversations?agent=x#frag")],
    "path_fragment": [_get("/healthz#x", token=None)],
    "conversation_lower_pct2f": [_get("/v1/conversations/a%2fb")],
    "conversation_pct25": [_get("/v1/conversations/a%25b")],
    "conversation_pct_mixed": [_get("/v1/conversations/caf%C3%A9%2F%ff%E2%82")],
    "auth_empty": [_get("/v1/conversations", extra="Authorization: \r\n", token=None)],
    "head_404": [_get("/nothing", method="HEAD")],
    "webhook_head_405": [_get("/hook", method="HEAD")],
    "expect_continue_413": [_post("/v1/messages", b"x" * 2000, ctype="text/plain",
                                  extra="Expect: 100-continue\r\n")[:-2000]],
    # (Refused before the body is read: the final answer, no 100 Continue; and the
    # connection closes, as the client may send its body or not.)
    "expect_continue_401": [_post("/v1/messages", MSG, token=None, close=False,
                                  extra="Expect: 100-continue\r\n")[:-len(MSG)]],
    "expect_continue_403": [_post("/v1/messages", MSG, token=OPS, close=False,
                                  extra="Expect: 100-continue\r\n")[:-len(MSG)]],
    "expect_continue_404": [_post("/nothing", MSG, close=False,
                                  extra="Expect: 100-continue\r\n")[:-len(MSG)]],
    "expect_continue_405": [_post("/healthz", MSG, close=False,
                                  extra="Expect: 100-continue\r\n")[:-len(MSG)]],
    "expect_continue_415": [_post("/v1/messages", MSG, ctype="image/png", close=False,
                                  extra="Expect: 100-continue\r\n")[:-len(MSG)]],
    "expect_continue_413_keepalive": [
        _post("/v1/messages", b"x" * 2000, ctype="text/plain", close=False,
              extra="Expect: 100-continue\r\n")[:-2000]],
    # The refused request's body, sent anyway, is a request: not answered.
    "expect_continue_401_body_follows": [
        _post("/v1/messages", _get("/healthz", token=None), token=None, close=False,
              extra="Expect: 100-continue\r\n")[:-len(_get("/healthz", token=None))],
        PAUSE, _get("/healthz", token=None)],
    # Sent without waiting for 100 Continue: read whole, the connection goes on.
    "expect_continue_401_body_sent": [
        _post("/v1/messages", MSG, token=None, close=False, extra="Expect: 100-continue\r\n")
        + _get("/healthz", token=None)],
    "expect_continue_chunked": [b"".join(_chunked("/v1/messages", [b"ab"])).replace(
        b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n", 1)],
    # -- connections
    "pipelined": [
        _get("/healthz", token=None, close=False) + _post("/v1/messages", MSG, close=False)
        + _get("/v1/conversations/req-1", close=False) + _get("/nothing")],
    "pipelined_with_error_in_middle": [
        _get("/healthz", token=None, close=False) + b"BAD\x01 / HTTP/1.1\r\n\r\n"
        + _get("/healthz", token=None)],
    "too_large_then_next": [
        _post("/v1/messages", b"x" * 2000, ctype="text/plain", close=False)
        + _get("/healthz", token=None)],
    "unauthorized_body_then_next": [
        _post("/v1/messages", MSG, token=None, close=False) + _get("/healthz", token=None)],
    "pipelined_posts": [
        _post("/v1/messages", b"one", ctype="text/plain", close=False)
        + _post("/v1/messages", MSG, close=False) + _post("/v1/commands", b"status",
                                                         ctype="text/plain")],
    "pipelined_chunked": [b"".join(_chunked("/v1/messages", [b"a", b"b"])).replace(
        b"Connection: close\r\n", b"") + _get("/healthz", token=None)],
    "keepalive_idle_closed": [_get("/healthz", token=None, close=False)],
    "http10_get": [_get("/healthz", token=None, close=False, version="1.0")],
    "http10_keepalive": [_get("/healthz", token=None, close=False, version="1.0",
                              extra="Connection: keep-alive\r\n")],
    # -- half-closed (the client sends no more after EOF, and reads the answers)
    # (An inbox read waits on Redis: the EOF arrives before its answer is ready.)
    "eof_after_request": [_get("/v1/agents/alice/inbox", close=False), EOF],
    "eof_after_post": [_post("/v1/messages", MSG, close=False), EOF],
    "eof_after_pipelined": [
        _get("/healthz", token=None, close=False) + _get("/v1/agents/alice/inbox", close=False)
        + _post("/v1/messages", MSG, close=False) + _get("/nothing", close=False), EOF],
    "eof_after_http10": [_get("/healthz", token=None, close=False, version="1.0"), EOF],
    "eof_after_pause": [_get("/healthz", token=None, close=False), PAUSE, EOF],
    "eof_in_head": [_get("/healthz", token=None, close=False)
                    + b"GET /healthz HTTP/1.1\r\nHo", EOF],
    "eof_in_body": [_post("/v1/messages", MSG, close=False)[:-5], EOF],
    "eof_in_chunked_body": [b"".join(_chunked("/v1/messages", [b"ab"]))[:-5], EOF],
    "eof_in_unread_body": [_post("/v1/messages", MSG, token=None, close=False)[:-5], EOF],
    "eof_in_expect_body": [_post("/v1/messages", MSG, close=False,
                                 extra="Expect: 100-continue\r\n")[:-5], EOF],
    "eof_after_malformed": [_get("/healthz", token=None, close=False) + b"GARBAGE\r\n\r\n",
                            EOF],
    "eof_only": [EOF],
    "silent": [],
    "partial_head": [b"GET /healthz HTTP/1.1\r\nHost: x\r\n"],
    # -- malformed
    "garbage": [b"GARBAGE\r\n\r\n"],
    "binary": [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"],
    "bad_version": [b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n"],
    "bad_version_text": [b"GET /healthz HTTX/1.1\r\nHost: x\r\n\r\n"],
    "no_version": [b"GET /healthz\r\n\r\n"],
    "header_no_colon": [b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"],
    "header_space_before_colon": [b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n"],
    "bare_lf": [b"GET /healthz HTTP/1.1\nHost: x\nConnection: close\n\n"],
    "long_header": [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n"],
    "long_target": [b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"],
    "many_headers": [b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n"],
    "huge_head": [b"GET /healthz HTTP/1.1\r\n" + b"".join(
        b"X-H%d: %s\r\n" % (i, b"v" * 4000) for i in range(40)) + b"\r\n"],
    "bad_content_length": [b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"],
    "two_content_lengths": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4"
        b"\r\n\r\nabcd"],
    "negative_content_length": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"],
    "nul_in_header": [b"GET /healthz HTTP/1.1\r\nHost: x\x00y\r\n\r\n"],
    "upgrade_websocket": [_get("/healthz", token=None, extra="Upgrade: websocket\r\n"
                               "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", close=False)],
    "connect_method": [b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n"],
    "te_unknown": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip\r\nConnection: close"
        b"\r\n\r\nab"],
    "duplicate_auth": [
        b"GET /v1/conversations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nAuthorization: Bearer nope-nope-1\r\nConnection: close\r\n\r\n"],
    "auth_lowercase_name": [
        b"GET /v1/conversations HTTP/1.1\r\nhost: x\r\nauthorization: bearer " + ALICE.encode()
        + b"\r\nconnection: close\r\n\r\n"],
    "te_gzip_chunked": [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip, chunked\r\n"
        b"Connection: close\r\n\r\n2\r\nab\r\n0\r\n\r\n"],
    "te_chunked_http10": [
        b"POST /v1/messages HTTP/1.0\r\nAuthorization: Bearer " + ALICE.encode()
        + b"\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nab\r\n0\r\n\r\n"],
    "te_chunked_upper": [b"".join(_chunked("/v1/messages", [b"ab"])).replace(
        b"Transfer-Encoding: chunked", b"Transfer-Encoding: CHUNKED")],
    "two_hosts": [b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\nConnection: close\r\n\r\n"],
    "two_content_types": [_post("/v1/messages", MSG, extra="Content-Type: text/plain\r\n")],
    "trailer_not_a_header": [b"".join(_chunked("/hook", [b"ab"])).replace(
        b"0\r\n\r\n", b"0\r\nX-Secret: s\r\n\r\n")],
    "trailer_endless": [b"".join(_chunked("/v1/messages", [b"ab"]))[:-2]
                        + b"X-Trailer: " + b"a" * 200_000],
    "obs_fold": [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\nConnection: close\r\n\r\n"],
}

_DATE = re.compile(rb"\r\nDate: [^\r]*")
_NATIVE_ID = re.compile(rb'"native_id":"[0-9a-f]{32}"')


def normalize(answer: bytes) -> str:
    """``answer`` with the Date value and native ids masked, as text for JSON."""
    answer = _DATE.sub(b"\r\nDate: <date>", answer)
    answer = _NATIVE_ID.sub(b'"native_id":"<id>"', answer)
    return answer.decode("latin-1")


async def exchange(host: str, port: int, writes: Sequence[bytes]) -> tuple[bytes, float]:
    """Send ``writes`` on a fresh connection; every byte answered until the server
    closes it (a reset ends the answer too, marked ``<reset>``), and how long after the
    last write it closed."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    got = bytearray()
    sent = loop.time()

    async def read() -> None:
        try:
            while chunk := await reader.read(65536):
                got.extend(chunk)
        except ConnectionResetError:
            got.extend(b"<reset>")

    reading = asyncio.ensure_future(read())
    try:
        for data in writes:
            if data == PAUSE:
                await asyncio.sleep(0.2)
            elif data == EOF:
                writer.write_eof()
            elif not writer.is_closing():
                writer.write(data)
            sent = loop.time()
        await asyncio.wait_for(reading, 8)
    finally:
        reading.cancel()
        writer.close()
    return bytes(got), loop.time() - sent


async def answers(adapter: HttpAdapter, *, timed: bool = False) -> dict[str, str]:
    """Every case's normalized answer from the running ``adapter``; ``timed``: each
    ending with whether the server closed at once or after a timeout (for a person to
    compare two servers, not for a test: timing on a loaded machine varies)."""
    host, port = adapter.url.removeprefix("http://").rsplit(":", 1)
    names = list(CASES)
    got = await asyncio.gather(*(exchange(host, int(port), CASES[n]) for n in names))
    out = {}
    for name, (answer, took) in zip(names, got, strict=True):
        out[name] = normalize(answer)
        if timed:
            out[name] += " <closed at once>" if took < 0.5 else " <closed after a timeout>"
    return out


async def _main() -> None:
    import redis.asyncio as aioredis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = aioredis.from_url(url, decode_responses=True)
    namespace = f"bpgwwire-{uuid.uuid4().hex[:12]}"
    try:
        async with serving(client, namespace) as adapter:
            found = await answers(adapter, timed=True)
    finally:
        async for key in client.scan_iter(match=f"*{namespace}*"):
            await client.delete(key)
        await client.aclose()
    json.dump(found, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    asyncio.run(_main())

"""The local HTTP transport: agents post messages and long-poll their inboxes.

See docs/http-api.md for the endpoints. An HTTP agent's channel is its own inbox, so
the gateway's replies and notices addressed to ``http:<agent>`` land in that inbox. The
inboxes live in Redis (adapters/http/inbox.py), shared by every replica.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from json.encoder import encode_basestring as _json_str
from typing import Any, TypeVar

from pydantic import BaseModel

from adapters.base import (
    Adapter,
    Address,
    Capabilities,
    CommandRequest,
    ConfigError,
    DeliveryError,
    Disposition,
    Envelope,
    GatewaySink,
    HealthState,
    Outbound,
    OwnedName,
    Probe,
    Receipt,
    WebRequest,
    WebRoute,
)
from adapters.http.auth import Caller, MetricsAccess, TokenAuth
from adapters.http.connections import ConnectionGuard, fit_descriptor_limit
from adapters.http.http11 import JSON_HEAD, Handler, HttpServer, Request, Response, encode_headers
from adapters.http.inbox import ACK_ID, Inboxes, inbox_body
from adapters.http.settings import HttpSettings
from adapters.http.wire import (
    RETRY_AFTER_SECONDS,
    AckBody,
    ApiError,
    CommandBody,
    error_answer,
    error_response,
    json_response,
    malformed,
    message_fields,
    parse_as,
    query_number,
    query_text,
    read_body,
    read_bytes,
)
from adapters.options import load_options
from protocol.names import name_key
from state.frozen import maker

log = logging.getLogger("bpgw.adapters.http")
# A handler of a path with a parameter (an agent's name, a RequestId): called with its value.
PathHandler = Callable[[Request, str], Awaitable[Response]]
BodyT = TypeVar("BodyT", bound=BaseModel)
HandlerT = TypeVar("HandlerT")

# Dispositions answered with 422: the gateway looked at the message and refused it.
REFUSED_OUTCOMES = frozenset({"malformed", "rejected"})
# Dispositions answered with 503: the gateway could not process the message (its state
# store is unreachable or overloaded); the agent should retry later.
FAILED_OUTCOMES = frozenset({"error"})
INBOX_MAX_BATCH = 1000
DEFAULT_INBOX_BATCH = 100
PAGE_MAX = 1000
DEFAULT_PAGE = 50
# The head of the 503 answer to a post (Retry-After before the Content-Type, as always).
_RETRY_JSON_HEAD = encode_headers({"Retry-After": str(RETRY_AFTER_SECONDS)})
# How long stop() lets in-flight requests finish before cancelling them.
SHUTDOWN_SECONDS = 5.0
# An Envelope per post without its frozen __init__ (state.frozen).
_make_envelope = maker(Envelope)


# Native ids: a random per-process prefix and a counter. Unique across processes and
# restarts like a UUID, at a fraction of uuid4's cost on the hot path.
_ID_PREFIX = secrets.token_hex(8)
_id_counter = itertools.count(1)


def new_native_id() -> str:
    """A fresh unique native id for a message on this transport."""
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


def _ack_id(text: str | None) -> str | None:
    if text is None:
        return None
    if not ACK_ID.match(text):
        raise ApiError(400, "ack: a message id looks like 1735000000000-0")
    return text


async def _bind_problem(host: str, port: int, table: str) -> tuple[str, str] | None:
    """Why ``host:port`` can not be listened on, with the fix (naming the config
    ``table`` to change); None when it can."""
    where = f"{host}:{port}"
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        return (f"{host} does not resolve: {exc}", f"set [{table}] host to an address of this "
                "machine")
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            # As the server binds (asyncio's create_server): reuse allowed, so TIME_WAIT
            # leftovers do not count.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return (f"{where} is taken: {exc.strerror}",
                            "stop what listens there (a gateway already running?) or set "
                            f"[{table}] port")
                if exc.errno == errno.EACCES:
                    return (f"{where}: {exc.strerror}",
                            "use a port above 1023, or let the gateway bind low ports "
                            "(CAP_NET_BIND_SERVICE)")
                return (f"{where}: {exc.strerror or exc}",
                        f"set [{table}] host to an address of this machine (127.0.0.1 for "
                        "local agents)")
    return None


def answer_json(native_id: str, disposition: Disposition) -> str:
    """The answer to ``POST /v1/messages``: the native id and the disposition, as JSON.

    The usual disposition (no errors, no warnings) is written out by hand, each string
    through the json module's own encoder: every post gets one.
    """
    d = disposition
    if d.errors or d.warnings:
        return json.dumps({"native_id": native_id, **d.to_dict()})
    ids = ",".join([_json_str(r) for r in d.request_ids])
    return (
        f'{{"native_id":{_json_str(native_id)},"outcome":{_json_str(d.outcome)},'
        f'"detail":{_json_str(d.detail)},"request_ids":[{ids}],"errors":[],"warnings":[]}}'
    )


def _get_and_head(handler: HandlerT) -> dict[str, HandlerT]:
    """``handler`` for GET and HEAD (the server leaves the body out of a HEAD's answer)."""
    return {"GET": handler, "HEAD": handler}


def _not_allowed(methods: Mapping[str, object]) -> Response:
    """405 with ``Allow: methods`` (the message is the one aiohttp's router used)."""
    allow = ",".join(sorted(methods))
    return error_response(405, "405: Method Not Allowed", headers={"Allow": allow})


def _path_value(raw: str) -> str:
    """A path parameter: the request's path is decoded but for ``%2F`` and ``%25``
    (``http11.decode_path``), which are decoded in the value only."""
    if "%" not in raw:
        return raw
    return raw.replace("%2F", "/").replace("%25", "%")


def _expect(request: Request, expect: str) -> None:
    """Refuse an unknown expectation on HTTP/1.1 (417), for every target. (``100
    Continue`` is sent by the server when a handler reads the body: ``Request.body``.)"""
    if request.version == "1.1" and expect.lower() != "100-continue":
        raise ApiError(417, f"Unknown Expect: {expect}")


def _ids(message: Outbound) -> dict[str, str | None]:
    """A delivery's ids for its log record."""
    return {"request_id": message.request_id, "trace_id": message.trace_id}


class HttpAdapter(Adapter):
    """Transport kind ``http``: a local HTTP server with per-agent bearer tokens.

    It runs on our own HTTP/1.1 server (adapters/http/http11.py): one handler, ``_serve``,
    looks a request's path up in ``_paths`` (exact paths) and ``_patterns`` (the paths
    with a parameter); ``_answer`` turns what it raises into the JSON error shape.
    """

    # Native ids are minted per POST (a retry is a new POST): no cross-replica claim.
    capabilities = Capabilities(
        max_message_length=None,
        threads=True,
        native_commands=False,
        sees_other_bots=True,
        fresh_native_ids=True,
        batched_sends=True,
        web_server=True,
    )

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings = load_options(HttpSettings, name, options)
        # Asked for every post: read out of the (frozen) settings once, not through two
        # pydantic attribute hooks (a few hundred instructions each) every time.
        self._max_body_bytes = self.settings.max_body_bytes
        self._body_timeout_seconds = self.settings.body_timeout_seconds
        self._auth = TokenAuth(self.settings.tokens, self.settings.operator_tokens)
        self._metrics_access = MetricsAccess(
            self.settings.metrics_token, self._auth, self.settings.host
        )
        self._token_keys = frozenset(name_key(agent) for agent in self.settings.tokens)
        self._inboxes_store: Inboxes | None = None
        self._sink: GatewaySink | None = None
        self._server: HttpServer | None = None
        self._guard = ConnectionGuard(self.settings.max_connections)
        self._url: str | None = None
        self._stopping = False
        # The API's paths; serve_routes adds other transports' webhooks.
        self._paths: dict[str, dict[str, Handler]] = {
            "/v1/messages": {"POST": self._post_message},
            "/v1/commands": {"POST": self._post_command},
            "/v1/conversations": _get_and_head(self._list_conversations),
            "/healthz": _get_and_head(self._healthz),
            "/metrics": _get_and_head(self._metrics),
        }
        # Tried in order when no exact path is the target's; a parameter is anything but
        # ``/``, ``{`` and ``}`` (what aiohttp's router's ``{name}`` matched before).
        self._patterns: tuple[tuple[re.Pattern[str], dict[str, PathHandler]], ...] = (
            (re.compile(r"/v1/agents/([^{}/]+)/inbox"), _get_and_head(self._get_inbox)),
            (re.compile(r"/v1/agents/([^{}/]+)/inbox/ack"), {"POST": self._post_ack}),
            (re.compile(r"/v1/conversations/([^{}/]+)"), _get_and_head(self._get_conversation)),
        )

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL the server listens on (with the real port when ``port`` was 0)."""
        if self._url is None:
            raise RuntimeError(f"http transport {self.name} is not running")
        return self._url

    async def _answer(self, request: Request) -> Response:
        """The answer to ``request``: ``_serve``'s, or the JSON error shape of what it
        raised (never a 500); raises only when the client went away."""
        try:
            return await self._serve(request)
        except Exception as exc:
            answer = error_answer(request, exc)
            if answer is None:
                raise
            return answer

    async def _serve(self, request: Request) -> Response:
        """Answer one request: the handler of its path and method; else 404, or 405 with
        ``Allow`` when the path has other methods."""
        if expect := request.headers.get("expect"):
            _expect(request, expect)
        # The path decoded but for %2F and %25.
        path = request.path
        methods = self._paths.get(path)
        if methods is not None:
            handler = methods.get(request.method)
            return _not_allowed(methods) if handler is None else await handler(request)
        for pattern, at in self._patterns:
            if (found := pattern.fullmatch(path)) is not None:
                by_path = at.get(request.method)
                if by_path is None:
                    return _not_allowed(at)
                return await by_path(request, _path_value(found[1]))
        return error_response(404, "404: Not Found")  # (aiohttp's router's words)

    def serve_routes(self, routes: Sequence[WebRoute]) -> None:
        """Serve other transports' webhook routes next to the API (before ``start``)."""
        for route in routes:
            if route.path.startswith("/v1/") or route.path in ("/healthz", "/metrics"):
                raise ConfigError(
                    f"transports.{route.transport}: route {route.path} clashes with the "
                    "HTTP API's endpoints"
                )
            methods = self._paths.setdefault(route.path, {})
            if route.method in methods:
                raise ConfigError(
                    f"transports.{route.transport}: {route.method} {route.path} is served "
                    "for another transport already"
                )
            methods[route.method] = self._web_handler(route)

    def _web_handler(self, route: WebRoute) -> Handler:
        async def handle(request: Request) -> Response:
            s = self.settings
            body = await read_bytes(request, s.max_body_bytes, s.body_timeout_seconds)
            answer = await route.handler(WebRequest(request.headers, body, request.remote))
            return json_response(dict(answer.body), answer.status, headers=answer.headers)

        return handle

    def use_redis(self, redis: Any, namespace: str) -> None:
        """Keep the inboxes in ``redis`` under ``namespace`` (called before ``start``)."""
        s = self.settings
        self._inboxes_store = Inboxes(
            redis,
            f"{namespace}:{self.name}",
            max_count=s.inbox_max,
            max_bytes=s.inbox_max_bytes,
            visibility_seconds=s.inbox_visibility_seconds,
            max_waiters=s.long_poll_max_waiters,
            max_wait_seconds=s.long_poll_max_seconds,
        )

    @property
    def _inboxes(self) -> Inboxes:
        if self._inboxes_store is None:
            raise RuntimeError(f"http transport {self.name} needs Redis (use_redis) first")
        return self._inboxes_store

    def destination(self, message: Outbound) -> str:
        """Deliveries are ordered per inbox: the recipient's, else the channel's."""
        return message.recipient or message.address.channel

    async def start(self, sink: GatewaySink) -> None:
        """Bind the server and begin serving; raises ``OSError`` when it cannot bind."""
        _ = self._inboxes  # fail early without Redis
        if self._server is not None:
            raise RuntimeError(f"http transport {self.name} is already running")
        self._sink = sink
        self._stopping = False
        s = self.settings
        self._guard.limit = fit_descriptor_limit(s.max_connections)
        server = HttpServer(
            self._answer,
            malformed,
            self._guard,
            max_body_bytes=s.max_body_bytes,
            # Closes a connection whose request head is incomplete (silent or trickling)
            # this long after it opened or after its last answer; the unread rest of a
            # body is dropped at most this long after the answer, then it closes.
            header_timeout=s.header_timeout_seconds,
        )
        try:
            host, port = await server.listen(s.host, s.port)
        except OSError as exc:
            self.set_health(HealthState.DOWN, f"cannot listen: {exc}")
            raise
        self._server = server
        host = f"[{host}]" if ":" in host else host
        self._url = f"http://{host}:{port}"
        self.set_health(HealthState.UP, f"listening on {self._url}")
        log.info("http transport %s listening on %s", self.name, self._url)

    async def stop(self) -> None:
        """Stop serving; waiting long-polls return empty at once. Safe to call twice."""
        server, self._server = self._server, None
        self._stopping = True
        if self._inboxes_store is not None:
            self._inboxes_store.wake_all()
        if server is not None:
            # No new connections; requests in progress finish (or are cancelled).
            await server.stop(SHUTDOWN_SECONDS)
        if self._inboxes_store is not None:
            await self._inboxes_store.close()
            log.info("http transport %s stopped", self.name)
        self._url = None
        self.set_health(HealthState.DOWN, "stopped")

    def stats(self) -> Mapping[str, Any]:
        """Open client connections, the cap, how many were accepted, closed to make room
        and refused at it (``/healthz``, ``/protocol status``)."""
        if self._server is None:
            return {}
        g = self._guard
        return {
            "connections": len(g),
            "max_connections": g.limit,
            "connections_accepted": g.accepted,
            "connections_evicted": g.evicted,
            "connections_refused": g.refused,
        }

    async def probe(self) -> Sequence[Probe]:
        """The listening address can be bound (as ``start`` will: every address ``host``
        resolves to), and agents have tokens to post with."""
        s = self.settings
        check = f"transport {self.name}: listen {s.host}:{s.port}"
        problem = await _bind_problem(s.host, s.port, f"transports.{self.name}")
        if problem is None:
            found = [Probe(check, True, "free" if s.port else "any free port")]
        else:
            found = [Probe(check, False, problem[0], problem[1])]
        names = f"transport {self.name}: tokens"
        if s.tokens:
            found.append(Probe(names, True, f"{len(s.tokens)} agent(s), "
                               f"{len(s.operator_tokens)} operator(s)"))
        else:
            found.append(Probe(names, True, "no agent tokens: no agent can post here",
                               f"add [transports.{self.name}.tokens] NAME = \"env:VAR\""))
        return found

    def owned_names(self) -> list[OwnedName]:
        """Each agent token proves its name: identity ``<transport>:<name>``, inbox address
        ``<transport>:<name>``."""
        return [
            OwnedName(
                agent,
                f"{self.name}:{agent}",
                Address(self.name, agent),
                f"transports.{self.name}.tokens.{agent}",
            )
            for agent in self.settings.tokens
        ]

    # -- outbound --------------------------------------------------------------------

    async def send(self, message: Outbound) -> Receipt:
        """Put ``message`` into the inbox of ``recipient`` (or the address's channel).

        Stored once per outbox journal id (``message.id``): a replayed delivery returns
        the id it got the first time. Raises ``DeliveryError`` (code ``inbox_full``)
        when the inbox is at ``inbox_max`` messages or ``inbox_max_bytes``; the outbox
        keeps the message queued and retries, nothing is dropped.
        """
        [result] = await self.send_batch([message])
        if isinstance(result, DeliveryError):
            raise result
        return result

    async def send_batch(self, messages: Sequence[Outbound]) -> list[Receipt | DeliveryError]:
        """Put ``messages`` (for one inbox) into it in one round trip, as ``send`` would
        one by one: a full inbox ends the list with its ``DeliveryError``."""
        if not messages:
            return []
        owner = messages[0].recipient or messages[0].address.channel
        if any((m.recipient or m.address.channel) != owner for m in messages):
            return await super().send_batch(messages)  # not one inbox: one by one
        at = time.time()
        items = [
            (
                inbox_body(
                    m.text,
                    str(m.kind),
                    request_id=m.request_id,
                    trace_id=m.trace_id,
                    reply_to=m.reply_to,
                    thread=m.address.thread,
                    at=at,
                ),
                m.id,
            )
            for m in messages
        ]
        out: list[Receipt | DeliveryError] = []
        debug = log.isEnabledFor(logging.DEBUG)
        for message, (status, value) in zip(
            messages, await self._inboxes.put_many(owner, items), strict=False
        ):
            if status == "full":
                log.warning("http transport %s: %s", self.name, value, extra=_ids(message))
                out.append(DeliveryError(value, retry_after=1.0, code="inbox_full"))
                break
            if debug:
                log.debug("queued %s %s for %s", message.kind, value, owner,
                          extra=_ids(message))
            out.append(Receipt((value,)))
        return out

    # -- request helpers -------------------------------------------------------------

    @property
    def sink(self) -> GatewaySink:
        """The gateway this transport feeds (set by ``start``)."""
        if self._sink is None:
            raise RuntimeError(f"http transport {self.name} has not been started")
        return self._sink

    def _caller(self, request: Request) -> Caller:
        caller = self._auth.identify(request.headers.get("authorization"))
        if caller is None:
            raise ApiError(
                401,
                "missing or unknown bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="bpgw"'},
            )
        return caller

    async def _body(self, request: Request, model: type[BodyT]) -> BodyT:
        return parse_as(model, await read_body(request, self._max_body_bytes,
                                               self._body_timeout_seconds))

    # -- handlers --------------------------------------------------------------------

    async def _post_message(self, request: Request) -> Response:
        caller = self._caller(request)
        if caller.is_operator:
            raise ApiError(403, "operator tokens send commands (POST /v1/commands), not messages")
        text, thread = message_fields(
            await read_body(request, self._max_body_bytes, self._body_timeout_seconds)
        )
        native_id = new_native_id()
        envelope = _make_envelope(
            transport=self.name,
            channel=caller.name,
            author=caller.author,
            text=text,
            thread=thread,
            native_id=native_id,
        )
        disposition = await self.sink.on_envelope(envelope)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "message %s from %s: %s",
                native_id,
                caller.name,
                disposition.outcome,
                extra={"request_id": ",".join(disposition.request_ids) or None},
            )
        head = JSON_HEAD
        if disposition.outcome in FAILED_OUTCOMES:
            status = 503
            head = _RETRY_JSON_HEAD
        elif disposition.outcome in REFUSED_OUTCOMES:
            status = 422
        else:
            status = 200
        return Response(status, answer_json(native_id, disposition).encode(), head)

    async def _check_reader(self, request: Request, owner: str) -> None:
        caller = self._caller(request)
        if not caller.may_read(owner):
            raise ApiError(403, f"{caller.name} may not read the inbox of {owner}")
        if name_key(owner) not in self._token_keys and not await self._inboxes.exists(owner):
            raise ApiError(404, f"no inbox for {owner}")

    async def _get_inbox(self, request: Request, owner: str) -> Response:
        await self._check_reader(request, owner)
        wait = query_number(request, "wait", 0.0, minimum=0, maximum=float("inf"), integer=False)
        limit = int(
            query_number(request, "max", DEFAULT_INBOX_BATCH, minimum=1, maximum=INBOX_MAX_BATCH)
        )
        ack = _ack_id(query_text(request, "ack"))
        if self._stopping or request.client_gone():
            return json_response({"messages": []})
        messages = await self._inboxes.take(
            owner,
            limit,
            min(wait, self.settings.long_poll_max_seconds),
            ack=ack,
            give_up=lambda: self._stopping or request.client_gone(),
        )
        # A reader that never gets the answer loses nothing: unacknowledged messages
        # come back after the visibility timeout. The messages are JSON (UTF-8) already.
        return Response(200, b'{"messages":[' + b",".join(messages) + b"]}")

    async def _post_ack(self, request: Request, owner: str) -> Response:
        await self._check_reader(request, owner)
        body = await self._body(request, AckBody)
        ack = _ack_id(body.id)
        await self._inboxes.take(owner, 0, 0.0, ack=ack)
        return json_response({"acked": ack})

    async def _post_command(self, request: Request) -> Response:
        caller = self._caller(request)
        body = await self._body(request, CommandBody)
        name, args = body.resolve()
        command = CommandRequest(
            transport=self.name,
            channel=caller.name,
            author=caller.author,
            name=name,
            args=args,
            roles=("operator",) if caller.is_operator else (),
            operator=caller.is_operator,
        )
        result = await self.sink.on_command(command)
        log.info("command %s from %s: ok=%s", name, caller.name, result.ok)
        return json_response(result.to_dict())

    async def _list_conversations(self, request: Request) -> Response:
        self._caller(request)
        offset = int(query_number(request, "offset", 0, minimum=0, maximum=2**31))
        limit = int(query_number(request, "limit", DEFAULT_PAGE, minimum=1, maximum=PAGE_MAX))
        found = await self.sink.conversations(
            status=query_text(request, "status"),
            agent=query_text(request, "agent"),
            offset=offset,
            limit=limit,
        )
        return json_response({"conversations": found})

    async def _get_conversation(self, request: Request, request_id: str) -> Response:
        self._caller(request)
        found = await self.sink.conversation(request_id)
        if found is None:
            raise ApiError(404, f"no conversation {request_id}")
        return json_response(found)

    async def _healthz(self, request: Request) -> Response:
        health = await self.sink.check_health()
        # 503 while any part fails, so a load balancer can act on it.
        if health.get("status") == "ok":
            return json_response(health)
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return json_response(health, 503, headers=headers)

    async def _metrics(self, request: Request) -> Response:
        if not self._metrics_access.allows(request.headers.get("authorization")):
            raise ApiError(
                401,
                "the metrics need the metrics_token or an operator token",
                headers={"WWW-Authenticate": 'Bearer realm="bpgw"'},
            )
        body, content_type = await self.sink.metrics()
        return Response(200, body, encode_headers({"Content-Type": content_type}))

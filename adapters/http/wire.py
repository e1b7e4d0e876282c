"""Request parsing and the JSON error shape of the HTTP API.

Every error leaves the server as ``{"error": {"code": "...", "message": "..."}}``:
``ApiError`` for the errors handlers raise, the server's ``BodyError`` (a body too large,
undecodable or late) and malformed requests (``malformed``), the gateway's ``QueryError``
as 400 and ``Unavailable`` (or the inboxes' Redis failing) as 503 with ``Retry-After``.
Never a 500: an unexpected exception is logged and answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from redis.exceptions import RedisError

from adapters.base import QueryError, Unavailable
from adapters.http.http11 import (
    JSON_HEAD,
    BodyError,
    Request,
    Response,
    encode_headers,
    parse_content_type,
)
from adapters.options import describe_validation_error
from protocol.text import lone_surrogate

log = logging.getLogger("bpgw.adapters.http")

ModelT = TypeVar("ModelT", bound=BaseModel)

ERROR_CODES: Mapping[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    417: "expectation_failed",
    503: "unavailable",
}
RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a 503: the gateway cannot answer now, try again shortly."""

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain"


class ApiError(Exception):
    """An expected client error, answered with its status and the JSON error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        # Close the connection after answering (its request stream is unusable).
        self.close = close


def json_response(
    data: Any, status: int = 200, *, headers: Mapping[str, str] | None = None,
    close: bool = False,
) -> Response:
    """``data`` as a JSON answer (``headers`` before its Content-Type)."""
    head = encode_headers(headers) if headers else JSON_HEAD
    return Response(status, json.dumps(data).encode(), head, close=close)


def error_response(
    status: int, message: str, *, headers: Mapping[str, str] | None = None, close: bool = False
) -> Response:
    """The JSON error answer for ``status``."""
    code = ERROR_CODES.get(status, f"http_{status}")
    return json_response(
        {"error": {"code": code, "message": message}}, status, headers=headers, close=close
    )


def unavailable(message: str, retry_after: float = RETRY_AFTER_SECONDS) -> Response:
    """A 503 answer with ``Retry-After`` (whole seconds, at least 1)."""
    seconds = str(max(1, math.ceil(retry_after)))
    return error_response(503, message, headers={"Retry-After": seconds})


def malformed(problem: str) -> Response:
    """The answer to input that is not a request the server takes (the connection
    closes after it)."""
    return error_response(400, f"malformed request: {problem}", close=True)


def error_answer(request: Request, exc: Exception) -> Response | None:
    """The JSON error shape for an exception a handler raised: a documented 4xx, or 503
    with ``Retry-After`` (an unexpected exception is logged and answered 503, never 500);
    None for the client going away (nothing to answer)."""
    if isinstance(exc, ApiError | BodyError):
        headers = exc.headers if isinstance(exc, ApiError) else None
        return error_response(exc.status, exc.message, headers=headers, close=exc.close)
    if isinstance(exc, QueryError):
        return error_response(400, str(exc))
    if isinstance(exc, Unavailable):
        return unavailable(str(exc), exc.retry_after)
    if isinstance(exc, RedisError):  # the inboxes' own Redis calls
        log.warning("state store unavailable for %s %s: %s", request.method, request.path, exc)
        return unavailable(f"the state store cannot answer now ({exc}); retry")
    if isinstance(exc, ConnectionError):
        return None
    log.error("unexpected error handling %s %s", request.method, request.path, exc_info=exc)
    return unavailable("unexpected server error; see the gateway log; retry")


def read_bytes(request: Request, max_bytes: int, within: float) -> Awaitable[bytes]:
    """The raw request body, at most ``max_bytes``, arrived whole within ``within`` s.

    Oversize bodies are refused (413) from ``Content-Length`` before reading (the server
    refuses others while reading: a chunked or compressed one). A body that does not
    arrive whole in time (a trickling client) is 408 and the connection is closed.
    (Not a coroutine itself: what it returns, the body's own, is the one that waits.)
    """
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(
            413, f"body of {request.content_length} bytes exceeds the limit of {max_bytes}"
        )
    return request.body(within)


async def read_body(request: Request, max_bytes: int, within: float) -> Any:
    """The request body (see ``read_bytes``) as JSON, or ``{"text": <body>}`` for a
    ``text/plain`` body."""
    raw_type = request.headers.get("content-type")
    charset: str | None = "utf-8"
    if raw_type == JSON_TYPE:
        # The usual header, written exactly so: nothing to parse.
        content_type = JSON_TYPE
    else:
        content_type, charset = parse_content_type(raw_type)
        if content_type not in (JSON_TYPE, TEXT_TYPE):
            raise ApiError(
                415, f"unsupported content type {content_type!r}; send {JSON_TYPE} or {TEXT_TYPE}"
            )
    raw = await read_bytes(request, max_bytes, within)
    try:
        text = raw.decode(charset or "utf-8")
    except (UnicodeDecodeError, LookupError) as exc:
        raise ApiError(400, f"body is not valid text: {exc}") from None
    if content_type == TEXT_TYPE:
        return {"text": text}
    try:
        return _json_loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "body is not valid JSON: nested too deeply") from None


_DECODER = json.JSONDecoder()
"""What ``json.loads`` decodes with when given no options."""


def _json_loads(text: str) -> Any:
    """``json.loads(text)``, the same value or the same error. The usual body, an object
    with no white space around it, is decoded by ``raw_decode`` alone: ``json.loads``
    also matches a regular expression for white space before and after the document
    (with its own two calls, about half the work of decoding a 250-byte message under
    callgrind). Any other text, a document followed by more, or an error, goes through
    ``json.loads``, which decides as before."""
    if text.startswith("{") and text.endswith("}"):
        try:
            value, end = _DECODER.raw_decode(text)
        except json.JSONDecodeError:
            return json.loads(text)  # (raises it again: the words json.loads uses)
        if end == len(text):
            return value
    return json.loads(text)


def parse_as(model: type[ModelT], data: Any) -> ModelT:
    """Validate a decoded body against ``model``; 400 naming the field on failure."""
    if not isinstance(data, dict):
        raise ApiError(400, f"body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, describe_validation_error(exc, "body", model)) from None


def message_fields(data: Any) -> tuple[str, str | None]:
    """``(text, thread)`` of a decoded ``POST /v1/messages`` body (``MessageBody``).

    The usual body, ``{"text": "..."}`` with perhaps a ``thread``, is checked here by
    hand, as the model would; any other goes through the model (its checks, its 400).
    """
    fields = _usual_message(data)
    if fields is None:
        body = parse_as(MessageBody, data)
        fields = body.text, body.thread
    text, thread = fields
    # The text may hold anything (a block with a lone surrogate is refused by the
    # parser with its line); the thread is stored as it is, so it must be valid Unicode.
    if thread is not None and (bad := lone_surrogate(thread)) is not None:
        raise ApiError(400, f"body.thread: not valid Unicode ({bad}, a lone surrogate)")
    return text, thread


def _usual_message(data: Any) -> tuple[str, str | None] | None:
    """``(text, thread)`` when ``data`` is a body the model would take as it is (a
    non-empty text, perhaps a non-empty thread or null, nothing else), else None."""
    if type(data) is not dict:
        return None
    text, thread = data.get("text"), data.get("thread")
    if (type(text) is str and text and (thread is None or (type(thread) is str and thread))
            and len(data) == (2 if "thread" in data else 1)):
        return text, thread
    return None


def query_number(
    request: Request,
    name: str,
    default: float,
    *,
    minimum: float,
    maximum: float,
    integer: bool = True,
) -> float:
    """A numeric query parameter within ``[minimum, maximum]``; 400 when it is not."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ApiError(400, f"query parameter {name!r} must be {kind}, got {raw!r}") from None
    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise ApiError(400, f"query parameter {name!r} must be between {minimum:g} and {maximum:g}")
    return value


def query_text(request: Request, name: str) -> str | None:
    """An optional text query parameter (absent or empty is None)."""
    return request.query.get(name) or None


class MessageBody(BaseModel):
    """``POST /v1/messages`` body."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    thread: str | None = Field(default=None, min_length=1)


class AckBody(BaseModel):
    """Body of ``POST /v1/agents/{name}/inbox/ack``: the last message id processed."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=3, max_length=41)


class CommandBody(BaseModel):
    """``POST /v1/commands`` body: ``command`` + ``args``, or a ``text`` command line."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")
    args: list[str] = Field(default_factory=list)
    text: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CommandBody:
        """Exactly one of ``command`` and ``text``; ``args`` only with ``command``."""
        if (self.command is None) == (self.text is None):
            raise ValueError("send either 'command' (with optional 'args') or 'text'")
        if self.text is not None and self.args:
            raise ValueError("'args' goes with 'command', not with 'text'")
        return self

    def resolve(self) -> tuple[str, tuple[str, ...]]:
        """The command name and arguments; a ``text`` line may start with ``/protocol``."""
        if self.command is not None:
            return self.command, tuple(self.args)
        try:
            words = shlex.split(self.text or "")
        except ValueError as exc:
            raise ApiError(400, f"body.text: cannot split command line: {exc}") from None
        if words and words[0] in ("/protocol", "protocol"):
            words = words[1:]
        if not words:
            raise ApiError(400, "body.text: no command name (e.g. '/protocol status')")
        return words[0], tuple(words[1:])

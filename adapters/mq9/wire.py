"""mq9 wire format: request models (pydantic, lenient like the broker) and reply bodies.

Every reply is a JSON object with an ``error`` field, ``""`` on success. Error texts the
broker has are copied exactly; the service's own (limits, bad values) say what was wrong.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters.mq9.store import Stored

DEFAULT_MAILBOX_TTL = 86_400
DEFAULT_FETCH_MESSAGES = 100
DEFAULT_MAX_WAIT_MS = 500
QUERY_LIMIT = 100
DEFAULT_DISCOVER_LIMIT = 20
MAX_DISCOVER_LIMIT = 100
# json.dumps(..., ensure_ascii=False) builds a new encoder on every call: one, made once.
_to_json = json.JSONEncoder(ensure_ascii=False).encode

SEMANTIC_DISABLED = (
    "agent search is not enabled in this build (missing the 'vector-search' feature)"
)


class BadRequest(Exception):
    """A request the service answers with an error reply (the text is the error)."""


class _Request(BaseModel):
    # Unknown fields are ignored, as the broker's JSON decoding does.
    model_config = ConfigDict(extra="ignore")


class CreateRequest(_Request):
    """MAILBOX.CREATE body."""

    name: str | None = None
    ttl: int = Field(DEFAULT_MAILBOX_TTL, ge=0)
    desc: str = ""


class FetchConfig(_Request):
    """FETCH ``config``."""

    num_msgs: int = DEFAULT_FETCH_MESSAGES
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS


class FetchRequest(_Request):
    """FETCH body; ``group_name`` absent or null is a stateless read."""

    group_name: str | None = None
    deliver: Literal["earliest", "latest", "from_time", "from_id"] = "earliest"
    from_time: float | None = None
    from_id: int | None = Field(None, ge=0)
    force_deliver: bool = False
    config: FetchConfig = Field(default_factory=FetchConfig)


class AckRequest(_Request):
    """ACK body."""

    group_name: str
    mail_address: str | None = None
    msg_id: int = Field(ge=0)


class QueryRequest(_Request):
    """QUERY body; one filter applies: key, then tags, then since, else all."""

    key: str | None = None
    tags: list[str] | None = None
    since: float | None = None
    limit: int | None = None


class AgentNameRequest(_Request):
    """UNREGISTER body."""

    name: str | None = None


class ReportRequest(_Request):
    """REPORT body."""

    name: str | None = None
    report_info: Any = None


class DiscoverRequest(_Request):
    """DISCOVER body."""

    text: str | None = None
    semantic: str | None = None
    limit: int = DEFAULT_DISCOVER_LIMIT
    page: int = 1


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes, *, empty_ok: bool = False) -> M:
    """``body`` as ``model``; BadRequest with a short reason when it is not."""
    if not body.strip():
        if empty_ok:
            return model()
        raise BadRequest("invalid request: empty body, a JSON object is required")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("invalid request: body is not JSON") from exc
    if not isinstance(data, dict):
        raise BadRequest("invalid request: body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadRequest(f"invalid request: {where}: {first['msg']}") from exc


def reply(error: str = "", **fields: Any) -> bytes:
    """A reply body: ``error`` first, then the fields."""
    return _to_json({"error": error, **fields}).encode()


def message_json(stored: Stored, encoding: Literal["text", "base64"]) -> dict[str, Any]:
    """One message as FETCH and QUERY list it."""
    if encoding == "base64":
        payload = base64.b64encode(stored.data).decode()
    else:
        payload = stored.data.decode("utf-8", errors="replace")
    return {"msg_id": stored.msg_id, "payload": payload, "priority": stored.lane.value,
            "header": stored.user_headers() or None, "create_time": stored.time}


def messages_reply(stored: list[Stored], encoding: Literal["text", "base64"],
                   budget: int) -> bytes:
    """A ``messages`` reply holding as many of ``stored`` (in order) as fit in ``budget``
    bytes; the rest stays for the next call (at least one always goes)."""
    items: list[str] = []
    size = 64
    for one in stored:
        text = _to_json(message_json(one, encoding))
        encoded = len(text.encode())
        if items and size + encoded + 1 > budget:
            break
        items.append(text)
        size += encoded + 1
    return ('{"error":"","messages":[' + ",".join(items) + "]}").encode()

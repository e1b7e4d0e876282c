"""Pydantic models of the five bot-protocol message types (wire-format.md, section 2).

A message is immutable. Field names are the spec's canonical names; the sender is
``sender`` in Python and ``from`` in JSON (``model_dump(by_alias=True)``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from protocol.fields import FIELD_KEYS, KEY_SHAPE, TEXT_FIELDS, WEAK_ALIASES, normalize_key
from protocol.names import check_name
from protocol.text import clean_value

MAX_DEPTH_LIMIT = 50
DEFAULT_MAX_DEPTH = 5
DEFAULT_VERSION = "0.1"
REQUEST_ID_MAX_LEN = 128
TOKEN_MAX_LEN = 128
VERSION_MAX_LEN = 32



class MessageType(StrEnum):
    """The five protocol message types, as written on the wire."""

    REQUEST = "REQUEST"
    RESPONSE = "RESPONSE"
    CLARIFY = "CLARIFY"
    HANDOFF = "HANDOFF"
    BROADCAST = "BROADCAST"


class Priority(StrEnum):
    """Priority of a REQUEST or HANDOFF (also the BROADCAST urgency scale)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    CRITICAL = "critical"


class Status(StrEnum):
    """Outcome carried by a RESPONSE."""

    DONE = "done"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Input spellings accepted for Status (the deployed v0.1 vocabulary and US spelling).
STATUS_ALIASES: dict[str, Status] = {
    "success": Status.DONE,
    "partial_success": Status.PARTIAL,
    "canceled": Status.CANCELLED,
}


class Depth(BaseModel):
    """Hop counter ``current/max`` of one conversation (1 <= current <= max <= 50)."""

    model_config = ConfigDict(frozen=True)

    current: int = 1
    max: int = DEFAULT_MAX_DEPTH

    @model_validator(mode="after")
    def _check_range(self) -> Self:
        if not 1 <= self.current <= self.max <= MAX_DEPTH_LIMIT:
            raise ValueError(
                f"depth must satisfy 1 <= current <= max <= {MAX_DEPTH_LIMIT}, "
                f"got {self.current}/{self.max}"
            )
        return self

    @property
    def at_limit(self) -> bool:
        """True when only a RESPONSE may follow."""
        depth = self.__dict__  # (one pass through pydantic's __getattr__ hook, not two)
        return depth["current"] >= depth["max"]  # type: ignore[no-any-return]

    def next(self) -> Depth:
        """The depth a reply carries; raises ValueError past the limit."""
        return Depth(current=self.current + 1, max=self.max)

    def __str__(self) -> str:
        return f"{self.current}/{self.max}"


def check_token(value: str, what: str, max_len: int = TOKEN_MAX_LEN) -> str:
    """Validate a single-token value: 1-max_len printable characters, no white space."""
    # Printable and without " " means without white space: " " is the only printable
    # white-space character.
    if not value or len(value) > max_len or not value.isprintable() or " " in value:
        raise ValueError(f"{what} is 1-{max_len} printable characters without white space")
    return value


def check_request_id(value: str) -> str:
    """Validate a RequestId: 1-128 printable characters, no white space."""
    return check_token(value, "a RequestId", REQUEST_ID_MAX_LEN)


def _clean_meta(type_name: str, meta: Any) -> tuple[tuple[str, str], ...]:
    """Meta pairs trimmed, empty values dropped; keys must not name a field of the type."""
    own = FIELD_KEYS[type_name]
    pairs: list[tuple[str, str]] = []
    weak_seen: set[str] = set()
    for key, raw in meta:
        if not isinstance(key, str) or not KEY_SHAPE.fullmatch(key):
            raise ValueError(f"meta key {key!r} must match [A-Za-z][A-Za-z0-9_-]*")
        norm = normalize_key(key)
        if norm in WEAK_ALIASES:
            if norm in weak_seen:
                raise ValueError(f"meta key {key!r} may appear only once")
            weak_seen.add(norm)
        elif norm in own:
            raise ValueError(f"meta key {key!r} names a {type_name} field; set the field")
        value = clean_value(str(raw))
        if value:
            pairs.append((key, value))
    return tuple(pairs)


_CONSTRUCTORS: dict[type[BaseModel], Callable[[dict[str, Any]], Any]] = {}
_new_object = object.__new__
_set_attribute = object.__setattr__
# BaseModel's own slots, set directly (what pydantic's model_construct sets, minus the work).
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def checked_constructor(cls: type[_M]) -> Callable[[dict[str, Any]], _M]:
    """The function behind `MessageBase.from_checked` for one class (see there)."""
    construct = _CONSTRUCTORS.get(cls)
    if construct is not None:
        return construct
    # Every field in declaration order; required ones are always in ``values``.
    defaults = {
        name: None if info.is_required() else info.get_default(call_default_factory=True)
        for name, info in cls.model_fields.items()
    }

    def construct_checked(values: dict[str, Any]) -> _M:
        obj = _new_object(cls)  # BaseModel has no __new__ of its own
        _set_attribute(obj, "__dict__", {**defaults, **values})
        _set_fields_set(obj, set(values))
        _set_extra(obj, None)
        _set_private(obj, None)
        return obj

    _CONSTRUCTORS[cls] = construct_checked
    return construct_checked


_M = TypeVar("_M", bound=BaseModel)


def addresses_everyone(to: str) -> bool:
    """Whether a message to ``to`` (its recipient, without the ``@``) is for every agent
    (``@all``): ``is_broadcast`` of a message, for code that has the name already."""
    return to.lower() == "all"


class MessageBase(BaseModel):
    """Fields every message type carries."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    to: str
    sender: str = Field(alias="from")
    request_id: str
    depth: Depth = Field(default_factory=Depth)
    context: str | None = None
    trace_id: str | None = None
    version: str = DEFAULT_VERSION
    key_id: str | None = None
    signature: str | None = None
    # Unknown fields in their original order and spelling, written back unchanged.
    meta: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _clean_values(cls, data: Any) -> Any:
        """Trim text values (empty means absent) and check meta against the type."""
        if not isinstance(data, dict):
            return data
        cleaned = dict(data)
        for name, value in data.items():
            if name in TEXT_FIELDS and isinstance(value, str):
                cleaned[name] = clean_value(value) or None
        type_field = cls.model_fields.get("type")
        if type_field is not None and "meta" in cleaned:
            cleaned["meta"] = _clean_meta(str(type_field.default), cleaned["meta"])
        return cleaned

    @field_validator("to", "sender")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_name(value)

    @field_validator("request_id")
    @classmethod
    def _valid_request_id(cls, value: str) -> str:
        return check_request_id(value)

    @field_validator("trace_id", "key_id", "signature")
    @classmethod
    def _valid_token(cls, value: str | None) -> str | None:
        return None if value is None else check_token(value, "this value")

    @field_validator("version")
    @classmethod
    def _valid_version(cls, value: str) -> str:
        return check_token(value, "a Protocol-Version", VERSION_MAX_LEN)

    @classmethod
    def from_checked(cls, values: dict[str, Any]) -> Self:
        """Build a message from values that already passed every check of this model.

        The parser checks each value with the same functions the validators use, then
        calls this to skip a second validation pass (it is several times faster). Anyone
        else should construct models normally.
        """
        return checked_constructor(cls)(values)

    @property
    def is_broadcast(self) -> bool:
        """True when addressed to every agent (``@all``)."""
        return addresses_everyone(self.to)


class Request(MessageBase):
    """Ask an agent to do a task; opens a conversation."""

    type: Literal[MessageType.REQUEST] = MessageType.REQUEST
    task: str
    priority: Priority = Priority.NORMAL
    callback: str | None = None


class Response(MessageBase):
    """Answer a conversation (or, from the requester, answer a CLARIFY)."""

    type: Literal[MessageType.RESPONSE] = MessageType.RESPONSE
    status: Status | None = None
    result: str | None = None
    next_action: str | None = None

    @model_validator(mode="after")
    def _status_or_result(self) -> Self:
        if self.status is None and self.result is None:
            raise ValueError("a RESPONSE needs a Status or a Result")
        return self


class Clarify(MessageBase):
    """Ask the requester a question before going on."""

    type: Literal[MessageType.CLARIFY] = MessageType.CLARIFY
    question: str


class Handoff(MessageBase):
    """Pass a conversation to another agent."""

    type: Literal[MessageType.HANDOFF] = MessageType.HANDOFF
    task: str
    reason: str | None = None
    callback: str | None = None
    priority: Priority = Priority.NORMAL


class Broadcast(MessageBase):
    """Announce something to every agent (or a group)."""

    type: Literal[MessageType.BROADCAST] = MessageType.BROADCAST
    message: str
    subject: str | None = None
    urgency: Priority | None = None


Message = Annotated[Request | Response | Clarify | Handoff | Broadcast, Field(discriminator="type")]
"""Any protocol message; ``message.type`` tells which."""

MESSAGE_CLASSES: dict[MessageType, type[MessageBase]] = {
    MessageType.REQUEST: Request,
    MessageType.RESPONSE: Response,
    MessageType.CLARIFY: Clarify,
    MessageType.HANDOFF: Handoff,
    MessageType.BROADCAST: Broadcast,
}

# Types that start or continue a hop chain and are refused at current == max.
DEPTH_BOUNDED_TYPES = frozenset({MessageType.REQUEST, MessageType.CLARIFY, MessageType.HANDOFF})

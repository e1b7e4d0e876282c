"""Builders for the five message types, reply helpers, and the depth rule (section 5).

Every builder returns a validated model or raises `BuildError` (a ``ValueError``) whose
text says what to change. Building a REQUEST, CLARIFY or HANDOFF at ``current == max``
raises `DepthLimitError`: at the limit only a RESPONSE may be sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import ValidationError

from protocol.errors import BuildError, DepthLimitError
from protocol.ids import new_request_id, new_trace_id
from protocol.models import (
    DEPTH_BOUNDED_TYPES,
    Broadcast,
    Clarify,
    Depth,
    Handoff,
    Message,
    MessageBase,
    MessageType,
    Priority,
    Request,
    Response,
    Status,
)
from protocol.values import parse_depth, parse_priority, parse_status

MetaArg = Iterable[tuple[str, str]]
DepthArg = Depth | str | None
_M = TypeVar("_M", bound=MessageBase)


def is_depth_violation(msg: Message | MessageBase) -> bool:
    """True for a REQUEST, CLARIFY or HANDOFF at ``current == max`` (a gateway drops these)."""
    return getattr(msg, "type", None) in DEPTH_BOUNDED_TYPES and msg.depth.at_limit


def check_depth_for_send(msg: Message | MessageBase) -> None:
    """Raise `DepthLimitError` when ``msg`` may not be sent because its depth is used up."""
    if is_depth_violation(msg):
        raise DepthLimitError(
            f"depth {msg.depth} is at its limit: a {getattr(msg, 'type').value} can not be "  # noqa: B009
            "sent there, only a RESPONSE (answer the conversation instead)"
        )


def _make(cls: type[_M], values: dict[str, Any]) -> _M:
    """Validate ``values`` into ``cls``; problems become one readable `BuildError`."""
    try:
        if isinstance(values.get("depth"), str):
            values["depth"] = parse_depth(values["depth"])
        elif values.get("depth") is None:
            values.pop("depth", None)
        to = values.get("to")
        if isinstance(to, str) and to.startswith("@"):
            values["to"] = to[1:]
        values["meta"] = tuple(values.get("meta", ()))
        msg = cls(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or cls.__name__.lower()}: "
            f"{error['msg']}"
            for error in exc.errors()
        )
        raise BuildError(f"can not build a {cls.__name__.upper()}: {problems}") from None
    except ValueError as exc:
        raise BuildError(f"can not build a {cls.__name__.upper()}: {exc}") from None
    check_depth_for_send(msg)
    return msg


def _conversation_id(request_id: str | None, kind: str) -> str:
    if request_id is None:
        raise BuildError(
            f"a {kind} belongs to a conversation: pass request_id= (the RequestId it "
            "answers), or build it from the message with reply_response, reply_clarify or "
            "reply_handoff"
        )
    return request_id


def _priority(value: str | Priority) -> Priority:
    try:
        return parse_priority(value)
    except ValueError as exc:
        raise BuildError(str(exc)) from None


def build_request(
    *,
    sender: str,
    to: str,
    task: str,
    context: str | None = None,
    priority: str | Priority = "normal",
    callback: str | None = None,
    request_id: str | None = None,
    trace_id: str | None = None,
    depth: DepthArg = None,
    meta: MetaArg = (),
) -> Request:
    """A REQUEST opening a conversation (new RequestId and TraceId unless given)."""
    return _make(
        Request,
        {
            "sender": sender,
            "to": to,
            "task": task,
            "context": context,
            "priority": _priority(priority),
            "callback": callback,
            "request_id": request_id or new_request_id(sender),
            "trace_id": trace_id or new_trace_id(),
            "depth": depth,
            "meta": meta,
        },
    )


def build_response(
    *,
    sender: str,
    to: str,
    request_id: str | None = None,
    status: str | Status | None = None,
    result: str | None = None,
    next_action: str | None = None,
    context: str | None = None,
    trace_id: str | None = None,
    depth: DepthArg = None,
    meta: MetaArg = (),
) -> Response:
    """A RESPONSE in conversation ``request_id``; needs a status (aliases accepted) or a result."""
    try:
        parsed_status = None if status is None else parse_status(status)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    return _make(
        Response,
        {
            "sender": sender,
            "to": to,
            "request_id": _conversation_id(request_id, "RESPONSE"),
            "status": parsed_status,
            "result": result,
            "next_action": next_action,
            "context": context,
            "trace_id": trace_id,
            "depth": depth,
            "meta": meta,
        },
    )


def build_clarify(
    *,
    sender: str,
    to: str,
    question: str,
    request_id: str | None = None,
    context: str | None = None,
    trace_id: str | None = None,
    depth: DepthArg = None,
    meta: MetaArg = (),
) -> Clarify:
    """A CLARIFY asking the requester of conversation ``request_id`` a question."""
    return _make(
        Clarify,
        {
            "sender": sender,
            "to": to,
            "question": question,
            "request_id": _conversation_id(request_id, "CLARIFY"),
            "context": context,
            "trace_id": trace_id,
            "depth": depth,
            "meta": meta,
        },
    )


def build_handoff(
    *,
    sender: str,
    to: str,
    task: str,
    request_id: str | None = None,
    reason: str | None = None,
    context: str | None = None,
    callback: str | None = None,
    priority: str | Priority = "normal",
    trace_id: str | None = None,
    depth: DepthArg = None,
    meta: MetaArg = (),
) -> Handoff:
    """A HANDOFF passing conversation ``request_id`` to agent ``to``."""
    return _make(
        Handoff,
        {
            "sender": sender,
            "to": to,
            "task": task,
            "request_id": _conversation_id(request_id, "HANDOFF"),
            "reason": reason,
            "context": context,
            "callback": callback,
            "priority": _priority(priority),
            "trace_id": trace_id,
            "depth": depth,
            "meta": meta,
        },
    )


def build_broadcast(
    *,
    sender: str,
    message: str,
    to: str = "all",
    subject: str | None = None,
    urgency: str | Priority | None = None,
    context: str | None = None,
    request_id: str | None = None,
    trace_id: str | None = None,
    depth: DepthArg = None,
    meta: MetaArg = (),
) -> Broadcast:
    """A BROADCAST to ``@all`` (or a group); new RequestId and TraceId unless given."""
    return _make(
        Broadcast,
        {
            "sender": sender,
            "to": to,
            "message": message,
            "subject": subject,
            "urgency": None if urgency is None else _priority(urgency),
            "context": context,
            "request_id": request_id or new_request_id(sender),
            "trace_id": trace_id or new_trace_id(),
            "depth": depth,
            "meta": meta,
        },
    )


def _inherited_priority(msg: Message | MessageBase) -> Priority:
    priority = getattr(msg, "priority", None)
    return priority if isinstance(priority, Priority) else Priority.NORMAL


def _reply_depth(to_msg: Message | MessageBase, reply_type: MessageType) -> Depth:
    """``current + 1`` with the same max; a RESPONSE to a message at the limit stays there."""
    depth = to_msg.depth
    if depth.current < depth.max:
        return depth.next()
    if reply_type is MessageType.RESPONSE:
        return depth
    raise DepthLimitError(f"depth {depth} is at its limit: only a RESPONSE may answer this message")


def reply_response(
    to_msg: Message | MessageBase,
    *,
    sender: str,
    status: str | Status | None = None,
    result: str | None = None,
    next_action: str | None = None,
) -> Response:
    """Answer ``to_msg`` with a RESPONSE to its sender, in the same conversation and trace."""
    return build_response(
        sender=sender,
        to=to_msg.sender,
        request_id=to_msg.request_id,
        status=status,
        result=result,
        next_action=next_action,
        trace_id=to_msg.trace_id,
        depth=_reply_depth(to_msg, MessageType.RESPONSE),
    )


def answer_clarify(clarify_msg: Message | MessageBase, *, sender: str, result: str) -> Response:
    """The requester's answer to a CLARIFY: a RESPONSE with a Result and no Status."""
    return reply_response(clarify_msg, sender=sender, result=result)


def reply_clarify(to_msg: Message | MessageBase, *, sender: str, question: str) -> Clarify:
    """Ask the sender of ``to_msg`` a question (CLARIFY) in the same conversation."""
    return build_clarify(
        sender=sender,
        to=to_msg.sender,
        question=question,
        request_id=to_msg.request_id,
        trace_id=to_msg.trace_id,
        depth=_reply_depth(to_msg, MessageType.CLARIFY),
    )


def reply_handoff(
    to_msg: Message | MessageBase,
    *,
    sender: str,
    to: str,
    task: str,
    reason: str | None = None,
) -> Handoff:
    """Pass the conversation of ``to_msg`` to agent ``to`` (keeps priority and callback)."""
    return build_handoff(
        sender=sender,
        to=to,
        task=task,
        reason=reason,
        request_id=to_msg.request_id,
        priority=_inherited_priority(to_msg),
        callback=getattr(to_msg, "callback", None),
        trace_id=to_msg.trace_id,
        depth=_reply_depth(to_msg, MessageType.HANDOFF),
    )


def sub_request(
    parent: Message | MessageBase,
    *,
    sender: str,
    to: str,
    task: str,
    context: str | None = None,
    priority: str | Priority | None = None,
    callback: str | None = None,
    meta: MetaArg = (),
) -> Request:
    """A REQUEST made while serving ``parent``: new RequestId, same TraceId, depth + 1.

    Priority defaults to the parent's. A parent without a TraceId starts a new trace.
    """
    return build_request(
        sender=sender,
        to=to,
        task=task,
        context=context,
        priority=priority if priority is not None else _inherited_priority(parent),
        callback=callback,
        trace_id=parent.trace_id,
        depth=_reply_depth(parent, MessageType.REQUEST),
        meta=meta,
    )

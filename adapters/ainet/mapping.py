"""How plain AINET messages and bot-protocol messages map onto each other (pure functions).

Inbound, a plain AINET message (no bot-protocol block in its Content) either opens a
conversation or continues one:

- **Opening**: BROADCAST -> a protocol BROADCAST; PRIVATE -> a REQUEST to the agent named
  by a leading ``@Name`` in the content, else to ``default_recipient``; TASK -> the same,
  or a BROADCAST when neither names anyone. The RequestId is generated.
- **Continuing** (a turn in a conversation the gateway knows, or a response file to the
  bridge's request), by the sender's place in it and the file's 【Status】:

  ======================  ==============  ======================================
  sender                  conversation    message
  ======================  ==============  ======================================
  assignee                open/handed off DONE: RESPONSE done; PENDING: CLARIFY
                                          (RESPONSE partial at the depth limit)
  assignee                clarifying      DONE: RESPONSE done; PENDING: refused
  requester               clarifying      the answer (RESPONSE without Status)
  requester               open/handed off DONE: RESPONSE done; PENDING: refused
  anyone                  a BROADCAST     a new REQUEST to the broadcaster
  anyone                  closed          DONE: nothing (a closing thank-you);
                                          PENDING: refused
  ======================  ==============  ======================================

Outbound, a protocol message becomes one AINET message from the bridge: 【Status】 DONE
for a RESPONSE carrying a Status (it closes the conversation), PENDING otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from adapters.ainet.message import AinetMessage, AinetStatus, AinetType
from adapters.ainet.workspace import SlotKind
from protocol import (
    BuildError,
    Depth,
    Message,
    MessageType,
    Status,
    build_broadcast,
    build_clarify,
    build_request,
    build_response,
    check_name,
    name_key,
)

_MENTION = re.compile(r"\s*@(\S+)[ \t]*\n?")
_JOIN = re.compile(r"\s*AI Agent \S+ has joined AINET\b")


@dataclass(frozen=True)
class Refusal:
    """The file can't become a protocol message; ``reason`` goes back in an error reply."""

    reason: str


@dataclass(frozen=True)
class Settled:
    """Nothing to hand to the gateway (a thank-you on a closed conversation); record it."""

    reason: str


Outcome = Message | Refusal | Settled


@dataclass(frozen=True)
class ConvView:
    """What the mapping needs to know of a conversation the gateway tracks."""

    request_id: str
    trace_id: str | None
    kind: str
    requester: str
    assignee: str
    status: str
    depth_current: int
    depth_max: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConvView:
        """From the gateway's JSON-ready conversation (``GatewaySink.conversation``)."""
        return cls(str(data["request_id"]), data.get("trace_id"), str(data["kind"]),
                   str(data["requester"]), str(data["assignee"]), str(data["status"]),
                   int(data["depth_current"]), int(data["depth_max"]))

    @property
    def closed(self) -> bool:
        """True once the conversation takes no more messages."""
        return self.status not in ("open", "clarifying", "handed_off")

    def next_depth(self) -> Depth:
        """The depth of the next message (a RESPONSE at the limit stays there)."""
        return Depth(current=min(self.depth_current + 1, self.depth_max), max=self.depth_max)


def is_join(msg: AinetMessage) -> bool:
    """True for an agent's join announcement (``AI Agent <id> has joined AINET...``)."""
    return msg.type is AinetType.BROADCAST and _JOIN.match(msg.content) is not None


def mention(content: str) -> tuple[str | None, str]:
    """A leading ``@Name`` (a valid agent name) and the content without it."""
    match = _MENTION.match(content)
    if match is None:
        return None, content
    try:
        return check_name(match.group(1)), content[match.end():]
    except ValueError:
        return None, content


def _built(build: Any, **fields: Any) -> Message | Refusal:
    try:
        message: Message = build(**fields)
    except BuildError as exc:
        return Refusal(str(exc))
    return message


def opening(msg: AinetMessage, sender: str, default_recipient: str | None, *,
            request_id: str | None = None, trace_id: str | None = None,
            context: str | None = None, recipient: str | None = None) -> Message | Refusal:
    """The protocol message a plain AINET message opening a conversation becomes."""
    named, task = mention(msg.content)
    target = recipient or named or default_recipient
    if not task.strip():
        return Refusal("the message has no content to pass on")
    if msg.type is AinetType.BROADCAST or (msg.type is AinetType.TASK and target is None):
        return _built(build_broadcast, sender=sender, message=task, context=context,
                      request_id=request_id, trace_id=trace_id)
    if target is None:
        return Refusal("it names no agent: start the content with @Name (the bot-protocol "
                       "agent it is for), or ask the operator to set default_recipient")
    return _built(build_request, sender=sender, to=target, task=task, context=context,
                  request_id=request_id, trace_id=trace_id)


def follow_up(msg: AinetMessage, sender: str, conv: ConvView, *, fresh_id: str) -> Outcome:
    """The protocol message a plain turn of a known conversation becomes (table above).

    ``fresh_id`` is the RequestId of the conversation a reply to a BROADCAST opens.
    """
    done = msg.status is AinetStatus.DONE
    who = name_key(sender)
    if conv.kind.upper() == MessageType.BROADCAST:
        return opening(msg, sender, None, recipient=conv.requester, request_id=fresh_id,
                       trace_id=conv.trace_id, context=f"reply to BROADCAST {conv.request_id}")
    if conv.closed:
        if done:
            return Settled(f"conversation {conv.request_id} is already {conv.status}")
        return Refusal(f"conversation {conv.request_id} is closed ({conv.status}); start a "
                       "new conversation for a new question")
    common: dict[str, Any] = {"sender": sender, "request_id": conv.request_id,
                              "trace_id": conv.trace_id, "depth": conv.next_depth()}
    if who == name_key(conv.assignee):
        if done:
            return _built(build_response, to=conv.requester, status=Status.DONE,
                          result=msg.content, **common)
        if conv.status == "clarifying":
            return Refusal(f"@{conv.requester} has not answered your question yet; write "
                           "【Status】DONE to answer the request instead")
        if conv.depth_current + 1 >= conv.depth_max:
            return _built(build_response, to=conv.requester, status=Status.PARTIAL,
                          result=msg.content, **common)
        return _built(build_clarify, to=conv.requester, question=msg.content, **common)
    if who == name_key(conv.requester):
        if conv.status == "clarifying":
            return _built(build_response, to=conv.assignee, result=msg.content, **common)
        if done:
            return _built(build_response, to=conv.assignee, status=Status.DONE,
                          result=msg.content, **common)
        return Refusal(f"@{conv.assignee} owes the reply in conversation {conv.request_id}; "
                       "write 【Status】DONE to close it yourself")
    return Refusal(f"you are not a party of conversation {conv.request_id}")


def closes(message: Message | None) -> bool:
    """True for a message that ends its conversation (a RESPONSE carrying a Status)."""
    return (message is not None and message.type is MessageType.RESPONSE
            and getattr(message, "status", None) is not None)


def status_of(message: Message | None) -> AinetStatus:
    """The 【Status】 an outbound message carries."""
    return AinetStatus.DONE if closes(message) else AinetStatus.PENDING


def slot_kind(message: Message | None) -> SlotKind:
    """The single-exchange file kind: a question or task is a request, a reply a response."""
    if message is None:
        return SlotKind.RESPONSE
    if message.is_broadcast:
        return SlotKind.BROADCAST
    if message.type in (MessageType.REQUEST, MessageType.HANDOFF):
        return SlotKind.REQUEST
    return SlotKind.RESPONSE

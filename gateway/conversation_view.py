"""What every view of a conversation shows the same way: who each event went to, and
the JSON form (``GET /v1/conversations/{id}``, ``bpgw show --json``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from state.records import Conversation, Event


def event_to(conv: Conversation, event: Event) -> str:
    """Who an event went to ("" when nobody is known). An operator's CANCEL tells both
    parties and the gateway's own CLOSE the requester; the store records no recipient
    for either."""
    if event.to:
        return event.to
    if event.type == "CANCEL":
        parties = dict.fromkeys((conv.requester, conv.assignee))  # one name when the same
        return ", ".join(parties)
    return conv.requester if event.type == "CLOSE" else ""


def conversation_to_dict(conv: Conversation) -> dict[str, Any]:
    """JSON-ready form of a conversation (enums as strings, history as a list, each
    event's ``to`` as the text views show it)."""
    data = dataclasses.asdict(conv)
    data["status"] = str(conv.status)
    data["owes_reply"] = None if conv.is_terminal else conv.owes_reply
    for event, row in zip(conv.history, data["history"], strict=True):
        row["to"] = event_to(conv, event)
    return data

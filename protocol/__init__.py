"""bot-protocol core: parse, render, build, sign and fingerprint protocol messages.

See docs/protocol.md and the wire-format contract. Platform rendering lives elsewhere.
"""

from __future__ import annotations

from protocol.build import (
    answer_clarify,
    build_broadcast,
    build_clarify,
    build_handoff,
    build_request,
    build_response,
    check_depth_for_send,
    is_depth_violation,
    reply_clarify,
    reply_handoff,
    reply_response,
    sub_request,
)
from protocol.errors import ERROR_CODES, BuildError, DepthLimitError, ParseError
from protocol.fingerprint import fingerprint, fingerprint_and_render
from protocol.ids import new_request_id, new_trace_id
from protocol.jsonview import exit_status, message_to_dict, result_to_dict
from protocol.models import (
    DEPTH_BOUNDED_TYPES,
    MESSAGE_CLASSES,
    STATUS_ALIASES,
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
    addresses_everyone,
    check_request_id,
)
from protocol.names import check_name, name_key, skeleton
from protocol.parser import DEFAULT_MAX_BLOCK_BYTES, ParseResult, parse
from protocol.render import render, render_body
from protocol.signing import (
    canonical_bytes,
    generate_keypair,
    load_private_key,
    load_public_key,
    public_key_id,
    sign,
    signature_problem,
    verify,
)
from protocol.values import parse_depth, parse_priority, parse_status

__all__ = [
    "DEFAULT_MAX_BLOCK_BYTES",
    "DEPTH_BOUNDED_TYPES",
    "ERROR_CODES",
    "MESSAGE_CLASSES",
    "STATUS_ALIASES",
    "Broadcast",
    "BuildError",
    "Clarify",
    "Depth",
    "DepthLimitError",
    "Handoff",
    "Message",
    "MessageBase",
    "MessageType",
    "ParseError",
    "ParseResult",
    "Priority",
    "Request",
    "Response",
    "Status",
    "addresses_everyone",
    "answer_clarify",
    "build_broadcast",
    "build_clarify",
    "build_handoff",
    "build_request",
    "build_response",
    "canonical_bytes",
    "check_depth_for_send",
    "check_name",
    "check_request_id",
    "exit_status",
    "fingerprint",
    "fingerprint_and_render",
    "generate_keypair",
    "is_depth_violation",
    "load_private_key",
    "load_public_key",
    "message_to_dict",
    "name_key",
    "new_request_id",
    "new_trace_id",
    "parse",
    "parse_depth",
    "parse_priority",
    "parse_status",
    "public_key_id",
    "render",
    "render_body",
    "reply_clarify",
    "reply_handoff",
    "reply_response",
    "result_to_dict",
    "sign",
    "signature_problem",
    "skeleton",
    "sub_request",
    "verify",
]

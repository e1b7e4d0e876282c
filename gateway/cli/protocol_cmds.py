"""``bpgw parse``, ``build``, ``keygen``, ``sign`` and ``verify`` (wire-format.md section 6).

Exit status: 0 success; 1 ``parse`` found no protocol block; 2 any error (bad input, a
block with errors, a file that can not be read, a signature that does not verify).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol import (
    DEFAULT_MAX_BLOCK_BYTES,
    BuildError,
    Message,
    MessageType,
    ParseResult,
    Response,
    build_broadcast,
    build_clarify,
    build_handoff,
    build_request,
    build_response,
    exit_status,
    generate_keypair,
    load_private_key,
    load_public_key,
    message_to_dict,
    name_key,
    parse,
    render,
    reply_clarify,
    reply_handoff,
    reply_response,
    result_to_dict,
    sign,
    signature_problem,
    verify,
)

_Key = TypeVar("_Key")


class _CliError(Exception):
    """A problem to report on stderr with exit status 2."""


def _read_input(source: str | None) -> bytes:
    if source in (None, "-"):
        return sys.stdin.buffer.read()
    try:
        return Path(str(source)).read_bytes()
    except OSError as exc:
        raise _CliError(f"can not read {source}: {exc.strerror or exc}") from None


MAX_KEY_BYTES = 16 * 1024
"""A PEM Ed25519 key is a few hundred bytes; larger files are not keys."""


def _read_key(path: str) -> bytes:
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise _CliError(f"can not read key file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_KEY_BYTES:
        raise _CliError(f"{path} is larger than {MAX_KEY_BYTES} bytes: not a key file")
    return data


def _fail(command: str, problem: object) -> int:
    print(f"bpgw {command}: {problem}", file=sys.stderr)
    return 2


def _parse_input(args: argparse.Namespace) -> ParseResult:
    return parse(_read_input(args.file), max_block_bytes=args.max_block_bytes)


def _describe(msg: Message) -> str:
    data = message_to_dict(msg)
    head = f"{data.pop('type')} {data.pop('from')} → @{data.pop('to')}"
    lines = [head, f"  request_id: {data.pop('request_id')}"]
    depth = data.pop("depth")
    lines.append(f"  depth: {depth['current']}/{depth['max']}")
    meta: dict[str, Any] = data.pop("meta")
    for name, value in [*data.items(), *meta.items()]:
        text = "\n".join(value) if isinstance(value, list) else str(value)
        lines.append(f"  {name}: " + text.replace("\n", "\n    "))
    return "\n".join(lines)


def _report_errors(result: ParseResult) -> None:
    for error in result.errors:
        field = f", field {error.field}" if error.field else ""
        print(
            f"error {error.code} (block {error.block}, line {error.line}{field}): "
            f"{error.message}\n  hint: {error.hint}",
            file=sys.stderr,
        )


def _cmd_parse(args: argparse.Namespace) -> int:
    try:
        result = _parse_input(args)
    except _CliError as exc:
        return _fail("parse", exc)
    if args.json:
        print(json.dumps(result_to_dict(result), ensure_ascii=False, indent=2))
    else:
        for number, msg in enumerate(result.messages, 1):
            print(f"message {number}: {_describe(msg)}")
        _report_errors(result)
        if not result.found_block:
            print("no protocol block found")
    return exit_status(result)


# Per type: the options a block needs, and the ones it may take (wire-format.md section 2).
_BUILD_OPTIONS: dict[MessageType, tuple[tuple[str, ...], tuple[str, ...]]] = {
    MessageType.REQUEST: (
        ("to", "task"),
        ("context", "priority", "callback", "request_id", "trace_id", "depth"),
    ),
    MessageType.RESPONSE: (
        ("to", "request_id"),
        ("status", "result", "next_action", "context", "trace_id", "depth"),
    ),
    MessageType.CLARIFY: (("to", "request_id", "question"), ("context", "trace_id", "depth")),
    MessageType.HANDOFF: (
        ("to", "request_id", "task"),
        ("reason", "callback", "priority", "context", "trace_id", "depth"),
    ),
    MessageType.BROADCAST: (
        ("message",),
        ("to", "subject", "priority", "context", "request_id", "trace_id", "depth"),
    ),
}
# Help of every `bpgw build` field option; `reply` shares the ones it takes.
_OPTION_HELP = {
    "to": "recipient agent (@ optional; BROADCAST defaults to all)",
    "task": "what to do (REQUEST, HANDOFF)",
    "context": "background the recipient needs (any type)",
    "question": "what the CLARIFY asks",
    "status": "done, partial, failed or cancelled (RESPONSE; success, canceled... accepted)",
    "result": "the answer (RESPONSE; a RESPONSE needs --status or --result)",
    "message": "the announcement (BROADCAST)",
    "subject": "a short subject (BROADCAST)",
    "reason": "why the work is handed on (HANDOFF)",
    "callback": "where the result should go (REQUEST, HANDOFF)",
    "request_id": "RequestId: the conversation a RESPONSE, CLARIFY or HANDOFF belongs to "
    "(REQUEST and BROADCAST: a new one unless given)",
    "trace_id": "TraceId shared by every hop of one task (default: a new one on REQUEST "
    "and BROADCAST)",
    "next_action": "what the recipient should do next (RESPONSE)",
    "depth": "current/max, e.g. 2/5 (default 1/5)",
    "priority": "low, normal, high or critical (REQUEST, HANDOFF; urgency on BROADCAST)",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _and(flags: list[str]) -> str:
    return flags[0] if len(flags) == 1 else ", ".join(flags[:-1]) + " and " + flags[-1]


def _build_problem(kind: MessageType, args: argparse.Namespace) -> str | None:
    """The options missing or out of place for a ``kind`` block, in one sentence."""
    required, optional = _BUILD_OPTIONS[kind]
    missing = [_flag(name) for name in required if getattr(args, name) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        hint = (" (the RequestId of the conversation it belongs to; `bpgw reply FILE` builds "
                "the whole reply from the message you answer)"
                if "--request-id" in missing else "")
        return f"{_and(missing)} {verb} required for a {kind.value}{hint}"
    stray = [_flag(n) for n in _OPTION_HELP if n not in required + optional
             and getattr(args, n) is not None]
    if stray:
        takes = _and([_flag(n) for n in required + optional])
        verb = "does" if len(stray) == 1 else "do"
        return f"{_and(stray)} {verb} not apply to a {kind.value} (it takes {takes})"
    if kind is MessageType.RESPONSE and args.status is None and args.result is None:
        return "a RESPONSE needs --status or --result (or both)"
    return None


def _cmd_build(args: argparse.Namespace) -> int:
    kind = MessageType(args.type)
    problem = _build_problem(kind, args)
    if problem is not None:
        return _fail(f"build {kind.value}", problem)
    common: dict[str, Any] = {
        "sender": args.sender,
        "context": args.context,
        "trace_id": args.trace_id,
        "depth": args.depth,
        "meta": [],
    }
    try:
        msg: Message
        if kind is MessageType.REQUEST:
            msg = build_request(
                to=args.to,
                task=args.task,
                priority=args.priority or "normal",
                callback=args.callback,
                request_id=args.request_id,
                **common,
            )
        elif kind is MessageType.RESPONSE:
            msg = build_response(
                to=args.to,
                request_id=args.request_id,
                status=args.status,
                result=args.result,
                next_action=args.next_action,
                **common,
            )
        elif kind is MessageType.CLARIFY:
            msg = build_clarify(
                to=args.to, request_id=args.request_id, question=args.question, **common
            )
        elif kind is MessageType.HANDOFF:
            msg = build_handoff(
                to=args.to,
                request_id=args.request_id,
                task=args.task,
                reason=args.reason,
                callback=args.callback,
                priority=args.priority or "normal",
                **common,
            )
        else:
            msg = build_broadcast(
                to=args.to or "all",
                message=args.message,
                subject=args.subject,
                urgency=args.priority,
                request_id=args.request_id,
                **common,
            )
    except BuildError as exc:
        return _fail("build", exc)
    print(render(msg))
    return 0


def _replied_message(args: argparse.Namespace) -> Message:
    """The one message of the input that ``reply`` answers."""
    result = _parse_input(args)
    if result.errors:
        _report_errors(result)
        raise _CliError("the input has protocol errors (above): reply to a valid message")
    messages = result.messages
    if not messages:
        raise _CliError("no protocol message in the input to reply to")
    if args.block is None:
        if len(messages) > 1:
            raise _CliError(
                f"the input holds {len(messages)} protocol messages: choose one with --block N"
            )
        return messages[0]
    block = int(args.block)
    if not 1 <= block <= len(messages):
        raise _CliError(f"--block {block}: the input holds {len(messages)} message(s)")
    return messages[block - 1]


def _reply_to(msg: Message, args: argparse.Namespace) -> Message:
    """The reply ``args`` ask for: From/To swapped, same RequestId and TraceId, depth + 1."""
    if msg.type is MessageType.BROADCAST:
        raise _CliError("a BROADCAST takes no reply: to ask its sender something, "
                        "send a REQUEST (bpgw build REQUEST)")
    if isinstance(msg, Response) and msg.status is not None:
        raise _CliError(f"this RESPONSE (Status: {msg.status}) ended conversation "
                        f"{msg.request_id}: open a new one with bpgw build REQUEST")
    sender = args.sender or msg.to
    if args.sender is None and name_key(msg.to) == "all":
        raise _CliError("the message went to @all: say who replies with --from NAME")
    answer = [_flag(n) for n in ("status", "result", "next_action") if getattr(args, n)]
    if args.question is not None or args.handoff_to is not None:
        chosen = [f for f, v in (("--question", args.question),
                                 ("--handoff-to", args.handoff_to)) if v is not None]
        if len(chosen) > 1 or answer:
            raise _CliError(f"{_and(chosen + answer)} make different replies: give one kind")
    if args.question is not None:
        return reply_clarify(msg, sender=sender, question=args.question)
    if args.handoff_to is not None:
        if args.task is None:
            raise _CliError("--task is required with --handoff-to (what the new holder does)")
        return reply_handoff(msg, sender=sender, to=args.handoff_to, task=args.task,
                             reason=args.reason)
    if args.task is not None or args.reason is not None:
        raise _CliError("--task and --reason go with --handoff-to NAME")
    if args.status is None and args.result is None:
        raise _CliError("say what the reply is: --status and/or --result (a RESPONSE), "
                        "--question (a CLARIFY) or --handoff-to NAME --task (a HANDOFF)")
    return reply_response(msg, sender=sender, status=args.status, result=args.result,
                          next_action=args.next_action)


def _cmd_reply(args: argparse.Namespace) -> int:
    try:
        reply = _reply_to(_replied_message(args), args)
    except (_CliError, BuildError) as exc:
        return _fail("reply", exc)
    print(render(reply))
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    private_path, public_path = directory / f"{args.name}.key", directory / f"{args.name}.pub"
    private_pem, public_pem = generate_keypair()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.force else os.O_EXCL)
        descriptor = os.open(private_path, flags, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(private_pem)
        os.chmod(private_path, 0o600)
        public_path.write_bytes(public_pem)
    except FileExistsError:
        return _fail("keygen", f"{private_path} exists; pass --force to replace it")
    except OSError as exc:
        return _fail("keygen", f"can not write keys in {directory}: {exc.strerror or exc}")
    print(f"wrote {private_path} (private, mode 0600) and {public_path}")
    return 0


def _load_key_and_input(
    args: argparse.Namespace, command: str, key_path: str, loader: Callable[[bytes], _Key]
) -> tuple[_Key, ParseResult] | int:
    """The key file and the parsed input of ``sign``/``verify``, or the exit status."""
    try:
        return loader(_read_key(key_path)), _parse_input(args)
    except (_CliError, ValueError) as exc:
        return _fail(command, exc)


def _cmd_sign(args: argparse.Namespace) -> int:
    loaded = _load_key_and_input(args, "sign", args.key, load_private_key)
    if isinstance(loaded, int):
        return loaded
    key, result = loaded
    if result.errors:
        _report_errors(result)
        return 2
    if not result.messages:
        return _fail("sign", "no protocol message in the input")
    print("\n".join(render(sign(msg, key, key_id=args.key_id)) for msg in result.messages))
    return 0


MAX_KEY_FILES = 1000
"""Most ``*.pub`` files ``verify --keys DIR`` reads."""


def _keys_by_agent(folder: str) -> dict[str, tuple[str, Ed25519PublicKey]]:
    """``--keys DIR``: canonical agent name -> (file name, key) of each ``NAME.pub``."""
    try:
        paths = sorted(p for p in Path(folder).iterdir() if p.suffix == ".pub")
    except OSError as exc:
        raise _CliError(f"can not read key folder {folder}: {exc.strerror or exc}") from None
    if len(paths) > MAX_KEY_FILES:
        raise _CliError(f"{folder} holds more than {MAX_KEY_FILES} .pub files")
    keys: dict[str, tuple[str, Ed25519PublicKey]] = {}
    for path in paths:
        try:
            keys[name_key(path.stem)] = (path.name, load_public_key(_read_key(str(path))))
        except ValueError as exc:
            raise _CliError(f"{path}: {exc}") from None
    return keys


def _verdict(msg: Message, key: Ed25519PublicKey | None,
             others: dict[str, tuple[str, Ed25519PublicKey]]) -> str | None:
    """None when ``msg`` verifies with ``key``; else why not. ``others`` (the --keys
    folder) names the agent whose key did sign it, if any."""
    if key is None:
        if not msg.signature:
            return "not signed (no Signature field)"
        return f"unknown agent {msg.sender}: no key for it ({msg.sender}.pub)"
    problem = signature_problem(msg, key)
    if problem is None or not msg.signature:
        return problem
    for file, other in others.values():
        if other is not key and verify(msg, other):
            return f"wrong key: signed with the key in {file}, not {msg.sender}'s"
    return problem


def _cmd_verify(args: argparse.Namespace) -> int:
    try:
        result = _parse_input(args)
        keys = _keys_by_agent(args.keys) if args.keys else {}
        single = load_public_key(_read_key(args.pubkey)) if args.pubkey else None
    except (_CliError, ValueError) as exc:
        return _fail("verify", exc)
    _report_errors(result)
    all_valid = bool(result.messages) and not result.errors
    for number, msg in enumerate(result.messages, 1):
        key = single if single is not None else keys.get(name_key(msg.sender), (None, None))[1]
        problem = _verdict(msg, key, keys)
        all_valid = all_valid and problem is None
        verdict = "ok" if problem is None else "FAILED"
        print(
            f"message {number}: {verdict}: {msg.type.value} {msg.request_id} from {msg.sender} "
            f"(KeyId {msg.key_id or '-'})" + ("" if problem is None else f": {problem}")
        )
    if not result.messages:
        print("no protocol message to verify", file=sys.stderr)
    return 0 if all_valid else 2


def _input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", metavar="FILE", help="input (- = stdin)")
    parser.add_argument(
        "--max-block-bytes",
        type=int,
        default=DEFAULT_MAX_BLOCK_BYTES,
        metavar="N",
        help=f"largest block accepted (default {DEFAULT_MAX_BLOCK_BYTES})",
    )


def register(sub: Any) -> None:
    """Add ``parse``, ``build``, ``keygen``, ``sign`` and ``verify`` to the parser."""
    cmd = sub.add_parser("parse", help="read protocol blocks from chat text")
    _input_arguments(cmd)
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.set_defaults(handler=_cmd_parse)

    cmd = sub.add_parser(
        "build",
        help="print a protocol block",
        description="Print one protocol block. Each type needs its own options: REQUEST "
        "--to --task; RESPONSE --to --request-id and --status or --result; CLARIFY --to "
        "--request-id --question; HANDOFF --to --request-id --task; BROADCAST --message. "
        "To answer a message you received, `bpgw reply` fills in To, RequestId, TraceId "
        "and Depth from it.",
    )
    cmd.add_argument("type", type=str.upper, choices=[t.value for t in MessageType],
                     help="message type (any case)")
    cmd.add_argument("--from", dest="sender", required=True, help="the sending agent's name")
    for name, text in _OPTION_HELP.items():
        cmd.add_argument(_flag(name), dest=name, help=text)
    cmd.set_defaults(handler=_cmd_build)

    cmd = sub.add_parser(
        "reply",
        help="print the reply to a protocol message (From/To swapped, same RequestId)",
        description="Print the reply to the protocol message in FILE: From and To swapped, "
        "the same RequestId and TraceId, Depth one further. A RESPONSE (--status and/or "
        "--result; --result alone answers a CLARIFY), a CLARIFY (--question) or a HANDOFF "
        "(--handoff-to NAME --task).",
    )
    _input_arguments(cmd)
    cmd.add_argument("--from", dest="sender",
                     help="who replies (default: the message's recipient)")
    for name in ("status", "result", "next_action", "question"):
        cmd.add_argument(_flag(name), dest=name, help=_OPTION_HELP[name])
    cmd.add_argument("--handoff-to", metavar="NAME", help="hand the conversation to NAME")
    cmd.add_argument("--task", help="what the new holder does (with --handoff-to)")
    cmd.add_argument("--reason", help=_OPTION_HELP["reason"])
    cmd.add_argument("--block", type=int, metavar="N",
                     help="which protocol message of the input to answer (1 = first; "
                     "needed when it holds several)")
    cmd.set_defaults(handler=_cmd_reply)

    cmd = sub.add_parser("keygen", help="write an Ed25519 key pair NAME.key and NAME.pub")
    cmd.add_argument("name", help="file name stem, usually the agent's name")
    cmd.add_argument("--dir", default=".", help="folder to write the keys in (default .)")
    cmd.add_argument("--force", action="store_true", help="replace existing key files")
    cmd.set_defaults(handler=_cmd_keygen)

    cmd = sub.add_parser("sign", help="sign every protocol block of the input")
    cmd.add_argument("--key", required=True, help="private key file (PEM or base64url)")
    cmd.add_argument("--key-id", help="KeyId to write (default: from the public key)")
    _input_arguments(cmd)
    cmd.set_defaults(handler=_cmd_sign)

    cmd = sub.add_parser(
        "verify",
        help="check the signature of every protocol block",
        description="Check every block's Signature and say why one fails: not signed, "
        "wrong key, text changed after signing, or (with --keys) unknown agent. Exit "
        "status 0 only when every block verifies.",
    )
    keys = cmd.add_mutually_exclusive_group(required=True)
    keys.add_argument("--pubkey", help="public key file (PEM or base64url) for every block")
    keys.add_argument("--keys", metavar="DIR",
                      help="folder of NAME.pub files (as bpgw keygen writes them): each "
                      "block is checked with its From agent's key")
    _input_arguments(cmd)
    cmd.set_defaults(handler=_cmd_verify)

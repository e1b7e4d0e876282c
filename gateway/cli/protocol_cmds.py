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

from protocol import (
    DEFAULT_MAX_BLOCK_BYTES,
    BuildError,
    Message,
    MessageType,
    ParseResult,
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
    parse,
    render,
    result_to_dict,
    sign,
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


def _read_key(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise _CliError(f"can not read key file {path}: {exc.strerror or exc}") from None


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


def _cmd_build(args: argparse.Namespace) -> int:
    common: dict[str, Any] = {
        "sender": args.sender,
        "context": args.context,
        "trace_id": args.trace_id,
        "depth": args.depth,
        "meta": [],
    }
    kind = MessageType(args.type)
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


def _cmd_verify(args: argparse.Namespace) -> int:
    loaded = _load_key_and_input(args, "verify", args.pubkey, load_public_key)
    if isinstance(loaded, int):
        return loaded
    key, result = loaded
    _report_errors(result)
    all_valid = bool(result.messages) and not result.errors
    for number, msg in enumerate(result.messages, 1):
        valid = verify(msg, key)
        all_valid = all_valid and valid
        verdict = "ok" if valid else ("FAILED" if msg.signature else "FAILED (not signed)")
        print(
            f"message {number}: {verdict}: {msg.type.value} {msg.request_id} from {msg.sender} "
            f"(KeyId {msg.key_id or '-'})"
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

    cmd = sub.add_parser("build", help="print a protocol block")
    cmd.add_argument("type", type=str.upper, choices=[t.value for t in MessageType])
    cmd.add_argument("--from", dest="sender", required=True)
    cmd.add_argument("--to", help="recipient (BROADCAST defaults to all)")
    for option in (
        "task",
        "context",
        "question",
        "status",
        "result",
        "message",
        "subject",
        "reason",
        "callback",
        "request-id",
        "trace-id",
        "next-action",
    ):
        cmd.add_argument(f"--{option}")
    cmd.add_argument("--depth", help="current/max, e.g. 2/5 (default 1/5)")
    cmd.add_argument("--priority", help="low, normal, high, critical (urgency on BROADCAST)")
    cmd.set_defaults(handler=_cmd_build)

    cmd = sub.add_parser("keygen", help="write an Ed25519 key pair NAME.key and NAME.pub")
    cmd.add_argument("name")
    cmd.add_argument("--dir", default=".")
    cmd.add_argument("--force", action="store_true", help="replace existing key files")
    cmd.set_defaults(handler=_cmd_keygen)

    cmd = sub.add_parser("sign", help="sign every protocol block of the input")
    cmd.add_argument("--key", required=True, help="private key file (PEM or base64url)")
    cmd.add_argument("--key-id", help="KeyId to write (default: from the public key)")
    _input_arguments(cmd)
    cmd.set_defaults(handler=_cmd_sign)

    cmd = sub.add_parser("verify", help="check the signature of every protocol block")
    cmd.add_argument("--pubkey", required=True, help="public key file (PEM or base64url)")
    _input_arguments(cmd)
    cmd.set_defaults(handler=_cmd_verify)

"""NATS connections of the mq9 service and bridge: nats-py's client, cheaper header parsing.

Every message the service handles carries NATS headers (a SEND's, a stored message's as
JetStream hands it back), and nats-py 2.16 parses each header line with several decodes
and checks each name for whitespace one character at a time in Python: about a tenth of
the service's CPU. ``connect`` gives a client whose parser returns the same dict at about
half the cost (an ASCII block is decoded once, each name searched with one regular
expression). The override applies only while nats-py's parser is the one-argument static
method it replaces (``parser_replaced``); otherwise the library's own parser runs.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from nats.aio.client import Client

# For a str pattern, \s is exactly what str.isspace() accepts (the same Unicode table).
_SPACE = re.compile(r"\s")
_CRLF = b"\r\n"
_ASCII_SPACE = " \t\n\r\x0b\x0c"  # what bytes.strip() strips


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """The headers of a NATS header block (``Name: Value`` lines), as nats-py reads them:
    a line without ``:`` or whose name is not ASCII or holds whitespace is skipped, the
    value is stripped and decoded as UTF-8 (bad bytes replaced), the last of a name wins."""
    out: dict[str, str] = {}
    if raw.isascii():  # the usual block: decoded once, the same result
        for line in raw.decode("ascii").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip(_ASCII_SPACE)
                if not _SPACE.search(key):
                    out[key] = value.strip(_ASCII_SPACE)
        return out
    for raw_line in raw.split(_CRLF):
        raw_name, raw_sep, raw_value = raw_line.partition(b":")
        if not raw_sep:
            continue
        try:
            key = raw_name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if not _SPACE.search(key):
            out[key] = raw_value.strip().decode("utf-8", "replace")
    return out


def _replaceable() -> bool:
    """Whether nats-py parses header lines with the static method this module replaces."""
    found = inspect.getattr_static(Client, "_parse_header_lines", None)
    if not isinstance(found, staticmethod):
        return False
    return list(inspect.signature(found.__func__).parameters) == ["raw"]


parser_replaced = _replaceable()


class Mq9Connection(Client):
    """nats-py's client, parsing headers with ``parse_header_lines`` when it can."""

    if parser_replaced:
        _parse_header_lines = staticmethod(parse_header_lines)


async def connect(servers: str | list[str], **options: Any) -> Client:
    """Connect like ``nats.connect`` (same options), with the cheaper header parsing."""
    nc = Mq9Connection()
    await nc.connect(servers, **options)
    return nc

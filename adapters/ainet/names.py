"""AINET agent ids and the file names derived from them, validated against hostile input.

An agent id is ``<device>/<name>`` (AINET v0.3: device = ``Device-`` + host + 4 random
characters). File names use AINET's conversion rule: every ``/`` becomes ``-``.

Every string that becomes part of a path goes through ``check_component``: it refuses
``.``/``..``, separators, NUL and control characters, the characters Windows forbids
(a shared workspace is often mounted as a drive letter there) and names longer than
``COMPONENT_MAX_BYTES`` in UTF-8, so no agent id, RequestId or field can make a path
leave the workspace.
"""

from __future__ import annotations

import re
import secrets
import socket
import unicodedata
from functools import lru_cache

from protocol.names import NAME_MAX_LEN, invalid_name_reason, name_key

# A converted id appears twice in a pair file name (``A_to_B_response.txt``); 100 bytes
# each keeps that name under the common 255-byte file-name limit.
AGENT_ID_MAX_BYTES = 100
COMPONENT_MAX_BYTES = 200
_FORBIDDEN = frozenset('<>:"/\\|?*')
_SUFFIX_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
HOST_MAX_LEN = 24
# Names checked recently (the same few agent ids and RequestIds come up for every file);
# a refusal is never cached (it raises).
_CHECKED_MAX = 4096


class UnsafeNameError(ValueError):
    """A name, id or path component was refused; the message says why."""


def canonical(agent_id: str) -> str:
    """The one key agent ids compare under (the protocol's NFKC case-folded ``name_key``)."""
    return name_key(agent_id)


def _bad_char(text: str) -> str | None:
    for char in text:
        if char in _FORBIDDEN:
            return repr(char)
    # The protocol's name rule: no white space, control, format or invisible characters.
    for start in range(0, len(text), NAME_MAX_LEN):
        reason = invalid_name_reason(text[start:start + NAME_MAX_LEN])
        if reason is not None:
            return reason.removeprefix("a name may not contain ")
    return None


def check_component(text: str, what: str = "a name", max_bytes: int = COMPONENT_MAX_BYTES) -> str:
    """``text`` if it is safe as one path component inside the workspace, else raise.

    Refused: empty, ``.``/``..``, a leading/trailing dot or a leading ``-`` (an option
    to a shell tool), separators, NUL, control and format characters, white space,
    Windows-forbidden characters, more than ``max_bytes`` bytes in UTF-8.
    """
    if not isinstance(text, str) or not text:
        raise UnsafeNameError(f"{what} is empty")
    return _checked_component(text, what, max_bytes)


@lru_cache(maxsize=_CHECKED_MAX)
def _checked_component(text: str, what: str, max_bytes: int) -> str:
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise UnsafeNameError(f"{what} is longer than {max_bytes} bytes")
    if text in (".", "..") or text.startswith(".") or text.endswith("."):
        raise UnsafeNameError(f"{what} {text!r} starts or ends with a dot")
    if text.startswith("-"):
        raise UnsafeNameError(f"{what} {text!r} starts with '-'")
    bad = _bad_char(text)
    if bad is not None:
        raise UnsafeNameError(f"{what} {text!r} contains {bad}")
    return text


def check_agent_id(agent_id: str) -> str:
    """Validate an AINET agent id ``<device>/<name>``; return it NFC-normalised."""
    if not isinstance(agent_id, str):
        raise UnsafeNameError("an agent id must be text")
    return _checked_agent_id(agent_id)


@lru_cache(maxsize=_CHECKED_MAX)
def _checked_agent_id(agent_id: str) -> str:
    value = unicodedata.normalize("NFC", agent_id.strip())
    if len(value.encode("utf-8", "surrogatepass")) > AGENT_ID_MAX_BYTES:
        raise UnsafeNameError(f"agent id is longer than {AGENT_ID_MAX_BYTES} bytes")
    device, sep, name = value.partition("/")
    if not sep:
        raise UnsafeNameError(f"agent id {value!r} is not <device>/<name>")
    check_component(device, "the device part of an agent id")
    check_component(name, "the name part of an agent id")
    if value.upper() in ("BROADCAST", "TASK"):
        raise UnsafeNameError(f"agent id {value!r} is a reserved AINET address")
    return value


def file_part(agent_id: str) -> str:
    """AINET's file-name form of an agent id: ``/`` replaced by ``-`` (id validated first)."""
    return check_agent_id(agent_id).replace("/", "-")


def check_request_id(request_id: str) -> str:
    """A RequestId that can name ``tasks/task-<RequestId>/``, or raise saying why."""
    return check_component(request_id, "a RequestId", max_bytes=128)


def new_device(host: str | None = None) -> str:
    """A fresh device name: ``Device-`` + the host name's safe characters + 4 random ones."""
    raw = socket.gethostname() if host is None else host
    safe = re.sub(r"[^A-Za-z0-9]", "", raw)[:HOST_MAX_LEN] or "host"
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(4))
    return f"Device-{safe}{suffix}"


def new_agent_id(name: str, host: str | None = None) -> str:
    """A fresh agent id ``Device-<host+4 random>/<name>`` (``name`` validated)."""
    return check_agent_id(f"{new_device(host)}/{name}")

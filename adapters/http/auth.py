"""Bearer-token identities of the ``http`` transport.

Every configured token names one caller: an agent (a bot) or an operator (a human).
A presented token is looked up by its SHA-256 digest: the cost does not grow with the
number of tokens, and timing reveals neither a token nor which caller it belongs to (what
a lookup's timing could depend on is the digest, which says nothing useful about the
token; the found token is then compared in constant time). The usual header,
``Bearer <token>`` written exactly so, is first looked up as it is in a dict of those
headers: the same argument holds with Python's keyed (per-process random) string hash in
the digest's place, and the string comparison runs only once the whole hash matched.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from adapters.base import Author
from protocol.names import name_key


@dataclass(frozen=True)
class Caller:
    """Who sent an authenticated request."""

    name: str
    is_operator: bool

    @cached_property
    def author(self) -> Author:
        """The ``Author`` the gateway sees for this caller."""
        return Author(id=self.name, display_name=self.name, is_bot=not self.is_operator)

    def may_read(self, inbox_owner: str) -> bool:
        """Operators read any inbox; an agent reads only its own (names compare by
        canonical key: ``mantis`` is Mantis's inbox)."""
        return self.is_operator or name_key(inbox_owner) == name_key(self.name)


class TokenAuth:
    """Maps ``Authorization: Bearer <token>`` headers to callers."""

    def __init__(self, agents: Mapping[str, str], operators: Mapping[str, str]) -> None:
        entries = [(token, Caller(name, is_operator=False)) for name, token in agents.items()]
        entries += [(token, Caller(name, is_operator=True)) for name, token in operators.items()]
        self._by_digest: dict[bytes, tuple[bytes, Caller]] = {
            _digest(token.encode()): (token.encode(), caller) for token, caller in entries
        }
        # (A token with surrounding blanks never matches: ``bearer`` strips what it reads.)
        self._by_header = {
            f"Bearer {token}": caller for token, caller in entries if token == token.strip()
        }

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller a header authenticates, or None for a missing or unknown token."""
        if authorization is not None and (caller := self._by_header.get(authorization)):
            return caller
        presented = bearer(authorization)
        if presented is None:
            return None
        found = self._by_digest.get(_digest(presented))
        if found is None or not hmac.compare_digest(presented, found[0]):
            return None
        return found[1]


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def bearer(authorization: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


def is_loopback(host: str) -> bool:
    """True when ``host`` is a loopback address (or ``localhost``): only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class MetricsAccess:
    """Who may read ``GET /metrics``.

    With ``metrics_token`` set: that token or any operator token. Without it: everyone
    when the server listens on loopback only, else operator tokens only (the metrics
    name agents and channels).
    """

    def __init__(self, metrics_token: str | None, auth: TokenAuth, host: str) -> None:
        self._token = metrics_token.encode() if metrics_token else None
        self._auth = auth
        self.open = metrics_token is None and is_loopback(host)

    def allows(self, authorization: str | None) -> bool:
        """True when a request with this ``Authorization`` header may read the metrics."""
        if self.open:
            return True
        caller = self._auth.identify(authorization)
        if caller is not None and caller.is_operator:
            return True
        presented = bearer(authorization)
        return (
            presented is not None
            and self._token is not None
            and hmac.compare_digest(presented, self._token)
        )

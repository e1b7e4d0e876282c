"""Bearer-token identities of the ``http`` transport.

Every configured token names one caller: an agent (a bot) or an operator (a human).
Tokens are compared in constant time, and every configured token is compared on every
request, so timing reveals neither a token nor which caller it belongs to.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from adapters.base import Author
from protocol.names import name_key


@dataclass(frozen=True)
class Caller:
    """Who sent an authenticated request."""

    name: str
    is_operator: bool

    @property
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
        self._entries: list[tuple[bytes, Caller]] = [
            (token.encode(), Caller(name, is_operator=False)) for name, token in agents.items()
        ] + [(token.encode(), Caller(name, is_operator=True)) for name, token in operators.items()]

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller a header authenticates, or None for a missing or unknown token."""
        presented = bearer(authorization)
        if presented is None:
            return None
        found: Caller | None = None
        for expected, caller in self._entries:
            if hmac.compare_digest(presented, expected):
                found = caller
        return found


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

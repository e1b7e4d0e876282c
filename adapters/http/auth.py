"""Bearer-token identities of the ``http`` transport.

Every configured token names one caller: an agent (a bot) or an operator (a human).
Tokens are compared in constant time, and every configured token is compared on every
request, so timing reveals neither a token nor which caller it belongs to.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from adapters.base import Author


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
        """Operators read any inbox; an agent reads only its own."""
        return self.is_operator or inbox_owner == self.name


class TokenAuth:
    """Maps ``Authorization: Bearer <token>`` headers to callers."""

    def __init__(self, agents: Mapping[str, str], operators: Mapping[str, str]) -> None:
        self._entries: list[tuple[bytes, Caller]] = [
            (token.encode(), Caller(name, is_operator=False)) for name, token in agents.items()
        ] + [(token.encode(), Caller(name, is_operator=True)) for name, token in operators.items()]

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller a header authenticates, or None for a missing or unknown token."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = token.strip().encode()
        found: Caller | None = None
        for expected, caller in self._entries:
            if hmac.compare_digest(presented, expected):
                found = caller
        return found

"""The agent directory: where each agent lives and which native identities may speak as it.

Declared agents come from ``[agents.NAME]``. Undeclared names follow the identity policy:
``pin`` rejects them, ``tofu`` binds the first identity seen (in Redis, so every replica
agrees), ``open`` accepts anyone. Where an undeclared agent was last seen is remembered
as its address, so replies can find it. Names compare case-insensitively.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum

import redis.asyncio as aioredis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from adapters.base import Address
from gateway.config import ConfigError, GatewayConfig, IdentityPolicy, parse_address
from protocol import load_public_key, public_key_id

log = logging.getLogger("bpgw.gateway.agents")

# How long a replica trusts its cached copy of a registered key (or of its absence):
# a key registered or removed through another replica takes effect within this time.
KEY_CACHE_SECONDS = 10.0


class IdentityVerdict(StrEnum):
    """Result of checking a From against the author's native identity."""

    OK = "ok"
    IMPERSONATION = "impersonation"
    UNDECLARED = "undeclared"


@dataclass(frozen=True)
class Agent:
    """One declared agent."""

    name: str
    addresses: tuple[Address, ...]
    identities: frozenset[str]
    public_key: Ed25519PublicKey | None


def _key(name: str) -> str:
    return name.casefold()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class AgentDirectory:
    """Looks up agents and checks who may speak as whom."""

    def __init__(self, config: GatewayConfig, redis: aioredis.Redis, key_prefix: str) -> None:
        self._policy = config.policy.undeclared_agents
        self._redis = redis
        self._identity_key = f"{key_prefix}:gw:identity"
        self._address_key = f"{key_prefix}:gw:address"
        self._keys_key = f"{key_prefix}:gw:keys"
        self._key_cache: dict[str, tuple[float, Ed25519PublicKey | None]] = {}
        self._declared: dict[str, Agent] = {}
        for name, section in config.agents.items():
            key = None
            if section.public_key:
                try:
                    key = load_public_key(section.public_key.encode())
                except ValueError as exc:
                    raise ConfigError(f"agents.{name}.public_key: {exc}") from None
            self._declared[_key(name)] = Agent(
                name=name,
                addresses=tuple(parse_address(a) for a in section.addresses),
                identities=frozenset(section.identities),
                public_key=key,
            )
        # Local caches of Redis bindings; a binding never changes once made.
        self._bound: dict[str, str] = {}
        self._learned: dict[str, Address] = {}

    def declared(self, name: str) -> Agent | None:
        """The declared agent of that name, if any."""
        return self._declared.get(_key(name))

    def declared_agents(self) -> list[Agent]:
        """Every declared agent, in config order."""
        return list(self._declared.values())

    async def check_sender(self, name: str, identity: str, seen_at: Address) -> IdentityVerdict:
        """May ``identity`` (``transport:author``) speak as agent ``name``?"""
        agent = self.declared(name)
        if agent is not None and agent.identities:
            return (
                IdentityVerdict.OK
                if identity in agent.identities
                else IdentityVerdict.IMPERSONATION
            )
        if agent is None and self._policy is IdentityPolicy.PIN:
            return IdentityVerdict.UNDECLARED
        if agent is None and self._policy is IdentityPolicy.OPEN:
            verdict = IdentityVerdict.OK
        else:
            bound = await self._bind(name, identity)
            verdict = IdentityVerdict.OK if bound == identity else IdentityVerdict.IMPERSONATION
        if agent is None and verdict is IdentityVerdict.OK:
            # Only a sender that passed may move where replies to the name go.
            await self._learn_address(name, seen_at)
        return verdict

    async def _bind(self, name: str, identity: str) -> str:
        """Bind ``name`` to ``identity`` unless already bound; return the binding."""
        key = _key(name)
        cached = self._bound.get(key)
        if cached is not None:
            return cached
        await self._redis.hsetnx(self._identity_key, key, identity)
        raw = await self._redis.hget(self._identity_key, key)
        bound = identity if raw is None else _text(raw)
        self._bound[key] = bound
        if bound == identity:
            log.info(
                "bound agent to first identity seen", extra={"sender": name, "identity": identity}
            )
        return bound

    async def _learn_address(self, name: str, address: Address) -> None:
        key = _key(name)
        if self._learned.get(key) == address:
            return
        self._learned[key] = address
        await self._redis.hset(self._address_key, key, str(address))

    async def addresses(self, name: str) -> list[Address]:
        """Where messages for ``name`` go: declared addresses, else where it was last seen."""
        agent = self.declared(name)
        if agent is not None and agent.addresses:
            return list(agent.addresses)
        key = _key(name)
        learned = self._learned.get(key)
        if learned is not None:
            return [learned]
        raw = await self._redis.hget(self._address_key, key)
        if raw is None:
            return []
        address = parse_address(_text(raw))
        self._learned[key] = address
        return [address]

    async def all_addresses(self) -> dict[str, list[Address]]:
        """Every known agent (declared and learned) with its addresses, for ``@all``."""
        result: dict[str, list[Address]] = {
            a.name: list(a.addresses) for a in self._declared.values() if a.addresses
        }
        learned = await self._redis.hgetall(self._address_key)
        for raw_name, raw_addr in learned.items():
            name = _text(raw_name)
            agent = self.declared(name)
            if agent is None or not agent.addresses:
                result[name] = [parse_address(_text(raw_addr))]
        return result

    async def public_key(self, name: str) -> Ed25519PublicKey | None:
        """The Ed25519 key an agent must sign with: from config, else registered, else None."""
        agent = self.declared(name)
        if agent is not None and agent.public_key is not None:
            return agent.public_key
        key = _key(name)
        cached = self._key_cache.get(key)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        raw = await self._redis.hget(self._keys_key, key)
        public = None
        if raw is not None:
            try:
                public = load_public_key(_text(raw).encode())
            except ValueError:
                log.error(
                    "registered key of @%s is unreadable; ignoring it", name, extra={"sender": name}
                )
        self._key_cache[key] = (now + KEY_CACHE_SECONDS, public)
        return public

    async def register_key(self, name: str, key_text: str | None) -> str | None:
        """Register (or with None, remove) an agent's Ed25519 public key.

        Returns the key's id. Raises ``ValueError`` for an unreadable key or for an
        agent whose key is fixed in the config.
        """
        agent = self.declared(name)
        if agent is not None and agent.public_key is not None:
            raise ValueError(f"@{name}'s key is set in the config ([agents.{agent.name}])")
        key = _key(name)
        self._key_cache.pop(key, None)
        if key_text is None:
            await self._redis.hdel(self._keys_key, key)
            return None
        public = load_public_key(key_text.encode())
        await self._redis.hset(self._keys_key, key, key_text)
        return public_key_id(public)

    async def registered_keys(self) -> dict[str, str]:
        """Agent name -> key id of every registered (not configured) key."""
        raw = await self._redis.hgetall(self._keys_key)
        out: dict[str, str] = {}
        for name, text in raw.items():
            try:
                out[_text(name)] = public_key_id(_text(text).encode())
            except ValueError:
                out[_text(name)] = "unreadable"
        return out

    async def bindings(self) -> dict[str, str]:
        """Every identity binding (agent -> identity) made under TOFU."""
        raw = await self._redis.hgetall(self._identity_key)
        return {_text(k): _text(v) for k, v in raw.items()}

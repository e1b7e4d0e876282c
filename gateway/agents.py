"""The agent directory: where each agent lives and which native identities may speak as it.

Declared agents come from ``[agents.NAME]``; a transport credential that names an agent
(an HTTP token configured for ``Carol``) makes that credential's identity Carol's from the
start, whatever the policy. Other names follow the identity policy: ``pin`` rejects them,
``tofu`` binds the first identity seen (in Redis, so every replica agrees), ``open``
accepts anyone. Where an undeclared agent was last seen is remembered as its address, so
replies can find it.

Names compare under one canonical key (``protocol.names.name_key``); a name whose UTS #39
skeleton belongs to another declared, credential or bound name impersonates that name;
the gateway's own name and ``all`` are nobody's. Learned state is bounded: one identity
holds at most ``max_names_per_identity`` names, names idle for ``learned_name_idle_days``
are reclaimed (a bounded purge on every new binding, and ``bpgw identity purge``), and
broadcasts go to at most ``broadcast_max_targets`` learned channels, kept as an index.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from adapters.base import Address, OwnedName
from gateway.config import ConfigError, GatewayConfig, IdentityPolicy, parse_address
from protocol import load_public_key, public_key_id
from protocol.ids import slug
from protocol.names import name_key, skeleton

log = logging.getLogger("bpgw.gateway.agents")

# How long a replica trusts its cached copy of a binding, an address, a registered key
# or the broadcast targets: a change made through another replica (a reset, a purge, a
# key) takes effect everywhere within this time.
CACHE_SECONDS = 10.0
# Most names each local cache keeps (least recently used go first).
CACHE_MAX = 10_000
# Idle names reclaimed per new binding (the purge is bounded work on every call).
PURGE_BATCH = 32
# At most this many "<prefix>-" cuts of a RequestId are looked up as agent names.
REQUEST_ID_PREFIXES = 16
RESERVED_BROADCAST = "all"

_T = TypeVar("_T")

# Shared by the scripts below. P = "{namespace}:gw:". Per learned name (its key k):
#   P.."identity" hash k -> bound identity      P.."address" hash k -> "transport:chan[#thread]"
#   P.."name"     hash k -> display name        P.."skof"    hash k -> skeleton
#   P.."skel"     hash skeleton -> k            P.."seen"    zset k -> last seen
#   P.."held:"..identity  set of the keys that identity holds
#   P.."bcast"    hash "transport:chan" -> k.."\n"..address (broadcast targets, capped)
_LUA_COMMON = """
local P = ARGV[1]
local function chan(address)
  return string.match(address, '^([^#]*)')
end
local function forget(k)
  local ident = redis.call('HGET', P .. 'identity', k)
  if ident then redis.call('SREM', P .. 'held:' .. ident, k) end
  local sk = redis.call('HGET', P .. 'skof', k)
  if sk and redis.call('HGET', P .. 'skel', sk) == k then redis.call('HDEL', P .. 'skel', sk) end
  local addr = redis.call('HGET', P .. 'address', k)
  if addr then
    local c = chan(addr)
    local entry = redis.call('HGET', P .. 'bcast', c)
    if entry and string.sub(entry, 1, #k + 1) == k .. '\\n' then
      redis.call('HDEL', P .. 'bcast', c)
    end
  end
  redis.call('HDEL', P .. 'identity', k)
  redis.call('HDEL', P .. 'address', k)
  redis.call('HDEL', P .. 'name', k)
  redis.call('HDEL', P .. 'skof', k)
  return redis.call('ZREM', P .. 'seen', k)
end
local function purge(cutoff, limit)
  local idle = redis.call('ZRANGEBYSCORE', P .. 'seen', '-inf', cutoff, 'LIMIT', 0, limit)
  for _, k in ipairs(idle) do forget(k) end
  return #idle
end
"""

# ARGV: 1 prefix, 2 key, 3 identity, 4 skeleton, 5 display, 6 now, 7 max names,
# 8 idle cutoff, 9 purge batch. Returns {"bound", identity} | {"confusable", name} |
# {"limit", held}.
_BIND = (
    _LUA_COMMON
    + """
local k, ident, sk, display = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now = tonumber(ARGV[6])
purge(tonumber(ARGV[8]), tonumber(ARGV[9]))
local bound = redis.call('HGET', P .. 'identity', k)
if bound then
  if bound == ident then
    redis.call('ZADD', P .. 'seen', now, k)
    -- Bindings made before names were indexed get their skeleton and owner set now.
    redis.call('HSETNX', P .. 'skel', sk, k)
    redis.call('HSETNX', P .. 'skof', k, sk)
    redis.call('HSETNX', P .. 'name', k, display)
    redis.call('SADD', P .. 'held:' .. ident, k)
  end
  return {'bound', bound}
end
local owner = redis.call('HGET', P .. 'skel', sk)
if owner and owner ~= k then
  return {'confusable', redis.call('HGET', P .. 'name', owner) or owner}
end
local held = redis.call('SCARD', P .. 'held:' .. ident)
if held >= tonumber(ARGV[7]) then return {'limit', tostring(held)} end
redis.call('HSET', P .. 'identity', k, ident)
redis.call('HSET', P .. 'skel', sk, k)
redis.call('HSET', P .. 'skof', k, sk)
redis.call('HSET', P .. 'name', k, display)
redis.call('SADD', P .. 'held:' .. ident, k)
redis.call('ZADD', P .. 'seen', now, k)
return {'bound', ident}
"""
)

# ARGV: 1 prefix, 2 key, 3 address, 4 display, 5 now, 6 broadcast cap.
# Returns 1 when the broadcast targets changed.
_LEARN = (
    _LUA_COMMON
    + """
local k, addr = ARGV[2], ARGV[3]
local old = redis.call('HGET', P .. 'address', k)
redis.call('HSET', P .. 'address', k, addr)
redis.call('HSETNX', P .. 'name', k, ARGV[4])
redis.call('ZADD', P .. 'seen', tonumber(ARGV[5]), k)
if old == addr then return 0 end
local changed = 0
if old then
  local entry = redis.call('HGET', P .. 'bcast', chan(old))
  if entry and string.sub(entry, 1, #k + 1) == k .. '\\n' then
    redis.call('HDEL', P .. 'bcast', chan(old))
    changed = 1
  end
end
local c = chan(addr)
if redis.call('HEXISTS', P .. 'bcast', c) == 0 and
   redis.call('HLEN', P .. 'bcast') < tonumber(ARGV[6]) then
  redis.call('HSET', P .. 'bcast', c, k .. '\\n' .. addr)
  changed = 1
end
return changed
"""
)

# ARGV: 1 prefix, 2 key. Returns 1 when the name had learned state.
_FORGET = _LUA_COMMON + "return forget(ARGV[2])"
# ARGV: 1 prefix, 2 idle cutoff, 3 limit. Returns how many names were reclaimed.
_PURGE = _LUA_COMMON + "return purge(tonumber(ARGV[2]), tonumber(ARGV[3]))"


class IdentityVerdict(StrEnum):
    """Result of checking a From against the author's native identity."""

    OK = "ok"
    IMPERSONATION = "impersonation"
    UNDECLARED = "undeclared"
    RESERVED = "reserved"
    CONFUSABLE = "confusable"
    TOO_MANY_NAMES = "too_many_names"


@dataclass(frozen=True)
class SenderCheck:
    """A verdict with what the sender should be told (the name it looks like, a count)."""

    verdict: IdentityVerdict
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True when the sender may speak as the name."""
        return self.verdict is _VERDICT_OK


# Read once: ``IdentityVerdict.OK`` in a function goes through EnumType's __getattr__
# hook (several hundred instructions), and every message's verdict is asked for.
_VERDICT_OK = IdentityVerdict.OK
# The usual verdicts, made once (immutable; every message's sender gets one).
_OK = SenderCheck(IdentityVerdict.OK)
_IMPERSONATION = SenderCheck(IdentityVerdict.IMPERSONATION)


@dataclass(frozen=True)
class Agent:
    """One declared agent, or one a transport credential names."""

    name: str
    addresses: tuple[Address, ...]
    identities: frozenset[str]
    public_key: Ed25519PublicKey | None
    # Where it comes from: "declared" ([agents.NAME]) or "token" (a transport credential).
    source: str = "declared"


@dataclass(frozen=True)
class LearnedName:
    """What the directory learned about one undeclared name."""

    name: str
    identity: str | None
    address: Address | None
    last_seen: float | None


class _Cache(Generic[_T]):
    """A small LRU cache whose entries expire: bounded memory per name on every replica."""

    def __init__(self, seconds: float = CACHE_SECONDS, size: int = CACHE_MAX) -> None:
        self._seconds = seconds
        self._size = size
        self._items: OrderedDict[Hashable, tuple[float, _T]] = OrderedDict()

    def get(self, key: Hashable) -> tuple[bool, _T | None]:
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            return False, None
        self._items.move_to_end(key)
        return True, item[1]

    def put(self, key: Hashable, value: _T) -> None:
        self._items[key] = (time.monotonic() + self._seconds, value)
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def drop(self, key: Hashable) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


def _other_than(owner: str | None, sender: str) -> str | None:
    """``owner`` unless it is ``sender`` (who may open its own RequestIds)."""
    return None if owner is None or owner == sender else owner


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _build_agents(config: GatewayConfig, owned: Iterable[OwnedName]) -> dict[str, Agent]:
    """Declared agents plus credential-owned names, by key; refuses clashing names."""
    agents: dict[str, Agent] = {}
    origin: dict[str, str] = {}
    for name, section in config.agents.items():
        key = name_key(name)
        if key in agents:
            raise ConfigError(f"agents.{name} and agents.{origin[key]} are the same name")
        public = None
        if section.public_key:
            try:
                public = load_public_key(section.public_key.encode())
            except ValueError as exc:
                raise ConfigError(f"agents.{name}.public_key: {exc}") from None
        agents[key] = Agent(
            name=name,
            addresses=tuple(parse_address(a) for a in section.addresses),
            identities=frozenset(section.identities),
            public_key=public,
        )
        origin[key] = name
    for item in owned:
        key = name_key(item.name)
        agent = agents.get(key)
        if agent is None:
            agents[key] = Agent(
                item.name, (item.address,), frozenset({item.identity}), None, source="token"
            )
            origin[key] = item.source
        elif agent.source == "token" or not config.agents[agent.name].identities:
            # A credential proves the name; [agents.X] without identities adds no others.
            agents[key] = Agent(
                agent.name,
                agent.addresses or (item.address,),
                agent.identities | {item.identity},
                agent.public_key,
                agent.source,
            )
    gateway = skeleton(config.gateway.name)
    looks: dict[str, str] = {}
    for key, agent in agents.items():
        where = origin[key] if agent.source == "token" else f"agents.{agent.name}"
        if key == RESERVED_BROADCAST or skeleton(key) == gateway:
            raise ConfigError(
                f"{where}: {agent.name!r} is reserved (the gateway's name in [gateway] name, "
                "or @all)"
            )
        other = looks.setdefault(skeleton(key), where)
        if other != where:
            raise ConfigError(f"{where} and {other} name agents that look alike")
    return agents


class AgentDirectory:
    """Looks up agents and checks who may speak as whom."""

    def __init__(
        self,
        config: GatewayConfig,
        redis: aioredis.Redis,
        key_prefix: str,
        owned: Iterable[OwnedName] = (),
    ) -> None:
        policy = config.policy
        self._policy = policy.undeclared_agents
        self._max_names = policy.max_names_per_identity
        self._idle_seconds = policy.learned_name_idle_days * 86400
        self._broadcast_max = policy.broadcast_max_targets
        self._redis = redis
        self._prefix = f"{key_prefix}:gw:"
        self._keys_key = f"{key_prefix}:gw:keys"
        self._bind_script = redis.register_script(_BIND)
        self._learn_script = redis.register_script(_LEARN)
        self._forget_script = redis.register_script(_FORGET)
        self._purge_script = redis.register_script(_PURGE)
        self._declared = _build_agents(config, owned)
        self._by_skeleton = {skeleton(k): a for k, a in self._declared.items()}
        self._by_slug = {slug(a.name): a for a in self._declared.values()}
        self._gateway_name = config.gateway.name
        self._gateway_shape = skeleton(config.gateway.name)
        self._bound: _Cache[str] = _Cache()
        self._learned: _Cache[tuple[Address, str]] = _Cache()
        self._key_cache: _Cache[Ed25519PublicKey | None] = _Cache()
        self._nobody: _Cache[bool] = _Cache()  # RequestId cuts that name no bound agent
        # What the config says of a RequestId's cuts, by (its longest cut, sender).
        self._cuts: _Cache[tuple[str | None, tuple[str, ...]]] = _Cache(seconds=math.inf)
        # check_sender's verdicts that the config alone decides (reserved and declared
        # names, lookalikes of declared ones, undeclared ones under pin): they never
        # change while the process runs, and every message's sender is checked.
        self._fixed: _Cache[SenderCheck] = _Cache(seconds=math.inf)
        self._broadcast: tuple[float, list[tuple[Address, str]]] | None = None

    def reserved(self, name: str) -> str | None:
        """The reserved name ``name`` is or looks like (the gateway's own, or ``all``)."""
        if name_key(name) == RESERVED_BROADCAST:
            return RESERVED_BROADCAST
        return self._gateway_name if skeleton(name) == self._gateway_shape else None

    def declared(self, name: str) -> Agent | None:
        """The declared (or credential-owned) agent of that name, if any."""
        return self._declared.get(name_key(name))

    def declared_agents(self) -> list[Agent]:
        """Every declared agent, in config order, then the credential-owned ones."""
        return list(self._declared.values())

    async def display_names(self, keys: Sequence[str]) -> dict[str, str]:
        """How each name key in ``keys`` (``protocol.names.name_key``) is spelled: as
        declared (config, credentials), else as first learned, else the key itself. One
        HMGET for the keys not declared."""
        shown = {k: a.name for k in keys if (a := self._declared.get(k)) is not None}
        rest = [k for k in keys if k not in shown]
        if rest:
            learned = await self._redis.hmget(self._prefix + "name", rest)
            shown |= {k: k if d is None else _text(d)
                      for k, d in zip(rest, learned, strict=True)}
        return shown

    # -- who may speak as whom -----------------------------------------------------------

    def fixed_check(self, name: str, identity: str) -> SenderCheck | None:
        """``check_sender``'s verdict when the config alone decided it before (no Redis,
        no coroutine: asked for every message), else None."""
        return self._fixed.get((name, identity))[1]

    async def check_sender(self, name: str, identity: str, seen_at: Address) -> SenderCheck:
        """May ``identity`` (``transport:author``) speak as agent ``name``?"""
        fixed = self.fixed_check(name, identity)
        if fixed is not None:
            return fixed
        key = name_key(name)
        shape = skeleton(key)
        reserved = self.reserved(name)
        if reserved is not None:
            return self._fix(name, identity, SenderCheck(IdentityVerdict.RESERVED, reserved))
        agent = self._declared.get(key)
        if agent is not None and agent.identities:
            ok = identity in agent.identities
            return self._fix(name, identity, _OK if ok else _IMPERSONATION)
        if agent is None:
            lookalike = self._by_skeleton.get(shape)
            if lookalike is not None:
                return self._fix(
                    name, identity, SenderCheck(IdentityVerdict.CONFUSABLE, lookalike.name)
                )
            if self._policy is IdentityPolicy.PIN:
                return self._fix(name, identity, SenderCheck(IdentityVerdict.UNDECLARED))
        if agent is None and self._policy is IdentityPolicy.OPEN:
            check = _OK
        else:
            check = await self._bind(key, name, shape, identity)
        if agent is None and check.ok:
            # Only a sender that passed may move where replies to the name go.
            await self._learn_address(key, name, seen_at)
        return check

    def _fix(self, name: str, identity: str, check: SenderCheck) -> SenderCheck:
        """Remember ``check`` of ``name`` for ``identity``, which the config alone decided
        (names and identities come from outside: the LRU cache bounds them)."""
        self._fixed.put((name, identity), check)
        return check

    async def _bind(self, key: str, name: str, shape: str, identity: str) -> SenderCheck:
        """Bind ``name`` to ``identity`` unless it (or a lookalike) is bound already."""
        hit, cached = self._bound.get(key)
        if hit and cached is not None:
            ok = cached == identity
            return _OK if ok else _IMPERSONATION
        now = time.time()
        raw = await self._bind_script(
            args=[
                self._prefix, key, identity, shape, name, now, self._max_names,
                now - self._idle_seconds, PURGE_BATCH,
            ]
        )
        what, detail = _text(raw[0]), _text(raw[1])
        if what == "confusable":
            return SenderCheck(IdentityVerdict.CONFUSABLE, detail)
        if what == "limit":
            return SenderCheck(IdentityVerdict.TOO_MANY_NAMES, detail)
        self._bound.put(key, detail)
        self._nobody.drop(key)
        if detail != identity:
            return _IMPERSONATION
        if not hit:
            log.info("agent bound to identity", extra={"sender": name, "identity": identity})
        return _OK

    async def _learn_address(self, key: str, name: str, address: Address) -> None:
        hit, known = self._learned.get(key)
        if hit and known is not None and known[0] == address:
            return
        agent = self._declared.get(key)
        self._learned.put(key, (address, agent.name if agent is not None else name))
        changed = await self._learn_script(
            args=[self._prefix, key, str(address), name, time.time(), self._broadcast_max]
        )
        if changed:
            self._broadcast = None

    # -- where agents live -------------------------------------------------------------

    def declared_addresses(self, name: str) -> list[tuple[Address, str]] | None:
        """``addresses(name)`` when the config says where ``name`` lives (no Redis, no
        coroutine), else None."""
        agent = self._declared.get(name_key(name))
        if agent is not None and agent.addresses:
            return [(a, agent.name) for a in agent.addresses]
        return None

    async def addresses(self, name: str) -> list[tuple[Address, str]]:
        """Where messages for ``name`` go, each with the name as its agent writes it:
        declared addresses, else where it was last seen."""
        declared = self.declared_addresses(name)
        if declared is not None:
            return declared
        key = name_key(name)
        agent = self._declared.get(key)
        hit, learned = self._learned.get(key)
        if not hit or learned is None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hget(self._prefix + "address", key)
                pipe.hget(self._prefix + "name", key)
                raw_address, raw_name = await pipe.execute()
            if raw_address is None:
                return []
            shown = agent.name if agent is not None else _text(raw_name or name)
            learned = (parse_address(_text(raw_address)), shown)
            self._learned.put(key, learned)
        return [learned]

    async def looks_like(self, name: str) -> str | None:
        """The declared, credential-owned or bound agent ``name`` looks like (same UTS #39
        skeleton, another canonical key), as that agent writes its name; None if none.

        Such a name can never be held (binding it is refused as impersonation), so a
        message addressed to it would wait on nobody.
        """
        key = name_key(name)
        if key in self._declared:
            return None
        shape = skeleton(key)
        agent = self._by_skeleton.get(shape)
        if agent is not None:
            return agent.name
        owner = await self._redis.hget(self._prefix + "skel", shape)
        if owner is None or _text(owner) == key:
            return None
        shown = await self._redis.hget(self._prefix + "name", _text(owner))
        return _text(shown if shown is not None else owner)

    async def broadcast_targets(self) -> list[tuple[Address, str]]:
        """Where a BROADCAST goes: every declared address and the indexed learned channels
        (one per transport channel, at most ``broadcast_max_targets``), with their agents.

        Read from Redis at most every ``CACHE_SECONDS`` (or when this replica learned a new
        channel), so a broadcast costs O(targets), never O(names ever seen).
        """
        cached = self._broadcast
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        targets = [(a, agent.name) for agent in self._declared.values() for a in agent.addresses]
        declared = {(a.transport, a.channel) for a, _ in targets}
        names: dict[str, str] = {}
        raw = await self._redis.hgetall(self._prefix + "bcast")
        for value in raw.values():
            key, _, text = _text(value).partition("\n")
            address = parse_address(text)
            agent = self._declared.get(key)
            if agent is not None and agent.addresses:
                continue  # (its declared addresses are in already)
            if (address.transport, address.channel) not in declared:
                names[key] = key
                targets.append((address, key))
        if names:
            shown = await self.display_names(list(names))
            targets = [(a, shown.get(n, n)) for a, n in targets]
        self._broadcast = (time.monotonic() + CACHE_SECONDS, targets)
        return targets

    # -- RequestIds ------------------------------------------------------------------

    async def request_id_owner(self, request_id: str, sender: str) -> str | None:
        """The agent a RequestId of the form ``<agent>-<suffix>`` belongs to, when that is
        not ``sender``; None when the sender may open it.

        ``<agent>`` is the longest cut of the RequestId before a ``-`` that names a known
        agent (declared, credential-owned or bound, compared canonically, or the RequestId
        slug of a declared agent) or the sender itself.
        """
        local, unknown = self._cuts_of(request_id, sender)
        # Cuts seen lately to name nobody are not asked again (bounded, expiring: a
        # name bound on another replica owns its ids here within CACHE_SECONDS).
        asked = [k for k in unknown if not self._nobody.get(k)[0]]
        if asked:
            bound = await self._redis.hmget(self._prefix + "identity", asked)
            for key, who in zip(asked, bound, strict=True):
                if who is not None:
                    shown = await self._redis.hget(self._prefix + "name", key)
                    return key if shown is None else _text(shown)
                self._nobody.put(key, True)
        return _other_than(local, sender)

    def known_request_id_owner(self, request_id: str, sender: str) -> tuple[bool, str | None]:
        """(True, ``request_id_owner(request_id, sender)``) when known without Redis (the
        config decides, or every cut it does not know was seen lately to name nobody),
        else (False, None)."""
        local, unknown = self._cuts_of(request_id, sender)
        for key in unknown:
            if not self._nobody.get(key)[0]:
                return False, None
        return True, _other_than(local, sender)

    def _cuts_of(self, request_id: str, sender: str) -> tuple[str | None, tuple[str, ...]]:
        """What the config says of the cuts of ``request_id`` (``_put_cuts``)."""
        # Every cut ends at a "-" before the last one, so it is remembered per (the
        # RequestId up to its last "-", sender): every message's RequestId is asked
        # about, and its last part is usually what makes it unique.
        stem = (request_id.rpartition("-")[0], sender)
        _, known = self._cuts.get(stem)
        return self._put_cuts(stem) if known is None else known

    def _put_cuts(self, stem: tuple[str, str]) -> tuple[str | None, tuple[str, ...]]:
        """For a RequestId up to its last "-" and its sender: the agent the longest cut
        the config knows names (the sender itself, a declared or credential-owned agent
        by key or RequestId slug), or None, and the keys of the longer cuts (longest
        first), which only Redis can tell about; remembered (it never changes)."""
        head, sender = stem
        text = head + "-"  # (the RequestId's cuts are those of its part up to its last "-")
        cuts: list[int] = []  # the first REQUEST_ID_PREFIXES "-" after the first character
        cut = text.find("-", 1)
        while cut > 0 and len(cuts) < REQUEST_ID_PREFIXES:
            cuts.append(cut)
            cut = text.find("-", cut + 1)
        mine = {name_key(sender), slug(sender)}
        unknown: list[str] = []
        local: str | None = None
        for cut in reversed(cuts):
            prefix = text[:cut]
            key = name_key(prefix)
            if key in mine or prefix in mine:
                local = sender
                break
            agent = self._declared.get(key) or self._by_slug.get(prefix)
            if agent is not None:
                local = agent.name
                break
            unknown.append(key)
        known = (local, tuple(unknown))
        self._cuts.put(stem, known)
        return known

    # -- signing keys ----------------------------------------------------------------

    def known_public_key(self, name: str) -> tuple[bool, Ed25519PublicKey | None]:
        """(True, ``public_key(name)``) when known without Redis (from config or cached),
        else (False, None)."""
        key = name_key(name)
        agent = self._declared.get(key)
        if agent is not None and agent.public_key is not None:
            return True, agent.public_key
        return self._key_cache.get(key)

    async def public_key(self, name: str) -> Ed25519PublicKey | None:
        """The Ed25519 key an agent must sign with: from config, else registered, else None."""
        known, public = self.known_public_key(name)
        if known:
            return public
        key = name_key(name)
        raw = await self._redis.hget(self._keys_key, key)
        public = None
        if raw is not None:
            try:
                public = load_public_key(_text(raw).encode())
            except ValueError:
                log.error(
                    "registered key of @%s is unreadable; ignoring it", name, extra={"sender": name}
                )
        self._key_cache.put(key, public)
        return public

    async def register_key(self, name: str, key_text: str | None) -> str | None:
        """Register (or with None, remove) an agent's Ed25519 public key.

        Returns the key's id. Raises ``ValueError`` for an unreadable key or for an
        agent whose key is fixed in the config.
        """
        agent = self.declared(name)
        if agent is not None and agent.public_key is not None:
            raise ValueError(f"@{name}'s key is set in the config ([agents.{agent.name}])")
        key = name_key(name)
        self._key_cache.drop(key)
        if key_text is None:
            await self._redis.hdel(self._keys_key, key)
            return None
        public = load_public_key(key_text.encode())
        await self._redis.hset(self._keys_key, key, key_text)
        return public_key_id(public)

    async def registered_keys(self, names: Sequence[str]) -> dict[str, str]:
        """Name key -> key id of the registered (not configured) keys of ``names``."""
        keys = [name_key(n) for n in names]
        if not keys:
            return {}
        raw = await self._redis.hmget(self._keys_key, keys)
        out: dict[str, str] = {}
        for key, text in zip(keys, raw, strict=True):
            if text is None:
                continue
            try:
                out[key] = public_key_id(_text(text).encode())
            except ValueError:
                out[key] = "unreadable"
        return out

    # -- learned names (operators) -------------------------------------------------------

    async def learned_count(self) -> int:
        """How many undeclared names have learned state."""
        return int(await self._redis.zcard(self._prefix + "seen"))

    async def learned_page(self, offset: int, limit: int) -> list[LearnedName]:
        """Learned names, most recently seen first."""
        raw = await self._redis.zrevrange(
            self._prefix + "seen", offset, offset + limit - 1, withscores=True
        )
        rows: list[Any] = list(raw)  # (member, score) pairs, as asked with withscores
        return await self._learned_names([(_text(key), float(at)) for key, at in rows])

    async def learned(self, name: str) -> LearnedName | None:
        """What was learned about ``name`` (None when nothing was)."""
        key = name_key(name)
        at = await self._redis.zscore(self._prefix + "seen", key)
        found = await self._learned_names([(key, None if at is None else float(at))])
        item = found[0]
        return None if at is None and item.identity is None and item.address is None else item

    async def _learned_names(self, items: list[tuple[str, float | None]]) -> list[LearnedName]:
        if not items:
            return []
        keys = [k for k, _ in items]
        async with self._redis.pipeline(transaction=False) as pipe:
            for field in ("identity", "address", "name"):
                pipe.hmget(self._prefix + field, keys)
            identities, addresses, names = await pipe.execute()
        return [
            LearnedName(
                name=_text(shown) if shown is not None else key,
                identity=None if ident is None else _text(ident),
                address=None if addr is None else parse_address(_text(addr)),
                last_seen=at,
            )
            for (key, at), ident, addr, shown in zip(
                items, identities, addresses, names, strict=True
            )
        ]

    async def reset(self, name: str) -> bool:
        """Forget a learned (TOFU) binding and address; True when there was one.

        Raises ``ValueError`` for a declared or credential-owned name: that lives in the
        config. Other replicas drop their cached copy within ``CACHE_SECONDS``.
        """
        agent = self.declared(name)
        if agent is not None and agent.identities:
            where = f"[agents.{agent.name}]" if agent.source == "declared" else "a transport token"
            raise ValueError(f"@{agent.name}'s identity is set by {where}, not learned")
        key = name_key(name)
        self._bound.drop(key)
        self._learned.drop(key)
        self._broadcast = None
        return bool(await self._forget_script(args=[self._prefix, key]))

    async def adopt_unindexed(self, *, now: float | None = None) -> int:
        """Give every binding and address learned before names had a last-use time one
        (now), so they too are reclaimed once idle; returns how many were adopted.

        Walks the two hashes with HSCAN, a page at a time (``bpgw identity purge`` runs it).
        """
        at = time.time() if now is None else now
        adopted = 0
        for field in ("identity", "address"):
            cursor = 0
            while True:
                cursor, page = await self._redis.hscan(
                    self._prefix + field, cursor, count=1000
                )
                if page:
                    mapping: dict[str, float] = {_text(k): at for k in page}
                    added = await self._redis.zadd(self._prefix + "seen", mapping, nx=True)
                    adopted += int(added or 0)
                if not cursor:
                    break
        return adopted

    async def purge_idle(self, limit: int = 1000, *, now: float | None = None) -> int:
        """Reclaim up to ``limit`` names idle longer than ``learned_name_idle_days``."""
        cutoff = (time.time() if now is None else now) - self._idle_seconds
        reclaimed = int(await self._purge_script(args=[self._prefix, cutoff, limit]))
        if reclaimed:
            self._bound.clear()
            self._learned.clear()
            self._broadcast = None
        return reclaimed

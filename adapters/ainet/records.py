"""The bridge's small durable records on Redis, shared by every replica and restart.

- **Conversation folders**: a conversation an AINET agent started in its own task folder
  (``tasks/task-<X>/``) gets a generated RequestId R; ``X -> R`` and ``R -> X`` are kept
  so the agent's next turns join R and the answers go into ``task-<X>`` (default for
  every other RequestId: ``task-<R>``).
- **Deliveries**: what each outbox message (``Outbound.id``) already became in the
  workspace (its conversation turn, its session file per agent, its broadcast), so a
  delivery the outbox repeats after a crash, or a BROADCAST delivered once per AINET
  agent, writes each file once.
- **Peers**: the bot-protocol names of agents seen writing in this workspace, so a
  BROADCAST one of them made is not written back into the folder it came from.

Each is a ``BoundedHash`` (oldest entries dropped past its bound) under the transport's
hash tag.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from adapters.ainet.ledger import BoundedHash, text_of, transport_tag
from protocol import name_key

PEERS_MAX = 10_000


class BridgeRecords:
    """Conversation folders, deliveries and peers of one ``ainet`` transport."""

    def __init__(self, client: aioredis.Redis, namespace: str, transport: str, *,
                 conversations_max: int, deliveries_max: int) -> None:
        tag = transport_tag(namespace, transport)
        self._client = client
        self._folders = BoundedHash(client, f"{tag}:folders", max_entries=conversations_max)
        self._deliveries = BoundedHash(client, f"{tag}:delivered", max_entries=deliveries_max)
        self._peers = BoundedHash(client, f"{tag}:peers", max_entries=PEERS_MAX)
        # Peers this process has recorded already (most files come from known agents).
        self._noted: set[tuple[str, str]] = set()

    async def folders(self, tasks: Sequence[str]) -> list[str | None]:
        """The RequestId of the conversation living in each ``tasks/task-<task>/``, if
        mapped; one call."""
        return await self._folders.get_many([f"F:{task}" for task in tasks])

    async def link(self, links: Sequence[tuple[str, str]]) -> None:
        """For each ``(task, request_id)``: conversation ``request_id`` lives in
        ``tasks/task-<task>/``."""
        await self._folders.put([pair for task, rid in links
                                 for pair in ((f"F:{task}", rid), (f"R:{rid}", task))])

    async def placements(self, items: Sequence[tuple[str | None, Sequence[str]]]
                         ) -> list[tuple[str | None, list[str | None]]]:
        """For each ``(request_id, delivery keys)``: the task folder key of conversation
        ``request_id`` when it is not ``task-<RequestId>`` (else None) and, for each
        delivery key, the native ids it became (space-separated) or None; one round trip
        for them all."""
        async with self._client.pipeline(transaction=False) as pipe:
            for request_id, keys in items:
                pipe.hget(self._folders.key, f"R:{request_id}")
                if keys:
                    pipe.hmget(self._deliveries.key, list(keys))
            raw = iter(await pipe.execute())
        found: list[tuple[str | None, list[str | None]]] = []
        for request_id, keys in items:
            folder = next(raw)
            values = next(raw) if keys else []
            found.append((text_of(folder) if request_id is not None and folder is not None
                          else None, [None if v is None else text_of(v) for v in values]))
        return found

    async def mark_delivered(self, items: Sequence[tuple[str, str]]) -> None:
        """Remember ``(key, native ids)`` pairs."""
        if items:
            await self._deliveries.put(items)

    async def note_peers(self, names: Sequence[tuple[str, str]]) -> None:
        """Remember ``(bot-protocol name, agent id)`` of agents seen in the workspace."""
        fresh = [(name_key(name), agent_id) for name, agent_id in names
                 if (name_key(name), agent_id) not in self._noted]
        if fresh:
            await self._peers.put(fresh)
            if len(self._noted) + len(fresh) > PEERS_MAX:
                self._noted.clear()
            self._noted.update(fresh)

    async def is_peer(self, name: str) -> bool:
        """True when ``name`` is an agent seen writing in this workspace."""
        return (await self._peers.get_many([name_key(name)]))[0] is not None

    async def peer_count(self) -> int:
        """How many workspace agents are known."""
        return await self._peers.count()

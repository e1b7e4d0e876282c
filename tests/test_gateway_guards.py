"""The loop guard's pair budget, checked and charged by the state store's apply script.

Driven through ``ConversationStore.apply`` on a real server with explicit times (the
script uses the message's ``now``), so windows and cooldowns are tested without waiting.
"""

from __future__ import annotations

import pytest
from test_state_helpers import ORIGIN, T0, request, response, store

from gateway.config import PolicySection
from gateway.guards import PairBudget, budget_names
from state.records import Budget, Outcome
from state.store import ConversationStore

__all__ = ["store"]

pytestmark = pytest.mark.redis


def _budget(limit: int, window: float = 60, cooldown: float = 30) -> PairBudget:
    return PairBudget(
        PolicySection(
            pair_budget_messages=limit,
            pair_budget_window_seconds=window,
            pair_cooldown_seconds=cooldown,
        )
    )


class Sender:
    """Applies fresh REQUESTs through one store with a budget, at given times."""

    def __init__(self, store: ConversationStore, budget: PairBudget) -> None:
        self.store = store
        self.budget = budget
        self.n = 0

    async def send(
        self, sender: str, to: str, at: float, identity: str | None = None
    ) -> tuple[bool, bool, float]:
        """(allowed, tripped, retry_after) of one new REQUEST."""
        self.n += 1
        msg = request(f"r{self.n}", sender=sender, to=to)
        res = await self.store.apply(
            msg, ORIGIN, now=at, budget=self.budget.budget(sender, to, identity)
        )
        if res.outcome is Outcome.LOOP:
            return False, res.tripped, res.retry_after
        assert res.outcome is Outcome.APPLIED, res
        return True, False, 0.0


async def test_pair_budget_trips_once_cools_down_and_resets(store: ConversationStore) -> None:
    s = Sender(store, _budget(3, window=60, cooldown=30))
    # Both directions share one budget, and names compare by canonical key.
    assert [(await s.send(a, b, T0))[0] for a, b in [("A", "B"), ("B", "A"), ("a", "b")]] == [
        True
    ] * 3
    assert await s.send("A", "B", T0 + 1) == (False, True, 30)
    allowed, tripped, wait = await s.send("B", "A", T0 + 11)
    assert not allowed and not tripped and wait == pytest.approx(20)  # one notice, not one each
    assert (await s.send("A", "C", T0 + 11))[0]  # other pairs are not affected
    assert (await s.send("A", "B", T0 + 32))[0]  # cooldown over: a fresh window
    # A refused message changed nothing: its RequestId is still free.
    assert await store.get("r4") is None


async def test_pair_budget_window_slides(store: ConversationStore) -> None:
    s = Sender(store, _budget(2, window=60, cooldown=30))
    assert (await s.send("A", "B", T0))[0]
    assert (await s.send("A", "B", T0 + 50))[0]
    # A window later the earlier messages count less and less (sliding-window counter).
    assert (await s.send("A", "B", T0 + 65))[0]
    assert not (await s.send("A", "B", T0 + 65))[0]


async def test_pair_budget_is_per_identity_as_well_as_per_name(store: ConversationStore) -> None:
    s = Sender(store, _budget(5))
    # Four aliases of one token share one budget towards Mantis.
    verdicts = [await s.send(f"Dave{i}", "Mantis", T0, "http:dave") for i in range(4) for _ in "xy"]
    assert [v[0] for v in verdicts] == [True] * 5 + [False] * 3
    assert verdicts[5][1] and not verdicts[6][1]
    # Another identity has its own identity budget; the name pairs are separate too.
    assert (await s.send("Erin", "Mantis", T0, "http:erin"))[0]
    assert (await s.send("Dave0", "Someone", T0, "http:dave"))[0]  # other recipient


async def test_duplicates_never_use_the_budget(store: ConversationStore) -> None:
    budget = _budget(2).budget("Lotbot", "Mantis", "chat:u-lot")
    first = request("dup-1")
    assert (await store.apply(first, ORIGIN, now=T0, budget=budget)).outcome is Outcome.APPLIED
    for _ in range(5):  # a client retrying: duplicates, on any replica, before and after
        again = await store.apply(first, ORIGIN, now=T0 + 1, budget=budget)
        assert again.outcome is Outcome.DUPLICATE
    assert (await store.apply(request("dup-2"), ORIGIN, now=T0 + 2, budget=budget)).applied
    # The budget is full now, yet a retry of an accepted message is still a duplicate.
    assert (await store.apply(first, ORIGIN, now=T0 + 3, budget=budget)).outcome is (
        Outcome.DUPLICATE
    )
    loop = await store.apply(request("dup-3"), ORIGIN, now=T0 + 3, budget=budget)
    assert loop.outcome is Outcome.LOOP and loop.tripped
    # An orphan RESPONSE retried while the budget cools down: a duplicate too.
    back = Budget(budget_names("Heron", "Kite", None), 1, 60, 30)
    orphan = response("nobody-knows", sender="Heron", to="Kite")
    assert (await store.apply(orphan, ORIGIN, now=T0, budget=back)).outcome is Outcome.ORPHAN
    other = response("nobody-else", sender="Heron", to="Kite")
    assert (await store.apply(other, ORIGIN, now=T0, budget=back)).tripped
    assert (await store.apply(orphan, ORIGIN, now=T0, budget=back)).outcome is Outcome.DUPLICATE


async def test_budget_keys_share_the_slot_expire_and_stay_small(store: ConversationStore) -> None:
    s = Sender(store, _budget(1000, window=60, cooldown=30))
    names = [("x" * 128, "Mantis", "http:" + "y" * 500), ("{evil}", "M}a{n", "chat:{u}")]
    for sender, to, identity in names * 50:
        assert (await s.send(sender, to, T0, identity))[0]
    keys = [k async for k in store.redis.scan_iter(match=store.keys.prefix + "lg:*")]
    # One pair key and one identity key per sender, whatever the names look like.
    assert len(keys) == 4
    for key in keys:
        # Same hash tag as the records (the script touches one slot), short, bounded.
        assert key.startswith(store.keys.prefix) and len(key) < 100
        assert 60_000 < await store.redis.pttl(key) <= 120_000
        assert len(await store.redis.get(key)) < 80  # four numbers, however many messages

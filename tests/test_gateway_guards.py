"""Loop guards on a controlled clock: the recent set and the per-pair budget."""

from __future__ import annotations

from gateway.guards import PairBudget, RecentSet


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_recent_set_forgets_after_its_ttl_and_stays_bounded() -> None:
    clock = Clock()
    recent = RecentSet(ttl=10, max_items=3, clock=clock)
    assert recent.add("a") and not recent.add("a") and "a" in recent
    clock.now += 11
    assert "a" not in recent and recent.add("a")
    for key in ("b", "c", "d"):
        recent.add(key)
    assert "a" not in recent and all(k in recent for k in ("b", "c", "d"))


def test_pair_budget_trips_once_cools_down_and_resets() -> None:
    clock = Clock()
    budget = PairBudget(limit=3, window=60, cooldown=30, clock=clock)
    # Both directions share one budget: a ping-pong is one pair.
    verdicts = [budget.check(a, b) for a, b in [("A", "B"), ("B", "A"), ("a", "b")]]
    assert all(v.allowed for v in verdicts)
    tripped = budget.check("A", "B")
    assert not tripped.allowed and tripped.tripped and tripped.retry_after == 30
    again = budget.check("B", "A")
    assert not again.allowed and not again.tripped  # one notice, not one per message
    assert budget.check("A", "C").allowed  # other pairs are not affected
    clock.now += 31
    assert budget.check("A", "B").allowed  # cooldown over: a fresh window


def test_pair_budget_window_slides() -> None:
    clock = Clock()
    budget = PairBudget(limit=2, window=60, cooldown=30, clock=clock)
    assert budget.check("A", "B").allowed
    clock.now += 50
    assert budget.check("A", "B").allowed
    clock.now += 15  # the first message left the window
    assert budget.check("A", "B").allowed
    assert not budget.check("A", "B").allowed

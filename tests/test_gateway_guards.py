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


def test_pair_budget_is_per_identity_as_well_as_per_name() -> None:
    clock = Clock()
    budget = PairBudget(limit=5, window=60, cooldown=30, clock=clock)
    # Four aliases of one token share one budget towards Mantis.
    verdicts = [budget.check(f"Dave{i}", "Mantis", "http:dave") for i in range(4) for _ in range(2)]
    assert [v.allowed for v in verdicts] == [True] * 5 + [False] * 3
    assert verdicts[5].tripped and not verdicts[6].tripped
    # Another identity speaking as one of those names still has its own identity budget,
    # but the name pair (Dave0, Mantis) is shared.
    assert budget.check("Erin", "Mantis", "http:erin").allowed
    assert budget.check("Dave0", "Someone", "http:dave").allowed  # other recipient


def test_pair_budget_forgets_idle_keys_and_stays_bounded() -> None:
    clock = Clock()
    budget = PairBudget(limit=3, window=60, cooldown=30, clock=clock, max_keys=1000)
    for i in range(500):
        assert budget.check(f"name{i}", "Mantis", f"http:id{i}").allowed
    assert len(budget) == 1000  # one name pair and one identity key per sender
    for i in range(500, 2000):
        budget.check(f"name{i}", "Mantis", f"http:id{i}")
    assert len(budget) == 1000  # bounded: least recently used keys went first
    clock.now += 61  # every key idle past its window
    assert budget.check("A", "B").allowed
    assert len(budget) == 1  # nothing kept for names not seen again


def test_pair_budget_keeps_a_cooling_down_pair_until_its_cooldown_ends() -> None:
    clock = Clock()
    budget = PairBudget(limit=1, window=10, cooldown=100, clock=clock)
    assert budget.check("A", "B").allowed
    assert budget.check("A", "B").tripped
    clock.now += 50  # past the window, inside the cooldown: still blocked
    budget.check("C", "D")
    assert not budget.check("A", "B").allowed
    clock.now += 160
    assert budget.check("A", "B").allowed


def test_recent_set_len_is_bounded() -> None:
    recent = RecentSet(ttl=10, max_items=5, clock=Clock())
    for i in range(20):
        recent.add(str(i))
    assert len(recent) == 5 and "19" in recent and "0" not in recent

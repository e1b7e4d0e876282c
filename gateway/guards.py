"""Loop guard: the per-agent-pair message budget, shared by every replica.

The budget is checked and charged by the state store's apply script, in the same atomic
step as the message it counts (``state.records.Budget``, ``state/lua/apply.lua``), so
replicas on one Redis share it exactly and a refused message changes nothing. Duplicates
are recognised there too, before the budget, by the fingerprints the conversation
records keep, so a retried message never uses the budget on any replica.

A message counts against two budgets, and passes only when both allow it:

- the unordered pair of names (A->B and B->A share a budget: a ping-pong uses both
  directions);
- the sender's native identity (``http:dave``) towards the recipient, so one credential
  speaking under several names has one budget, not one per alias.
"""

from __future__ import annotations

from functools import lru_cache

from gateway.config import PolicySection
from protocol import name_key
from state.keys import hash_tag
from state.records import Budget


# Remembered: an agent pair sends many messages, and the keys are a pure function of the
# names (bounded: identities come from outside).
@lru_cache(maxsize=4096)
def budget_names(sender: str, recipient: str, identity: str | None) -> tuple[str, ...]:
    """The budget keys one message from ``sender`` (as ``identity``) to ``recipient`` uses.

    Names compare by canonical key; each part is short and brace-free (``hash_tag``), and
    a space (in no part) separates them.
    """
    a, b = hash_tag(name_key(sender)), hash_tag(name_key(recipient))
    pair = f"p:{a} {b}" if a <= b else f"p:{b} {a}"
    if identity is None:
        return (pair,)
    return (pair, f"i:{hash_tag(identity)} {b}")


class PairBudget:
    """The ``[policy]`` pair budget as the store's ``Budget`` for one message."""

    def __init__(self, policy: PolicySection) -> None:
        limit = policy.pair_budget_messages
        window = policy.pair_budget_window_seconds
        cooldown = policy.pair_cooldown_seconds

        # A Budget is immutable and a pure function of the names: one per agent pair and
        # identity, not one per message (bounded like ``budget_names``).
        @lru_cache(maxsize=4096)
        def budget(sender: str, recipient: str, identity: str | None) -> Budget:
            return Budget(budget_names(sender, recipient, identity), limit, window, cooldown)

        self._budget = budget

    def budget(self, sender: str, recipient: str, identity: str | None) -> Budget:
        """What a message from ``sender`` (speaking as ``identity``) to ``recipient`` uses."""
        return self._budget(sender, recipient, identity)

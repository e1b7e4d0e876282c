"""Which msg_ids the bridge ACKs after processing a FETCH batch, safe on any mq9 broker.

Two ACK semantics exist. The RobustMQ broker sets one offset for all three priority
lanes (msg_id + 1), so an ACK skips every message with a smaller id, fetched or not. The
bpgw service moves only the acknowledged message's lane and the more urgent ones. A plan
is safe under both when every message an ACK could skip is committed:

- a message the gateway has not committed (its state store failed) must not be skipped:
  only ids below the smallest uncommitted id are acknowledged;
- a batch shorter than ``num_msgs`` holds every pending message, so its largest id may be
  acknowledged; a full batch may have left messages behind: the unfetched ones of its
  last lane come after that lane's largest fetched id, so when that lane is ``normal``
  nothing beyond it is acknowledged. When a full batch ends in a more urgent lane, the
  ids of the normal messages left behind are unknown: the plan acknowledges per lane,
  which the bpgw service handles without loss and the broker may not (docs/mq9.md).

Each lane's largest safe id is acknowledged, smallest first, so the broker's single offset
ends at the largest and the service moves every lane.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from adapters.mq9.client import Fetched

NORMAL = "normal"


def ack_plan(batch: Sequence[Fetched], committed: Collection[int], *, full: bool) -> list[int]:
    """The msg_ids to ACK, in order, for ``batch`` (in FETCH order) of which the ids in
    ``committed`` are committed; ``full`` when the FETCH returned ``num_msgs`` messages."""
    limit: float = float("inf")
    uncommitted = [m.msg_id for m in batch if m.msg_id not in committed]
    if uncommitted:
        limit = min(uncommitted) - 1
    if full and batch and batch[-1].priority == NORMAL:
        limit = min(limit, max(m.msg_id for m in batch if m.priority == NORMAL))
    best: dict[str, int] = {}
    for m in batch:
        if m.msg_id in committed and m.msg_id <= limit:
            best[m.priority] = max(best.get(m.priority, -1), m.msg_id)
    return sorted(best.values())

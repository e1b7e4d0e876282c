"""Transport kind ``ainet``: the gateway as a participant of a shared AINET folder (v0.3).

The file layer, one job per module: ``names`` (agent ids, safe path components),
``message`` (parse/render the message file), ``fsio`` (atomic and exclusive writes,
bounded reads), ``identity`` (a stable agent id), ``workspace`` (the layout and what the
bridge writes), ``discovery``/``inbox``/``watch`` (finding complete new files),
``ledger``/``records`` (what was ingested and delivered, on Redis), ``mapping`` (plain
AINET <-> bot-protocol), ``ingest`` (files to envelopes), ``outbound`` (what one
delivery writes) and ``adapter`` (the transport). See docs/ainet.md.
"""

from adapters.ainet.adapter import AinetAdapter
from adapters.base import register_adapter

register_adapter("ainet")(AinetAdapter)

__all__ = ["AinetAdapter"]

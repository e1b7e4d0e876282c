"""Transport kind ``slack``: a slack-bolt app (docs/slack.md). Needs ``bpgw[slack]``."""

from __future__ import annotations

from adapters.base import register_adapter
from adapters.slack.transport import SlackAdapter

register_adapter("slack")(SlackAdapter)

__all__ = ["SlackAdapter"]

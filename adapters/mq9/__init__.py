"""mq9 over NATS: the ``mq9`` transport (the bridge) and an mq9-compatible mailbox service
on stock NATS JetStream.

The bridge is transport kind ``mq9`` (``[transports.NAME] kind = "mq9"``);
``start_service(nats_url, ServiceSettings(...))`` runs one service instance. See docs/mq9.md.
"""

from adapters.base import register_adapter
from adapters.mq9.bridge import Mq9Bridge
from adapters.mq9.service import Mq9Service, start_service, stop_service
from adapters.mq9.settings import BridgeSettings, ServiceSettings

register_adapter("mq9")(Mq9Bridge)

__all__ = ["BridgeSettings", "Mq9Bridge", "Mq9Service", "ServiceSettings", "start_service",
           "stop_service"]

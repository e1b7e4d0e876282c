"""mq9 over NATS: an mq9-compatible mailbox service on stock NATS JetStream.

``start_service(nats_url, ServiceSettings(...))`` runs one instance; see docs/mq9.md.
"""

from adapters.mq9.service import Mq9Service, start_service, stop_service
from adapters.mq9.settings import ServiceSettings

__all__ = ["Mq9Service", "ServiceSettings", "start_service", "stop_service"]

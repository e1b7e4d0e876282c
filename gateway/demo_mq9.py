"""``bpgw demo``'s mq9 participant: SecurityBot as a plain mq9 client.

The demo's gateway runs the embedded mq9 transport (a private nats-server and the mq9
service); SecurityBot is declared at its own mailbox there instead of the HTTP API, and
speaks only the mq9 wire protocol (``adapters/mq9/agent.py``).
"""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from gateway.config import GatewayConfig
from gateway.defaults import MQ9_TRANSPORT

MQ9_AGENT = "SecurityBot"
MQ9_MAILBOX = "securitybot.inbox"


def with_mq9_agent(config: GatewayConfig) -> GatewayConfig:
    """``config`` with SecurityBot living at its mq9 mailbox (its HTTP token dropped)."""
    data = config.model_dump(mode="json")
    address = f"{MQ9_TRANSPORT}:{MQ9_MAILBOX}"
    data["agents"][MQ9_AGENT] = {"addresses": [address], "identities": [address]}
    for options in data["transports"].values():
        if isinstance(options.get("tokens"), dict):
            options["tokens"].pop(MQ9_AGENT, None)
    return GatewayConfig.model_validate(data)


async def connect_mq9_agent(gateway: Gateway) -> Any:
    """SecurityBot, connected to the gateway's NATS (an ``adapters.mq9.agent.Mq9Agent``)."""
    from adapters.mq9.agent import Mq9Agent  # the NATS client only when the demo runs

    bridge: Any = gateway.adapters[MQ9_TRANSPORT]
    return await Mq9Agent.connect(bridge.url, MQ9_AGENT, MQ9_MAILBOX, bridge.mailbox,
                                  "demo security agent with shell access to build hosts")

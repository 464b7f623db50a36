"""The Tether gateway: sessions, validation, micro-batching into Triton, actions with versions."""

from bridge.gateway.server import Gateway, GatewayConfig

__all__ = ["Gateway", "GatewayConfig"]

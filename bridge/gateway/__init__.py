"""The Tether gateway: sessions, validation, micro-batching into Triton, actions with versions.

    from bridge.gateway import Gateway, GatewayConfig

`Gateway` and `GatewayConfig` load on first use, so `bridge.gateway.errors` (which the registry,
the gate and the security package import) does not pull in the server, Triton's client and torch.
"""

__all__ = ["Gateway", "GatewayConfig"]


def __getattr__(name: str):
    if name in __all__:
        from bridge.gateway import server

        return getattr(server, name)
    raise AttributeError(f"module 'bridge.gateway' has no attribute {name!r}")

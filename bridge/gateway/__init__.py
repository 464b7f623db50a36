"""The Tether gateway: sessions, validation, micro-batching into Triton, actions with versions.

    from bridge.gateway.server import Gateway, GatewayConfig

The package itself re-exports nothing, so importing a light module (`bridge.gateway.errors`,
`bridge.gateway.session.figures`) never pulls in the server, Triton's client and torch. Nothing below the
gateway imports it (tests/common/test_layering.py), so no import cycle needs a lazy workaround.
"""

"""The Tether gateway: sessions, validation, micro-batching into Triton, actions with versions.

    from bridge.app import GatewayApp        # the gateway with the console composed on top (`tether gateway`)
    from bridge.gateway.server import Gateway   # the gateway alone

Roles as sub-packages: session/ (a Hello becoming a session, its steps), rollout/ (which version serves whom),
versions/ (publishing, loading, verifying), replicas/ (several Triton servers); the wiring at the root:
server.py (what a Gateway holds), config.py (its settings and flags), cli.py (`tether gateway`'s parser),
views.py (what the operator's side reads), errors.py (gRPC statuses).

The package itself re-exports nothing, so importing a light module (`bridge.gateway.errors`,
`bridge.gateway.session.figures`) never pulls in the server, Triton's client and torch. Nothing below the
gateway imports it (tests/common/test_layering.py), so no import cycle needs a lazy workaround.
"""

"""The operator's view of a gateway: the web console, the fleet's figures and e-stops, metrics (JSON logs are
bridge.common.logs: the gateway's step path logs through them without importing the console).

    gateway.fleet            # bridge.console.fleet.Fleet: displays gateway.figures and gateway.estops, forwards
                             # operators' e-stops and releases (gateway session/figures, holds)
    gateway.console          # bridge.console.server.Console: HTTP (page, JSON API, /metrics), when enabled
    tether status | estop | release     # bridge.console.cli, through tether.v1.Fleet
"""

"""The gateway satisfies the small Protocols its consumers are typed against (bridge.metrics, bridge/gateway/views.py,
bridge.console.server), and the consumers read nothing else of it."""

from __future__ import annotations

import ast
from pathlib import Path

from bridge.app import GatewayApp
from bridge.console.server import ConsoleSource
from bridge.gateway.config import GatewayConfig
from bridge.gateway.views import FleetSource
from bridge.metrics import FreshnessSource, MetricsSource

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("bridge.metrics", "bridge.gateway.views", "bridge.console.server")  # where the Protocols live


def test_a_gateway_is_every_source_its_consumers_need():
    gw = GatewayApp(GatewayConfig(triton_url="127.0.0.1:1"))  # built, never started: nothing listens
    assert isinstance(gw, MetricsSource) and isinstance(gw, FleetSource) and isinstance(gw, ConsoleSource)
    assert isinstance(gw.rollout, FreshnessSource)
    assert gw.fleet.figures is gw.figures and gw.fleet.holds is gw.estops  # the fleet view displays the gateway's


def _gateway_attributes_read(path: Path, handle: str) -> set[str]:
    """Attributes read off `self._gw` / `gw` in a consumer module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == handle) or (
                    isinstance(base, ast.Attribute) and base.attr == "_gw"):
                names.add(node.attr)
    return names


def _protocol_members(protocol: type) -> set[str]:
    return {name for klass in protocol.__mro__ if klass.__module__ in SOURCES
            for name in vars(klass) if not name.startswith("_")}


def test_consumers_read_only_what_their_protocol_names():
    for module, protocol in (("bridge/metrics.py", MetricsSource), ("bridge/console/fleet.py", FleetSource),
                             ("bridge/console/server.py", ConsoleSource)):
        read = _gateway_attributes_read(ROOT / module, "gw")
        assert read, f"{module}: the check reads nothing: it looks at the wrong names"
        assert read <= _protocol_members(protocol), f"{module} reads {sorted(read - _protocol_members(protocol))} " \
                                                    f"of the gateway, which {protocol.__name__} does not name"

"""What the gateway offers the operator's side to read, as a small Protocol: the fleet view (bridge.console.fleet)
names what it needs instead of being handed the gateway object and probing it (`getattr(gw, "registry", None)`).

    Fleet(gateway)              # FleetSource: sessions, server_version, registry, figures, estops, logging_state()

The metrics' sources (SessionSource, MetricsSource, ...) are bridge.metrics's, the console's ConsoleSource is
bridge.console.server's: each consumer declares what it reads. `bridge.gateway.server.Gateway` satisfies them all;
a stand-in (a benchmark, a test) gives the same attributes, None where it has no registry or rollout controller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from bridge.metrics import SessionSource

if TYPE_CHECKING:
    from bridge.gateway.session.figures import FleetFigures
    from bridge.gateway.session.holds import EStops
    from bridge.registry import Registry

__all__ = ["FleetSource"]


@runtime_checkable
class FleetSource(SessionSource, Protocol):
    """What the operator's fleet view reads (bridge.console.fleet.Fleet): figures and e-stops are the gateway's."""

    @property
    def server_version(self) -> str: ...

    @property
    def registry(self) -> Registry | None: ...

    @property
    def figures(self) -> FleetFigures: ...

    @property
    def estops(self) -> EStops: ...

    def logging_state(self) -> str:
        """"ok", "off" or "degraded: <why>" (the experience log's state, FleetStatus.logging)."""



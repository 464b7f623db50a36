"""What the gateway's consumers read of it, as small Protocols: the metrics, the fleet view and the console
name what they need instead of being handed the gateway object and probing it (`getattr(gw, "registry", None)`).

    GatewayMetrics(gateway)     # MetricsSource: sessions, registry, rollout, experience
    Fleet(gateway)              # FleetSource: sessions, server_version, registry, figures, estops, logging_state()
    Console(gateway)            # ConsoleSource: the above, with auth, config, address, fleet, logging_state()

`bridge.gateway.server.Gateway` satisfies all of them; a stand-in (a benchmark, a test) gives the same
attributes, None where it has no registry, rollout controller or experience log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from bridge.console.fleet import Fleet
    from bridge.experience import LogStats
    from bridge.gateway.config import GatewayConfig
    from bridge.gateway.session.figures import FleetFigures
    from bridge.gateway.session.holds import EStops
    from bridge.registry import Registry
    from bridge.security import Authorizer

__all__ = ["ConsoleSource", "FleetSource", "FreshnessSource", "LogSource", "MetricsSource", "SessionSource"]


@runtime_checkable
class SessionSource(Protocol):
    """The connected sessions by id (each has .id, .source, .policy.name/.version, .stats)."""

    @property
    def sessions(self) -> Mapping[str, Any]: ...


@runtime_checkable
class FreshnessSource(Protocol):
    """The rollout controller's read model of how far sessions lag the newest version."""

    def freshness(self) -> dict: ...

    def version_stats(self, policy: str) -> dict: ...


@runtime_checkable
class LogSource(Protocol):
    """The experience log's counters."""

    @property
    def stats(self) -> LogStats: ...


@runtime_checkable
class MetricsSource(SessionSource, Protocol):
    """What /metrics reads at a scrape (bridge.metrics.GatewayMetrics)."""

    @property
    def registry(self) -> Registry | None: ...

    @property
    def rollout(self) -> FreshnessSource | None: ...

    @property
    def experience(self) -> LogSource | None: ...


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


@runtime_checkable
class ConsoleSource(MetricsSource, Protocol):
    """What the console's HTTP server reads and forwards to (bridge.console.server.Console)."""

    @property
    def auth(self) -> Authorizer: ...

    @property
    def config(self) -> GatewayConfig: ...

    @property
    def address(self) -> str: ...

    @property
    def server_version(self) -> str: ...

    @property
    def fleet(self) -> Fleet: ...

    def logging_state(self) -> str: ...

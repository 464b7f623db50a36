"""The operator's view of a gateway's fleet: a thin adapter over what the gateway owns.

    fleet = Fleet(gateway)                         # a FleetSource (bridge.gateway.views); the gateway owns one
    await fleet.estop(Target(robot="arm_1"), who="operator:ada", why="person in the cell")   # (changed, held)
    await fleet.release(Target(robot="arm_1"), who="operator:ada", why="cell clear")
    fleet.status()                                 # fleet_pb2.FleetStatus (tether status, the console)
    fleet.sessions(); fleet.estops; fleet.audit_events()

E-stops, their durability and the held replies are the gateway's (`session.holds.EStops`, gateway.estops);
per-session figures and metrics too (`session.figures.FleetFigures`, gateway.figures). This module displays
them and forwards operators' e-stops and releases, with the identity the caller authenticated as (`who` comes from
`gateway.auth`, never from the request).

`status()` (tether.v1.Fleet.Status, open to anonymous viewers) never waits on a database: on a shared (PostgreSQL)
registry the versions and the e-stops' audit events come from the follower's snapshot (`bridge.registry.view`),
e-stops and sessions from memory; a SQLite registry is a local file, read as it is.
"""

from __future__ import annotations

import logging
from collections import Counter, deque

from bridge.gateway.session.holds import MAX_NAME, ROBOT_LABELS, BadTarget, EStops, Target, selector
from bridge.gateway.views import FleetSource
from bridge.metrics import GatewayMetrics
from bridge.registry import RegistryError
from bridge.registry.view import view_of
from protos import fleet_pb2

__all__ = ["MAX_NAME", "ROBOT_LABELS", "BadTarget", "Fleet", "Target"]
AUDIT_KINDS = ("estop", "release")
log = logging.getLogger("tether.console")


class Fleet:
    def __init__(self, gateway: FleetSource):
        self._gw = gateway
        self.figures = gateway.figures
        self.holds: EStops = gateway.estops
        self.console_url = ""
        self._audit: deque = deque(maxlen=1000)  # the e-stop registry's estop/release events, newest last
        self._audit_since = 0
        self.view = view_of(getattr(gateway, "registry", None))  # reads that never wait on PostgreSQL

    # -- the figures (the Bridge servicer feeds gateway.figures; these forward for other callers) --------------

    @property
    def metrics(self) -> GatewayMetrics:
        return self.figures.metrics

    @property
    def returns(self):
        return self.figures.returns

    @property
    def total_rows(self) -> int:
        return self.figures.total_rows

    def opened(self, session, hello) -> None:
        self.figures.opened(session, hello)

    def observed(self, session, obs, reply) -> None:
        self.figures.observed(session, obs, reply)

    def closed(self, session) -> None:
        self.figures.closed(session)

    def latencies_ms(self):
        return self.figures.latencies_ms()

    # -- operator actions -------------------------------------------------------------------------

    async def estop(self, target: Target, *, who: str, why: str) -> tuple[bool, list[str]]:
        """Latch (durable, audited); returns (changed, the sessions held now)."""
        outcome = await self.holds.estop(target, who=who, why=why)
        return outcome.changed, self.held_sessions()

    async def release(self, target: Target, *, who: str, why: str) -> tuple[bool, list[str]]:
        """Unlatch that selector (others stay latched); returns (changed, the sessions still held)."""
        outcome = await self.holds.release(target, who=who, why=why)
        return outcome.changed, self.held_sessions()

    def held_sessions(self) -> list[str]:
        return self.holds.held_sessions(self._gw.sessions.values())

    @property
    def estops(self) -> dict[str, fleet_pb2.EStopSelector]:
        """The standing e-stops by target ("all", "session=ID", "robot=NAME")."""
        return {r.target: selector(r) for r in self.holds.standing()}

    def audit_events(self, limit: int = 200) -> list[dict]:
        """E-stops and releases, oldest first (the newest `limit`), from the registry that keeps them; `in_registry`
        says whether that is the gateway's registry (whose events the console lists already)."""
        registry = self.holds.registry
        source = self.view if registry is self._gw.registry and self.view is not None else view_of(registry)
        try:
            while batch := source.events("", since_id=self._audit_since, limit=1000):  # new ones only: a cursor
                self._audit.extend(e for e in batch if e.kind in AUDIT_KINDS)
                self._audit_since = batch[-1].id
                if len(batch) < 1000:
                    break
        except RegistryError as exc:  # closed (the gateway stopped) or unreadable: what was read so far
            log.debug("cannot read the e-stops' audit events: %s", exc)
        shared = registry is self._gw.registry
        return [dict(id=e.id, t_ns=e.t_ns, kind=e.kind, policy=e.policy, detail=e.detail, version=e.version, who=e.who,
                     why=e.why, figures=e.figures, estop_id=e.to_state or e.from_state, in_registry=shared)
                for e in list(self._audit)[-limit:]]

    # -- what operators see -----------------------------------------------------------------------

    def sessions(self) -> list[dict]:
        return self.figures.rows(self._gw.sessions, held=self.holds.holder)

    def versions(self) -> list[dict]:
        """Versions with their state: the registry's when there is one, else what sessions act with."""
        acting = Counter((s.policy.name, s.policy.version) for s in list(self._gw.sessions.values()))
        registry = self.view
        rows = []
        if registry is not None:
            for policy in registry.policies():
                for rec in registry.versions(policy):
                    rows.append(dict(policy=policy, version=rec.version, state=str(rec.state),
                                     sessions=acting.pop((policy, rec.version), 0)))
        for (policy, version), n in sorted(acting.items()):
            rows.append(dict(policy=policy, version=version, state="serving", sessions=n))
        return rows

    def status(self) -> fleet_pb2.FleetStatus:
        out = fleet_pb2.FleetStatus(server_version=self._gw.server_version, console_url=self.console_url)
        for row in self.sessions():
            fields = {k: v for k, v in row.items() if k != "held_steps"}
            out.sessions.append(fleet_pb2.SessionStatus(**fields))
        for row in self.versions():
            out.versions.append(fleet_pb2.VersionStatus(**row))
        out.estops.extend(selector(r) for r in self.holds.standing())
        out.logging = self._gw.logging_state()  # "ok", "off", "degraded: <why>" (bridge.gateway.server)
        return out

"""The gateway's view of its fleet for operators: per-session figures, e-stops, the audit trail.

    fleet = Fleet(gateway)                         # the gateway owns one: gateway.fleet
    fleet.opened(session, hello)                   # the Bridge servicer, once a session is open
    reply = await fleet.hold(session, obs) if fleet.held(session) else await session.handle(obs)
    fleet.observed(session, obs, reply)            # after every reply: metrics and figures
    fleet.closed(session)
    fleet.estop(Target(robot="arm_1"), who="operator:ada", why="person in the cell")
    fleet.release(Target(robot="arm_1"), who="operator:ada", why="cell clear")
    fleet.status()                                 # fleet_pb2.FleetStatus (tether status, the console)

E-stop: a latched selector (a session id, a robot = the Hello label robot=NAME, or the edge node's
node=NAME, or all). It holds
sessions that connect later too, until released. A held session's observations get the safe action
(zero clipped into the action spec's bounds) with `Action.estop = true`, no inference, and nothing
is logged for those steps (the pending transition is dropped, so no transition spans the hold); a
single-env LAST still ends its episode. Episode returns and lengths that span a hold count only the
policy's steps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import grpc
import numpy as np

from bridge.gateway.errors import GatewayError
from bridge.gateway.vector_session import _safe_rows
from bridge.metrics import GUARD_KINDS, GatewayMetrics
from protos import bridge_pb2, fleet_pb2
from protos.codec import encode

Code = bridge_pb2.StepError.Code
ROBOT_LABELS = ("robot", "node")  # Hello labels naming a robot: robot=NAME, or the ROS 2 edge node's node=NAME
MAX_NAME = 128


class BadTarget(GatewayError):
    status = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True, kw_only=True)
class Target:
    """Whom an e-stop or release addresses: exactly one of a session id, a robot name, or all."""

    session_id: str = ""
    robot: str = ""
    all: bool = False

    def __post_init__(self):
        given = [n for n, v in (("session_id", self.session_id), ("robot", self.robot), ("all", self.all)) if v]
        if len(given) != 1:
            raise BadTarget(f"an e-stop names exactly one of session_id, robot or all; got {given or 'none'}")
        for name in ("session_id", "robot"):
            value = getattr(self, name)
            if len(value) > MAX_NAME or (value and not value.isprintable()):
                raise BadTarget(f"{name} must be printable and at most {MAX_NAME} characters, got {value[:40]!r}")

    @property
    def key(self) -> str:
        return "all" if self.all else f"session={self.session_id}" if self.session_id else f"robot={self.robot}"

    @classmethod
    def from_proto(cls, request: fleet_pb2.EStopRequest) -> Target:
        which = request.WhichOneof("target")
        if which is None:
            raise BadTarget("an e-stop names exactly one of session_id, robot or all; got none")
        return cls(**{which: getattr(request, which)})


@dataclass
class _View:
    """What the fleet keeps per connected session (bounded)."""

    session: object
    labels: dict[str, str]
    opened: float
    num_envs: int
    vector: bool
    latency_ns: deque = field(default_factory=lambda: deque(maxlen=512))
    replies: deque = field(default_factory=lambda: deque(maxlen=64))      # monotonic times of answered steps
    returns: deque = field(default_factory=lambda: deque(maxlen=32))
    guard: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GUARD_KINDS, 0))
    last_error: str = ""
    held_steps: int = 0
    safe: list | None = None                                               # encoded safe action tensors


class Fleet:
    def __init__(self, gateway, *, metrics: GatewayMetrics | None = None):
        self._gw = gateway
        self.metrics = metrics or GatewayMetrics(gateway)
        self._views: dict[str, _View] = {}
        self.estops: dict[str, fleet_pb2.EStopSelector] = {}
        self._audit: deque[dict] = deque(maxlen=1000)
        self._audit_ids = 0
        self.returns: dict[tuple[str, int], deque] = {}    # (policy, version) -> (t_unix, episode return)
        self.total_rows = 0                                 # env steps answered (policy or safe)
        self.console_url = ""

    # -- the servicer's calls ---------------------------------------------------------------------

    def opened(self, session, hello: bridge_pb2.Hello) -> None:
        n = getattr(session, "num_envs", None)
        self._views[session.id] = _View(session, dict(hello.labels), time.monotonic(), n or 1, n is not None)
        self.metrics.sessions_opened += 1

    def closed(self, session) -> None:
        view = self._views.get(session.id)
        if view is not None and view.session is session:
            del self._views[session.id]

    def held(self, session) -> bool:
        if not self.estops:
            return False
        return self._holder(session) is not None

    def _holder(self, session) -> str | None:
        if "all" in self.estops:
            return "all"
        if (key := f"session={session.id}") in self.estops:
            return key
        view = self._views.get(session.id)
        if view is not None:
            for label in ROBOT_LABELS:
                robot = view.labels.get(label)
                if robot and (key := f"robot={robot}") in self.estops:
                    return key
        return None

    async def hold(self, session, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        """The reply to an e-stopped session's observation: the safe action, estop=true, no inference."""
        received = time.time_ns()
        vector = hasattr(session, "num_envs")
        if not vector and obs.step_type == bridge_pb2.LAST:
            session._acted = None
            return await session.handle(obs)  # ends the episode; with nothing acted, no inference, no reward
        if (error := session._out_of_order(obs.step)) is not None:
            return error
        if obs.HasField("guard"):
            session.stats.guard = obs.guard
        if vector:  # drop pending transitions: nothing of a held step is logged, no transition spans the hold
            session._acted[:] = False
            for recorder in session.recorder.recorders:
                recorder.abandon()
        else:
            session._acted = None
            session.recorder.abandon()
        view = self._views.get(session.id)
        safe = view.safe if view is not None else None
        if safe is None:
            rows = _safe_rows(session.action_spec, session.num_envs if vector else 1)
            safe = [encode(name, value if vector else value[0]) for name, value in rows.items()]
            if view is not None:
                view.safe = safe
        now = time.time_ns()
        timing = bridge_pb2.Timing(t_sent_ns=obs.t_sent_ns, gateway_recv_ns=received, infer_start_ns=now,
                                   infer_end_ns=now, gateway_send_ns=now)
        return bridge_pb2.ServerMessage(action=bridge_pb2.Action(
            step=obs.step, tensors=safe, policy=session.policy.name, policy_version=session.policy.version,
            timing=timing, episode=obs.episode, estop=True))

    def observed(self, session, obs: bridge_pb2.Observation, reply: bridge_pb2.ServerMessage) -> None:
        """Metrics and figures of one answered observation (cheap: the control path calls it; few proto reads)."""
        view = self._views.get(session.id)
        if view is None:
            return
        kind = reply.WhichOneof("kind")
        m = self.metrics
        if kind == "action":
            a = reply.action
            t = a.timing
            rows = view.num_envs
            self.total_rows += rows
            view.replies.append(time.monotonic())
            sent = t.t_sent_ns
            if sent:
                view.latency_ns.append(t.gateway_send_ns - sent)
            policy = session.policy  # the version that acted (the action is labelled with it)
            if a.estop:
                view.held_steps += 1
                m.held += rows
            elif view.vector:
                errors = a.env_errors
                m.step(t, policy=policy.name, version=policy.version, rows=rows - len(errors))
                for error in errors:
                    m.error(Code.Name(error.code))
                    view.last_error = f"env {error.env}: {Code.Name(error.code)}: {error.message}"
            else:
                m.step(t, policy=policy.name, version=policy.version)
            if view.vector:
                for end in a.episode_ends:
                    self._ended(view, policy.name, policy.version, end.episode_return)
        elif kind == "episode_end":
            self._ended(view, session.policy.name, session.policy.version, reply.episode_end.episode_return)
        elif kind == "error":
            e = reply.error
            m.error(Code.Name(e.code))
            view.last_error = f"step {e.step}: {Code.Name(e.code)}: {e.message}"
        if obs.HasField("guard"):
            g, seen = obs.guard, view.guard
            for k, now in (("clamped", g.clamped), ("rate_limited", g.rate_limited), ("watchdog", g.watchdog),
                           ("estop", g.estop)):
                if now > seen[k]:
                    m.guard_delta(k, now - seen[k])
                seen[k] = now

    def _ended(self, view: _View, policy: str, version: int, episode_return: float) -> None:
        view.returns.append(episode_return)
        self.metrics.episodes += 1
        series = self.returns.get((policy, version))
        if series is None:
            series = self.returns[(policy, version)] = deque(maxlen=500)
        series.append((time.time(), episode_return))

    # -- operator actions -------------------------------------------------------------------------

    def estop(self, target: Target, *, who: str, why: str) -> tuple[bool, list[str]]:
        """Latch; returns (changed, the sessions held now)."""
        changed = target.key not in self.estops
        if changed:
            self.estops[target.key] = fleet_pb2.EStopSelector(
                session_id=target.session_id, robot=target.robot, all=target.all, who=who, why=why,
                t_ns=time.time_ns())
        self.audit("estop", who=who, why=why, figures={"changed": float(changed)}, detail=target.key)
        return changed, self.held_sessions()

    def release(self, target: Target, *, who: str, why: str) -> tuple[bool, list[str]]:
        """Unlatch that selector (others stay latched); returns (changed, the sessions still held)."""
        changed = self.estops.pop(target.key, None) is not None
        self.audit("release", who=who, why=why, figures={"changed": float(changed)}, detail=target.key)
        return changed, self.held_sessions()

    def held_sessions(self) -> list[str]:
        return sorted(s.id for s in list(self._gw.sessions.values()) if self.held(s))

    def audit(self, kind: str, *, who: str, why: str, policy: str = "", version: int | None = None,
              figures: dict[str, float] | None = None, detail: str = "") -> None:
        """An operator action into the audit trail: the registry's (it survives a restart), and ours."""
        registry = getattr(self._gw, "registry", None)
        if registry is not None:
            registry.record_event(kind=kind, policy=policy, version=version, who=who, why=why, figures=figures,
                                  detail=detail)
        self._audit_ids += 1
        self._audit.append(dict(id=self._audit_ids, t_ns=time.time_ns(), kind=kind, policy=policy, detail=detail,
                                version=version, who=who, why=why, figures=figures or {},
                                in_registry=registry is not None))

    def audit_events(self, limit: int = 200) -> list[dict]:
        return list(self._audit)[-limit:]

    # -- what operators see -----------------------------------------------------------------------

    def sessions(self) -> list[dict]:
        now = time.monotonic()
        rows = []
        for sid, session in sorted(self._gw.sessions.items()):
            view = self._views.get(sid)
            if view is None:
                continue
            p50, p99 = _p50_p99(view.latency_ns)
            r = view.replies
            rate = 0.0
            if len(r) > 1 and now - r[-1] < 3.0:
                rate = (len(r) - 1) / max(r[-1] - r[0], 1e-9) * view.num_envs
            g = session.stats.guard
            rows.append(dict(
                session_id=sid, source=session.source, labels=view.labels, policy=session.policy.name,
                policy_version=session.policy.version, num_envs=view.num_envs, steps=session.stats.steps,
                episodes=session.stats.episodes, steps_per_s=round(rate, 2),
                latency_p50_ms=round(p50 / 1e6, 3), latency_p99_ms=round(p99 / 1e6, 3),
                guard_interventions=int(g.clamped + g.rate_limited + g.watchdog + g.estop),
                estopped=self._holder(session) is not None, edge_estopped=bool(g.estopped),
                last_error=view.last_error, connected_s=round(now - view.opened, 1),
                mean_return=round(float(np.mean(view.returns)), 3) if view.returns else 0.0,
                held_steps=view.held_steps))
        return rows

    def latencies_ms(self) -> np.ndarray:
        """Recent per-step latencies (client send -> gateway reply) over all sessions, in ms."""
        parts = [np.fromiter(v.latency_ns, np.int64) for v in list(self._views.values()) if v.latency_ns]
        return np.concatenate(parts) / 1e6 if parts else np.zeros(0)

    def versions(self) -> list[dict]:
        """Versions with their state: the registry's when there is one, else what sessions act with."""
        acting: dict[tuple[str, int], int] = {}
        for s in list(self._gw.sessions.values()):
            acting[(s.policy.name, s.policy.version)] = acting.get((s.policy.name, s.policy.version), 0) + 1
        registry = getattr(self._gw, "registry", None)
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
        out.estops.extend(self.estops.values())
        return out


def _p50_p99(values) -> tuple[float, float]:
    """Nearest-rank percentiles of a small window (sorting 512 ints beats np.percentile's overhead 30x).

    >>> _p50_p99(range(1, 101))
    (50, 99)
    """
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)
    n = len(ordered)
    return ordered[max(0, -(-50 * n // 100) - 1)], ordered[max(0, -(-99 * n // 100) - 1)]

"""Per-session figures of a gateway's sessions (latency, step rate, returns, guard counts, held steps) and the
hot-path metrics they feed; what `tether status`, the console and /metrics show.

    figures = FleetFigures(GatewayMetrics(gateway))   # the gateway owns one: gateway.figures
    figures.opened(session, hello)                    # the Bridge servicer, once a session is open
    figures.observed(session, obs, reply)             # after every reply (cheap: the control path calls it)
    figures.closed(session)
    figures.rows(gateway.sessions, held=estops.holder)  # one dict per session (SessionStatus's fields + held_steps)

Episode returns and lengths that span an e-stop's hold count only the policy's steps. Bounded: a window of
latencies, reply times and returns per session, 500 returns per policy version.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from bridge.common.percentiles import p50_p99
from bridge.metrics import GUARD_KINDS, HOPS, GatewayMetrics, gateway_hops
from protos import bridge_pb2

Code = bridge_pb2.StepError.Code


@dataclass
class SessionFigures:
    """What is kept per connected session (bounded)."""

    session: object
    labels: dict[str, str]
    opened: float
    num_envs: int
    vector: bool
    latency_ns: deque = field(default_factory=lambda: deque(maxlen=512))
    hops_ns: deque = field(default_factory=lambda: deque(maxlen=256))    # gateway_hops tuples (HOPS order)
    client_ns: deque = field(default_factory=lambda: deque(maxlen=256))  # (reply, execution) the client told
    replies: deque = field(default_factory=lambda: deque(maxlen=64))      # monotonic times of answered steps
    returns: deque = field(default_factory=lambda: deque(maxlen=32))
    guard: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GUARD_KINDS, 0))
    last_error: str = ""
    held_steps: int = 0


class FleetFigures:
    """The figures of every connected session, and per policy version the recent episode returns."""

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics
        self._views: dict[str, SessionFigures] = {}
        self.returns: dict[tuple[str, int], deque] = {}    # (policy, version) -> (t_unix, episode return)
        self.total_rows = 0                                 # env steps answered (policy or safe)

    def opened(self, session, hello: bridge_pb2.Hello) -> None:
        n = getattr(session, "num_envs", None)
        self._views[session.id] = SessionFigures(session, dict(hello.labels), time.monotonic(), n or 1, n is not None)
        self.metrics.sessions_opened += 1

    def closed(self, session) -> None:
        view = self._views.get(session.id)
        if view is not None and view.session is session:
            del self._views[session.id]

    def observed(self, session, obs: bridge_pb2.Observation, reply: bridge_pb2.ServerMessage) -> None:
        """Metrics and figures of one answered observation (few proto reads)."""
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
            if sent:  # the robot's clock: the offset the client estimated applied
                view.latency_ns.append(t.gateway_send_ns - t.clock_offset_ns - sent)
            view.hops_ns.append(gateway_hops(t))
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
        if obs.HasField("client_hops"):
            c = obs.client_hops
            m.client(c)
            view.client_ns.append((c.reply_ns, c.execution_ns))
        if obs.HasField("guard"):
            g, seen = obs.guard, view.guard
            for k, now in (("clamped", g.clamped), ("rate_limited", g.rate_limited), ("watchdog", g.watchdog),
                           ("estop", g.estop)):
                if now > seen[k]:
                    m.guard_delta(k, now - seen[k])
                seen[k] = now

    def _ended(self, view: SessionFigures, policy: str, version: int, episode_return: float) -> None:
        view.returns.append(episode_return)
        self.metrics.episodes += 1
        series = self.returns.get((policy, version))
        if series is None:
            series = self.returns[(policy, version)] = deque(maxlen=500)
        series.append((time.time(), episode_return))

    def rows(self, sessions: Mapping[str, object], *, held: Callable[[object], object]) -> list[dict]:
        """One dict per connected session, by id; `held(session)` is truthy when an e-stop holds it."""
        now = time.monotonic()
        rows = []
        for sid, session in sorted(dict(sessions).items()):
            view = self._views.get(sid)
            if view is None:
                continue
            p50, p99 = p50_p99(view.latency_ns)
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
                estopped=bool(held(session)), edge_estopped=bool(g.estopped),
                last_error=view.last_error, connected_s=round(now - view.opened, 1),
                mean_return=round(float(np.mean(view.returns)), 3) if view.returns else 0.0,
                held_steps=view.held_steps, hop_p50_ms=hop_medians_ms(view)))
        return rows

    def latencies_ms(self) -> np.ndarray:
        """Recent per-step latencies (client send -> gateway reply) over all sessions, in ms."""
        parts = [np.fromiter(v.latency_ns, np.int64) for v in list(self._views.values()) if v.latency_ns]
        return np.concatenate(parts) / 1e6 if parts else np.zeros(0)


def hop_medians_ms(view: SessionFigures) -> dict[str, float]:
    """The session's recent latency budget: the median of each hop in ms (hops never measured left out)."""
    out = {}
    gateway = list(view.hops_ns)
    client = list(view.client_ns)
    for i, hop in enumerate(HOPS):
        if hop in ("reply", "execution"):
            values = [c[0 if hop == "reply" else 1] for c in client]
            values = [v for v in values if v > 0]
        else:
            values = [g[i] for g in gateway if g[i] is not None]
        if values:
            out[hop] = round(float(np.median(values)) / 1e6, 3)
    return out

"""Prometheus metrics of one gateway (`prometheus_client`, a registry of its own per gateway).

    metrics = GatewayMetrics(gateway)              # the gateway's sessions, log, registry, rollout
    metrics.step(timing, policy="hopper", version=3, rows=8)   # once per answered observation
    text = metrics.exposition()                    # what GET /metrics serves

Hot-path cost: a few pre-bound histogram/counter updates per step. Everything that is a state of
the gateway (sessions, versions served, policy lag, log bytes, trainer throughput) is read only
when scraped, by a collector, never on the control path.

Per-hop latency (`tether_hop_latency_seconds{hop}`) from an Action's Timing fields:
    client_to_gateway  t_sent -> gateway_recv   (the uplink; same clock on one machine, else skewed)
    gateway_in         gateway_recv -> infer_start   (validation, episode accounting)
    inference          infer_start -> infer_end   (micro-batch queue + Triton)
    gateway_out        infer_end -> gateway_send   (encoding the reply)
    gateway            gateway_recv -> gateway_send  (the gateway's whole share)
The downlink (gateway_send -> the client applying it) is measured by clients, not here.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

HOPS = ("client_to_gateway", "gateway_in", "inference", "gateway_out", "gateway")
LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3,
                   20e-3, 50e-3, 100e-3, 250e-3, 1.0)
GUARD_KINDS = ("clamped", "rate_limited", "watchdog", "estop")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    def __init__(self, gateway=None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.hop = Histogram("tether_hop_latency_seconds", "Per-hop latency of a control step, from Timing",
                             ["hop"], buckets=LATENCY_BUCKETS, registry=r)
        self._hops = [self.hop.labels(h) for h in HOPS]
        self.steps = Counter("tether_steps", "Env steps answered with a policy action", registry=r)
        self.actions = Counter("tether_actions", "Actions served per policy version (rows of vector sessions)",
                               ["policy", "version"], registry=r)
        self.errors = Counter("tether_step_errors", "Steps answered with an error, by code", ["code"], registry=r)
        self.episodes = Counter("tether_episodes", "Episodes ended", registry=r)
        self.held = Counter("tether_estop_steps", "Steps answered with the safe action under an operator e-stop",
                            registry=r)
        self.guard = Counter("tether_guard_interventions", "Edge safety-guard interventions reported by sessions",
                             ["kind"], registry=r)
        self._guard = {k: self.guard.labels(k) for k in GUARD_KINDS}
        self.sessions_opened = Counter("tether_sessions_opened", "Sessions opened", registry=r)
        self._actions: dict[tuple[str, int], object] = {}
        if gateway is not None:
            r.register(_GatewayState(gateway))

    def step(self, timing, *, policy: str, version: int, rows: int = 1) -> None:
        """One observation answered with an action of `rows` rows (timing: a bridge_pb2.Timing)."""
        sent, recv, start, end, out = (timing.t_sent_ns, timing.gateway_recv_ns, timing.infer_start_ns,
                                       timing.infer_end_ns, timing.gateway_send_ns)
        h = self._hops
        if sent and recv >= sent:
            h[0].observe((recv - sent) * 1e-9)
        h[1].observe((start - recv) * 1e-9)
        h[2].observe((end - start) * 1e-9)
        h[3].observe((out - end) * 1e-9)
        h[4].observe((out - recv) * 1e-9)
        self.steps.inc(rows)
        key = (policy, version)
        child = self._actions.get(key)
        if child is None:
            child = self._actions[key] = self.actions.labels(policy, str(version))
        child.inc(rows)

    def guard_delta(self, kind: str, n: int) -> None:
        if n > 0:
            self._guard[kind].inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _GatewayState(Collector):
    """Gauges read at scrape time from the gateway (nothing on the control path)."""

    def __init__(self, gateway):
        self._gw = gateway
        self._trainer: dict[str, tuple[float, int]] = {}   # policy -> (t, trainer_step) at the previous scrape

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        gw = self._gw
        sessions = list(gw.sessions.values())
        yield _gauge("tether_sessions", "Connected sessions", len(sessions))
        yield _gauge("tether_envs", "Connected envs (vector sessions count N)",
                     sum(getattr(s, "num_envs", 1) for s in sessions))
        served = GaugeMetricFamily("tether_version_sessions", "Sessions acting with each policy version",
                                   labels=["policy", "version"])
        acting: dict[tuple[str, int], int] = {}
        for s in sessions:
            key = (s.policy.name, s.policy.version)
            acting[key] = acting.get(key, 0) + 1
        for (policy, version), n in sorted(acting.items()):
            served.add_metric([policy, str(version)], n)
        yield served
        lag = GaugeMetricFamily("tether_policy_lag_versions",
                                "How many versions the furthest-behind session lags the trainer's newest version",
                                labels=["policy"])
        fresh = _call(getattr(getattr(gw, "rollout", None), "freshness", None))
        policies = fresh.get("policies") if isinstance(fresh, dict) else None
        if isinstance(policies, dict):  # the rollout controller's view (rolled-back versions are not "newest")
            seconds = GaugeMetricFamily("tether_policy_lag_seconds", "How long the trainer's newest version has "
                                        "existed while a session acts with an older one", labels=["policy"])
            for policy, f in sorted(policies.items()):
                lag.add_metric([policy], f.get("max_version_lag", 0))
                seconds.add_metric([policy], f.get("max_time_lag_s", 0.0))
            yield lag
            yield seconds
        else:
            for policy, newest in _newest_versions(gw).items():
                oldest = min((v for (p, v) in acting if p == policy), default=newest)
                lag.add_metric([policy], max(0, newest - oldest))
            yield lag
        experience = getattr(gw, "experience", None)
        if experience is not None:
            stats = experience.stats  # a property: LogStats
            yield _gauge("tether_log_bytes", "Experience log message bytes written since start", stats.bytes)
            yield _gauge("tether_log_transitions", "Transitions appended to the experience log", stats.appended)
        throughput = GaugeMetricFamily("tether_trainer_steps_per_second",
                                       "Trainer optimiser steps per second, from the lineage of published versions",
                                       labels=["policy"])
        for policy, rate in self._trainer_rates(gw).items():
            throughput.add_metric([policy], rate)
        yield throughput

    def _trainer_rates(self, gw) -> dict[str, float]:
        """From the two newest versions' lineage (trainer_step) and creation times, when a registry has them."""
        registry = getattr(gw, "registry", None)
        rates = {}
        if registry is None:
            return rates
        try:
            for policy in registry.policies():
                records = [r for r in registry.versions(policy) if r.lineage.get("trainer_step")]
                if len(records) >= 2:
                    a, b = records[-2], records[-1]
                    dt = (b.created_ns - a.created_ns) * 1e-9
                    steps = int(b.lineage["trainer_step"]) - int(a.lineage["trainer_step"])
                    if dt > 0 and steps >= 0:
                        rates[policy] = steps / dt
        except Exception:  # a scrape never fails on a registry problem; the console shows it
            return rates
        return rates


def _newest_versions(gw) -> dict[str, int]:
    newest: dict[str, int] = {}
    registry = getattr(gw, "registry", None)
    if registry is not None:
        try:
            for policy in registry.policies():
                versions = [r.version for r in registry.versions(policy)]
                if versions:
                    newest[policy] = max(versions)
        except Exception:
            pass
    for s in gw.sessions.values():
        newest[s.policy.name] = max(newest.get(s.policy.name, 0), s.policy.version)
    return newest


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _call(fn):
    if fn is None:
        return None
    try:
        return fn()
    except Exception:
        return None

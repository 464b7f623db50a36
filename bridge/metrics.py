"""Prometheus metrics of one gateway (`prometheus_client`, a registry of its own per gateway).

    metrics = GatewayMetrics(gateway)              # a MetricsSource (below): sessions, log, registry,
                                                   # rollout; read at scrape time only
    metrics.step(timing, policy="hopper", version=3, rows=8)   # once per answered observation
    text = metrics.exposition()                    # what GET /metrics serves

Hot-path cost: a few plain-number updates per step (no locks: the event loop's thread only; the
prometheus_client families are built when scraped). Everything that is a state of
the gateway (sessions, versions served, policy lag, log bytes, trainer throughput) is read only
when scraped, by a collector, never on the control path.

Per-hop latency (`tether_hop_latency_seconds{hop}`), the latency budget of a step in the robot's clock
(the client's offset estimate, Timing.clock_offset_ns, applied; see bridge.client.clock):
    observation_age  t_sent -> gateway_recv        (the uplink: how old the observation is on arrival)
    checks           gateway_recv -> infer_start   (spec checks, image decoding, episode accounting)
    queue            infer_start -> batch_start    (waiting for a batch slot)
    batch            batch_start -> triton_start   (forming the batch)
    triton           triton_start -> triton_end    (the Triton call)
    respond          triton_end -> gateway_send    (rows back, the reply encoded)
    reply            gateway_send -> the client has it      } told by the client with its next
    execution        the client has it -> the first action  } observation (Observation.client_hops)
    gateway          gateway_recv -> gateway_send  (the gateway's whole share)
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from bridge.registry.newest import newest_versions, version_lags
from bridge.registry.view import view_of
from protos.timing import HOPS, gateway_hops  # the hops of a Timing; re-exported for the gateway's views

if TYPE_CHECKING:
    from bridge.experience import LogStats
    from bridge.registry import Registry

LATENCY_BUCKETS = (50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3,
                   20e-3, 50e-3, 100e-3, 250e-3, 1.0)
GUARD_KINDS = ("clamped", "rate_limited", "watchdog", "estop")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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


class Histogram:
    """Bucket counts and a sum, no lock: updated and read on the gateway's event loop thread only
    (prometheus_client's own Histogram takes a lock per observation: ~5x the cost on the control path).

    >>> h = Histogram((0.001, 0.01)); h.observe(0.0005); h.observe(0.005); h.observe(2.0)
    >>> h.cumulative(), round(h.sum, 4)
    ([('0.001', 1), ('0.01', 2), ('+Inf', 3)], 2.0055)
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1   # le semantics: value <= bound
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class GatewayMetrics:
    """Hot-path counters as plain numbers; `exposition()` turns them and the gateway's state into families."""

    def __init__(self, gateway: MetricsSource | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        self.hops = {hop: Histogram(LATENCY_BUCKETS) for hop in HOPS}
        self._h = [self.hops[h] for h in HOPS]
        self.steps = 0                                   # env steps answered with a policy action
        self.actions: dict[tuple[str, int], int] = {}    # (policy, version) -> action rows served
        self.errors: dict[str, int] = {}                 # StepError code name -> steps
        self.episodes = 0
        self.held = 0                                    # env steps answered with the safe action (e-stop)
        self.guard = dict.fromkeys(GUARD_KINDS, 0)       # edge guard interventions (deltas of the reports)
        self.sessions_opened = 0
        self.registry.register(_Counters(self))
        if gateway is not None:
            self.registry.register(_GatewayState(gateway))

    def step(self, timing, *, policy: str, version: int, rows: int = 1) -> None:
        """One observation answered with an action of `rows` rows (timing: a bridge_pb2.Timing)."""
        for hop, ns in zip(self._h, gateway_hops(timing), strict=True):
            if ns is not None:
                hop.observe(max(ns, 0) * 1e-9)
        self.steps += rows
        key = (policy, version)
        self.actions[key] = self.actions.get(key, 0) + rows

    def client(self, hops) -> None:
        """The client's side of a reply (a tether.v1 ClientHops): its reply and execution hops."""
        if hops.reply_ns > 0:
            self.hops["reply"].observe(hops.reply_ns * 1e-9)
        if hops.execution_ns > 0:
            self.hops["execution"].observe(hops.execution_ns * 1e-9)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def guard_delta(self, kind: str, n: int) -> None:
        if n > 0:
            self.guard[kind] += n

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Counters(Collector):
    def __init__(self, metrics: GatewayMetrics):
        self._m = metrics

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        m = self._m
        hops = HistogramMetricFamily("tether_hop_latency_seconds", "Per-hop latency of a control step, from Timing",
                                     labels=["hop"])
        for hop, h in m.hops.items():
            hops.add_metric([hop], h.cumulative(), sum_value=h.sum)
        yield hops
        yield CounterMetricFamily("tether_steps", "Env steps answered with a policy action", value=m.steps)
        yield _labelled(CounterMetricFamily, "tether_actions", "Action rows served per policy version",
                        ["policy", "version"], (([p, str(v)], n) for (p, v), n in sorted(m.actions.items())))
        yield _labelled(CounterMetricFamily, "tether_step_errors", "Steps answered with an error, by code", ["code"],
                        (([code], n) for code, n in sorted(m.errors.items())))
        yield CounterMetricFamily("tether_episodes", "Episodes ended", value=m.episodes)
        yield CounterMetricFamily("tether_estop_steps", "Env steps answered with the safe action under an "
                                  "operator e-stop", value=m.held)
        yield _labelled(CounterMetricFamily, "tether_guard_interventions", "Edge safety-guard interventions "
                        "reported by sessions", ["kind"], (([kind], n) for kind, n in m.guard.items()))
        yield CounterMetricFamily("tether_sessions_opened", "Sessions opened", value=m.sessions_opened)


class _GatewayState(Collector):
    """Gauges read at scrape time from the gateway (nothing on the control path)."""

    def __init__(self, gateway: MetricsSource):
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
        acting = Counter((s.policy.name, s.policy.version) for s in sessions)
        yield _labelled(GaugeMetricFamily, "tether_version_sessions", "Sessions acting with each policy version",
                        ["policy", "version"], (([p, str(v)], n) for (p, v), n in sorted(acting.items())))
        lag = GaugeMetricFamily("tether_policy_lag_versions",
                                "How many versions the furthest-behind session lags the trainer's newest version",
                                labels=["policy"])
        fresh = _call(gw.rollout.freshness) if gw.rollout is not None else None
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
            for policy, behind in version_lags(_newest_versions(gw, acting), acting).items():
                lag.add_metric([policy], behind)
            yield lag
        experience = gw.experience
        if experience is not None:
            stats = experience.stats  # a property: LogStats
            yield _gauge("tether_log_bytes", "Experience log message bytes written since start", stats.bytes)
            yield _gauge("tether_log_transitions", "Transitions appended to the experience log", stats.appended)
            yield _gauge("tether_experience_degraded", "1 while the experience log's disk refuses writes (sessions "
                         "act on; nothing becomes durable; the writer retries)", 1 if stats.degraded else 0)
            yield _gauge("tether_experience_pending", "Transitions accepted by the log, not yet on disk", stats.pending)
            yield _gauge("tether_experience_pending_bytes", "Their serialized size", stats.pending_bytes)
            yield CounterMetricFamily("tether_experience_refused", "Transitions not logged: the log's bound "
                                      "(--log-max-pending), or their session past a refused one", value=stats.refused)
            yield CounterMetricFamily("tether_experience_write_errors", "Failed writes/fsyncs of the log (each "
                                      "retried)", value=stats.write_errors)
            yield CounterMetricFamily("tether_experience_pruned_segments", "Segments deleted by retention",
                                      value=stats.pruned)
            stream = getattr(experience, "second", experience).stats  # the JetStream log's, alone or tee'd
            if hasattr(stream, "foreign_duplicates"):
                yield CounterMetricFamily("tether_stream_foreign_duplicates", "Duplicate acknowledgements from the "
                                          "stream whose stored message is not this transition (a forged or replayed "
                                          "message id): never counted durable", value=stream.foreign_duplicates)
                yield CounterMetricFamily("tether_stream_untrusted", "Messages read back for a moved session whose "
                                          "message id is not that session's own: ignored", value=stream.untrusted)
        yield _labelled(GaugeMetricFamily, "tether_trainer_steps_per_second", "Trainer optimiser steps per second, "
                        "from the lineage of published versions", ["policy"],
                        (([policy], rate) for policy, rate in self._trainer_rates(gw).items()))

    def _trainer_rates(self, gw) -> dict[str, float]:
        """From the two newest versions' lineage (trainer_step) and creation times, when a registry has them (a
        shared one's snapshot: a scrape never waits on PostgreSQL, bridge.registry.view)."""
        registry = view_of(gw.registry)
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


def _newest_versions(gw: MetricsSource, acting: Iterable[tuple[str, int]]) -> dict[str, int]:
    """bridge.registry.newest over the registry's policies and the acting versions; the sessions' alone when the
    registry cannot be read (a scrape never fails on it)."""
    try:
        return newest_versions(view_of(gw.registry), acting)
    except Exception:
        return newest_versions(None, acting)


def _labelled(family: type, name: str, doc: str, labels: list[str], samples: Iterable[tuple[list[str], float]]):
    """A `family` (CounterMetricFamily, GaugeMetricFamily) with one sample per (label values, value)."""
    metric = family(name, doc, labels=labels)
    for values, value in samples:
        metric.add_metric(values, value)
    return metric


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _call(fn):
    if fn is None:
        return None
    try:
        return fn()
    except Exception:
        return None

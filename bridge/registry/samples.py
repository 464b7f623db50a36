"""What every gateway's sessions show, for the one gateway that judges: on a shared registry each gateway ships
what its sessions fed the rollout's statistics and regression monitor (episode returns exactly; steps and shadow
comparisons as counts with a bounded sample of latencies and divergences) to the `monitor_samples` table, and the
leader feeds the other gateways' rows into its own (bridge.gateway.rollout.follow), so a canary is judged on the
whole fleet's sessions, wherever they are connected.

    tap = SampleTap()                                   # the router calls tap.step / tap.episode / tap.shadow
    shipper = SampleShipper(url, gateway="host:pid")    # a connection of its own (no epoch bump, no NOTIFY)
    shipper.ship(tap.drain())                           # every ~0.5 s, from a thread
    for policy, version, bucket in shipper.others():    # on the leader: the other gateways' new rows
        ...

Rows older than `KEEP_S` are deleted by the leader. The table is migration 4 (bridge.registry.migrations).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from dataclasses import dataclass, field

from bridge.registry.backends import connect

LATENCY_SAMPLES = 64   # latencies (and shadow divergences) kept per (policy, version) per shipment: a reservoir
KEEP_S = 600.0


@dataclass
class Bucket:
    returns: list[float] = field(default_factory=list)
    steps: int = 0
    errors: int = 0
    guard: int = 0
    latencies: list[float] = field(default_factory=list)
    shadow_steps: int = 0
    shadow_failed: int = 0
    divergences: list[float] = field(default_factory=list)
    interventions: int = 0  # env steps a person's command acted (of env_steps)
    env_steps: int = 0      # env steps of those steps (a vectorised session's step has N; 0: rows before migration 5)


class SampleTap:
    """Per (policy, version): what the monitor was fed since the last `drain()`. Called on the event loop."""

    def __init__(self, *, rng: random.Random | None = None):
        self._buckets: dict[tuple[str, int], Bucket] = {}
        self._rng = rng or random.Random(0)
        self._lock = threading.Lock()

    def step(self, policy: str, version: int, latency_s: float, error: bool, guard: int, *, interventions: int = 0,
             env_steps: int = 1) -> None:
        with self._lock:
            b = self._buckets.setdefault((policy, version), Bucket())
            b.steps += 1
            b.interventions += int(interventions)
            b.env_steps += int(env_steps)
            b.errors += bool(error)
            b.guard += int(guard)
            self._keep(b.latencies, b.steps, float(latency_s))

    def shadow(self, policy: str, version: int, divergence: float | None) -> None:
        with self._lock:
            b = self._buckets.setdefault((policy, version), Bucket())
            b.shadow_steps += 1
            if divergence is None:
                b.shadow_failed += 1
            else:
                self._keep(b.divergences, b.shadow_steps - b.shadow_failed, float(divergence))

    def _keep(self, sample: list[float], seen: int, value: float) -> None:
        if len(sample) < LATENCY_SAMPLES:
            sample.append(value)
        elif (i := self._rng.randrange(seen)) < LATENCY_SAMPLES:
            sample[i] = value

    def episode(self, policy: str, version: int, episode_return: float) -> None:
        with self._lock:
            self._buckets.setdefault((policy, version), Bucket()).returns.append(float(episode_return))

    def drain(self) -> dict[tuple[str, int], Bucket]:
        with self._lock:
            buckets, self._buckets = self._buckets, {}
        return buckets


class SampleShipper:
    """The monitor_samples rows of one gateway (`ship`) and, on the leader, the others' new rows (`others`).
    Its own connection, reopened after a failure; while the database is away, shipments are dropped (the
    leader judges from what it has)."""

    def __init__(self, url: str, *, gateway: str):
        self.url, self.gateway = url, gateway
        self._conn = None
        self._seen = None  # the last row id fed: None until the first `others()` (then from the newest)

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, application_name=f"tether-samples {self.gateway}")
        return self._conn

    def ship(self, buckets: dict[tuple[str, int], Bucket]) -> None:
        if not buckets:
            return
        now = time.time_ns()
        rows = [(self.gateway, policy, version, now, json.dumps(b.returns), b.steps, b.errors, b.guard,
                 json.dumps(b.latencies), b.shadow_steps, b.shadow_failed, json.dumps(b.divergences), b.interventions,
                 b.env_steps)
                for (policy, version), b in buckets.items()]
        try:
            with self._connection().cursor() as cur:
                cur.executemany("INSERT INTO monitor_samples (gateway, policy, version, t_ns, returns, steps, errors, "
                                "guard, latencies, shadow_steps, shadow_failed, divergences, interventions, env_steps) "
                                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)
        except Exception:
            self.close()
            raise

    def others(self) -> list[tuple[str, int, Bucket]]:
        """The other gateways' rows since the last call (the first call: those of the last minute)."""
        try:
            conn = self._connection()
            if self._seen is None:  # a new leader: what the others showed in the last minute, then onwards
                self._seen = conn.execute("SELECT coalesce(max(id), 0) FROM monitor_samples WHERE t_ns < %s",
                                          (time.time_ns() - int(60e9),)).fetchone()[0]
            rows = conn.execute("SELECT id, policy, version, returns, steps, errors, guard, latencies, shadow_steps, "
                                "shadow_failed, divergences, interventions, env_steps FROM monitor_samples "
                                "WHERE id > %s AND gateway <> %s "
                                "ORDER BY id LIMIT 10000",
                                (self._seen, self.gateway)).fetchall()
            if rows:
                self._seen = rows[-1][0]
            conn.execute("DELETE FROM monitor_samples WHERE t_ns < %s", (time.time_ns() - int(KEEP_S * 1e9),))
        except Exception:
            self.close()
            raise
        return [(r[1], r[2], Bucket(json.loads(r[3]), r[4], r[5], r[6], json.loads(r[7]), r[8], r[9],
                                    json.loads(r[10]), r[11], r[12])) for r in rows]

    def forget_position(self) -> None:
        """Leadership was lost: the next `others()` starts from the newest row again."""
        self._seen = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

"""Read models of the rollout: how fresh each session's acting version is against the trainer's newest one.

    fresh = Freshness(registry)
    fresh.numbered("hopper", 7)                     # a publish numbered v7 (the newest now, from this moment)
    fresh.withdrawn("hopper")                       # it was rejected: the newest is read from the registry again
    fresh.report(controller.rollouts(), sessions)   # {"sessions": {id: {...}}, "policies": {name: {...}}}

Sessions are anything with `.id` and `.policy` (a ServedPolicy: `.name`, `.version`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import numpy as np

from bridge.registry import Registry, Rollout
from bridge.registry.newest import newest_record


class Freshness:
    """Per session and per policy: the version lag behind the newest version and for how long it has lasted."""

    def __init__(self, registry: Registry, *, view=None):
        """`view`: a shared registry's snapshot (bridge.registry.view): read from memory at every report, never
        cached, so the event loop never waits on the database and a rejection shows once the view has it."""
        self._registry, self._view = registry, view
        self._newest: dict[str, tuple[int, int] | None] = {}  # policy -> (newest non-rejected version, created_ns)

    def numbered(self, name: str, version: int) -> None:
        self._newest[name] = (version, time.time_ns())

    def withdrawn(self, name: str) -> None:
        self._newest.pop(name, None)

    def newest(self, name: str) -> tuple[int, int] | None:
        """(version, created_ns) of the newest version not rejected, or None when there is none."""
        if name not in self._newest and self._view is not None:
            record = newest_record(self._view.versions(name), rejected=False)
            return (record.version, record.created_ns) if record is not None else None
        if name not in self._newest:
            record = newest_record(self._registry.versions(name), rejected=False)  # bridge.registry.newest
            self._newest[name] = (record.version, record.created_ns) if record is not None else None
        return self._newest[name]

    def report(self, rollouts: Mapping[str, Rollout], sessions: Iterable) -> dict:
        """Per session: policy, version, newest, version_lag, time_lag_s (how long the newest has existed while
        an older one acts); per policy of `rollouts`: newest, live, sessions, max/mean version lag, max time lag."""
        now = time.time_ns()
        newest = {name: self.newest(name) for name in rollouts}
        rows = {}
        for s in sessions:
            top = newest.get(s.policy.name)
            if top is None:
                continue
            lag = max(0, top[0] - s.policy.version)
            rows[s.id] = {"policy": s.policy.name, "version": s.policy.version, "newest": top[0],
                          "version_lag": lag, "time_lag_s": (now - top[1]) / 1e9 if lag else 0.0}
        fleet = {}
        for name, top in newest.items():
            if top is None:
                continue
            mine = [v for v in rows.values() if v["policy"] == name]
            fleet[name] = {"newest": top[0], "live": rollouts[name].live, "sessions": len(mine),
                           "max_version_lag": max((r["version_lag"] for r in mine), default=0),
                           "mean_version_lag": float(np.mean([r["version_lag"] for r in mine])) if mine else 0.0,
                           "max_time_lag_s": max((r["time_lag_s"] for r in mine), default=0.0)}
        return {"sessions": rows, "policies": fleet}

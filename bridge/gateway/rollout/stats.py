"""Runtime figures per policy version, as sessions act with it (and as its shadow is compared).

    stats = VersionStats()
    stats.step("hopper", 3, latency_s=0.0012, error=False, guard=0, interventions=1)   # a person acted
    stats.episode("hopper", 3, episode_return=412.0)
    stats.shadow("hopper", 4, divergence=0.03)
    stats.table("hopper")[3]["latency_p99_ms"]

Bounded memory: latencies and returns are rolling windows; counters are plain integers. Percentiles are
nearest rank (bridge.common.percentiles): a latency that happened, the same definition as every other p50/p99.

    >>> s = VersionStats(window=4)
    >>> for ms in (1, 2, 3, 4, 100):
    ...     s.step("p", 1, latency_s=ms / 1e3, error=False, guard=0)
    >>> s.episode("p", 1, episode_return=10.0)
    >>> row = s.table("p")[1]
    >>> row["steps"], row["episodes"], row["mean_return"], row["latency_p50_ms"]   # window (2, 3, 4, 100) ms
    (5, 1, 10.0, 3.0)

The intervention rate is over env steps: a vectorised session's step brings `env_steps` of them.

    >>> s.step("p", 1, latency_s=0.001, error=False, guard=0, interventions=3, env_steps=5)
    >>> s.get("p", 1)["intervention_steps"], s.get("p", 1)["intervention_rate"]    # 3 of 5 + 5
    (3, 0.3)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from bridge.common.percentiles import p50_p99


@dataclass
class _Figures:
    window: int
    steps: int = 0
    episodes: int = 0
    errors: int = 0
    guard: int = 0
    shadow_steps: int = 0
    shadow_errors: int = 0
    divergence_sum: float = 0.0
    env_steps: int = 0           # answered env steps (a vectorised session's step: one per env)
    interventions: int = 0       # of them, steps a person's command acted instead (Observation.intervention)
    latencies: deque = field(init=False)
    returns: deque = field(init=False)

    def __post_init__(self):
        self.latencies = deque(maxlen=self.window)
        self.returns = deque(maxlen=self.window)

    def row(self) -> dict[str, float]:
        p50, p99 = p50_p99(self.latencies)  # nearest rank (bridge.common.percentiles), as every other p99
        return {"steps": self.steps, "episodes": self.episodes,
                "mean_return": float(np.mean(self.returns)) if self.returns else 0.0,
                "latency_p50_ms": float(p50) * 1e3, "latency_p99_ms": float(p99) * 1e3,
                "errors": self.errors, "guard_interventions": self.guard,
                "shadow_steps": self.shadow_steps, "shadow_errors": self.shadow_errors,
                "shadow_divergence": self.divergence_sum / self.shadow_steps if self.shadow_steps else 0.0,
                "intervention_steps": self.interventions,
                "intervention_rate": self.interventions / self.env_steps if self.env_steps else 0.0}


class VersionStats:
    """Per (policy, version): steps, episodes, mean return, step latency p50/p99, errors, guard
    interventions, shadow steps and mean shadow divergence (mean absolute action difference), and the steps a
    person's command acted instead of it (intervention_steps, intervention_rate over env steps)."""

    def __init__(self, *, window: int = 4096):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._window = window
        self._by: dict[tuple[str, int], _Figures] = {}

    def _of(self, policy: str, version: int) -> _Figures:
        key = (policy, version)
        figures = self._by.get(key)
        if figures is None:
            figures = self._by[key] = _Figures(self._window)
        return figures

    def step(self, policy: str, version: int, *, latency_s: float, error: bool, guard: int, interventions: int = 0,
             env_steps: int = 1) -> None:
        """One step; `interventions` of its `env_steps` env steps reported a person's command applied."""
        f = self._of(policy, version)
        if error:
            f.errors += 1
        else:
            f.steps += 1
            f.env_steps += env_steps
            f.latencies.append(latency_s)
        f.guard += guard
        f.interventions += interventions

    def episode(self, policy: str, version: int, *, episode_return: float) -> None:
        f = self._of(policy, version)
        f.episodes += 1
        f.returns.append(episode_return)

    def shadow(self, policy: str, version: int, *, divergence: float | None) -> None:
        """One shadow inference compared (None: it failed or missed its deadline)."""
        f = self._of(policy, version)
        if divergence is None:
            f.shadow_errors += 1
        else:
            f.shadow_steps += 1
            f.divergence_sum += divergence

    def get(self, policy: str, version: int) -> dict[str, float]:
        return self._of(policy, version).row()

    def table(self, policy: str) -> dict[int, dict[str, float]]:
        return {v: f.row() for (p, v), f in sorted(self._by.items()) if p == policy}

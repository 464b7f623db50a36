"""Has a canary or live version regressed against the incumbent? Pure bookkeeping over rolling windows, one monitor
per policy; the caller feeds samples and acts on the verdict (e.g. `registry.move(..., State.ROLLED_BACK)`).

    monitor = RegressionMonitor(Thresholds(min_return_ratio=0.8, min_episodes=5))
    monitor.observe_step(version, latency_s=0.0012, error=False, guard_interventions=0)    # every step
    monitor.observe_episode(version, episode_return=431.0)                                  # every episode end
    verdict = monitor.verdict(candidate=4, incumbent=3)
    if verdict.regressed: registry.move(policy, 4, State.ROLLED_BACK, who="auto", why=verdict.reason)

>>> m = RegressionMonitor(Thresholds(min_episodes=2, min_steps=2))
>>> for v, ret in ((3, 480.0), (3, 480.0), (4, 12.0), (4, 12.0)):
...     m.observe_episode(v, ret); m.observe_step(v, latency_s=0.001, error=False, guard_interventions=0)
>>> m.verdict(4, 3).reason
'episode return 12.0 vs 480.0 of v3 (ratio 0.03 < 0.8)'
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields

from bridge.common.percentiles import percentile_sorted


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    min_return_ratio: float = 0.8  # candidate mean return >= ratio x incumbent's (negative returns: same margin)
    max_guard_per_1k_steps: float = 20.0  # guard interventions per 1000 steps
    max_latency_p99_ratio: float = 2.0  # step latency p99 vs max(incumbent p99, latency_floor_s)
    latency_floor_s: float = 0.002  # below this, latency differences are jitter, not regressions
    max_error_rate: float = 0.01  # failed steps / steps
    min_episodes: int = 5  # before judging returns
    min_steps: int = 200  # before judging anything per step
    window_episodes: int = 200  # rolling windows: memory is bounded whatever runs
    window_steps: int = 5000
    max_versions: int = 16  # versions tracked at once; the least recently fed is forgotten first

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"threshold {f.name}={value!r} is not a finite number >= 0")
        for name in ("window_episodes", "window_steps", "max_versions", "min_episodes", "min_steps"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"threshold {name}={getattr(self, name)!r} is not an integer")
        for name in ("window_episodes", "window_steps", "max_versions"):
            if getattr(self, name) < 1:
                raise ValueError(f"threshold {name}={getattr(self, name)!r} is not >= 1")
        if self.min_return_ratio > 1:
            raise ValueError(f"threshold min_return_ratio={self.min_return_ratio!r} is not in [0, 1]")
        if self.min_episodes > self.window_episodes or self.min_steps > self.window_steps:
            raise ValueError(f"min_episodes/min_steps ({self.min_episodes}/{self.min_steps}) exceed their windows "
                             f"({self.window_episodes}/{self.window_steps})")


@dataclass(frozen=True)
class Verdict:
    regressed: bool
    reason: str  # why it regressed, or why it is fine / not judged yet
    figures: dict[str, float] = field(default_factory=dict)
    judged: bool = True  # False while the candidate has fewer samples than the thresholds' minimums


class _Window:
    def __init__(self, t: Thresholds):
        self.returns: deque[float] = deque(maxlen=t.window_episodes)
        self.latency: deque[float] = deque(maxlen=t.window_steps)
        self.errors: deque[bool] = deque(maxlen=t.window_steps)
        self.guard: deque[int] = deque(maxlen=t.window_steps)
        self.interventions: deque[float] = deque(maxlen=t.window_steps)  # per step: the share a person acted

    def figures(self, prefix: str) -> dict[str, float]:
        steps = len(self.latency)
        out = {f"{prefix}episodes": float(len(self.returns)), f"{prefix}steps": float(steps)}
        if self.returns:
            out[f"{prefix}return_mean"] = sum(self.returns) / len(self.returns)
        if steps:
            ordered = sorted(self.latency)
            out[f"{prefix}latency_p50_s"] = percentile_sorted(ordered, 50)
            out[f"{prefix}latency_p99_s"] = percentile_sorted(ordered, 99)
            out[f"{prefix}error_rate"] = sum(self.errors) / steps
            out[f"{prefix}guard_per_1k_steps"] = 1000.0 * sum(self.guard) / steps
            out[f"{prefix}intervention_rate"] = sum(self.interventions) / steps
        return out


class RegressionMonitor:
    """Per-version rolling samples of one policy and the verdict of a candidate against an incumbent."""

    def __init__(self, thresholds: Thresholds | None = None):
        self.thresholds = thresholds or Thresholds()
        self._windows: OrderedDict[int, _Window] = OrderedDict()

    def observe_episode(self, version: int, episode_return: float) -> None:
        self._window(version).returns.append(float(episode_return))

    def observe_step(self, version: int, latency_s: float, error: bool, guard_interventions: int, *,
                     interventions: float = 0.0) -> None:
        """`interventions`: the share of the step's env steps a person's command acted (0 or 1 for one env);
        recorded in the figures (`intervention_rate`), not judged."""
        w = self._window(version)
        w.latency.append(float(latency_s))
        w.errors.append(bool(error))
        w.guard.append(int(guard_interventions))
        w.interventions.append(float(interventions))

    def forget(self, version: int) -> None:
        self._windows.pop(version, None)

    def summary(self, version: int) -> dict[str, float]:
        """episodes, steps, return_mean, latency_p50_s/p99_s, error_rate, guard_per_1k_steps, intervention_rate
        over the windows."""
        w = self._windows.get(version)
        return w.figures("") if w is not None else {"episodes": 0.0, "steps": 0.0}

    def verdict(self, candidate: int, incumbent: int | None) -> Verdict:
        """Whether `candidate` is worse than `incumbent` (None: absolute checks only) beyond the thresholds."""
        t = self.thresholds
        c = self.summary(candidate)
        figures = dict(c)
        i: dict[str, float] = {}
        if incumbent is not None and incumbent != candidate:
            i = self.summary(incumbent)
            figures.update({f"incumbent_{k}": v for k, v in i.items()})
        episodes_ok, steps_ok = c["episodes"] >= t.min_episodes, c["steps"] >= t.min_steps
        reasons = []
        if steps_ok:
            if c["error_rate"] > t.max_error_rate:
                reasons.append(f"error rate {c['error_rate']:.3g} > {t.max_error_rate:g}")
            if c["guard_per_1k_steps"] > t.max_guard_per_1k_steps:
                reasons.append(f"guard interventions {c['guard_per_1k_steps']:.3g} per 1k steps > "
                               f"{t.max_guard_per_1k_steps:g}")
            if i.get("steps", 0) >= t.min_steps:
                base = max(i["latency_p99_s"], t.latency_floor_s)
                figures["latency_p99_ratio"] = ratio = c["latency_p99_s"] / base
                if ratio > t.max_latency_p99_ratio:
                    reasons.append(f"step latency p99 {c['latency_p99_s'] * 1e3:.3g} ms vs "
                                   f"{i['latency_p99_s'] * 1e3:.3g} ms of v{incumbent} (ratio {ratio:.2f} > "
                                   f"{t.max_latency_p99_ratio:g})")
        if episodes_ok and i.get("episodes", 0) >= t.min_episodes:
            cand, inc = c["return_mean"], i["return_mean"]
            floor = inc - (1.0 - t.min_return_ratio) * abs(inc)
            figures["return_floor"] = floor
            if inc > 0:
                figures["return_ratio"] = cand / inc
            if cand < floor:
                how = (f"ratio {cand / inc:.2f} < {t.min_return_ratio:g}" if inc > 0
                       else f"below {_num(floor)} = incumbent - {1.0 - t.min_return_ratio:g} x |incumbent|")
                reasons.append(f"episode return {_num(cand)} vs {_num(inc)} of v{incumbent} ({how})")
        if reasons:
            return Verdict(True, "; ".join(reasons), figures)
        if not (episodes_ok and steps_ok):
            return Verdict(False, f"not judged yet: v{candidate} has {c['episodes']:.0f}/{t.min_episodes} episodes "
                                  f"and {c['steps']:.0f}/{t.min_steps} steps", figures, judged=False)
        versus = f"v{incumbent}" if i.get("episodes", 0) >= t.min_episodes else "its thresholds (no incumbent data)"
        return Verdict(False, f"v{candidate} within thresholds vs {versus}", figures)

    def _window(self, version: int) -> _Window:
        w = self._windows.get(version)
        if w is None:
            w = self._windows[version] = _Window(self.thresholds)
            while len(self._windows) > self.thresholds.max_versions:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(version)
        return w


def _num(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.3g}"

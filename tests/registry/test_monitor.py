"""RegressionMonitor verdicts on synthetic samples; bounded memory."""

from __future__ import annotations

import random

import pytest

from bridge.registry import RegressionMonitor, Thresholds

T = Thresholds(min_episodes=5, min_steps=100, window_episodes=50, window_steps=1000)


def feed(m: RegressionMonitor, version: int, *, returns: float, n_episodes: int = 10, n_steps: int = 300,
         latency_s: float = 0.001, error_every: int = 0, guard_every: int = 0, seed: int = 0) -> None:
    rng = random.Random(seed)
    for i in range(n_steps):
        m.observe_step(version, latency_s=latency_s * rng.uniform(0.8, 1.2),
                       error=bool(error_every) and i % error_every == 0,
                       guard_interventions=1 if guard_every and i % guard_every == 0 else 0)
    for _ in range(n_episodes):
        m.observe_episode(version, returns + rng.uniform(-1, 1))


def test_healthy_candidate_passes():
    m = RegressionMonitor(T)
    feed(m, 3, returns=480.0)
    feed(m, 4, returns=470.0, seed=1)
    v = m.verdict(4, 3)
    assert (v.regressed, v.judged) == (False, True) and v.reason == "v4 within thresholds vs v3"
    assert v.figures["return_ratio"] == pytest.approx(470 / 480, abs=0.01) and v.figures["incumbent_episodes"] == 10


def test_worse_returns_regress_with_the_figures_in_the_reason():
    m = RegressionMonitor(T)
    feed(m, 3, returns=480.0)
    feed(m, 4, returns=12.0)
    v = m.verdict(4, 3)
    assert v.regressed and v.reason.startswith("episode return 1") and "of v3 (ratio 0.0" in v.reason
    assert "< 0.8)" in v.reason and v.figures["return_mean"] < 13


def test_negative_returns_use_the_same_margin():
    m = RegressionMonitor(T)
    feed(m, 3, returns=-100.0)
    feed(m, 4, returns=-110.0, seed=1)  # within 20 % of |-100|
    feed(m, 5, returns=-150.0, seed=2)
    assert not m.verdict(4, 3).regressed
    v = m.verdict(5, 3)
    assert v.regressed and "vs -99.9 of v3 (below -119.9 = incumbent - 0.2 x |incumbent|)" in v.reason


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(error_every=10), "error rate 0.1 > 0.01"),
    (dict(guard_every=20), "guard interventions 50 per 1k steps > 20"),
    (dict(latency_s=0.02), "step latency p99"),
])
def test_per_step_regressions(kw, needle):
    m = RegressionMonitor(T)
    feed(m, 3, returns=480.0)
    feed(m, 4, returns=480.0, **kw)
    v = m.verdict(4, 3)
    assert v.regressed and needle in v.reason, v.reason


def test_latency_below_the_floor_is_jitter():
    m = RegressionMonitor(T)
    feed(m, 3, returns=1.0, latency_s=0.0002)
    feed(m, 4, returns=1.0, latency_s=0.0012)  # 6x slower, still under the 2 ms floor
    assert not m.verdict(4, 3).regressed


def test_not_judged_before_the_minimums_and_absolute_checks_without_incumbent():
    m = RegressionMonitor(T)
    feed(m, 3, returns=480.0)
    feed(m, 4, returns=0.0, n_episodes=4, n_steps=99)
    v = m.verdict(4, 3)
    assert (v.regressed, v.judged) == (False, False) and v.reason == (
        "not judged yet: v4 has 4/5 episodes and 99/100 steps")
    feed(m, 6, returns=0.0, error_every=2)
    v = m.verdict(6, None)
    assert v.regressed and v.reason.startswith("error rate 0.5") and "incumbent_steps" not in v.figures
    v = m.verdict(3, 9)  # an incumbent without data: only absolute checks
    assert not v.regressed and v.reason == "v3 within thresholds vs its thresholds (no incumbent data)"


def test_memory_is_bounded():
    m = RegressionMonitor(Thresholds(min_steps=10, window_steps=100, window_episodes=10, max_versions=3))
    for version in range(1, 6):
        feed(m, version, returns=1.0, n_steps=1000, n_episodes=100)
    assert [m.summary(v)["steps"] for v in range(1, 6)] == [0, 0, 100, 100, 100]
    assert m.summary(5)["episodes"] == 10
    m.forget(5)
    assert m.summary(5) == {"episodes": 0.0, "steps": 0.0}


@pytest.mark.parametrize(("kw", "match"), [
    (dict(min_return_ratio=1.5), "min_return_ratio=1.5"), (dict(max_error_rate=-1), "max_error_rate=-1"),
    (dict(window_steps=0), "window_steps=0"), (dict(min_steps=2.5), "min_steps=2.5"),
    (dict(min_episodes=300), "exceed their windows"), (dict(latency_floor_s=float("nan")), "latency_floor_s=nan"),
])
def test_thresholds_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Thresholds(**kw)

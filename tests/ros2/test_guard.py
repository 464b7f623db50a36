"""The edge safety guard, with an exact fake clock: limits, rates, watchdog, e-stop latch, counts."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.ros2.guard import GuardConfig, GuardCounts, GuardError, SafetyGuard
from protos.tether.v1 import bridge_pb2


class Clock:
    """A settable clock: `clock.t = 1.5` then the guard reads 1.5."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(clock: Clock, **overrides) -> SafetyGuard:
    cfg = dict(position_low=[-1.0, -2.0, 0.0], position_high=[1.0, 2.0, 3.0], deadline_s=0.1)
    cfg.update(overrides)
    return SafetyGuard(GuardConfig(**cfg), now=clock)


# -- config validation -------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "field"), [
    (dict(position_low=[0.0, 0.0], position_high=[1.0]), "position_high"),
    (dict(position_low=[2.0], position_high=[1.0]), "position_low"),
    (dict(position_low=[float("nan")], position_high=[1.0]), "position_low"),
    (dict(position_low=[], position_high=[]), "position_low"),
    (dict(position_low=[[0.0]], position_high=[[1.0]]), "position_low"),
    (dict(position_low=[0.0], position_high=[float("inf")]), "position_high"),
    (dict(position_low=[0.0], position_high=[1.0], velocity_limit=0.0), "velocity_limit"),
    (dict(position_low=[0.0], position_high=[1.0], velocity_limit=[1.0, 2.0]), "velocity_limit"),
    (dict(position_low=[0.0], position_high=[1.0], max_delta=-0.1), "max_delta"),
    (dict(position_low=[0.0], position_high=[1.0], max_delta="big"), "max_delta"),
    (dict(position_low=[0.0], position_high=[1.0], deadline_s=0), "deadline_s"),
    (dict(position_low=[0.0], position_high=[1.0], deadline_s=float("inf")), "deadline_s"),
    (dict(position_low=[0.0], position_high=[1.0], deadline_s=True), "deadline_s"),
    (dict(position_low=[0.0], position_high=[1.0], safe_action="stop"), "safe_action"),
    (dict(position_low=[0.0], position_high=[1.0], safe_action=[2.0]), "safe_action"),
    (dict(position_low=[0.5], position_high=[1.0], safe_action="zero"), "safe_action"),
])
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        GuardConfig(**overrides)


def test_config_is_keyword_only_frozen_and_normalised():
    with pytest.raises(TypeError):
        GuardConfig([0.0], [1.0])  # type: ignore[misc]
    cfg = GuardConfig(position_low=np.array([-1, -1]), position_high=[1, 1], velocity_limit=[2.0, np.inf],
                      max_delta=0.5, safe_action=np.array([0.0, 0.5]))
    assert cfg.position_low == (-1.0, -1.0) and cfg.velocity_limit == (2.0, float("inf"))
    assert cfg.max_delta == (0.5, 0.5) and cfg.safe_action == (0.0, 0.5) and cfg.size == 2
    assert cfg == GuardConfig(position_low=[-1, -1], position_high=[1, 1], velocity_limit=[2, np.inf],
                              max_delta=[0.5, 0.5], safe_action=[0, 0.5])
    with pytest.raises(AttributeError):
        cfg.deadline_s = 1.0  # type: ignore[misc]


# -- clamp and rate limit ----------------------------------------------------------------------

def test_clamp_to_position_limits():
    clock = Clock()
    guard = make(clock)
    d = guard.filter(np.array([5.0, -5.0, 1.5]))
    assert d.sent.tolist() == [1.0, -2.0, 1.5]
    assert d.requested.tolist() == [5.0, -5.0, 1.5]
    assert d.clamped and not d.rate_limited and not d.watchdog and not d.estopped and d.t == 0.0
    d = guard.filter(np.array([0.5, 0.5, 0.5]))
    assert d.sent.tolist() == [0.5, 0.5, 0.5] and not d.clamped
    assert guard.counts.clamped == 1


def test_decision_arrays_are_readonly_copies():
    guard = make(Clock())
    req = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    d = guard.filter(req)
    req[0] = 9.0
    assert d.requested.dtype == np.float64 and d.requested[0] == pytest.approx(0.1)
    with pytest.raises(ValueError):
        d.sent[0] = 1.0


def test_bad_actions_are_rejected_and_not_fresh():
    clock = Clock()
    guard = make(clock)
    guard.filter(np.zeros(3) + 0.5)
    with pytest.raises(ValueError, match="requested: expected shape"):
        guard.filter(np.zeros(2))
    clock.t = 0.05
    with pytest.raises(ValueError, match="non-finite"):
        guard.filter(np.array([np.nan, 0.0, 0.0]))
    clock.t = 0.11
    assert guard.tick().watchdog  # the NaN did not refresh the deadline


def test_max_delta_limits_each_step():
    clock = Clock()
    guard = make(clock, max_delta=[0.1, 0.2, 0.3])
    guard.filter(np.array([0.0, 0.0, 1.0]))
    d = guard.filter(np.array([1.0, -1.0, 1.1]))
    assert np.allclose(d.sent, [0.1, -0.2, 1.1]) and d.rate_limited and not d.clamped
    d = guard.filter(np.array([1.0, -1.0, 1.1]))
    assert np.allclose(d.sent, [0.2, -0.4, 1.1]) and d.rate_limited
    assert guard.counts.rate_limited == 2


def test_velocity_limit_scales_with_elapsed_time():
    clock = Clock()
    guard = make(clock, velocity_limit=2.0)
    guard.filter(np.zeros(3))
    clock.t = 0.01
    d = guard.filter(np.ones(3))
    assert np.allclose(d.sent, 0.02) and d.rate_limited
    clock.t = 0.51  # 0.5 s later: up to 1.0 per joint, the target is within reach
    d = guard.filter(np.ones(3))
    assert np.allclose(d.sent, 1.0) and not d.rate_limited
    clock.t = 0.51  # no time elapsed: no motion allowed
    d = guard.filter(np.array([0.0, 1.0, 1.0]))
    assert np.allclose(d.sent, 1.0) and d.rate_limited


def test_clamp_then_rate_limit_and_the_tighter_bound_wins():
    clock = Clock()
    guard = make(clock, velocity_limit=10.0, max_delta=0.05)
    guard.filter(np.array([0.9, 0.0, 0.0]))
    clock.t = 0.001  # velocity bound 0.01 < max_delta 0.05
    d = guard.filter(np.array([3.0, 0.0, 0.0]))
    assert np.allclose(d.sent, [0.91, 0.0, 0.0]) and d.clamped and d.rate_limited
    clock.t = 1.0  # velocity bound 9.99 > max_delta: step 0.05, but the clamp caps at 1.0
    d = guard.filter(np.array([3.0, 0.0, 0.0]))
    assert np.allclose(d.sent, [0.96, 0.0, 0.0])
    clock.t = 2.0
    d = guard.filter(np.array([3.0, 0.0, 0.0]))
    assert np.allclose(d.sent, [1.0, 0.0, 0.0]) and d.clamped and not d.rate_limited


def test_initial_rate_limits_the_first_action():
    clock = Clock()
    cfg = GuardConfig(position_low=[-1.0, -2.0, 0.0], position_high=[1.0, 2.0, 3.0], max_delta=0.1)
    guard = SafetyGuard(cfg, now=clock, initial=[0.0, 0.0, 1.0])
    d = guard.filter(np.array([1.0, 1.0, 1.0]))
    assert np.allclose(d.sent, [0.1, 0.1, 1.0]) and d.rate_limited
    with pytest.raises(ValueError, match="^initial:"):
        SafetyGuard(guard.config, now=clock, initial=[0.0, 0.0, -1.0])


# -- watchdog ----------------------------------------------------------------------------------

def test_watchdog_unarmed_before_the_first_action():
    clock = Clock()
    guard = make(clock, safe_action="zero")
    clock.t = 10.0
    assert guard.tick() is None and guard.counts.watchdog == 0


def test_watchdog_fires_after_the_deadline_once_per_silence():
    clock = Clock()
    deadline, period = 0.125, 0.03125  # exact in binary: the boundary is tested exactly
    guard = make(clock, deadline_s=deadline)
    guard.filter(np.array([0.5, 0.5, 0.5]))
    fired_at = None
    for k in range(1, 33):  # 1 s of ticks at 32 Hz, no fresh action
        clock.t = k * period
        d = guard.tick()
        if d is None:
            assert fired_at is None
            continue
        fired_at = fired_at if fired_at is not None else clock.t
        assert d.watchdog and d.requested is None and d.sent.tolist() == [0.5, 0.5, 0.5] and d.t == clock.t
    assert deadline < fired_at <= deadline + period
    assert guard.counts.watchdog == 1

    clock.t = 1.0
    guard.filter(np.array([0.4, 0.4, 0.4]))  # a fresh action ends the silence
    clock.t = 1.0 + deadline
    assert guard.tick() is None  # exactly at the deadline: still on time
    clock.t = 1.0 + deadline + period
    assert guard.tick().watchdog and guard.counts.watchdog == 2


def test_hold_vs_zero_vs_explicit_safe_action():
    for safe, expected in [("hold", [0.5, 1.5, 2.5]), ("zero", [0.0, 0.0, 0.0]),
                           ([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])]:
        clock = Clock()
        guard = make(clock, safe_action=safe)
        guard.filter(np.array([0.5, 1.5, 2.5]))
        clock.t = 0.5
        assert guard.tick().sent.tolist() == expected, safe


def test_recovery_after_watchdog_is_rate_limited_from_the_safe_action():
    clock = Clock()
    guard = make(clock, safe_action="zero", max_delta=0.1)
    guard.filter(np.array([0.1, 0.1, 0.1]))
    clock.t = 0.2
    assert guard.tick().sent.tolist() == [0.0, 0.0, 0.0]
    d = guard.filter(np.array([0.1, 1.0, 1.0]))
    assert np.allclose(d.sent, [0.1, 0.1, 0.1]) and d.rate_limited


# -- e-stop latch ------------------------------------------------------------------------------

def test_estop_latches_until_explicit_release():
    clock = Clock()
    guard = make(clock, safe_action="hold", max_delta=0.5)
    guard.filter(np.array([0.5, 0.5, 0.5]))
    guard.estop("bumper contact")
    guard.estop("second press")  # already latched: one engagement, first reason kept
    assert guard.estopped and guard.estop_reason == "bumper contact"
    for k in range(1, 20):
        clock.t = k * 0.01
        d = guard.filter(np.array([-1.0, -1.0, 3.0]))
        assert d.estopped and d.sent.tolist() == [0.5, 0.5, 0.5]
        assert not (d.clamped or d.rate_limited or d.watchdog)
        assert d.requested.tolist() == [-1.0, -1.0, 3.0]
        t = guard.tick()
        assert t.estopped and not t.watchdog and t.sent.tolist() == [0.5, 0.5, 0.5]
    assert guard.counts == GuardCounts(estop=1, estopped=True)

    with pytest.raises(ValueError, match="^operator:"):
        guard.release(operator="")
    assert guard.estopped
    guard.release(operator="ada")
    assert not guard.estopped and guard.estop_reason is None
    assert guard.tick() is None  # the policy gets a fresh deadline after release
    d = guard.filter(np.array([-5.0, -1.0, 3.0]))
    assert np.allclose(d.sent, [0.0, 0.0, 1.0]) and d.rate_limited and d.clamped
    guard.release(operator="ada")  # not latched: nothing to do
    with pytest.raises(ValueError, match="^reason:"):
        guard.estop(" ")


def test_estop_zero_and_hold_with_nothing_to_hold():
    clock = Clock()
    guard = make(clock, safe_action="zero")
    guard.estop("test")
    assert guard.tick().sent.tolist() == [0.0, 0.0, 0.0]
    assert guard.filter(np.ones(3)).sent.tolist() == [0.0, 0.0, 0.0]

    hold = make(clock, safe_action="hold")
    hold.estop("test")
    assert hold.tick() is None  # never commanded: nothing to send
    with pytest.raises(GuardError, match="nothing to hold"):
        hold.filter(np.ones(3))
    held = SafetyGuard(hold.config, now=clock, initial=[0.1, 0.2, 0.3])
    held.estop("test")
    assert held.filter(np.ones(3)).sent.tolist() == [0.1, 0.2, 0.3]


def test_watchdog_does_not_count_while_estopped():
    clock = Clock()
    guard = make(clock)
    guard.filter(np.zeros(3) + 0.5)
    guard.estop("test")
    clock.t = 5.0
    assert guard.tick().estopped and guard.counts.watchdog == 0


# -- counts ------------------------------------------------------------------------------------

def test_counts_are_cumulative_and_map_onto_the_proto():
    clock = Clock()
    guard = make(clock, max_delta=0.1)
    guard.filter(np.array([0.0, 0.0, 0.0]))
    guard.filter(np.array([5.0, 0.0, 0.0]))  # clamped and rate-limited
    guard.filter(np.array([0.5, 0.0, 0.0]))  # rate-limited only
    clock.t = 1.0
    guard.tick()
    guard.tick()
    guard.estop("x")
    guard.release(operator="ada")
    guard.estop("y")
    counts = guard.counts
    assert counts == GuardCounts(clamped=1, rate_limited=2, watchdog=1, estop=2, estopped=True)
    msg = counts.to_proto()
    assert isinstance(msg, bridge_pb2.GuardReport)
    assert (msg.clamped, msg.rate_limited, msg.watchdog, msg.estop, msg.estopped) == (1, 2, 1, 2, True)
    assert bridge_pb2.GuardReport.FromString(msg.SerializeToString()) == msg

"""The edge safety guard, with an exact fake clock: limits, rates, watchdog, e-stop latch (gateway ids,
the latch file), counts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from bridge.ros2.guard import GATEWAY_ESTOP, GuardConfig, GuardCounts, GuardError, SafetyGuard
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
    guard = make(clock, safe_action="zero")                          # no rate limit: nothing to ramp
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


# -- gateway e-stops: latch by id, release exactly that id ---------------------------------------

def test_gateway_latch_holds_an_id_and_releases_only_for_that_id():
    guard = make(Clock())
    assert guard.gateway_estop == "" and guard.counts.gateway_estop == ""
    assert guard.estop("ignored for a gateway latch", gateway_id="es-1")
    assert guard.estop_reason == GATEWAY_ESTOP and guard.gateway_estop == "es-1"
    assert not guard.estop(GATEWAY_ESTOP, gateway_id="es-2")      # a newer e-stop: the id is replaced
    assert guard.gateway_estop == "es-2" and guard.counts.estop == 1
    assert not guard.release_gateway("es-1") and guard.estopped   # the old e-stop's release frees nothing
    report = guard.counts.to_proto()
    assert report.gateway_estop == "es-2" and report.estopped
    with pytest.raises(ValueError, match="^estop_id:"):
        guard.release_gateway("")
    assert guard.release_gateway("es-2") and not guard.estopped and guard.gateway_estop == ""
    assert not guard.release_gateway("es-2")                      # nothing latched any more
    assert guard.counts == GuardCounts(estop=1)


def test_a_local_estop_over_a_gateway_latch_is_never_released_by_the_gateway():
    guard = make(Clock())
    guard.estop(GATEWAY_ESTOP, gateway_id="es-1")
    guard.estop("True on /tether/estop", supersedes=GATEWAY_ESTOP)
    assert guard.estop_reason == "True on /tether/estop" and guard.gateway_estop == ""
    assert not guard.estop(GATEWAY_ESTOP, gateway_id="es-3")      # a gateway e-stop does not take it over
    assert guard.gateway_estop == "" and not guard.release_gateway("es-1") and not guard.release_gateway("es-3")
    assert guard.estopped and guard.counts.gateway_estop == ""
    assert guard.release(operator="ada") and not guard.estopped


def test_release_gateway_is_atomic_against_a_concurrent_local_estop():
    """Many rounds of a gateway release racing a local e-stop: whichever comes second, the local
    latch is never lost (the old check-then-release in two steps could drop it)."""
    for k in range(300):
        guard = make(Clock())
        guard.estop(GATEWAY_ESTOP, gateway_id=f"es-{k}")
        barrier = threading.Barrier(2)
        released: list[bool] = []

        def gateway(guard=guard, k=k, barrier=barrier, released=released):
            barrier.wait()
            released.append(guard.release_gateway(f"es-{k}"))

        def local(guard=guard, barrier=barrier):
            barrier.wait()
            guard.estop("local button", supersedes=GATEWAY_ESTOP)

        threads = [threading.Thread(target=gateway), threading.Thread(target=local)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # released first then latched locally, or superseded first and the release refused: latched either way
        assert guard.estopped and guard.estop_reason == "local button", (k, released)


# -- the latch file: the e-stop survives a restart -----------------------------------------------

def test_latch_file_restores_the_latch_reason_and_gateway_id(tmp_path):
    path = tmp_path / "state" / "latch.json"
    cfg = make(Clock()).config
    guard = SafetyGuard(cfg, now=Clock(), latch_file=path)
    assert not guard.estopped and not path.exists()              # nothing written before a change
    guard.estop(GATEWAY_ESTOP, gateway_id="es-9")
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["gateway_estop"] == "es-9"
    again = SafetyGuard(cfg, now=Clock(), latch_file=path)
    assert again.estopped and again.estop_reason == GATEWAY_ESTOP and again.gateway_estop == "es-9"
    assert again.counts == GuardCounts(estop=1, estopped=True, gateway_estop="es-9")
    again.estop("bumper", supersedes=GATEWAY_ESTOP)
    third = SafetyGuard(cfg, now=Clock(), latch_file=path)
    assert third.estop_reason == "bumper" and third.gateway_estop == ""
    assert third.release(operator="ada")
    assert not SafetyGuard(cfg, now=Clock(), latch_file=path).estopped
    assert [p.name for p in path.parent.iterdir()] == ["latch.json"]  # no temp files left behind


@pytest.mark.parametrize(("content", "problem"), [
    (b"{not json", "corrupt"),
    (b"", "corrupt"),
    (b'{"format": "something-else", "latched": false}', "corrupt"),
    (b'{"format": "tether-edge-latch/1", "latched": "no"}', "corrupt"),
    (b'{"format": "tether-edge-latch/1", "latched": true, "reason": ""}', "corrupt"),
    (b'\xff\xfe', "corrupt"),
])
def test_a_corrupt_latch_file_starts_latched_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "latch.json"
    path.write_bytes(content)
    guard = SafetyGuard(make(Clock()).config, now=Clock(), latch_file=path)
    assert guard.estopped and str(path) in guard.estop_reason and problem in guard.estop_reason
    assert guard.gateway_estop == "" and not guard.release_gateway("anything")
    assert guard.release(operator="ada") and json.loads(path.read_text())["latched"] is False


def test_an_unreadable_latch_file_starts_latched(tmp_path):
    path = tmp_path / "latch.json"
    path.mkdir()                                                  # reading a folder fails (IsADirectoryError)
    guard = SafetyGuard(make(Clock()).config, now=Clock(), latch_file=path)
    assert guard.estopped and "unreadable" in guard.estop_reason and str(path) in guard.estop_reason


def test_the_latch_survives_kill_9_of_the_process_that_latched(tmp_path):
    """A real process latches the guard, says so, and is killed with SIGKILL: a new guard on the
    same file starts latched with the same gateway id."""
    path = tmp_path / "latch.json"
    code = textwrap.dedent(f"""
        import sys, time
        from bridge.ros2.guard import GATEWAY_ESTOP, GuardConfig, SafetyGuard
        g = SafetyGuard(GuardConfig(position_low=[-1.0], position_high=[1.0]), latch_file={str(path)!r})
        g.estop(GATEWAY_ESTOP, gateway_id="es-kill")
        print("latched", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout.readline().strip() == "latched"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    guard = SafetyGuard(GuardConfig(position_low=[-1.0], position_high=[1.0]), latch_file=path)
    assert guard.estopped and guard.gateway_estop == "es-kill"


# -- the guard's own commands obey its limits: the watchdog and e-stop ramp ----------------------

@pytest.mark.parametrize("limits", [dict(velocity_limit=[0.8, 1.5, 0.5]), dict(max_delta=[0.01, 0.03, 0.02]),
                                    dict(velocity_limit=1.0, max_delta=0.008)], ids=["velocity", "delta", "both"])
@pytest.mark.parametrize("safe", ["zero", (0.5, -1.5, 2.5)], ids=["zero", "vector"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_guard_trace_never_exceeds_its_limits_through_watchdog_and_estop(limits, safe, seed):
    """A 100 Hz control loop with a fake clock: policy actions (jittered, some far outside the limits),
    a silence long enough for the watchdog, the policy back, then an e-stop. Every consecutive pair of
    commands sent obeys max_delta and velocity_limit x dt, and both safety phases end exactly at the
    safe action, reached by a ramp, not a step."""
    rng = np.random.default_rng(seed)
    clock = Clock()
    period = 0.01
    guard = make(clock, safe_action=safe, deadline_s=0.05, **limits)
    low, high, safe_vec = np.array(guard.config.position_low), np.array(guard.config.position_high), \
        np.zeros(3) if safe == "zero" else np.array(safe)
    assert guard.start_from(rng.uniform(low, high))
    sent: list[tuple[float, np.ndarray, str]] = [(0.0, guard._s.last_sent, "start")]

    def record(d, phase):
        if d is not None:
            sent.append((d.t, d.sent, phase))

    k = 0

    def run(ticks, phase, *, act):
        nonlocal k
        for _ in range(ticks):
            k += 1
            if act and rng.random() < 0.6:       # the policy answers on ~60% of the periods, off-grid
                clock.t = k * period + rng.uniform(0, period / 2)
                record(guard.filter(rng.uniform(low - 1.0, high + 1.0)), phase)
            clock.t = k * period + period * 0.75  # the control tick, every period
            record(guard.tick(), phase)

    run(80, "policy", act=True)
    run(600, "watchdog", act=False)
    watchdog = [(t, s) for t, s, p in sent if p == "watchdog"]
    assert watchdog and np.array_equal(watchdog[-1][1], safe_vec)   # reached the safe action exactly
    assert not np.array_equal(watchdog[0][1], safe_vec)             # ... by a ramp, not in one step
    run(80, "policy again", act=True)
    guard.estop("trace test")
    run(600, "estop", act=True)
    estop = [s for _, s, p in sent if p == "estop"]
    assert not np.array_equal(estop[0], safe_vec) and np.array_equal(estop[-1], safe_vec)
    assert guard.tick().ramping is False

    vel = None if guard.config.velocity_limit is None else np.array(guard.config.velocity_limit)
    delta = None if guard.config.max_delta is None else np.array(guard.config.max_delta)
    for (t0, a, _), (t1, b, phase) in zip(sent, sent[1:], strict=False):
        step = np.abs(b - a)
        assert np.all(low <= b) and np.all(b <= high), (phase, t1, b)
        if delta is not None:
            assert np.all(step <= delta + 1e-12), (phase, t1, step)
        if vel is not None:
            assert np.all(step <= vel * (t1 - t0) + 1e-12), (phase, t1, step, t1 - t0)
            if phase in ("watchdog", "estop"):                     # no jump by the length of a silence
                assert np.all(step <= vel * period + 1e-12), (phase, t0, t1, step)


def test_the_safe_ramp_is_flagged_and_not_counted_as_a_policy_intervention():
    clock = Clock()
    guard = make(clock, safe_action="zero", max_delta=0.25)
    guard.filter(np.array([1.0, -1.0, 1.0]))
    guard.estop("bumper")
    steps = []
    for k in range(1, 8):
        clock.t = k * 0.01
        d = guard.tick()
        steps.append((d.sent.tolist(), d.ramping, d.rate_limited, d.estopped))
    assert steps[:5] == [([0.75, -0.75, 0.75], True, True, True), ([0.5, -0.5, 0.5], True, True, True),
                         ([0.25, -0.25, 0.25], True, True, True), ([0.0, 0.0, 0.0], False, False, True),
                         ([0.0, 0.0, 0.0], False, False, True)]
    assert guard.counts.rate_limited == 0           # the guard's own ramp: not the policy's doing
    clock.t = 1.0
    d = guard.filter(np.array([1.0, 1.0, 1.0]))     # while latched a policy action is a ramp step too
    assert d.estopped and d.sent.tolist() == [0.0, 0.0, 0.0] and d.requested.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("limits", [dict(max_delta=0.01), dict(velocity_limit=[np.inf, 1.0, np.inf])])
def test_estop_before_any_command_never_jumps_to_the_safe_action(tmp_path, limits):
    """E-stopped with no pose to ramp from (e.g. a node restarted latched, before the robot's pose
    came): with a rate limit the guard sends nothing (the actuator holds where it is) and refuses a
    policy action, until a start pose gives the ramp its start."""
    clock = Clock()
    guard = make(clock, safe_action=[0.5, 0.5, 0.5], **limits)
    guard.estop("test")
    clock.t = 1.0
    assert guard.tick() is None
    with pytest.raises(GuardError, match="e-stopped before any command: no pose to ramp"):
        guard.filter(np.ones(3))
    assert guard.start_from([0.0, 0.0, 0.0])
    clock.t = 1.01
    d = guard.tick()
    assert d.ramping and 0.0 < d.sent[1] <= 0.01 + 1e-12                # one limited step from the pose


# -- the start pose: a first command is never only clamped when the node can know better ---------

def test_missing_start_names_the_elements_without_a_measured_pose():
    clock = Clock()
    guard = make(clock, max_delta=0.1)
    assert guard.missing_start == (0, 1, 2)                        # nothing measured yet
    assert not guard.start_from([0.5, None, np.nan])
    assert guard.missing_start == (1, 2) and not guard.commanded
    assert not guard.start_from(np.array([0.5, 1.0, np.nan]))
    assert guard.missing_start == (2,)
    assert guard.start_from([0.5, 1.0, 1.5]) and guard.missing_start == () and guard.commanded
    assert np.allclose(guard.filter(np.array([1.0, -2.0, 3.0])).sent, [0.6, 0.9, 1.6])
    for bad, match in [([0.0, 0.0], "expected 3 values"), (["a", 0.0, 0.0], "expected numbers"),
                       ([np.inf, 0.0, 0.0], "infinite")]:
        with pytest.raises(ValueError, match=f"^measured: {match}"):
            make(clock).start_from(bad)


def test_require_start_refuses_a_first_command_that_could_only_be_clamped():
    clock = Clock()
    cfg = make(clock).config
    guard = SafetyGuard(cfg, now=clock, require_start=True)
    guard.start_from([0.1, None, 0.2])
    with pytest.raises(GuardError, match=r"no measured start pose for elements \[1\]"):
        guard.filter(np.array([0.5, 0.5, 0.5]))
    clock.t = 1.0
    assert guard.tick() is None and guard.counts.watchdog == 0      # the refused action armed nothing
    guard.start_from([0.1, 0.0, 0.2])
    assert guard.filter(np.array([0.5, 0.5, 0.5])).sent.tolist() == [0.5, 0.5, 0.5]
    assert SafetyGuard(cfg, now=clock, require_start=True, initial=[0.0, 0.0, 0.0]).filter(np.zeros(3)) is not None


def test_a_slow_latch_write_never_holds_up_the_safe_action(tmp_path, monkeypatch):
    """While estop() waits for the disk, the control thread's filter and tick go on (already
    e-stopped); estop() returns only once the file says latched."""
    import bridge.ros2.guard as guard_module

    clock = Clock()
    path = tmp_path / "latch.json"
    guard = SafetyGuard(make(clock).config, now=clock, latch_file=path, initial=[0.5, 0.5, 0.5])
    writing, proceed = threading.Event(), threading.Event()
    real_write = guard_module.write_durable

    def slow_write(p, data, **kw):
        writing.set()
        assert proceed.wait(10)
        real_write(p, data, **kw)

    monkeypatch.setattr(guard_module, "write_durable", slow_write)
    latcher = threading.Thread(target=guard.estop, args=("bumper",))
    latcher.start()
    assert writing.wait(10)
    clock.t = 0.01
    d = guard.filter(np.array([1.0, 1.0, 1.0]))            # does not wait for the disk
    assert d.estopped and d.sent.tolist() == [0.5, 0.5, 0.5] and guard.tick().estopped
    assert latcher.is_alive() and not path.exists()         # estop() has not returned yet
    proceed.set()
    latcher.join(10)
    assert json.loads(path.read_text())["latched"] is True


def test_concurrent_latch_changes_leave_the_file_at_the_newest_state(tmp_path):
    path = tmp_path / "latch.json"
    cfg = make(Clock()).config
    guard = SafetyGuard(cfg, now=Clock(), latch_file=path)

    def churn(k):
        for i in range(40):
            guard.estop(GATEWAY_ESTOP, gateway_id=f"es-{k}-{i}")
            guard.release_gateway(f"es-{k}-{i}")
            guard.estop(f"local {k}")
            guard.release(operator="ada")

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    guard.estop(GATEWAY_ESTOP, gateway_id="es-final")
    again = SafetyGuard(cfg, now=Clock(), latch_file=path)
    assert again.gateway_estop == "es-final"
    assert [p.name for p in tmp_path.iterdir()] == ["latch.json"]


def test_a_latch_file_that_cannot_be_written_is_logged_and_the_latch_holds(tmp_path, caplog):
    folder = tmp_path / "state"
    folder.mkdir()
    guard = SafetyGuard(make(Clock()).config, now=Clock(), latch_file=folder / "latch.json")
    folder.rmdir()
    folder.write_text("")                                   # the folder is now a file: every write fails
    assert guard.estop("bumper") and guard.estopped
    assert "cannot write the e-stop latch file" in caplog.text and "the latch holds in memory only" in caplog.text
    assert guard.release(operator="ada") and not guard.estopped
    assert SafetyGuard(guard.config, now=Clock(), latch_file=folder / "latch.json").estopped  # unreadable: latched

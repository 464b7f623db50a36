"""Chunk alignment through the real gateway and a real tritonserver (issue 24): `tether sim`'s chunk loop
(`sim.chunked`, on `bridge.client.chunks.ChunkExecutor`, the edge node's core too) with the inference delay
injected in control ticks (`delay_ticks` d = 0 .. H/2: the reply is applied before tick t + d), so every
count below is exact, on any machine.

- A prefix-inpainting policy (`Inpaint`, real-time chunking): every tick gets an action, the executed one is
  exactly what the newest chunk scheduled for that tick (aligned, never replayed from its start), the prefix
  the policy got is what the robot executed, and each seam's step is within the in-chunk p95.
- A prefix-ignoring, multimodal policy (`Planner`): its seams jump by more than the guard's per-command
  limit, and the blend over the seam window keeps every executed step inside it (the edge guard, run over
  the executed commands, never rate-limits).
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from bridge.client.chunks import ChunkConfig, ChunkExecutor
from bridge.ros2.guard import GuardConfig, SafetyGuard
from sim.cli import main as sim_main
from sim.client import SessionError, run_sessions
from tests.sim.chunk_policies import MODE, VELOCITY, Inpaint, Planner, Servo, policy_specs
from tests.support.gateways import running_gateway
from tests.support.triton import LOAD_TIMEOUT_S

H = 16
TICKS = 240                        # per run: 15 chunk lengths
LIMIT = 0.125                      # the guard's max change per command: above a blended seam, below a jump


@pytest.fixture(scope="module")
def policies(triton):
    for name, module, prefix in (("rtc_inpaint", Inpaint(H), True), ("rtc_planner", Planner(H), False)):
        triton.claim(name)
        triton.repo.write_version(name, 1, module.eval(), *policy_specs(H, prefix=prefix))
        triton.server.load_model(name, timeout=LOAD_TIMEOUT_S)
    return triton


def run(triton, policy: str, config: ChunkConfig, delay: int | None, *,
        rate_hz: float | None = None) -> tuple[ChunkExecutor, Servo, object]:
    envs: list[Servo] = []
    executors: list[ChunkExecutor] = []

    def make(_: int) -> Servo:
        envs.append(Servo())
        return envs[-1]

    async def scenario():
        async with running_gateway(triton.url, policy=policy) as gw:
            return await run_sessions(gw.address, make, envs=1, steps=TICKS, chunks=config, delay_ticks=delay,
                                      executors_out=executors, rate_hz=rate_hz)

    stats = asyncio.run(scenario())
    assert not stats.errors, stats.errors
    return executors[0], envs[0], stats


def check_every_tick_from_the_newest_chunk(ex: ChunkExecutor, env: Servo, stats) -> dict[int, object]:
    """Every tick 0 .. TICKS-1 executed a chunk's action for exactly that tick, from the newest chunk that had
    arrived, and the env applied it; returns the arrivals by chunk id."""
    assert stats.steps == TICKS and stats.idle_ticks == 0 and ex.idle == 0
    assert [e.tick for e in ex.trace] == list(range(TICKS))                      # no idle tick
    np.testing.assert_array_equal(np.array(env.applied), np.array([e.action for e in ex.trace], np.float32))
    arrivals = {a.chunk: a for a in ex.arrivals}
    assert len(arrivals) == ex.chunks >= TICKS // H
    for e in ex.trace:
        a = arrivals[e.source.chunk]
        assert a.start + e.source.index == e.tick, (e, a.start)                   # aligned to its own tick
        newest = [b for b in ex.arrivals if b.tick <= e.tick < b.start + H][-1]
        assert newest is a, (e.tick, newest.chunk, a.chunk)
    return arrivals


@pytest.mark.parametrize("delay", range(H // 2 + 1))
def test_an_inpainting_policy_continues_the_motion_at_every_delay(policies, delay):
    ex, env, stats = run(policies, "rtc_inpaint", ChunkConfig(horizon=H, prefix=True), delay)
    arrivals = check_every_tick_from_the_newest_chunk(ex, env, stats)
    executed = np.array([e.action for e in ex.trace])
    first, *rest = list(ex.arrivals)
    assert first.delay == 0 and all(a.delay == delay for a in rest)              # d measured in ticks
    assert stats.chunk_delays == ({0: 1, delay: len(rest)} if delay else {0: len(arrivals)})
    rest = [a for a in rest if a.tick < TICKS]                                    # not the one the end cut off
    for e in ex.trace:                                                            # no blend: the chunk's row
        assert e.source.blend == 1.0
        np.testing.assert_array_equal(e.action, arrivals[e.source.chunk].actions[e.source.index])
    for a in rest:                                                                # the prefix it got is what ran
        assert a.estimate == delay
        np.testing.assert_array_equal(a.actions[:delay], executed[a.start:a.start + delay])
    steps = np.abs(np.concatenate([np.diff(a.actions, axis=0) for a in ex.arrivals]))
    p95 = np.percentile(steps, 95, axis=0)
    seams = np.array([np.abs(executed[a.tick] - executed[a.tick - 1]) for a in rest])
    assert len(seams) >= TICKS // H - 1 and (p95 > 0).all()
    assert (seams <= p95).all(), (seams.max(axis=0), p95)
    modes = {round(float(np.max(np.diff(a.actions[delay:], axis=0)[:, 0]) - VELOCITY[0]) * H, 6) for a in rest}
    assert modes == {0.0, MODE}, modes                                            # both modes were continued


@pytest.mark.parametrize("delay", [0, 3, H // 2])
def test_a_prefix_ignoring_policy_is_blended_inside_the_guard_limits(policies, delay):
    config = ChunkConfig(horizon=H)
    assert config.blend == H // 4
    ex, env, stats = run(policies, "rtc_planner", config, delay)
    arrivals = check_every_tick_from_the_newest_chunk(ex, env, stats)
    executed = np.array([e.action for e in ex.trace])
    # unblended, the newest chunk's row for each tick: its seams jump by MODE, past the guard's limit
    scheduled = np.array([arrivals[e.source.chunk].actions[e.source.index] for e in ex.trace])
    assert np.abs(np.diff(scheduled, axis=0)).max() >= MODE > LIMIT
    assert any(e.source.blend < 1.0 for e in ex.trace)
    for e, want in zip(ex.trace, scheduled, strict=True):                        # blended only in the window
        if e.source.blend == 1.0:
            np.testing.assert_array_equal(e.action, want)
        else:
            assert 0 <= e.tick - arrivals[e.source.chunk].tick < config.blend
    guard = SafetyGuard(GuardConfig(position_low=[-100.0] * 2, position_high=[100.0] * 2, max_delta=LIMIT),
                        initial=[0.0, 0.0])
    decisions = [guard.filter(action) for action in executed]
    assert not any(d.rate_limited or d.clamped for d in decisions), np.abs(np.diff(executed, axis=0)).max()
    unblended = SafetyGuard(guard.config, initial=[0.0, 0.0])
    assert any(unblended.filter(action).rate_limited for action in scheduled)  # the check can fail


def test_the_gateway_passes_the_prefix_only_to_a_policy_that_declares_it(policies):
    # a session that sends the prefix to a policy without those inputs is served (they are logged, not inferred)
    ex, env, stats = run(policies, "rtc_planner", ChunkConfig(horizon=H, prefix=True, blend=H // 4), 3)
    check_every_tick_from_the_newest_chunk(ex, env, stats)
    assert all(a.estimate == 3 for a in list(ex.arrivals)[1:])
    # a policy that declares them refuses a session that does not send them, naming the input
    with pytest.raises(SessionError, match="observation_spec lacks 'action_prefix', an input of policy 'rtc_inpaint'"):
        run(policies, "rtc_inpaint", ChunkConfig(horizon=H), 3)


def test_at_a_control_rate_the_delay_is_measured_and_chunks_stay_aligned(policies):
    # --rate 200 without --chunk-delay: d is what the round trip took in 5 ms ticks (the machine's business);
    # whatever it was, every executed action is its chunk's for that tick, and the prefix is what ran
    ex, env, stats = run(policies, "rtc_inpaint", ChunkConfig(horizon=H, prefix=True), None, rate_hz=200.0)
    assert stats.steps == TICKS and sum(stats.chunk_delays.values()) == ex.chunks
    arrivals = {a.chunk: a for a in ex.arrivals}
    executed = {e.tick: e.action for e in ex.trace}
    assert len(ex.trace) + stats.idle_ticks == TICKS
    for e in ex.trace:
        a = arrivals[e.source.chunk]
        assert a.start + e.source.index == e.tick and a.tick <= e.tick
        np.testing.assert_array_equal(e.action, a.actions[e.source.index])
    for a in list(ex.arrivals)[1:]:
        rows = [t for t in range(a.start, a.start + a.estimate) if t in executed]
        assert rows or not a.estimate
        if rows:
            np.testing.assert_array_equal(a.actions[[t - a.start for t in rows]], np.array([executed[t] for t in rows]))
    if max(stats.chunk_delays) <= H // 2:
        assert stats.idle_ticks == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--chunk-delay", "3"], "--chunk-delay: needs --chunk H"),
    (["--chunk", "16", "--chunk-blend", "17"], r"chunk blend: expected an integer \[0, 16\], got 17"),
])
def test_tether_sim_refuses_a_bad_chunk_flag_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:                 # refused before any gateway is contacted
        sim_main(["--gateway", "127.0.0.1:9", "--seconds", "1", *argv])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)

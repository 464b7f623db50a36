"""Trajectory assembly, GAE against hand-computed values, and policy-lag handling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protos import bridge_pb2, codec, experience_pb2
from trainer.ppo import PPOConfig, stale_terms
from trainer.trajectory import TrajectoryAssembler, gae, lag_stats, policy_lag


def tr(step: int, *, session: str = "s", episode: int = 0, reward: float = 1.0, version: int = 1,
       terminated: bool = False, truncated: bool = False, next_obs: float | None = None,
       recv_ns: int = 0) -> experience_pb2.Transition:
    t = experience_pb2.Transition(
        session=session, episode=episode, step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
        observation=[codec.encode("observation", np.full(2, step, np.float32))],
        action=[codec.encode("action", np.zeros(1, np.float32))], reward=reward, terminated=terminated,
        truncated=truncated, policy_version=version, timing=bridge_pb2.Timing(gateway_recv_ns=recv_ns))
    if next_obs is not None:
        t.next_observation.extend([codec.encode("observation", np.full(2, next_obs, np.float32))])
    return t


def test_gae_matches_hand_computed_values():
    gamma, lam = 0.9, 0.8
    rewards, values, bootstrap = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 1.5]), 2.0
    d2 = 3.0 + 0.9 * 2.0 - 1.5        # 3.3
    d1 = 2.0 + 0.9 * 1.5 - 1.0        # 2.35
    d0 = 1.0 + 0.9 * 1.0 - 0.5        # 1.4
    a2 = d2
    a1 = d1 + 0.72 * a2               # 4.726
    a0 = d0 + 0.72 * a1               # 4.80272
    advantages, returns = gae(rewards, values, bootstrap, gamma=gamma, lam=lam)
    np.testing.assert_allclose(advantages, [a0, a1, a2], rtol=1e-12)
    np.testing.assert_allclose(returns, [a0 + 0.5, a1 + 1.0, a2 + 1.5], rtol=1e-12)
    # lam = 1, terminal: discounted returns to go
    _, returns = gae(np.ones(3), np.zeros(3), 0.0, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(returns, [1.75, 1.5, 1.0])
    with pytest.raises(ValueError, match="2 values for 3 rewards"):
        gae(np.ones(3), np.zeros(2), 0.0, gamma=0.9, lam=0.9)


def test_a_cut_segment_bootstraps_from_the_successor_and_holds_the_newest_transition():
    asm = TrajectoryAssembler()
    for step in range(4):
        asm.add(tr(step))
    assert asm.ready == 3  # step 3 is held until its successor arrives
    (seg,) = asm.take()
    assert [t.step for t in seg.transitions] == [0, 1, 2]
    assert not seg.terminated and seg.bootstrap_observation["observation"].tolist() == [3.0, 3.0]
    asm.add(tr(4))
    (seg,) = asm.take()
    assert [t.step for t in seg.transitions] == [3]
    assert seg.bootstrap_observation["observation"].tolist() == [4.0, 4.0]


def test_terminated_has_no_bootstrap_and_truncated_uses_next_observation():
    asm = TrajectoryAssembler()
    for step in range(2):
        asm.add(tr(step, session="a"))
    asm.add(tr(2, session="a", terminated=True, next_obs=99.0))
    for step in range(2):
        asm.add(tr(step, session="b"))
    asm.add(tr(2, session="b", truncated=True, next_obs=7.0))
    segs = {s.session: s for s in asm.take()}
    assert segs["a"].terminated and segs["a"].bootstrap_observation is None and len(segs["a"]) == 3
    assert segs["b"].truncated and not segs["b"].terminated
    assert segs["b"].bootstrap_observation["observation"].tolist() == [7.0, 7.0]
    assert sorted(asm.take_episode_returns()) == [(3.0, 3), (3.0, 3)]


def test_duplicates_are_ignored_and_a_gap_closes_the_segment():
    asm = TrajectoryAssembler()
    for step in (0, 1, 1, 0, 2):
        asm.add(tr(step))
    asm.add(tr(5))  # steps 3, 4 lost: step 2 has no known successor and is dropped
    (seg,) = asm.take()
    assert [t.step for t in seg.transitions] == [0, 1]
    assert seg.bootstrap_observation["observation"].tolist() == [2.0, 2.0]
    asm.add(tr(0, episode=1))  # a new episode: step 5 never ended, it has no successor either
    assert asm.take() == []


def test_episode_returns_count_only_episodes_seen_from_their_first_step():
    asm = TrajectoryAssembler()
    for step in range(3, 6):  # joined mid-episode
        asm.add(tr(step, reward=2.0, terminated=step == 5))
    for step in range(4):
        asm.add(tr(step, episode=1, reward=0.5, truncated=step == 3, next_obs=0.0))
    assert asm.take_episode_returns() == [(2.0, 4)]


def test_lag_versions_and_seconds_behind():
    t0 = 1_000_000_000_000
    batch = [tr(0, version=5, recv_ns=t0 + 2_000_000_000), tr(1, version=4, recv_ns=t0 - 500_000_000),
             tr(2, version=2, recv_ns=t0 - 1_500_000_000), tr(3, version=6, recv_ns=t0),
             tr(4, version=4, recv_ns=t0 + 1_000_000_000)]  # v4 still acting after v5's publish
    behind, seconds = policy_lag(batch, newest_version=5, newest_publish_ns=t0)
    assert behind.tolist() == [0, 1, 3, 0, 1]
    np.testing.assert_allclose(seconds, [0.0, 0.5, 1.5, 0.0, 0.0])
    stats = lag_stats(behind, seconds, max_version_lag=1)
    assert (stats.versions_max, stats.stale) == (3, 1)
    assert stats.versions_mean == pytest.approx(1.0) and stats.seconds_max == pytest.approx(1.5)
    assert stats.seconds_mean == pytest.approx(0.4)


def test_stale_drop_masks_and_importance_weights_are_truncated():
    behind = torch.tensor([0, 1, 2, 3])
    start = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    behaviour = torch.tensor([-1.0, -0.5, -2.0, -1.2])
    keep, old, weight = stale_terms(PPOConfig(stale="drop", max_version_lag=1), behind=behind, start_logp=start,
                                    behaviour_logp=behaviour)
    assert keep.tolist() == [True, True, False, False]
    assert torch.equal(old, behaviour) and torch.equal(weight, torch.ones(4))
    keep, old, weight = stale_terms(PPOConfig(stale="importance", rho_max=1.0), behind=behind, start_logp=start,
                                    behaviour_logp=behaviour)
    assert keep.all() and torch.equal(old, start)
    expected = torch.tensor([1.0, float(np.exp(-0.5)), 1.0, 1.0])  # exp(1.0), exp(0.2) truncated at 1
    torch.testing.assert_close(weight, expected)
    with pytest.raises(ValueError, match="stale 'sometimes'"):
        PPOConfig(stale="sometimes")


def test_vector_env_keys_are_per_env_trajectories_across_a_gateway_change():
    """A vectorised session's envs are logged as "<id>/<i>" with the gateway's count of each env's episodes; a new
    gateway (a failover, a restart) counts from 0 again while the steps go on: nothing is taken for a duplicate,
    and the MID step after the change continues the same segment."""
    asm = TrajectoryAssembler()
    for env in range(2):
        for step in range(4):
            asm.add(tr(step, session=f"v/{env}", episode=3))
        for step in range(4, 7):  # the new gateway: episode 0 for the same episode
            asm.add(tr(step, session=f"v/{env}", episode=0, terminated=step == 6))
    segments = asm.take()
    assert [(s.session, [t.step for t in s.transitions], s.terminated) for s in segments] == [
        ("v/0", list(range(7)), True), ("v/1", list(range(7)), True)]
    asm.add(tr(5, session="v/0", episode=0))  # a repeat of a step already seen: dropped
    assert asm.ready == 0 and asm.take() == []

"""PPO's core, in process: it learns InvertedPendulum-v5 (real MuJoCo through gymnasium), and
stale data is dropped or importance-weighted inside a real update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protos import bridge_pb2, codec, experience_pb2
from protos.codec import Spec
from sim.mujoco import make_env
from trainer.policy import GaussianPolicy, MLPPolicy
from trainer.ppo import PPOConfig, PPOLearner
from trainer.trajectory import TrajectoryAssembler

BATCH = 1024
ENVS = 4


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what every trainer process does (2 shared cores)
    yield
    torch.set_num_threads(threads)


def rollout_transition(i: int, ts, nts, obs: np.ndarray, action: np.ndarray, log_prob: float, *, episode: int,
                       step: int, version: int) -> experience_pb2.Transition:
    t = experience_pb2.Transition(
        session=f"sim-{i}", episode=episode, step=step, step_type=int(ts.step_type),
        observation=[codec.encode("observation", obs)], action=[codec.encode("action", action)],
        reward=nts.reward, terminated=nts.terminated, truncated=nts.last() and not nts.terminated,
        policy_version=version, has_log_prob=True, log_prob=log_prob)
    if nts.last():
        t.next_observation.extend([codec.encode("observation", nts.observation["observation"])])
    return t


def test_ppo_learns_inverted_pendulum_in_process():
    """The hyperparameters `tether train` defaults to (batch 1024, 10 epochs x 8 minibatches, lr 1e-3,
    gamma 0.99, lambda 0.95, clip 0.2): a mean return >= 500 within 40k env steps (about 15k here)."""
    torch.manual_seed(0)
    envs = [make_env("InvertedPendulum-v5", seed=i) for i in range(ENVS)]
    policy = GaussianPolicy(envs[0].observation_spec()[0], envs[0].action_spec()[0], seed=0)
    learner = PPOLearner(policy, config=PPOConfig(), seed=0)
    asm = TrajectoryAssembler()
    ts = [env.reset() for env in envs]
    episode, step, version, returns = [0] * ENVS, [0] * ENVS, 1, []
    env_steps = 0
    try:
        while env_steps < 40_000:
            obs = np.stack([t.observation["observation"] for t in ts])
            with torch.no_grad():
                action, log_prob, _ = policy(torch.from_numpy(obs))
            for i, env in enumerate(envs):
                nts = env.step({"action": action[i].numpy()})
                asm.add(rollout_transition(i, ts[i], nts, obs[i], action[i].numpy(), float(log_prob[i, 0]),
                                           episode=episode[i], step=step[i], version=version))
                step[i] += 1
                if nts.last():
                    nts, episode[i], step[i] = envs[i].reset(), episode[i] + 1, 0
                ts[i] = nts
            env_steps += ENVS
            if asm.ready >= BATCH:
                stats = learner.update(asm.take(), newest_version=version)
                version += 1  # what a publish would do
                assert stats["lag_versions_max"] <= 1 and stats["kept"] == stats["samples"]  # held: one step old
                returns += [r for r, _ in asm.take_episode_returns()]
                if len(returns) >= 3 and np.mean(returns[-3:]) >= 500:
                    break
    finally:
        for env in envs:
            env.close()
    assert len(returns) >= 3 and np.mean(returns[-3:]) >= 500, (env_steps, returns[-5:])
    assert learner.steps == (version - 1) * 80


def synthetic_segments(versions: list[int]) -> TrajectoryAssembler:
    asm = TrajectoryAssembler()
    rng = np.random.default_rng(0)
    for step, v in enumerate(versions):
        asm.add(experience_pb2.Transition(
            session="s", episode=0, step=step, step_type=bridge_pb2.MID,
            observation=[codec.encode("observation", rng.normal(size=4).astype(np.float32))],
            action=[codec.encode("action", rng.normal(size=1).astype(np.float32))], reward=1.0,
            terminated=step == len(versions) - 1, policy_version=v, has_log_prob=True, log_prob=-1.0))
    return asm


@pytest.mark.parametrize(("stale", "kept"), [("drop", 3), ("importance", 6)])
def test_stale_transitions_in_an_update(stale, kept):
    spec_o, spec_a = Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,))
    learner = PPOLearner(GaussianPolicy(spec_o, spec_a, seed=0),
                         config=PPOConfig(stale=stale, max_version_lag=1, epochs=2, minibatches=2), seed=0)
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    stats = learner.update(synthetic_segments([3, 3, 5, 4, 5, 2]).take(), newest_version=5)  # behind 2 2 0 1 0 3
    assert (stats["samples"], stats["kept"], stats["stale"], stats["lag_versions_max"]) == (6, kept, 3, 3)
    assert learner.steps == 4
    assert any(not torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())


def test_ppo_needs_a_stochastic_policy():
    with pytest.raises(TypeError, match="GaussianPolicy"):
        PPOLearner(MLPPolicy(Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,))),
                   config=PPOConfig())


def test_bf16_autocast_updates_on_cpu():
    from trainer.bc import BCConfig, BCLearner

    spec_o, spec_a = Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,))
    learner = PPOLearner(GaussianPolicy(spec_o, spec_a, seed=0),
                         config=PPOConfig(bf16=True, epochs=2, minibatches=2), seed=0)
    stats = learner.update(synthetic_segments([1] * 32).take(), newest_version=1)
    assert learner.steps == 4 and all(np.isfinite(v) for v in stats.values())
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())  # autocast, not a cast
    bc = BCLearner(GaussianPolicy(spec_o, spec_a, seed=0), config=BCConfig(lr=1e-2, bf16=True))
    batch = [t for seg in synthetic_segments([1] * 32).take() for t in seg.transitions]
    losses = [bc.update(batch)["loss"] for _ in range(20)]
    assert losses[-1] < losses[0]

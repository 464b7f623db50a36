"""The shipped example configs against real MuJoCo envs (through sim.mujoco, as the sim client runs them):
they fit the envs' specs, and they agree with the envs' own rewards and terminations, step by step and
as one batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bridge.rewards import RewardFunction
from sim.mujoco import make_env

CONFIGS = Path(__file__).resolve().parents[2] / "launch" / "config" / "rewards"


def rollout(env_id: str, *, episodes: int, seed: int, max_steps: int) -> list[dict]:
    """Random in-bounds actions; one record per transition, each tensor with a batch dimension of 1."""
    env = make_env(env_id, seed=seed, max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    spec = env.action_spec()[0]
    records = []
    try:
        for _ in range(episodes):
            ts = env.reset()
            previous = None
            while not ts.last():
                action = {"action": rng.uniform(spec.low, spec.high, size=spec.shape).astype(np.float32)}
                nxt = env.step(action)
                applied = nxt.applied_action
                records.append({"observation": {k: v[None] for k, v in ts.observation.items()},
                                "action": {k: v[None] for k, v in applied.items()},
                                "next_observation": {k: v[None] for k, v in nxt.observation.items()},
                                "env_reward": np.array([nxt.reward]),
                                "previous_action": previous, "terminated": nxt.terminated})
                previous = {k: v[None] for k, v in applied.items()}
                ts = nxt
    finally:
        env.close()
    return records


def batched(records: list[dict]) -> dict:
    """All transitions as one batch; rows at an episode's first step get a zero previous action and
    `first_step` True."""
    cat = {key: {k: np.concatenate([r[key][k] for r in records]) for k in records[0][key]}
           for key in ("observation", "action", "next_observation")}
    first = np.array([r["previous_action"] is None for r in records])
    prev = {k: np.concatenate([np.zeros_like(r["action"][k]) if r["previous_action"] is None
                               else r["previous_action"][k] for r in records]) for k in records[0]["action"]}
    env = np.concatenate([r["env_reward"] for r in records])
    return {**cat, "env_reward": env, "previous_action": prev, "first_step": first}


def check_batch_matches_steps(fn: RewardFunction, records: list[dict], per_step: list) -> None:
    b = batched(records)
    whole = fn.compute(b["observation"], b["action"], b["next_observation"], b["env_reward"],
                       b["previous_action"], first_step=b["first_step"])
    for name in fn.terms:
        np.testing.assert_allclose(whole.terms[name], np.concatenate([r.terms[name] for r in per_step]),
                                   rtol=1e-12, atol=1e-12)
    assert whole.terminate.tolist() == [bool(r.terminate[0]) for r in per_step]


def test_inverted_pendulum_config_passes_the_reward_through_and_terminates_like_the_env():
    fn = RewardFunction.from_yaml(CONFIGS / "inverted_pendulum.yaml")
    env = make_env("InvertedPendulum-v5", seed=0)
    fn.check_specs(env.observation_spec(), env.action_spec())
    env.close()
    records = rollout("InvertedPendulum-v5", episodes=8, seed=3, max_steps=200)
    results = [fn.compute(r["observation"], r["action"], r["next_observation"], r["env_reward"],
                          r["previous_action"]) for r in records]
    terminated = [r["terminated"] for r in records]
    assert sum(terminated) >= 4, "random actions should drop the pole in most episodes"
    for r, res in zip(records, results, strict=True):
        assert res.reward.tolist() == r["env_reward"].tolist()
        assert res.terminate.tolist() == [r["terminated"]]
    check_batch_matches_steps(fn, records, results)
    # without a simulator reward: alive_bonus + the failure condition is the env's reward exactly
    robot = RewardFunction.from_dict({"reward": {"terms": [
        {"type": "alive_bonus"},
        {"type": "failure", "observation": "observation", "indices": [1], "above": 0.2, "terminate": True}]}})
    for r in records:
        res = robot.compute(r["observation"], r["action"], r["next_observation"], np.zeros(1))
        assert res.reward.tolist() == r["env_reward"].tolist()


def test_reach_config_recomputes_reachers_reward_and_adds_smoothness():
    fn = RewardFunction.from_yaml(CONFIGS / "reach.yaml")
    env = make_env("Reacher-v5", seed=0)
    fn.check_specs(env.observation_spec(), env.action_spec())
    env.close()
    assert fn.terms == ("distance", "control", "smoothness", "reached")
    records = rollout("Reacher-v5", episodes=3, seed=5, max_steps=50)
    results = []
    for r in records:
        res = fn.compute(r["observation"], r["action"], r["next_observation"], r["env_reward"],
                         r["previous_action"])
        results.append(res)
        # the env's own reward, from float32 observations: equal to float32 precision
        np.testing.assert_allclose(res.terms["distance"] + res.terms["control"], r["env_reward"], rtol=1e-5,
                                   atol=1e-6)
        a = r["action"]["action"].astype(np.float64)
        prev = r["previous_action"]
        expected = 0.0 if prev is None else -0.1 * float(((a - prev["action"]) ** 2).sum())
        np.testing.assert_allclose(res.terms["smoothness"], [expected], rtol=1e-12)
        dist = float(np.hypot(*r["next_observation"]["observation"][0, 8:10].astype(np.float64)))
        assert res.terminate.tolist() == [dist < 0.01]
        assert res.terms["reached"].tolist() == [5.0 if dist < 0.01 else 0.0]
    assert len({round(float(r.terms["distance"][0]), 6) for r in results}) > 10   # the fingertip moved
    assert sum(1 for r in records if r["previous_action"] is not None) > 0
    check_batch_matches_steps(fn, records, results)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    fn = RewardFunction.from_yaml(path)
    assert fn.version.startswith("sha256:") and fn.terms

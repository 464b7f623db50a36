"""Every vector adapter passes `sim.vector_contract.VectorEnvironmentContract`: gymnasium's
SyncVectorEnv over MuJoCo envs, and the Isaac Lab interface over a torch-tensor vector env
written here the way Isaac Lab's `DirectRLEnv` works (Isaac Lab itself needs a GPU machine)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

from protos.codec import TensorError
from sim.env import StepType
from sim.gym_vector import GymnasiumVectorEnv
from sim.isaaclab import IsaacLabUnavailable, IsaacLabVectorEnv, make_isaaclab_env
from sim.mujoco import GymnasiumEnv
from sim.registry import make_vector_env
from sim.vector_contract import VectorEnvironmentContract


class TestInvertedPendulumVector(VectorEnvironmentContract):
    def make_env(self, *, num_envs, seed=None):
        return GymnasiumVectorEnv("InvertedPendulum-v5", num_envs=num_envs, seed=seed, max_episode_steps=25)


class TestHopperVector(VectorEnvironmentContract):
    def make_env(self, *, num_envs, seed=None):
        return make_vector_env("mujoco:Hopper-v5", num_envs=num_envs, seed=seed, max_episode_steps=30)


class TestSerialPointMass(VectorEnvironmentContract):
    mixed_episode_ends = False  # random pushes rarely drive it out of [-2, 2]: the time limit ends episodes

    def make_env(self, *, num_envs, seed=None):
        return make_vector_env("serial:PointMass", num_envs=num_envs, seed=seed, max_episode_steps=30)


class TorchPointMasses:
    """Isaac Lab's DirectRLEnv interface in miniature: N point masses on a plane, torch tensors on
    `device`, observation groups {"policy": (N, 4), "critic": {"state": (N, 4), "time": (N, 1)}},
    actions (N, 2) unbounded (the env clamps them itself), same-step reset of the envs that ended."""

    def __init__(self, num_envs: int, *, device: str = "cpu", max_episode_length: int = 40):
        self.num_envs, self.device, self.max_episode_length = num_envs, torch.device(device), max_episode_length
        box = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.single_observation_space = gym.spaces.Dict(
            {"policy": box, "critic": gym.spaces.Dict({"state": box, "time": gym.spaces.Box(0, 1, (1,), np.float32)})})
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.state = torch.zeros(num_envs, 4, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.gen = torch.Generator(device=self.device)
        self.steps_called = 0

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self.state[ids] = (torch.rand(len(ids), 4, generator=self.gen, device=self.device) - 0.5) * 0.4
        self.t[ids] = 0

    def _obs(self) -> dict:
        time = (self.t.float() / self.max_episode_length).unsqueeze(1)
        return {"policy": self.state * 2.0, "critic": {"state": self.state, "time": time}}

    def reset(self, seed: int | None = None, options=None):
        if seed is not None:
            self.gen.manual_seed(seed)
        self._reset_idx(torch.arange(self.num_envs, device=self.device))
        return self._obs(), {}

    def step(self, action: torch.Tensor):
        assert action.device == self.device and action.shape == (self.num_envs, 2)
        self.steps_called += 1
        self.state[:, 2:] += 0.1 * action.clamp(-1, 1)
        self.state[:, :2] += 0.1 * self.state[:, 2:]
        self.t += 1
        reward = -self.state[:, :2].norm(dim=1)
        terminated = self.state[:, :2].abs().max(dim=1).values > 0.5
        truncated = self.t >= self.max_episode_length
        done = torch.nonzero(terminated | truncated).flatten()
        if len(done):
            self._reset_idx(done)
        return self._obs(), reward, terminated, truncated, {}

    def close(self) -> None:
        pass


class TestIsaacLabInterface(VectorEnvironmentContract):
    def make_env(self, *, num_envs, seed=None):
        return IsaacLabVectorEnv(TorchPointMasses(num_envs), seed=seed, action_bounds=(-1.0, 1.0))


def test_isaaclab_groups_become_tensors_and_one_env_step_serves_the_batch():
    inner = TorchPointMasses(8)
    env = IsaacLabVectorEnv(inner, seed=0, action_bounds=(-1.0, 1.0))
    assert [(s.name, s.shape) for s in env.observation_spec()] == [  # gymnasium's Dict sorts its keys
        ("critic/state", (4,)), ("critic/time", (1,)), ("policy", (4,))]
    assert env.action_spec()[0].low == (-1.0,) and not env.provides_final_observation
    ts = env.reset()
    np.testing.assert_array_equal(ts.observation["policy"], 2 * ts.observation["critic/state"])
    for i in range(1, 60):
        ts = env.step({"action": np.ones((8, 2), np.float32)})
        assert inner.steps_called == i and ts.final_observation is None
        # a LAST env's observation is already its next episode's first one (time 0)
        assert (ts.observation["critic/time"][ts.last(), 0] == 0).all()
    env.close()


def test_isaaclab_observations_are_copies_not_views_of_the_env_buffers():
    env = IsaacLabVectorEnv(TorchPointMasses(3), seed=0, action_bounds=(-1.0, 1.0))
    first = env.reset().observation["critic/state"].copy()
    ts = env.reset(seed=0)
    env.step({"action": np.ones((3, 2), np.float32)})
    np.testing.assert_array_equal(ts.observation["critic/state"], first)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the GPU path of the "
                    "Isaac Lab adapter runs only where torch sees a GPU")
def test_isaaclab_interface_on_cuda_matches_cpu():
    cpu = IsaacLabVectorEnv(TorchPointMasses(16), seed=3, action_bounds=(-1.0, 1.0))
    gpu = IsaacLabVectorEnv(TorchPointMasses(16, device="cuda"), seed=3, action_bounds=(-1.0, 1.0))
    assert gpu.device.type == "cuda"
    a, b = cpu.reset(), gpu.reset()
    assert a.observation["policy"].shape == b.observation["policy"].shape == (16, 4)
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = {"action": rng.uniform(-1, 1, (16, 2)).astype(np.float32)}
        a, b = cpu.step(action), gpu.step(action)
        np.testing.assert_allclose(a.observation["critic/state"], b.observation["critic/state"], atol=1e-4)
        assert (a.step_type == b.step_type).all()


def test_isaaclab_interface_rejects_what_it_cannot_carry():
    inner = TorchPointMasses(2)
    inner.single_action_space = gym.spaces.Discrete(3)
    with pytest.raises(ValueError, match="single_action_space should be a Box"):
        IsaacLabVectorEnv(inner)
    with pytest.raises(ValueError, match=r"action_bounds .* got \(1.0, -1.0\)"):
        IsaacLabVectorEnv(TorchPointMasses(2), action_bounds=(1.0, -1.0))


@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is not None, reason="Isaac Lab is installed here")
def test_isaaclab_task_says_what_is_missing():
    with pytest.raises(IsaacLabUnavailable, match=r"isaaclab:Isaac-Cartpole-v0 needs Isaac Lab.*newton:"):
        make_vector_env("isaaclab:Isaac-Cartpole-v0", num_envs=4)


@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is None,
                    reason="Isaac Lab (isaaclab + Isaac Sim) is not installed: it needs an NVIDIA GPU machine")
def test_isaaclab_cartpole_task_runs():  # pragma: no cover - GPU machines only
    env = make_isaaclab_env("Isaac-Cartpole-v0", num_envs=16, seed=0)
    ts = env.reset()
    assert (ts.step_type == StepType.FIRST).all() and ts.observation["policy"].shape[0] == 16
    ts = env.step({"action": np.zeros((16, *env.action_spec()[0].shape), np.float32)})
    assert ts.reward.shape == (16,)
    env.close()


def test_make_vector_env_names():
    with pytest.raises(ValueError, match="unknown vector env 'nope:x'.*'nope'"):
        make_vector_env("nope:x", num_envs=2)
    with pytest.raises(ValueError, match="names no task"):
        make_vector_env("newton:", num_envs=2)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        make_vector_env("InvertedPendulum-v5", num_envs=0)
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        make_vector_env("NoSuchEnv-v0", num_envs=2)


def test_a_refused_env_is_named_and_others_step():
    env = GymnasiumVectorEnv("InvertedPendulum-v5", num_envs=4, seed=0)
    env.reset()
    action = np.zeros((4, 1), np.float32)
    action[3, 0] = np.inf
    ts = env.step({"action": action})
    assert ts.refused.tolist() == [False, False, False, True]
    assert ts.errors == ((3, "action: env 3: contains NaN or infinite values"),)
    with pytest.raises(TensorError, match=r"action: shape \[3, 1\], expected \[4, 1\]"):
        env.step({"action": action[:3]})
    env.close()


@pytest.mark.parametrize("env_id", ["InvertedPendulum-v5", "Hopper-v5"])
def test_vector_env_i_is_the_single_env_seeded_seed_plus_i(env_id):
    """Episode boundaries, rewards and observations of each env match a single `GymnasiumEnv`
    seeded with seed + i and given the same actions, across auto-resets (the single env is
    reset where the vector env reported LAST)."""
    n, seed, rng = 3, 10, np.random.default_rng(0)
    vector = GymnasiumVectorEnv(env_id, num_envs=n, seed=seed, max_episode_steps=15)
    singles = [GymnasiumEnv(env_id, seed=seed + i, max_episode_steps=15) for i in range(n)]
    ts = vector.reset()
    for i, env in enumerate(singles):
        np.testing.assert_array_equal(ts.observation["observation"][i], env.reset().observation["observation"])
    lasts = 0
    for _ in range(40):
        action = rng.uniform(-1, 1, (n, *vector.action_spec()[0].shape)).astype(np.float32)
        ts = vector.step({"action": action})
        for i, env in enumerate(singles):
            one = env.step({"action": action[i]})
            assert one.step_type == ts.step_type[i] and one.terminated == ts.terminated[i]
            assert one.reward == ts.reward[i]
            np.testing.assert_array_equal(one.observation["observation"], ts.final_observation["observation"][i])
            if one.last():
                lasts += 1
                np.testing.assert_array_equal(env.reset().observation["observation"], ts.observation["observation"][i])
    assert lasts >= n, "the run should cross auto-resets"
    vector.close()

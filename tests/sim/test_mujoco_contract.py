"""Every adapter passes the same `sim.contract.EnvironmentContract` suite."""

from __future__ import annotations

import numpy as np
import pytest

from protos.codec import Spec, TensorError
from sim.contract import EnvironmentContract
from sim.env import BaseEnvironment, StepType
from sim.mujoco import GymnasiumEnv, make_env
from sim.toy import PointMass


class TestHopper(EnvironmentContract):
    def make_env(self, *, seed=None):
        return GymnasiumEnv("Hopper-v5", seed=seed, max_episode_steps=40)


class TestInvertedPendulum(EnvironmentContract):
    def make_env(self, *, seed=None):
        return make_env("InvertedPendulum-v5", seed=seed, max_episode_steps=40)


class TestPointMass(EnvironmentContract):
    def make_env(self, *, seed=None):
        return PointMass(seed=seed, max_episode_steps=30)


class Bandit(BaseEnvironment):
    """A second tiny env with two int/float action tensors, to show the suite is generic."""

    def __init__(self, *, seed=None):
        super().__init__(
            observation_spec=(Spec("count", np.int64, ()), Spec("signal", np.float32, (3,))),
            action_spec=(Spec("arm", np.int32, (), low=(0,), high=(3,)),
                         Spec("gain", np.float32, (2,), low=(-1.0, 0.0), high=(1.0, 2.0))))
        self._rng = np.random.default_rng(seed)
        self._t = 0

    def _obs(self):
        return {"count": np.array(self._t, np.int64), "signal": self._rng.random(3).astype(np.float32)}

    def _reset(self, *, seed):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._obs()

    def _step(self, action):
        self._t += 1
        return self._obs(), float(action["arm"]) * float(action["gain"].sum()), False, self._t >= 5


class TestBandit(EnvironmentContract):
    def make_env(self, *, seed=None):
        return Bandit(seed=seed)


def test_truncation_is_last_but_not_terminated():
    env = GymnasiumEnv("InvertedPendulum-v5", seed=0, max_episode_steps=3)
    ts = env.reset()
    for _ in range(3):
        ts = env.step({"action": np.zeros(1, np.float32)})
    assert ts.step_type is StepType.LAST and not ts.terminated
    env.close()


def test_termination_sets_terminated():
    env = PointMass(seed=0, max_episode_steps=None)
    ts = env.reset()
    while not ts.last():
        ts = env.step({"action": np.ones(1, np.float32)})
    assert ts.terminated


def test_hopper_specs_follow_the_box():
    env = make_env("Hopper-v5")
    (obs,), (act,) = env.observation_spec(), env.action_spec()
    assert (obs.name, obs.dtype, obs.shape, obs.low) == ("observation", np.dtype(np.float32), (11,), ())
    assert (act.name, act.shape, act.low, act.high) == ("action", (3,), (-1.0,) * 3, (1.0,) * 3)
    assert env.source == "mujoco:Hopper-v5"
    env.close()


def test_half_cheetah_by_name():
    env = make_env("HalfCheetah-v5", seed=0)
    ts = env.reset()
    assert ts.observation["observation"].shape == (17,)
    env.close()


def test_unsupported_or_unknown_env_is_a_clear_error():
    with pytest.raises(ValueError, match="NoSuchEnv-v0"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="only 1-D Box action"):
        make_env("CartPole-v1")


def test_list_action_is_rejected_naming_the_tensor():
    env = PointMass(seed=0)
    env.reset()
    with pytest.raises(TensorError, match="action: dtype float64, expected float32"):
        env.step({"action": [0.5]})


def test_compiler_warnings_go_to_logging_not_a_file(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="sim.mujoco"):
        make_env("HalfCheetah-v5").close()
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert all(r.name == "sim.mujoco" for r in caplog.records)

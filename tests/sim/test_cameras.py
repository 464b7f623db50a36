"""MuJoCo cameras (sim.cameras) rendered offscreen on the CPU, and the CameraReach task (sim.camera_reach): both
pass the environment contract; the images show what the state does not (the goal); bad cameras are refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sim.camera_reach import SUCCESS_M, CameraReach, expert_action, goal_in_top_image
from sim.cameras import with_cameras
from sim.contract import EnvironmentContract
from sim.mujoco import make_env


class TestCameraReach(EnvironmentContract):
    def make_env(self, *, seed=None):
        return with_cameras(CameraReach(seed=seed, max_episode_steps=30), ["top", "front"], size=32)


class TestHopperWithItsCamera(EnvironmentContract):
    steps = 30

    def make_env(self, *, seed=None):
        return with_cameras(make_env("Hopper-v5", seed=seed, max_episode_steps=20), ["track"], size=(24, 40))


def test_the_goal_is_in_the_images_only():
    env = with_cameras(make_env("CameraReach", seed=3), ["top", "front"], size=64)
    try:
        first = env.reset().observation
        second = env.reset().observation  # another goal, the fingertip reset near the centre
        for name in ("top", "front"):
            assert first[name].shape == (64, 64, 3) and first[name].dtype == np.uint8
            assert not np.array_equal(first[name], second[name]), f"{name}: the goal moved, the image did not"
        goal = goal_in_top_image(second["top"])
        assert np.linalg.norm(goal - env.env.goal()) < 0.01  # pixels -> table through the pinhole model
    finally:
        env.close()


def test_the_expert_reaches_goals_it_sees_and_zero_actions_do_not():
    def final_distances(policy) -> list[float]:
        env = with_cameras(CameraReach(seed=7), ["top"], size=48)
        try:
            distances = []
            for _ in range(5):
                ts = env.reset()
                while not ts.last():
                    ts = env.step(policy(ts.observation))
                distances.append(env.env.distance())
            return distances
        finally:
            env.close()

    assert max(final_distances(expert_action)) < SUCCESS_M
    assert min(final_distances(lambda _: {"action": np.zeros(2, np.float32)})) > SUCCESS_M
    with pytest.raises(KeyError, match="needs the 'top' camera's image"):
        expert_action({"observation": np.zeros(4, np.float32)})


@pytest.mark.parametrize(("env_id", "cameras", "size", "message"), [
    ("CameraReach", ["wrist"], 32, "camera 'wrist' is not in the MuJoCo model; its cameras are ['top', 'front']"),
    ("CameraReach", ["top", "top"], 32, "name one camera twice"),
    ("CameraReach", ["observation"], 32, "would replace"),
    ("CameraReach", ["top"], 4, "image height must be an integer in [8, 4096], got 4"),
    ("PointMass", ["top"], 32, "has no MuJoCo model to render"),
])
def test_bad_cameras_are_refused_naming_them(env_id, cameras, size, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        with_cameras(make_env(env_id), cameras, size=size)


def test_tether_sim_refuses_a_bad_camera_flag_clearly():
    run = subprocess.run([sys.executable, "-m", "tether", "sim", "--gateway", "127.0.0.1:1", "--env", "CameraReach",
                          "--camera", "wrist", "--seconds", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "camera 'wrist' is not in the MuJoCo model" in run.stderr, run.stderr[-2000:]

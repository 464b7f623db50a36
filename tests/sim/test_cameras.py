"""MuJoCo cameras (sim.cameras) rendered offscreen on the CPU, and the CameraReach task (sim.camera_reach): both
pass the environment contract; the images show what the state does not (the goal); bad cameras are refused; `tether
sim --camera` streams JPEG frames that a real gateway decodes for the policy Triton serves."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from protos.codec import decode, encoding_name
from sim.camera_reach import SUCCESS_M, CameraReach, expert_action, goal_in_top_image
from sim.cameras import with_cameras
from sim.contract import EnvironmentContract
from sim.mujoco import make_env
from tests.support.gateways import gateway_process
from tests.support.triton import LOAD_TIMEOUT_S
from trainer.camera_policy import CameraChunkPolicy
from trainer.sources import LogDataset


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


def test_tether_sim_streams_jpeg_frames_that_the_gateway_decodes_for_the_policy(triton, tmp_path):
    """`tether sim --camera` through a real gateway and Triton: the frames travel and are logged as JPEG, and the
    action logged for each step is the served camera policy's output on the decoded frames."""
    probe = with_cameras(CameraReach(), ["top", "front"], size=32)
    state, *cameras = probe.observation_spec()
    policy = CameraChunkPolicy(state, cameras, probe.action_spec()[0], horizon=None, seed=3).eval()
    probe.close()
    name = triton.claim("camera_reach_sim")
    triton.repo.write_version(name, 1, policy, policy.inputs, policy.outputs)
    triton.server.load_model(name, timeout=LOAD_TIMEOUT_S)
    summary = tmp_path / "sim.json"
    with gateway_process(triton.url, tmp_path / "gateway.log", "--experience-dir", tmp_path / "log",
                         policy=name) as gateway:
        run = subprocess.run([sys.executable, "-m", "tether", "sim", "--gateway", gateway.address, "--env",
                              "CameraReach", "--camera", "top", "--camera", "front", "--image-size", "32", "--steps",
                              "60", "--seed", "0", "--summary", str(summary)], capture_output=True, text=True,
                             timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    stats = json.loads(summary.read_text())
    assert stats["steps"] == 60 and not stats["errors"] and stats["policy_versions"] == {"1": 60}, stats
    logged = LogDataset(tmp_path / "log").transitions
    assert len(logged) == 60
    for t in logged[::10]:
        frames = {x.name: x for x in t.observation}
        assert {encoding_name(frames[c].encoding) for c in ("top", "front")} == {"JPEG"}
        assert len(frames["top"].data) < 32 * 32 * 3
        seen = [decode(frames[s.name])[None].copy() for s in policy.inputs]
        with torch.no_grad():
            want = policy(*map(torch.from_numpy, seen)).numpy()[0]
        np.testing.assert_allclose(decode(t.action[0]), want, rtol=1e-4, atol=1e-5)

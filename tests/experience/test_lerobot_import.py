"""A LeRobotDataset written by LeRobot 0.4.4's own writer (in its environment, .venv/lerobot) of a scripted linear
demonstrator: `read_lerobot` gives its frames back as Transitions (the pictures LeRobot's loader decodes), and
`tether train --algo bc --demos DIR` clones the demonstrator from it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bridge.experience.lerobot import read_lerobot
from protos import codec
from protos.codec import Spec
from tests.support.lerobot_logs import ROOT, lerobot_side
from trainer.algorithms.sac import seed_replay
from trainer.replay import MixedReplay, ReplayAdder
from trainer.weights import build_policy

GAIN = np.array([[-1.0, 0.2, -0.5, 0.0], [0.3, -0.8, 0.0, -0.6]], np.float32)  # action = GAIN @ state
EPISODES, STEPS = 16, 30
# closed loop from new start states: |cloned - demonstrator| on actions of up to ~1.1 (measured: mean 0.016, max 0.15,
# at start states unlike the 16 demonstrated ones)
MEAN_ERROR, MAX_ERROR = 0.04, 0.3


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot") / "demo"
    made = lerobot_side("make", str(root), "--episodes", str(EPISODES), "--steps", str(STEPS),
                        "--gain", json.dumps(GAIN.tolist()))
    return root, made, np.load(str(root) + ".frames.npz")


def test_read_lerobot_imports_lerobots_own_dataset(demo):
    root, made, frames = demo
    assert made["lengths"] == [STEPS] * EPISODES and made["video_keys"] == ["observation.images.top"]
    ts = read_lerobot(root)
    assert len(ts) == EPISODES * STEPS
    assert [x.name for x in ts[0].observation] == ["observation", "top"]
    assert [(t.episode, t.step, t.offset) for t in ts[STEPS - 1:STEPS + 1]] == [(0, STEPS - 1, STEPS - 1),
                                                                                 (1, 0, STEPS)]
    last = [t for t in ts if t.step == STEPS - 1]
    assert len(last) == EPISODES and all(t.terminated and not t.truncated for t in last)
    assert not any(t.terminated or t.truncated for t in ts if t.step < STEPS - 1)
    assert all(t.intervention and t.source == "lerobot:demo" and t.applied_action == t.action for t in ts)
    states = np.stack([codec.decode(t.observation[0]) for t in ts])
    actions = np.stack([codec.decode(t.applied_action[0]) for t in ts])
    assert actions.tolist() == made["actions"]                                   # = what LeRobot's loader gives
    fit = np.linalg.lstsq(states, actions, rcond=None)[0].T                      # rows aligned: state i, action i
    assert np.abs(fit - GAIN).max() < 1e-4
    ours = np.stack([codec.decode(t.observation[1]) for t in ts])
    assert ours.shape == (EPISODES * STEPS, 48, 64, 3) and ours.dtype == np.uint8
    vs_lerobot = np.abs(ours.astype(np.int16) - frames["top"]).mean()
    vs_raw = np.abs(ours.astype(np.int16) - frames["raw"]).mean()
    assert vs_lerobot < 0.5, vs_lerobot       # PyAV's decode = torchcodec's (measured 0.0)
    assert vs_raw < 6.0, vs_raw               # AV1 at LeRobot's CRF 30 (measured ~2.6 levels of 255)


def test_bc_clones_the_demonstrator_from_the_lerobot_folder(demo, tmp_path):
    root, _, _ = demo
    out = tmp_path / "policy.safetensors"
    train = subprocess.run(
        [sys.executable, "-m", "tether", "train", "--algo", "bc", "--arch", "mlp", "--demos", str(root), "--nproc", "1",
         "--steps", "1500", "--lr", "3e-3", "--batch", "64", "--seed", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert train.returncode == 0, train.stderr[-3000:]
    assert f"bc: {EPISODES * STEPS} transitions" in train.stderr
    policy = build_policy("mlp", (Spec("observation", np.float32, (4,)),), (Spec("action", np.float32, (2,)),),
                          hidden=(64, 64), seed=0)
    policy.load_state_dict(load_file(out))
    rng, errors = np.random.default_rng(7), []
    for _ in range(5):  # the clone drives the demonstrator's point mass from new start states
        state = rng.uniform(-1, 1, 4).astype(np.float32)
        for _ in range(40):
            with torch.no_grad():
                action = policy(torch.from_numpy(state[None])).numpy()[0]
            errors.append(np.abs(action - GAIN @ state).max())
            vel = 0.9 * state[2:] + 0.1 * action
            state = np.concatenate([state[:2] + 0.1 * vel, vel]).astype(np.float32)
    assert np.mean(errors) < MEAN_ERROR and np.max(errors) < MAX_ERROR, (np.mean(errors), np.max(errors))


def test_sac_demos_take_the_lerobot_folder(demo):
    root, _, _ = demo
    replay = MixedReplay(capacity=1000, observation_size=4, action_size=2)
    demos = ReplayAdder(replay, observation="observation", action="action", demos=True)
    expect = (Spec("observation", np.float32, (4,)), Spec("action", np.float32, (2,)))
    assert seed_replay(demos, [str(root)], policy=None, expect=expect) == EPISODES * STEPS

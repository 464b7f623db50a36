"""Behaviour cloning end to end: a scripted controller drives MuJoCo sims through the real gateway,
which logs every transition; `tether train --algo bc` (torchrun, 2 ranks) learns from the log and
publishes a version that Triton then serves; it reproduces the controller's actions."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from sim.client import run_sessions
from sim.mujoco import make_env
from tether.stack import Stack

pytestmark = pytest.mark.slow
GAINS = np.array([0.5, 8.0, 0.6, 1.2], np.float32)  # a PD-like cart-pole controller, well inside [-3, 3]
TOLERANCE = 0.15  # max |served - controller| over the probe states, on a [-3, 3] action range (2.5%)


def controller(observation):
    return {"action": np.clip(observation["observation"] @ GAINS, -3.0, 3.0).reshape(1).astype(np.float32)}


def test_bc_from_logged_demonstrations_reproduces_the_controller(tmp_path):
    log_dir = tmp_path / "experience"
    # Triton + a `tether gateway` process serving a fresh MLP (seed 0) as invertedpendulum_v5 v1
    with Stack(tmp_path, envs=["InvertedPendulum-v5"],
               gateway_args=["--experience-dir", str(log_dir), "--deadline-ms", "2000"]) as stack:
        gw, policy = stack.gateway, "invertedpendulum_v5"
        demo = asyncio.run(run_sessions(gw, lambda i: make_env("InvertedPendulum-v5", seed=i), envs=4,
                                        steps=4000, controller=controller))
        assert demo.steps == 4000 and not demo.errors
        train = subprocess.run(
            [sys.executable, "-m", "tether", "train", "--algo", "bc", "--arch", "mlp", "--gateway", gw,
             "--policy", policy, "--log-dir", str(log_dir), "--steps", "600", "--lr", "3e-3", "--nproc", "2",
             "--seed", "0", "--summary", str(tmp_path / "bc.json")],
            capture_output=True, text=True, timeout=600)
        assert train.returncode == 0, train.stderr[-3000:]
        summary = json.loads((tmp_path / "bc.json").read_text())
        assert summary["published_version"] == 2

        probe_env = make_env("InvertedPendulum-v5", seed=123)
        states = []

        def record(observation):  # the served policy acts; remember its states to compare
            states.append(observation["observation"].copy())
            return controller(observation)

        served = asyncio.run(run_sessions(gw, lambda i: probe_env, envs=1, steps=200, controller=record))
        assert served.policy_versions.keys() == {2}
        # the served actions on those states, straight from Triton at version 2
        import tritonclient.grpc as triton_grpc

        client = triton_grpc.InferenceServerClient(stack.triton_url)
        batch = np.stack(states[::3][:64]).astype(np.float32)  # the model's max batch is 64
        inp = triton_grpc.InferInput("observation", batch.shape, "FP32")
        inp.set_data_from_numpy(batch)
        got = client.infer(policy, [inp], model_version="2").as_numpy("action")[:, 0]
    want = np.clip(batch @ GAINS, -3.0, 3.0)
    error = np.abs(got - want)
    assert error.max() <= TOLERANCE, f"max {error.max():.3f}, mean {error.mean():.3f}"

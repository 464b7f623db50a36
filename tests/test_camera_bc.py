"""Behaviour cloning from logged camera demonstrations: the scripted expert (it finds the goal in the top camera's
image) drives CameraReach sims with two rendered cameras through a real gateway on the session's Triton, which logs
every transition, images included; the BC learner fits a chunk policy (H = 16) to the logged actions. On episodes it
never saw, its chunks are far closer to the expert's than the mean chunk or the untrained policy, and executed in
closed loop (8 actions of each chunk) it ends episodes far nearer the goal than the untrained policy does. Small
images (32x32) keep it to tens of seconds on a CPU; `tether demo --camera` runs the 224x224 policy."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc

from protos.codec import JPEG, decode_all
from sim.camera_reach import SUCCESS_M, CameraReach, expert_action
from sim.cameras import with_cameras
from sim.client import run_sessions
from sim.env import observation_encoder
from tests.support.gateways import gateway_process, running_gateway
from tests.support.triton import LOAD_TIMEOUT_S
from trainer.bc import BCConfig, BCLearner, chunk_targets, inputs
from trainer.camera_policy import CameraChunkPolicy
from trainer.sources import LogDataset

pytestmark = pytest.mark.slow

SIZE, HORIZON, NAMES = 32, 16, ("observation", "top", "front")


def make(seed: int):
    return with_cameras(CameraReach(seed=seed), ["top", "front"], size=SIZE)


def chunk_error(policy, transitions, chunks) -> float:
    with torch.no_grad():
        out = policy(*(torch.from_numpy(x) for x in inputs(transitions, NAMES))).numpy()
    return float(((out - np.stack([chunks[t.offset] for t in transitions])) ** 2).mean())


def final_distances(policy, *, episodes: int = 10, execute: int = 8) -> np.ndarray:
    """The fingertip's distance to the goal at the end of each episode, `policy` acting in closed loop on its
    chunks, 8 actions of each."""
    env, distances = make(99), []
    as_sent = observation_encoder(env.observation_spec())  # the policy sees what a gateway decodes: JPEG'd images
    try:
        for _ in range(episodes):
            ts = env.reset()
            while not ts.last():
                seen = decode_all(as_sent(ts.observation))
                with torch.no_grad():
                    chunk = policy(*(torch.from_numpy(seen[n][None].copy()) for n in NAMES)).numpy()[0]
                for action in chunk[:execute]:
                    ts = env.step({"action": action})
                    if ts.last():
                        break
            distances.append(env.env.distance())
    finally:
        env.close()
    return np.array(distances)


def test_bc_from_logged_camera_demonstrations_beats_the_baselines(triton, tmp_path):
    torch.set_num_threads(1)
    probe = make(0)
    state, cameras, action = probe.observation_spec()[0], probe.observation_spec()[1:], probe.action_spec()[0]
    probe.close()
    # the served policy answers each step (one action); the expert's action is the one applied and logged
    name = triton.claim("camera_reach_bc")
    acting = CameraChunkPolicy(state, cameras, action, horizon=None, seed=1).eval()
    triton.repo.write_version(name, 1, acting, acting.inputs, acting.outputs)
    triton.server.load_model(name, timeout=LOAD_TIMEOUT_S)

    async def demonstrate(log_dir, seed, episodes):
        async with running_gateway(triton.url, policy=name, experience_dir=log_dir) as gateway:
            # one session: the log's order, hence the batches and the learned policy, is the same each run
            return await run_sessions(gateway.address, lambda i: make(seed + i), envs=1, episodes=episodes,
                                      controller=expert_action, session_prefix=f"demo{seed}")

    train_stats = asyncio.run(demonstrate(tmp_path / "train", 1, 40))
    test_stats = asyncio.run(demonstrate(tmp_path / "test", 50, 6))
    assert not train_stats.errors and not test_stats.errors, (train_stats.errors, test_stats.errors)
    assert train_stats.episodes == 40 and train_stats.policy_versions.keys() == {1}

    train = LogDataset(tmp_path / "train", seed=0)
    held_out = LogDataset(tmp_path / "test").transitions
    assert len(train) == 40 * 50
    assert {(t.observation[1].name, t.observation[1].encoding) for t in train.transitions} == {("top", JPEG)}
    chunks, held_out_chunks = chunk_targets(train.transitions, horizon=HORIZON), \
        chunk_targets(held_out, horizon=HORIZON)

    policy = CameraChunkPolicy(state, cameras, action, horizon=HORIZON, seed=0)
    untrained_error, untrained = chunk_error(policy.eval(), held_out, held_out_chunks), final_distances(policy)
    mean_chunk = np.stack(list(chunks.values())).mean(axis=0)
    mean_error = float(((np.stack([held_out_chunks[t.offset] for t in held_out]) - mean_chunk) ** 2).mean())

    learner = BCLearner(policy.train(), config=BCConfig(lr=1e-3), observation=NAMES, chunks=chunks)
    epoch = 0
    while learner.steps < 1200:
        for batch in train.batches(64, epoch=epoch):
            learner.update(batch)
        epoch += 1
    policy.eval()
    error = chunk_error(policy, held_out, held_out_chunks)
    reached = final_distances(policy)
    report = (f"held-out chunk MSE {error:.4f} (mean chunk {mean_error:.4f}, untrained {untrained_error:.4f}); "
              f"final distance to the goal {reached.mean():.3f} m, {(reached < SUCCESS_M).sum()}/10 within "
              f"{SUCCESS_M} m (untrained {untrained.mean():.3f} m, {(untrained < SUCCESS_M).sum()}/10)")
    print(report)
    assert error < 0.5 * mean_error and error < 0.5 * untrained_error, report
    assert reached.mean() < 0.4 * untrained.mean() and (reached < SUCCESS_M).sum() > (untrained < SUCCESS_M).sum(), \
        report


def test_tether_train_bc_publishes_a_camera_chunk_policy_that_beats_its_parent(triton, tmp_path):
    """The same loop through `tether train --algo bc --arch camera`: the expert's steps are logged under a per-step
    camera policy (`--data-policy`), the trainer fetches the served chunk policy (v1), fits it to the logged
    steps' chunks and publishes v2, which the gateway verifies and Triton serves: v2's chunks on held-out episodes
    are far closer to the expert's than v1's."""
    probe = make(0)
    state, cameras, action = probe.observation_spec()[0], probe.observation_spec()[1:], probe.action_spec()[0]
    probe.close()
    step_name, chunk_name = triton.claim("camera_reach_step"), triton.claim("camera_reach_h16")
    acting = CameraChunkPolicy(state, cameras, action, horizon=None, seed=1).eval()
    chunked = CameraChunkPolicy(state, cameras, action, horizon=HORIZON, seed=0).eval()
    for name, policy in ((step_name, acting), (chunk_name, chunked)):
        triton.repo.write_version(name, 1, policy, policy.inputs, policy.outputs)
        triton.server.load_model(name, timeout=LOAD_TIMEOUT_S)
    log_dir, summary = tmp_path / "experience", tmp_path / "bc.json"
    with gateway_process(triton.url, tmp_path / "gateway.log", "--experience-dir", log_dir,
                         *triton.publishing_args(tmp_path), policy=chunk_name) as gateway:
        demo = asyncio.run(run_sessions(gateway.address, lambda i: make(1 + i), envs=1, episodes=30,
                                        controller=expert_action, policy=step_name, session_prefix="demo"))
        assert demo.episodes == 30 and not demo.errors and demo.policy_versions.keys() == {1}
        train = subprocess.run(
            [sys.executable, "-m", "tether", "train", "--algo", "bc", "--arch", "camera", "--gateway", gateway.address,
             "--policy", chunk_name, "--data-policy", step_name, "--experience-dir", str(log_dir), "--steps", "900",
             "--batch", "64", "--lr", "1e-3", "--nproc", "1", "--seed", "0", "--summary", str(summary)],
            capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    assert json.loads(summary.read_text())["published_version"] == 2

    # held-out episodes the expert drives in this process, their frames as the gateway decodes them
    env, episodes = make(77), []
    as_sent = observation_encoder(env.observation_spec())
    for _ in range(4):
        ts, observations, actions = env.reset(), [], []
        while not ts.last():
            observations.append(decode_all(as_sent(ts.observation)))
            actions.append(expert_action(ts.observation)["action"])
            ts = env.step({"action": actions[-1]})
        padded = np.concatenate([actions, np.repeat(actions[-1:], HORIZON - 1, axis=0)])
        episodes += [(o, padded[i:i + HORIZON]) for i, o in enumerate(observations)]
    env.close()
    want = np.stack([chunk for _, chunk in episodes[::4]])
    client = triton_grpc.InferenceServerClient(triton.url)
    errors = {}
    for version in ("1", "2"):
        feed = []
        for spec in chunked.inputs:
            batch = np.stack([o[spec.name] for o, _ in episodes[::4]])
            kind = "UINT8" if batch.dtype == np.uint8 else "FP32"
            tensor = triton_grpc.InferInput(spec.name, list(batch.shape), kind)
            tensor.set_data_from_numpy(batch)
            feed.append(tensor)
        got = client.infer(chunk_name, feed, model_version=version).as_numpy("action")
        errors[version] = float(((got - want) ** 2).mean())
    print(f"held-out chunk MSE through Triton: v1 (untrained) {errors['1']:.4f}, v2 (BC) {errors['2']:.4f}")
    assert errors["2"] < 0.5 * errors["1"], errors

"""A freshly initialised policy per env, as version 1 of its model: what `tether demo`, `tether triton --init`,
`tether.stack.Stack(envs=...)` and `tether cluster up` serve before any training.

    name = write_initial_policy(ModelRepository(root), "InvertedPendulum-v5", stochastic=True)   # "invertedpendulum_v5"
    name = write_camera_policy(ModelRepository(root), camera_env, horizon=16)   # "camerareach_h16": images -> chunks
"""

from __future__ import annotations

import re

import numpy as np

import sim
from inference_server import ModelRepository
from trainer.policy import GaussianPolicy, MLPPolicy

__all__ = ["initial_log_std", "policy_name", "write_camera_policy", "write_initial_policy"]


def policy_name(env_id: str) -> str:
    """A Triton model name for an env's policy: `Hopper-v5` -> `hopper_v5`."""
    return re.sub(r"[^a-z0-9]+", "_", env_id.lower()).strip("_")


def write_initial_policy(repo: ModelRepository, env_id: str, *, seed: int = 0, stochastic: bool = False,
                         serve: str | None = None) -> str:
    """A freshly initialised policy for `env_id`, written as version 1 of its model; returns the
    name. `stochastic`: a Gaussian policy that samples in Triton and reports its log-probability
    (what PPO learns from); otherwise a deterministic MLP. `serve`: its runtime in Triton, and
    that of every version published over it ("torchscript" | "onnx"); by default onnxruntime for
    the stochastic (trained) policy: a version then goes live in ~0.3 s instead of ~1.5-10 s, the
    stub not importing torch (benchmarks/weight_sync.py)."""
    serve = serve or ("onnx" if stochastic else "torchscript")
    env = sim.make(env_id)  # the one env registry (sim.registry): a vector id gives a vector env of one
    try:
        observation, action = env.observation_spec(), env.action_spec()
    finally:
        env.close()
    name = policy_name(env_id)
    if not repo.versions(name):
        if stochastic:
            module = GaussianPolicy(observation[0], action[0], seed=seed, log_std_init=initial_log_std(action[0]))
            repo.write_version(name, 1, module, observation, GaussianPolicy.output_specs(action[0]), serve=serve)
        else:
            repo.write_version(name, 1, MLPPolicy(observation[0], action[0], seed=seed), observation, action,
                               serve=serve)
    return name


def write_camera_policy(repo: ModelRepository, env, *, horizon: int = 16, seed: int = 0,
                        serve: str = "torchscript") -> str:
    """A fresh `CameraChunkPolicy` (trainer.camera_policy) for `env`, an env whose first observation tensor is its
    state and the others camera images (`sim.cameras.with_cameras`), as version 1 of `<env>_h<horizon>`: chunks of
    `horizon` actions. Returns the name."""
    from trainer.camera_policy import CameraChunkPolicy

    state, *cameras = env.observation_spec()
    name = f"{policy_name(getattr(env, 'source', 'camera').partition(':')[2] or 'camera')}_h{horizon}"
    if not repo.versions(name):
        policy = CameraChunkPolicy(state, cameras, env.action_spec()[0], horizon=horizon, seed=seed).eval()
        repo.write_version(name, 1, policy, policy.inputs, policy.outputs, serve=serve)
    return name


def initial_log_std(action) -> float:
    """The fresh Gaussian policy's exploration: std = a quarter of the action's range, at most 1 (1 without
    bounds). A [-1, 1] actuator (Hopper, Newton's cartpole) starts at 0.5: at std 1 about a third of the samples
    fall outside the bounds (clipped by the actuator) and PPO spends its first updates shrinking the std
    (Newton's cartpole: std 1.07 -> 1.00 over 11 versions); InvertedPendulum's [-3, 3] keeps 1.

    >>> from protos.codec import Spec
    >>> round(initial_log_std(Spec("a", "float32", (1,), low=(-1.0,), high=(1.0,))), 3), initial_log_std(
    ...     Spec("a", "float32", (1,), low=(-3.0,), high=(3.0,))), initial_log_std(Spec("a", "float32", (2,)))
    (-0.693, 0.0, 0.0)
    """
    if not action.low or not action.high:
        return 0.0
    span = float(np.min(np.asarray(action.high, np.float64) - np.asarray(action.low, np.float64)))
    return float(np.log(min(1.0, span / 4))) if np.isfinite(span) and span > 0 else 0.0

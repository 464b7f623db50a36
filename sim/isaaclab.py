"""Isaac Lab's vector interface behind the `sim.vector` contract.

`IsaacLabVectorEnv` wraps any env with the interface of Isaac Lab's `ManagerBasedRLEnv` /
`DirectRLEnv` (a gymnasium vector env on torch tensors, possibly on CUDA): `num_envs`, `device`,
`single_observation_space` (a `Dict` of observation groups such as `{"policy": Box}`),
`single_action_space` (a `Box`), `reset(seed=) -> (obs, extras)` and
`step(action) -> (obs, reward, terminated, truncated, extras)`. With Isaac Lab installed (a GPU
machine), `make_isaaclab_env("Isaac-Cartpole-v0", num_envs=64)` starts Isaac Sim and builds the
task; elsewhere it raises `IsaacLabUnavailable` saying what is missing:

    env = make_isaaclab_env("Isaac-Cartpole-v0", num_envs=1024, device="cuda:0", seed=0)
    ts = env.reset()                        # ts.observation["policy"]: (1024, 4) float32 numpy
    ts = env.step({"action": actions})      # actions: (1024, 1) float32 numpy

Each observation group is one tensor named after it (nested groups as "group/term"); the action
is the tensor "action". Per batch, the action moves to the env's device in one copy and
everything the env returns comes back in one copy (concatenated on the device); no per-env Python.
Isaac Lab resets ended envs inside `step` (same-step auto-reset, the contract's) but does not
return their terminal observation: `final_observation` is None (`provides_final_observation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from protos.codec import Spec
from sim.vector import BaseVectorEnvironment

__all__ = ["IsaacLabUnavailable", "IsaacLabVectorEnv", "make_isaaclab_env"]


class IsaacLabUnavailable(ImportError):
    """`isaaclab:<task>` was asked for where Isaac Lab cannot be imported."""


def _box_bounds(space: Any, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    low = np.asarray(space.low, np.float64).ravel()
    high = np.asarray(space.high, np.float64).ravel()
    if np.isinf(low).all() and np.isinf(high).all():
        return (), ()
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(f"{name}: partly unbounded Box spaces are not supported, got {space}")
    return tuple(low.tolist()), tuple(high.tolist())


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"policy": x, "critic": {"a": y}} -> {"policy": x, "critic/a": y}, in insertion order."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


class IsaacLabVectorEnv(BaseVectorEnvironment):
    """The `sim.vector` contract over an Isaac Lab style env (`env.unwrapped` is used if present).

    `seed` seeds the first `reset()` that is not given its own seed. `action_bounds=(low, high)`
    clips actions where the action space is unbounded (Isaac Lab's usual Box(-inf, inf)).
    """

    provides_final_observation = False

    def __init__(self, env: Any, *, seed: int | None = None,
                 action_bounds: tuple[float, float] | None = None, source: str | None = None):
        import gymnasium as gym
        import torch

        inner = getattr(env, "unwrapped", env)
        obs_space, act_space = inner.single_observation_space, inner.single_action_space
        if not isinstance(obs_space, gym.spaces.Dict):
            raise ValueError(f"Isaac Lab env: single_observation_space should be a Dict of groups, got {obs_space}")
        if not isinstance(act_space, gym.spaces.Box):
            raise ValueError(f"Isaac Lab env: single_action_space should be a Box, got {act_space}")
        obs_specs = []
        for name, space in _flatten(obs_space.spaces).items():
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(f"Isaac Lab env: observation {name!r} should be a Box, got {space}")
            low, high = _box_bounds(space, name)
            obs_specs.append(Spec(name, np.dtype(space.dtype), tuple(space.shape), low=low, high=high))
        low, high = _box_bounds(act_space, "action")
        if action_bounds is not None:
            lo, hi = (float(b) for b in action_bounds)
            if not lo < hi:
                raise ValueError(f"action_bounds must be (low, high) with low < high, got {action_bounds!r}")
            low, high = (lo,), (hi,)
        super().__init__(num_envs=int(inner.num_envs), observation_spec=obs_specs,
                         action_spec=(Spec("action", np.float32, tuple(act_space.shape), low=low, high=high),))
        self._env = env
        self._torch = torch
        self.device = torch.device(inner.device)
        self.source = source or f"isaaclab:{type(inner).__name__}"
        self._seed = seed
        self._closed = False
        # one float32 host copy per batch when every observation is float32 (Isaac Lab's case)
        self._packed = all(s.dtype == np.float32 for s in obs_specs)
        self._widths = [int(np.prod(s.shape, dtype=np.int64)) for s in obs_specs]

    def _observations(self, obs: Mapping, extra: tuple = ()) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Observation tensors (and `extra` (N,) tensors) to numpy, in one device-to-host copy."""
        torch, n = self._torch, self.num_envs
        tensors = _flatten(obs)
        missing = [s.name for s in self._observation_spec if s.name not in tensors]
        if missing:
            raise ValueError(f"Isaac Lab env returned observation groups {sorted(tensors)}, missing {missing}")
        if self._packed:
            columns = [tensors[s.name].reshape(n, -1).to(torch.float32) for s in self._observation_spec]
            columns += [t.reshape(n, 1).to(torch.float32) for t in extra]
            host = torch.cat(columns, dim=1).to("cpu").numpy()
            out, at = {}, 0
            for spec, width in zip(self._observation_spec, self._widths, strict=True):
                out[spec.name] = host[:, at:at + width].reshape(n, *spec.shape)
                at += width
            return out, [host[:, at + i] for i in range(len(extra))]
        out = {s.name: tensors[s.name].detach().to("cpu", copy=True).numpy().astype(s.dtype, copy=False)
               for s in self._observation_spec}
        return out, [t.detach().to("cpu", copy=True).numpy() for t in extra]

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        obs, _ = self._env.reset(seed=seed)
        with self._torch.no_grad():
            return self._observations(obs)[0]

    def _step(self, actions: dict[str, np.ndarray]):
        torch = self._torch
        with torch.no_grad():
            action = torch.from_numpy(actions["action"]).to(self.device, copy=True)  # the env may write to it
            obs, reward, terminated, truncated, _ = self._env.step(action)
            out, (reward, terminated, truncated) = self._observations(obs, (reward, terminated, truncated))
        return out, reward.astype(np.float64), terminated != 0, truncated != 0, None

    def close(self) -> None:
        super().close()
        if not self._closed:
            self._closed = True
            self._env.close()


def make_isaaclab_env(task: str, *, num_envs: int, seed: int | None = None, device: str = "cuda:0",
                      headless: bool = True, action_bounds: tuple[float, float] | None = None) -> IsaacLabVectorEnv:
    """An Isaac Lab task (e.g. "Isaac-Cartpole-v0") as a vector env; starts Isaac Sim (headless).

    Raises `IsaacLabUnavailable` naming what is missing when Isaac Lab cannot be imported.
    """
    try:
        from isaaclab.app import AppLauncher
    except ImportError as e:
        raise IsaacLabUnavailable(
            f"isaaclab:{task} needs Isaac Lab, which is not installed here (import isaaclab failed: {e}). "
            "Isaac Lab (the isaaclab and isaaclab_tasks packages with Isaac Sim) runs on a machine with an "
            "NVIDIA GPU; install it there, or use a newton:<task> env (e.g. newton:cartpole) on this one.") from e
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    AppLauncher(headless=headless, device=device)  # Isaac Sim must run before the task modules import
    import gymnasium as gym

    try:
        import isaaclab_tasks  # noqa: F401  (registers the Isaac-* gymnasium ids)
        from isaaclab_tasks.utils import parse_env_cfg
    except ImportError as e:
        raise IsaacLabUnavailable(f"isaaclab:{task} needs the isaaclab_tasks package: {e}") from e
    try:
        cfg = parse_env_cfg(task, device=device, num_envs=num_envs)
    except (gym.error.Error, ValueError) as e:
        raise ValueError(f"unknown Isaac Lab task {task!r}: {e}") from e
    if seed is not None:
        cfg.seed = seed
    env = gym.make(task, cfg=cfg)
    return IsaacLabVectorEnv(env, seed=seed, action_bounds=action_bounds, source=f"isaaclab:{task}")

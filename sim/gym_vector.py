"""Gymnasium `SyncVectorEnv` (e.g. over MuJoCo `*-v5` envs) behind the `sim.vector` contract.

    >>> import numpy as np
    >>> env = GymnasiumVectorEnv("Hopper-v5", num_envs=4, seed=0, max_episode_steps=20)
    >>> ts = env.reset()
    >>> ts.observation["observation"].shape, env.action_spec()[0].shape
    ((4, 11), (3,))
    >>> ts = env.step({"action": np.zeros((4, 3), np.float32)})
    >>> ts.last().tolist(), ts.reward.shape, ts.final_observation["observation"].shape
    ([False, False, False, False], (4,), (4, 11))
    >>> env.close()

The gymnasium env runs with `AutoresetMode.SAME_STEP`, the contract's auto-reset; the envs are
stepped one after another in this process (async vector envs are slower on two cores).
Env i is seeded with `seed + i`, like gymnasium's own vector envs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.mujoco import _box_specs, _GymnasiumHolder, _mujoco_warnings_to_logging
from sim.vector import BaseVectorEnvironment

__all__ = ["GymnasiumVectorEnv"]


class GymnasiumVectorEnv(_GymnasiumHolder, BaseVectorEnvironment):
    """N copies of a gymnasium env with 1-D Box observation and action spaces, e.g. "Hopper-v5".

    `seed` seeds the first `reset()` that is not given its own seed; `max_episode_steps` overrides
    the registered time limit (truncation).
    """

    def __init__(self, env_id: str = "Hopper-v5", *, num_envs: int, seed: int | None = None,
                 max_episode_steps: int | None = None, **make_kwargs: Any):
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")

        def make() -> gym.Env:
            return gym.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True, **make_kwargs)

        try:
            with _mujoco_warnings_to_logging():
                env = SyncVectorEnv([make] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        except gym.error.Error as e:
            raise ValueError(f"cannot make gymnasium env {env_id!r}: {e}") from e
        super().__init__(num_envs=num_envs,
                         **_box_specs(env_id, env, env.single_observation_space, env.single_action_space))
        self.env_id = env_id
        self.source = f"gymnasium-vector:{env_id}"
        self._hold(env, env.single_action_space, seed)

    def _step(self, actions: dict[str, np.ndarray]):
        observation, reward, terminated, truncated, info = self._env.step(
            actions["action"].astype(self._action_dtype, copy=False))
        observation = np.asarray(observation, dtype=np.float32)
        final = observation
        ended = info.get("_final_obs")
        if ended is not None and ended.any():
            final = observation.copy()
            final[ended] = np.stack(info["final_obs"][ended]).astype(np.float32)
        return ({"observation": observation}, reward, terminated, truncated, {"observation": final})

    def __repr__(self) -> str:
        return f"GymnasiumVectorEnv({self.env_id!r}, num_envs={self.num_envs})"

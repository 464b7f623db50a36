"""N single-env `Environment`s behind the `sim.vector` contract, stepped one after another.

For simulators that only come one env at a time (the pure-numpy `PointMass`, a robot bridge):
the batching is the contract's, the stepping is a Python loop over the envs. Batched simulators
have their own adapters (`sim.gym_vector`, `sim.newton_tasks`, `sim.isaaclab`).

    >>> import numpy as np
    >>> env = make_serial("PointMass", num_envs=2, seed=0, max_episode_steps=3)
    >>> ts = env.reset()
    >>> for _ in range(3):
    ...     ts = env.step({"action": np.ones((2, 1), np.float32)})
    >>> ts.truncated.tolist(), ts.final_observation["observation"].shape
    ([True, True], (2, 2))
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.env import Environment
from sim.vector import BaseVectorEnvironment

__all__ = ["SerialVectorEnv", "make_serial"]


class SerialVectorEnv(BaseVectorEnvironment):
    """The contract over `envs` (all with the same specs); env i is reset with `seed + i`."""

    def __init__(self, envs: Sequence[Environment]):
        envs = list(envs)
        if not envs:
            raise ValueError("SerialVectorEnv needs at least one env")
        first = envs[0]
        for i, env in enumerate(envs[1:], start=1):
            if env.observation_spec() != first.observation_spec() or env.action_spec() != first.action_spec():
                raise ValueError(f"env {i} has other specs than env 0: {env.observation_spec()} {env.action_spec()}")
        super().__init__(num_envs=len(envs), observation_spec=first.observation_spec(),
                         action_spec=first.action_spec())
        self._envs = envs
        self.source = f"serial:{getattr(first, 'source', type(first).__name__)}"

    def _stack(self, observations: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {s.name: np.stack([o[s.name] for o in observations]) for s in self._observation_spec}

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        return self._stack([env.reset(seed=None if seed is None else seed + i).observation
                            for i, env in enumerate(self._envs)])

    def _step(self, actions: dict[str, np.ndarray]):
        n = self.num_envs
        reward, terminated, truncated = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        observations, finals = [], []
        for i, env in enumerate(self._envs):
            ts = env.step({name: value[i] for name, value in actions.items()})
            reward[i], terminated[i] = ts.reward, ts.terminated
            truncated[i] = ts.last() and not ts.terminated
            finals.append(ts.observation)
            observations.append(env.reset().observation if ts.last() else ts.observation)
        return self._stack(observations), reward, terminated, truncated, self._stack(finals)

    def close(self) -> None:
        super().close()
        for env in self._envs:
            env.close()


def make_serial(name: str, *, num_envs: int, seed: int | None = None, **kw: Any) -> SerialVectorEnv:
    """`num_envs` copies of `sim.mujoco.make_env(name, ...)` ("PointMass", "Hopper-v5", ...);
    env i gets `seed + i`."""
    from sim.mujoco import make_env

    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    envs = []
    try:
        for i in range(num_envs):
            envs.append(make_env(name, seed=None if seed is None else seed + i, **kw))
    except Exception:
        for env in envs:
            env.close()
        raise
    return SerialVectorEnv(envs)

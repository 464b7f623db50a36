"""`PointMass`: a pure-numpy environment for tests and demos that must not need MuJoCo.

A unit mass on a line, pushed by a force in [-1, 1]; the reward is minus the distance to
the origin, and the episode terminates when the mass leaves [-2, 2]:

    >>> import numpy as np
    >>> env = PointMass(seed=1, max_episode_steps=100)
    >>> ts = env.reset()
    >>> steps = 0
    >>> while not ts.last():
    ...     ts = env.step({"action": np.ones(1, np.float32)})
    ...     steps += 1
    >>> ts.terminated, steps < 100
    (True, True)
"""

from __future__ import annotations

import numpy as np

from protos.codec import Spec
from sim.env import BaseEnvironment

__all__ = ["PointMass"]


class PointMass(BaseEnvironment):
    """Observation {"observation": [x, v] float32}; action {"action": [force] float32 in [-1, 1]}."""

    source = "toy:PointMass"
    DT = 0.05
    LIMIT = 2.0

    def __init__(self, *, seed: int | None = None, max_episode_steps: int | None = 200):
        super().__init__(
            observation_spec=(Spec("observation", np.float32, (2,)),),
            action_spec=(Spec("action", np.float32, (1,), low=(-1.0,), high=(1.0,)),))
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self._max_steps = max_episode_steps
        self._rng = np.random.default_rng(seed)
        self._state = np.zeros(2)
        self._t = 0

    def _observe(self) -> dict[str, np.ndarray]:
        return {"observation": self._state.astype(np.float32)}

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = self._rng.uniform(-0.5, 0.5, size=2)
        self._t = 0
        return self._observe()

    def _step(self, action: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool, bool]:
        x, v = self._state
        v = v + self.DT * float(action["action"][0])
        x = x + self.DT * v
        self._state = np.array([x, v])
        self._t += 1
        terminated = abs(x) > self.LIMIT
        truncated = self._max_steps is not None and self._t >= self._max_steps
        return self._observe(), -abs(x), terminated, truncated and not terminated

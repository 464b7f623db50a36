"""Gymnasium MuJoCo `*-v5` environments behind the `sim.env.Environment` contract.

    >>> import numpy as np
    >>> env = make_env("InvertedPendulum-v5", seed=0, max_episode_steps=5)
    >>> [(s.name, s.dtype.name, s.shape) for s in env.action_spec()], env.action_spec()[0].high
    ([('action', 'float32', (1,))], (3.0,))
    >>> ts = env.reset()
    >>> while not ts.last():
    ...     ts = env.step({"action": np.full(1, 10.0, np.float32)})
    >>> ts.applied_action["action"].tolist(), ts.observation["observation"].dtype.name
    ([3.0], 'float32')
    >>> env.close()

The observation is {"observation": float32 vector}, the action {"action": float32 vector}
with the Box bounds; rendering is off (no pixels).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from protos.codec import Spec
from sim.env import BaseEnvironment, Environment

__all__ = ["GymnasiumEnv", "make_env", "register"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _mujoco_warnings_to_logging() -> Iterator[None]:
    """Send MuJoCo's model-compiler warnings (e.g. HalfCheetah's deprecated 'settotalmass') to
    `logging` instead of stderr plus a MUJOCO_LOG.TXT file in the current directory."""
    import mujoco

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: log.warning("mujoco: %s", message))
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def _box_bounds(space) -> tuple[tuple[float, ...], tuple[float, ...]]:
    low, high = np.asarray(space.low, np.float64).ravel(), np.asarray(space.high, np.float64).ravel()
    if np.isinf(low).all() and np.isinf(high).all():
        return (), ()
    return tuple(low.tolist()), tuple(high.tolist())


def _box_specs(env_id: str, env, observation_space, action_space) -> dict[str, tuple[Spec, ...]]:
    """The `observation_spec` and `action_spec` keyword arguments for a gymnasium env's (single) spaces;
    `env` is closed and ValueError raised unless both are 1-D Boxes."""
    import gymnasium as gym

    for role, space in (("observation", observation_space), ("action", action_space)):
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            env.close()
            raise ValueError(f"{env_id}: only 1-D Box {role} spaces are supported, got {space}")
    obs_low, obs_high = _box_bounds(observation_space)
    act_low, act_high = _box_bounds(action_space)
    return {"observation_spec": (Spec("observation", np.float32, observation_space.shape, low=obs_low, high=obs_high),),
            "action_spec": (Spec("action", np.float32, action_space.shape, low=act_low, high=act_high),)}


class _GymnasiumHolder:
    """`_reset` and `close` of an environment over a gymnasium env (vector or not) that `_hold` took:
    the first unseeded reset takes `seed`, close closes the gymnasium env once."""

    def _hold(self, env, action_space, seed: int | None) -> None:
        self._env = env
        self._action_dtype = action_space.dtype
        self._seed = seed
        self._closed = False

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        observation, _ = self._env.reset(seed=seed)
        return {"observation": np.asarray(observation, dtype=np.float32)}

    def close(self) -> None:
        super().close()
        if not self._closed:
            self._closed = True
            self._env.close()


class GymnasiumEnv(_GymnasiumHolder, BaseEnvironment):
    """A gymnasium env with a 1-D Box observation and a 1-D Box action, e.g. "Hopper-v5".

    `seed` seeds the first `reset()` that is not given its own seed; later unseeded resets
    continue the same random stream, so a seeded env replays the same episodes.
    `max_episode_steps` overrides the registered time limit (a truncation: LAST, not terminated).
    """

    def __init__(self, env_id: str = "Hopper-v5", *, seed: int | None = None,
                 max_episode_steps: int | None = None, **make_kwargs: Any):
        import gymnasium as gym

        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        try:
            with _mujoco_warnings_to_logging():
                env = gym.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True,
                               **make_kwargs)
        except gym.error.Error as e:
            raise ValueError(f"cannot make gymnasium env {env_id!r}: {e}") from e
        super().__init__(**_box_specs(env_id, env, env.observation_space, env.action_space))
        self.env_id = env_id
        is_mujoco = "mujoco" in type(env.unwrapped).__module__
        self.source = f"{'mujoco' if is_mujoco else 'gymnasium'}:{env_id}"
        self._hold(env, env.action_space, seed)

    def _step(self, action: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool, bool]:
        observation, reward, terminated, truncated, _ = self._env.step(
            action["action"].astype(self._action_dtype, copy=False))
        observation = {"observation": np.asarray(observation, dtype=np.float32)}
        return observation, float(reward), bool(terminated), bool(truncated)

    @property
    def physics(self):
        """The MuJoCo (model, data) it steps, for cameras (sim.cameras); AttributeError for a non-MuJoCo env."""
        return self._env.unwrapped.model, self._env.unwrapped.data

    def __repr__(self) -> str:
        return f"GymnasiumEnv({self.env_id!r})"


_FACTORIES: dict[str, Callable[..., Environment]] = {}


def register(name: str, factory: Callable[..., Environment]) -> None:
    """Make `make_env(name, **kw)` call `factory(**kw)` (for envs that are not gymnasium ids)."""
    _FACTORIES[name] = factory


def make_env(name: str, **kw: Any) -> Environment:
    """An environment by name: a registered one ("PointMass") or any gymnasium id ("Hopper-v5").

    Keyword arguments (seed, max_episode_steps, ...) go to the factory.
    """
    return _FACTORIES[name](**kw) if name in _FACTORIES else GymnasiumEnv(name, **kw)


def _point_mass(**kw: Any) -> Environment:
    from sim.toy import PointMass

    return PointMass(**kw)


def _camera_reach(**kw: Any) -> Environment:
    from sim.camera_reach import CameraReach

    return CameraReach(**kw)


register("PointMass", _point_mass)
register("CameraReach", _camera_reach)

"""The one environment contract every simulator adapter implements (dm_env style).

An environment declares its tensors as `protos.codec.Spec`s, starts an episode with `reset`
(a FIRST `TimeStep`) and advances it with `step` until a LAST one. Like LeRobot's
`send_action`, `step` reports the action it actually applied, after clipping to the bounds:

    >>> import numpy as np
    >>> from sim.toy import PointMass
    >>> env = PointMass(seed=0, max_episode_steps=3)
    >>> ts = env.reset()
    >>> ts.step_type.name, sorted(ts.observation), ts.applied_action is None
    ('FIRST', ['observation'], True)
    >>> while not ts.last():
    ...     ts = env.step({"action": np.array([5.0], dtype=np.float32)})
    >>> ts.step_type.name, ts.terminated, ts.applied_action["action"].tolist()
    ('LAST', False, [1.0])
    >>> env.step({"action": np.zeros(1, np.float32)})
    Traceback (most recent call last):
    ...
    sim.env.ResetRequired: step() after LAST: call reset() to start a new episode
    >>> env.close()

Adapters usually subclass `BaseEnvironment`, which owns the episode bookkeeping and the
action checks (`TensorError` naming the tensor for a bad action, clipping for an
out-of-bounds one), and implement `_reset` and `_step` only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, runtime_checkable

import numpy as np

from protos.codec import RAW, Spec, TensorError, encode, encode_image, encoding_name
from protos.tether.v1 import bridge_pb2, tensor_pb2

__all__ = ["ActionClipper", "BaseEnvironment", "Environment", "ResetRequired", "StepType", "TimeStep",
           "bounds", "observation_encoder", "zeros"]


class StepType(IntEnum):
    """dm_env's step types, with the values of `tether.v1.StepType` on the wire."""

    FIRST = bridge_pb2.FIRST
    MID = bridge_pb2.MID
    LAST = bridge_pb2.LAST


@dataclass(frozen=True)
class TimeStep:
    """What an environment returns from `reset` (FIRST) and `step` (MID or LAST)."""

    step_type: StepType
    observation: dict[str, np.ndarray]
    reward: float = 0.0          # reward for the previous action (0.0 on FIRST)
    terminated: bool = False     # LAST because the MDP ended (False when truncated by a time limit)
    applied_action: dict[str, np.ndarray] | None = None  # after clipping; None on FIRST

    def first(self) -> bool:
        return self.step_type is StepType.FIRST

    def mid(self) -> bool:
        return self.step_type is StepType.MID

    def last(self) -> bool:
        return self.step_type is StepType.LAST


@runtime_checkable
class Environment(Protocol):
    """The contract: specs, then `reset()` and `step(action)` until LAST, then `reset()` again."""

    def observation_spec(self) -> tuple[Spec, ...]: ...

    def action_spec(self) -> tuple[Spec, ...]: ...

    def reset(self, *, seed: int | None = None) -> TimeStep: ...

    def step(self, action: Mapping[str, np.ndarray]) -> TimeStep: ...

    def close(self) -> None: ...


class ResetRequired(RuntimeError):
    """`step()` was called before the first `reset()` or after a LAST time step."""


def bounds(spec: Spec) -> tuple[np.ndarray, np.ndarray] | None:
    """`spec`'s (low, high) broadcast to its shape (`Spec.bounds`), or None when it declares none.

    Bounds are given per element or as one value for all (see tensor.proto); an empty side
    is unbounded.
    """
    return spec.bounds() if spec.bounded else None


def zeros(specs: Sequence[Spec]) -> dict[str, np.ndarray]:
    """A zero-valued tensor for every spec (clip it to bounds before applying it)."""
    return {s.name: np.zeros(s.shape, dtype=s.dtype) for s in specs}


def observation_encoder(specs: Sequence[Spec], *, quality: int = 90
                        ) -> Callable[[Mapping[str, np.ndarray]], list[tensor_pb2.Tensor]]:
    """What turns an observation into the tensors it travels as: an image whose spec declares an encoding (a camera:
    JPEG or PNG, `protos.codec.encode_image`) encoded, every other tensor raw.

    >>> from protos.codec import JPEG
    >>> encode_obs = observation_encoder((Spec("cam", np.uint8, (8, 8, 3), encoding=JPEG),))
    >>> [encoding_name(t.encoding) for t in encode_obs({"cam": np.zeros((8, 8, 3), np.uint8)})]
    ['JPEG']
    """
    formats = {s.name: encoding_name(s.encoding).lower() for s in specs if s.encoding != RAW}

    def encode_observation(observation: Mapping[str, np.ndarray]) -> list[tensor_pb2.Tensor]:
        return [encode_image(name, value, quality=quality, format=formats[name]) if name in formats
                else encode(name, value) for name, value in observation.items()]
    return encode_observation


class ActionClipper:
    """Checks an action against its specs and clips it into the declared bounds.

    >>> clip = ActionClipper((Spec("a", np.float32, (2,), low=(-1.0,), high=(1.0,)),))
    >>> clip({"a": np.array([0.5, 3.0], np.float32)})["a"].tolist()
    [0.5, 1.0]
    >>> clip({"a": np.array([0.5, np.nan], np.float32)})
    Traceback (most recent call last):
    ...
    protos.codec.TensorError: a: contains NaN or infinite values
    """

    def __init__(self, specs: Sequence[Spec]):
        self.specs = tuple(specs)
        self._bounds = {s.name: bounds(s) for s in self.specs}

    def __call__(self, action: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(action, Mapping):
            raise TensorError("action", f"expected a mapping of name -> array, got {type(action).__name__}")
        names = [s.name for s in self.specs]
        for name in action:
            if name not in self._bounds:
                raise TensorError(str(name), f"not in the action spec {names}")
        applied = {}
        for spec in self.specs:
            if spec.name not in action:
                raise TensorError(spec.name, f"missing (the action spec is {names})")
            value = np.asarray(action[spec.name])
            spec.check(value)
            limits = self._bounds[spec.name]
            if limits is None:
                applied[spec.name] = value.copy()
            else:
                applied[spec.name] = np.asarray(np.clip(value, *limits)).astype(spec.dtype, copy=False)
        return applied


class Specified(abc.ABC):
    """What an environment and a vectorised one share: their specs, and why a step is refused (`_needs_reset`:
    `not_reset` until the first reset, None while stepping is allowed)."""

    def __init__(self, observation_spec: Sequence[Spec], action_spec: Sequence[Spec], not_reset: str):
        self._observation_spec = tuple(observation_spec)
        self._action_spec = tuple(action_spec)
        self._needs_reset: str | None = not_reset

    def observation_spec(self) -> tuple[Spec, ...]:
        return self._observation_spec

    def action_spec(self) -> tuple[Spec, ...]:
        return self._action_spec

    def close(self) -> None:
        self._needs_reset = "step() after close()"

    @abc.abstractmethod
    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]: ...


class BaseEnvironment(Specified):
    """Episode bookkeeping and action checking; subclasses implement `_reset` and `_step`.

    `_step` receives the already checked and clipped action and returns
    `(observation, reward, terminated, truncated)`.
    """

    def __init__(self, *, observation_spec: Sequence[Spec], action_spec: Sequence[Spec]):
        super().__init__(observation_spec, action_spec, "step() before reset(): call reset() to start an episode")
        self._clip = ActionClipper(self._action_spec)

    def reset(self, *, seed: int | None = None) -> TimeStep:
        observation = self._reset(seed=seed)
        self._needs_reset = None
        return TimeStep(StepType.FIRST, observation)

    def step(self, action: Mapping[str, np.ndarray]) -> TimeStep:
        if self._needs_reset is not None:
            raise ResetRequired(self._needs_reset)
        applied = self._clip(action)
        observation, reward, terminated, truncated = self._step(applied)
        if terminated or truncated:
            self._needs_reset = "step() after LAST: call reset() to start a new episode"
            return TimeStep(StepType.LAST, observation, float(reward), bool(terminated), applied)
        return TimeStep(StepType.MID, observation, float(reward), False, applied)

    @abc.abstractmethod
    def _step(self, action: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool, bool]: ...

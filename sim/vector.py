"""The vector environment contract: N environments stepped as one batch (batch-first, dm_env style).

Specs are per environment (no batch dimension); every tensor in a `VectorTimeStep` and in the
action passed to `step` carries a leading dimension `num_envs`:

    >>> import numpy as np
    >>> from sim.env import StepType
    >>> from sim.gym_vector import GymnasiumVectorEnv
    >>> env = GymnasiumVectorEnv("InvertedPendulum-v5", num_envs=3, seed=0, max_episode_steps=5)
    >>> ts = env.reset()
    >>> [StepType(t).name for t in ts.step_type], ts.observation["observation"].shape
    (['FIRST', 'FIRST', 'FIRST'], (3, 4))
    >>> action = {"action": np.array([[0.5], [9.0], [np.nan]], np.float32)}
    >>> ts = env.step(action)
    >>> ts.last().tolist(), ts.applied_action["action"].ravel().tolist(), ts.refused.tolist()
    ([False, False, False], [0.5, 3.0, 0.0], [False, False, True])
    >>> ts.errors
    ((2, 'action: env 2: contains NaN or infinite values'),)
    >>> for _ in range(5):   # env 1 (pushed hard) falls: terminated; envs 0, 2 hit the time limit
    ...     ts = env.step({"action": np.zeros((3, 1), np.float32)})
    ...     print([StepType(t).name for t in ts.step_type], ts.terminated.tolist(), ts.truncated.tolist())
    ['MID', 'MID', 'MID'] [False, False, False] [False, False, False]
    ['MID', 'LAST', 'MID'] [False, True, False] [False, False, False]
    ['MID', 'MID', 'MID'] [False, False, False] [False, False, False]
    ['LAST', 'MID', 'LAST'] [False, False, False] [True, False, True]
    ['MID', 'MID', 'MID'] [False, False, False] [False, False, False]
    >>> env.close()

Auto-reset is *same-step* (gymnasium's `AutoresetMode.SAME_STEP`, Isaac Lab's own behaviour):
when env i's episode ends in a `step`, that step reports `step_type[i] == LAST` with the
ended episode's `reward[i]`, `terminated[i]`, `truncated[i]`, and its terminal observation in
`final_observation[i]`; env i is reset inside the same call, and `observation[i]` is already
the first observation of its next episode (what a single env's `reset()` would give as FIRST).
The next action for env i is applied to that new episode: no step is wasted, no action ignored.
FIRST only appears after `reset()`. Rows of `final_observation` for envs that did not end equal
`observation`, so transition i of a step is always
`(previous observation[i], applied_action[i], reward[i], final_observation[i], terminated[i])`.
An adapter whose simulator does not expose terminal observations (Isaac Lab) sets
`final_observation` to None and says so in `provides_final_observation`.

Bad actions: a malformed batch (a missing or unknown tensor name, a wrong dtype, a shape other
than `(num_envs, *spec.shape)`) raises `TensorError` naming the tensor, and nothing is stepped.
A non-finite value in env i's row does not fail the batch: env i is *refused*, it is stepped
with its safe action instead (zero clipped into the bounds, reported in `applied_action[i]`),
`refused[i]` is True and `errors` names env i and the tensor, so a gateway can fail that env's
step alone while every other env advances. Out-of-bounds values are clipped (not refused).

Adapters usually subclass `BaseVectorEnvironment`, which owns the checks, the clipping, the
refusal and the step types, and implement `_reset(seed)` and `_step(actions)` with numpy work
over the whole batch (no per-env Python).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from protos.codec import Spec, TensorError
from sim.env import ResetRequired, Specified, StepType, bounds

__all__ = ["BaseVectorEnvironment", "VectorEnvironment", "VectorTimeStep", "safe_action"]

FIRST, MID, LAST = np.int8(StepType.FIRST), np.int8(StepType.MID), np.int8(StepType.LAST)


@dataclass(frozen=True, eq=False)
class VectorTimeStep:
    """What a vector env returns from `reset` (all FIRST) and `step` (MID or LAST per env)."""

    step_type: np.ndarray                       # (N,) int8, `StepType` values
    observation: dict[str, np.ndarray]          # (N, *spec.shape); after LAST: the next episode's first
    reward: np.ndarray                          # (N,) float64, for the action just applied (0 on FIRST)
    terminated: np.ndarray                      # (N,) bool: LAST because the MDP ended
    truncated: np.ndarray                       # (N,) bool: LAST because of a time limit
    applied_action: dict[str, np.ndarray] | None = None     # (N, ...) after clipping/refusal; None on reset
    final_observation: dict[str, np.ndarray] | None = None  # rows of LAST envs: terminal observation
    refused: np.ndarray | None = None           # (N,) bool: the env's action was refused (safe action applied)
    errors: tuple[tuple[int, str], ...] = ()    # (env index, message) for each refused env

    def __post_init__(self):
        if self.refused is None:  # always an (N,) array for the reader
            object.__setattr__(self, "refused", np.zeros(self.step_type.shape[0], bool))

    @property
    def num_envs(self) -> int:
        return int(self.step_type.shape[0])

    def last(self) -> np.ndarray:
        """(N,) bool: the envs whose episode ended in this step."""
        return self.step_type == LAST


@runtime_checkable
class VectorEnvironment(Protocol):
    """The contract: per-env specs; `reset()` once, then `step(batched action)` forever (auto-reset)."""

    num_envs: int

    def observation_spec(self) -> tuple[Spec, ...]: ...

    def action_spec(self) -> tuple[Spec, ...]: ...

    def reset(self, *, seed: int | None = None) -> VectorTimeStep: ...

    def step(self, actions: Mapping[str, np.ndarray]) -> VectorTimeStep: ...

    def close(self) -> None: ...


def safe_action(specs: Sequence[Spec], num_envs: int) -> dict[str, np.ndarray]:
    """The action a refused env gets: zero, clipped into the declared bounds (`Spec.safe_value`), batched.

    >>> spec = Spec("a", np.float32, (2,), low=(0.5, -1.0), high=(1.0, 1.0))
    >>> safe_action([spec], 2)["a"].tolist()
    [[0.5, 0.0], [0.5, 0.0]]
    """
    return {spec.name: np.broadcast_to(spec.safe_value(), (num_envs, *spec.shape)).copy() for spec in specs}


class BatchActionChecker:
    """Checks a batched action against per-env specs, clips it and refuses non-finite rows.

    Returns `(applied, refused, errors)`; raises `TensorError` for a malformed batch.
    """

    def __init__(self, specs: Sequence[Spec], num_envs: int):
        self.specs = tuple(specs)
        self.num_envs = num_envs
        self._names = [s.name for s in self.specs]
        self._bounds = {}
        for s in self.specs:
            limits = bounds(s)
            if limits is not None and s.dtype.kind == "f":  # clip in the action's own dtype
                limits = (limits[0].astype(s.dtype), limits[1].astype(s.dtype))
            self._bounds[s.name] = limits
        self._safe = safe_action(self.specs, num_envs)

    def __call__(self, actions: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray, tuple]:
        if not isinstance(actions, Mapping):
            raise TensorError("action", f"expected a mapping of name -> array, got {type(actions).__name__}")
        for name in actions:
            if name not in self._bounds:
                raise TensorError(str(name), f"not in the action spec {self._names}")
        n = self.num_envs
        values = {}
        for spec in self.specs:
            if spec.name not in actions:
                raise TensorError(spec.name, f"missing (the action spec is {self._names})")
            value = actions[spec.name]
            if not isinstance(value, np.ndarray):
                raise TensorError(spec.name, f"expected a numpy array, got {type(value).__name__}")
            if value.dtype != spec.dtype:
                raise TensorError(spec.name, f"dtype {value.dtype.name}, expected {spec.dtype.name}")
            if value.shape != (n, *spec.shape):
                raise TensorError(spec.name, f"shape {list(value.shape)}, expected {[n, *spec.shape]}")
            values[spec.name] = value
        refused = np.zeros(n, bool)
        bad_by_name = {}
        for spec in self.specs:
            if spec.dtype.kind in "fc":
                bad = ~np.isfinite(values[spec.name].reshape(n, -1)).all(axis=1)
                if bad.any():
                    bad_by_name[spec.name] = bad
                    refused |= bad
        applied = {}
        for spec in self.specs:
            value, limits = values[spec.name], self._bounds[spec.name]
            value = value.copy() if limits is None else np.clip(value, *limits).astype(spec.dtype, copy=False)
            if refused.any():
                value[refused] = self._safe[spec.name][refused]
            applied[spec.name] = value
        errors = ()
        if refused.any():  # the rare path: build messages only for the refused envs
            errors = tuple((int(i), "; ".join(f"{name}: env {int(i)}: contains NaN or infinite values"
                                              for name, bad in bad_by_name.items() if bad[i]))
                           for i in np.flatnonzero(refused))
        return applied, refused, errors


class BaseVectorEnvironment(Specified):
    """Batch checks, clipping, refusal and step types; subclasses implement `_reset` and `_step`.

    `_reset(seed)` resets every env (env i seeded with `seed + i` when a seed is given) and returns
    the batched observation. `_step(applied)` steps every env with the checked action, resets the
    envs whose episode ended (same-step auto-reset) and returns
    `(observation, reward, terminated, truncated, final_observation)`; `final_observation` may be
    None when the simulator cannot give terminal observations.
    """

    provides_final_observation: bool = True

    def __init__(self, *, num_envs: int, observation_spec: Sequence[Spec], action_spec: Sequence[Spec]):
        if not isinstance(num_envs, int | np.integer) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = int(num_envs)
        super().__init__(observation_spec, action_spec, "step() before reset(): call reset() first")
        self._check = BatchActionChecker(self._action_spec, self.num_envs)

    def reset(self, *, seed: int | None = None) -> VectorTimeStep:
        if self._needs_reset == "step() after close()":
            raise ResetRequired("reset() after close()")
        observation = self._reset(seed=seed)
        self._needs_reset = None
        n = self.num_envs
        return VectorTimeStep(np.full(n, FIRST), observation, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool))

    def step(self, actions: Mapping[str, np.ndarray]) -> VectorTimeStep:
        if self._needs_reset is not None:
            raise ResetRequired(self._needs_reset)
        applied, refused, errors = self._check(actions)
        observation, reward, terminated, truncated, final = self._step(applied)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        step_type = np.where(terminated | truncated, LAST, MID).astype(np.int8)
        return VectorTimeStep(step_type, observation, np.asarray(reward, np.float64), terminated, truncated,
                              applied, final, refused, errors)

    @abc.abstractmethod
    def _step(self, actions: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                                             np.ndarray, dict[str, np.ndarray] | None]: ...

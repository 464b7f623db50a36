"""Vectorised reward terms: each compiled once from a `TermSpec`, then called per step on a batch.

Every term returns its weighted contribution as a (B,) float64 array; conditions (success, failure)
also give a (B,) bool array, evaluated before the other terms so that `alive_bonus` can read them.
Nothing here loops over the batch in Python.

    >>> import numpy as np
    >>> from bridge.rewards.config import TermSpec
    >>> term = compile_term(TermSpec(0, "goal_distance", "goal_distance", weight=-1.0, role="observation",
    ...                              tensor="obs", indices=(0, 1), goal=(3.0, 0.0)))
    >>> step = Step({}, {}, {"obs": np.array([[0.0, 4.0, 9.0]], np.float32)}, np.zeros(1), None, None)
    >>> term.value(step).tolist()
    [-5.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from bridge.rewards.config import TermSpec

__all__ = ["RewardInputError", "Step", "Term", "compile_term"]

Arrays = Mapping[str, np.ndarray]


class RewardInputError(ValueError):
    """`compute` got inputs that do not fit the config (a missing tensor, a wrong width or batch size);
    `field` names the tensor, or "env_reward"."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class Scratch:
    """Float64 work arrays reused from call to call (one `Scratch` per thread): with a steady batch size,
    the only batch-sized arrays a call allocates are its results. Large fresh temporaries are not free:
    glibc serves them with mmap, and every call then pays page faults on them."""

    def __init__(self):
        self._arrays: dict[object, np.ndarray] = {}

    def get(self, key: object, shape: tuple[int, int]) -> np.ndarray:
        a = self._arrays.get(key)
        if a is None or a.shape != shape:
            a = self._arrays[key] = np.empty(shape)
        return a


class Step:
    """One call's inputs, plus what the conditions found (`conditions`, `failed`) for the other terms.

    `block(where, tensor, reader)` gives a tensor as an (n, B) float64 array (feature-major: each selected
    element is one contiguous row, so elementwise work runs along the batch, not along a handful of
    features), converted once per call however many terms read it. Terms never return `scratch` arrays.
    """

    __slots__ = ("inputs", "env_reward", "previous_action", "first_step", "batch", "conditions", "failed",
                 "scratch", "_blocks")

    def __init__(self, observation: Arrays, action: Arrays, next_observation: Arrays, env_reward: np.ndarray,
                 previous_action: Arrays | None, first_step: np.ndarray | None, scratch: Scratch | None = None):
        """`scratch` None: fresh temporaries (cheapest for small batches)."""
        self.inputs = {"observation": observation, "action": action, "next_observation": next_observation,
                       "previous_action": previous_action}
        self.env_reward, self.previous_action, self.first_step = env_reward, previous_action, first_step
        self.batch = env_reward.shape[0]
        self.conditions: dict[str, np.ndarray] = {}
        self.failed: np.ndarray | None = None
        self.scratch = scratch
        self._blocks: dict[tuple[str, str], np.ndarray] = {}

    def block(self, where: str, tensor: str, reader: str) -> np.ndarray:
        key = (where, tensor)
        x = self._blocks.get(key)
        if x is not None:
            return x
        try:
            x = np.asarray(self.inputs[where][tensor])
        except KeyError:
            raise RewardInputError(tensor, f"missing from {where} (read by {reader})") from None
        if x.ndim == 0 or x.shape[0] != self.batch:
            raise RewardInputError(tensor, f"{where} has shape {list(x.shape)}: expected a leading batch "
                                           f"dimension of {self.batch} (from env_reward)")
        flat = x.reshape(self.batch, math.prod(x.shape[1:]))  # (not -1: a batch of 0 rows is fine)
        if self.scratch is None:
            x = self._blocks[key] = flat.T.astype(np.float64, order="C")
        else:
            x = self._blocks[key] = self.scratch.get(key, flat.shape[::-1])
            np.copyto(x, flat.T, casting="unsafe")
        return x


class _Select:
    """Picks a term's values from one tensor of a batch: an (n, B) float64 view or copy."""

    __slots__ = ("tensor", "label", "index", "exact", "need")

    def __init__(self, spec: TermSpec):
        self.tensor, self.label = spec.tensor, f"reward term {spec.index} ({spec.name})"
        idx = spec.indices
        self.exact = spec.width if idx is None else None      # no indices: the tensor must have this many values
        self.need = None if idx is None else max(idx) + 1     # indices: the tensor must have at least this many
        if idx is None:
            self.index = None
        elif idx == tuple(range(idx[0], idx[0] + len(idx))):
            self.index = slice(idx[0], idx[0] + len(idx))     # a slice is a view: cheaper than a gather
        else:
            self.index = np.asarray(idx, dtype=np.intp)

    def __call__(self, step: Step, where: str) -> np.ndarray:
        x = step.block(where, self.tensor, self.label)
        n = x.shape[0]
        if (self.exact is not None and n != self.exact) or (self.need is not None and n < self.need):
            want = f"{self.exact}" if self.exact is not None else f"at least {self.need}"
            raise RewardInputError(self.tensor, f"{where} has {n} values per row, {self.label} needs {want}")
        if self.index is None:
            return x
        return x[self.index] if isinstance(self.index, slice) else x.take(self.index, axis=0)


try:  # np.einsum's C core without its Python wrapper (half the cost for one row); numpy 1.26 and 2.x
    from numpy._core.multiarray import c_einsum as _einsum
except ImportError:  # pragma: no cover (numpy moved its internals)
    _einsum = np.einsum


def _sq_norm(d: np.ndarray) -> np.ndarray:
    return _einsum("ij,ij->j", d, d)  # (n, B) -> (B,), no (n, B) temporary


class Term:
    """A compiled term: `value(step)` is its weighted (B,) float64 contribution."""

    condition_kind: str | None = None   # "success" / "failure" for conditions

    def __init__(self, spec: TermSpec):
        self.spec, self.name, self.weight = spec, spec.name, spec.weight
        self._weights: dict[int, np.ndarray] = {}
        self._key = (spec.index, spec.name)   # its scratch array
        self.select = None if spec.tensor is None else _Select(spec)  # the values it reads (if it reads a tensor)

    def work(self, step: Step, like: np.ndarray) -> np.ndarray | None:
        """A scratch array shaped like `like` (n, B) for this term's temporaries (None: let numpy allocate)."""
        return None if step.scratch is None else step.scratch.get(self._key, like.shape)

    def weighted_sum(self, x: np.ndarray) -> np.ndarray:
        """weight * x.sum(axis=0) for an (n, B) array, as one matrix-vector product."""
        w = self._weights.get(x.shape[0])
        if w is None:
            w = self._weights[x.shape[0]] = np.full(x.shape[0], self.weight)
        return w @ x

    def weighted_sq_norm(self, d: np.ndarray) -> np.ndarray:
        """weight * ||d||^2 per column of an (n, B) array, without an (n, B) temporary."""
        out = _sq_norm(d)
        out *= self.weight
        return out

    def value(self, step: Step) -> np.ndarray:
        raise NotImplementedError


class EnvReward(Term):
    def value(self, step: Step) -> np.ndarray:
        return step.env_reward * self.weight


class AliveBonus(Term):
    """`weight` on every row that no failure condition flags this step."""

    def value(self, step: Step) -> np.ndarray:
        out = np.full(step.batch, self.weight)
        if step.failed is not None:
            out[step.failed] = 0.0
        return out


class GoalDistance(Term):
    def __init__(self, spec: TermSpec):
        super().__init__(spec)
        self.goal = np.asarray(spec.goal, dtype=np.float64)[:, None]

    def value(self, step: Step) -> np.ndarray:
        x = self.select(step, "next_observation")
        d = np.subtract(x, self.goal, out=self.work(step, x))
        out = _sq_norm(d)
        np.sqrt(out, out=out)
        out *= self.weight
        return out


class ActionMagnitude(Term):
    def value(self, step: Step) -> np.ndarray:
        return self.weighted_sq_norm(self.select(step, "action"))


class ActionSmoothness(Term):
    """||a_t - a_{t-1}||^2 on the selected elements; 0 without a previous action (or where `first_step`)."""

    def value(self, step: Step) -> np.ndarray:
        a = self.select(step, "action")
        if step.previous_action is None:
            return np.zeros(step.batch)
        p = self.select(step, "previous_action")
        if p.shape != a.shape:
            raise RewardInputError(self.spec.tensor, f"previous_action has {p.shape[0]} values per row, action has "
                                                     f"{a.shape[0]} (read by {self.select.label})")
        out = self.weighted_sq_norm(np.subtract(a, p, out=self.work(step, a)))
        if step.first_step is not None:
            out[step.first_step] = 0.0
        return out


class JointLimitProximity(Term):
    """Sum over elements of how far each is inside its margin band (or beyond its limit): linear in the
    distance past `low + margin` or `high - margin`, 0 in between."""

    def __init__(self, spec: TermSpec):
        super().__init__(spec)
        self.lo = np.asarray(spec.low, dtype=np.float64)[:, None] + spec.margin
        self.hi = np.asarray(spec.high, dtype=np.float64)[:, None] - spec.margin

    def value(self, step: Step) -> np.ndarray:
        q = self.select(step, "next_observation")
        past = np.maximum(q, self.lo, out=self.work(step, q))   # q clipped into the free range, then |q - it|
        np.minimum(past, self.hi, out=past)
        np.subtract(q, past, out=past)
        return self.weighted_sum(np.abs(past, out=past))


class Condition(Term):
    """distance = ||selected - goal|| (goal 0 when absent: with one index, the absolute value); the condition
    holds where distance < below (or > above). Its value is `bonus` where it holds, else 0."""

    def __init__(self, spec: TermSpec):
        super().__init__(spec)
        self.condition_kind = spec.type
        self.goal = None if spec.goal is None else np.asarray(spec.goal, dtype=np.float64)[:, None]
        self.below, self.above, self.bonus = spec.below, spec.above, spec.bonus

    def holds(self, step: Step) -> np.ndarray:
        x = self.select(step, "next_observation")
        d = x if self.goal is None else np.subtract(x, self.goal, out=self.work(step, x))
        dist = np.sqrt(_sq_norm(d))
        return dist < self.below if self.below is not None else dist > self.above

    def value(self, step: Step) -> np.ndarray:
        return step.conditions[self.name] * self.bonus


_CLASSES: dict[str, type[Term]] = {
    "env_reward": EnvReward, "alive_bonus": AliveBonus, "goal_distance": GoalDistance,
    "action_magnitude": ActionMagnitude, "action_smoothness": ActionSmoothness,
    "joint_limit_proximity": JointLimitProximity, "success": Condition, "failure": Condition,
}


def compile_term(spec: TermSpec) -> Term:
    return _CLASSES[spec.type](spec)

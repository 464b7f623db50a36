"""`RewardFunction`: a validated reward config compiled into vectorised terms; `RewardResult`."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bridge.rewards.config import RewardConfigError, TermSpec, canonical, parse_terms, version
from bridge.rewards.terms import Condition, RewardInputError, Scratch, Step, compile_term
from protos.codec import Spec

__all__ = ["RewardFunction", "RewardResult"]

Arrays = Mapping[str, np.ndarray]
SCRATCH_FROM_BATCH = 256   # from this batch size on, temporaries live in reused arrays (see terms.Scratch)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error, not a silent overwrite."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping)


@dataclass(frozen=True)
class RewardResult:
    """`reward` (B,) float64 = the sum of `terms` (name -> (B,) float64 weighted contribution, in config
    order); `terminate` (B,) bool: a condition with `terminate: true` holds; `conditions`: each success or
    failure term's (B,) bool; `terminating`: the names of those with `terminate: true`, in config order."""

    reward: np.ndarray
    terms: dict[str, np.ndarray]
    terminate: np.ndarray
    conditions: dict[str, np.ndarray] = field(default_factory=dict)
    terminating: tuple[str, ...] = ()

    def ended_by(self, row: int = 0) -> str | None:
        """The first terminating condition (config order) that holds on `row`, or None: for EpisodeEnd's
        reason "reward:<term>"."""
        return next((name for name in self.terminating if self.conditions[name][row]), None)


class RewardFunction:
    """Build with `from_yaml`, `from_dict` or `passthrough`; call `compute` once per (batched) step."""

    def __init__(self, terms: Sequence[TermSpec], *, source: str | None = None):
        if not terms:
            raise RewardConfigError("a reward function needs at least one term", source=source)
        self.specs: tuple[TermSpec, ...] = tuple(terms)
        self.source = source
        self.version: str = version(self.specs)
        self.terms: tuple[str, ...] = tuple(t.name for t in self.specs)
        self._compiled = tuple(compile_term(t) for t in self.specs)
        self._conditions = tuple(t for t in self._compiled if isinstance(t, Condition))
        self._terminating = tuple(t.name for t in self._conditions if t.spec.terminate)
        self._local = threading.local()   # a Scratch per thread

    @property
    def can_terminate(self) -> bool:
        """Whether a term may end an episode (a condition with `terminate: true`): without one, a step's reward
        never changes the reply, and the gateway computes it after the reply is sent."""
        return bool(self._terminating)

    @classmethod
    def from_dict(cls, config: Any, *, source: str | None = None) -> RewardFunction:
        """From a parsed config `{"reward": {"terms": [...]}}`; `source` prefixes error messages."""
        return cls(parse_terms(config, source=source), source=source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> RewardFunction:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RewardConfigError(f"cannot read the file: {exc}", source=str(path)) from None
        try:
            config = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
        except yaml.YAMLError as exc:
            raise RewardConfigError(f"not valid YAML: {exc}", source=str(path)) from None
        return cls.from_dict(config, source=str(path))

    @classmethod
    def passthrough(cls) -> RewardFunction:
        """The simulator's reward, unchanged: one `env_reward` term of weight 1."""
        return cls.from_dict({"reward": {"terms": [{"type": "env_reward"}]}}, source="passthrough")

    def to_dict(self) -> dict[str, Any]:
        """The config with defaults filled in; `from_dict(fn.to_dict())` has the same version."""
        return {"reward": {"terms": [t.fields() for t in self.specs]}}

    def canonical(self) -> str:
        """The JSON text whose hash is `version` (worth storing beside the data it labels)."""
        return canonical(self.specs)

    def check_specs(self, observation_specs: Sequence[Spec], action_specs: Sequence[Spec]) -> None:
        """Raise `RewardConfigError` naming the term and field if a term reads a tensor the session does not
        declare, or selects values the tensor does not have. Call it once per session (at Hello)."""
        declared = {"observation": {s.name: s for s in observation_specs}, "action": {s.name: s for s in action_specs}}
        for t in self.specs:
            if t.tensor is None:
                continue
            specs = declared[t.role]
            if t.tensor not in specs:
                raise self._spec_error(t, t.role, f"names tensor {t.tensor!r}, which is not among the session's "
                                                  f"{t.role} tensors {sorted(specs)}")
            shape = specs[t.tensor].shape
            n = math.prod(shape)
            what = f"tensor {t.tensor!r} of shape {list(shape)} ({n} values)"
            if n == 0:
                raise self._spec_error(t, t.role, f"{what} has no values to read")
            if t.indices is not None:
                bad = [i for i in t.indices if i >= n]
                if bad:
                    raise self._spec_error(t, "indices", f"index {bad[0]} is out of range for {what}")
                continue
            for key in ("goal", "low", "high"):
                vec = getattr(t, key)
                if vec is not None and len(vec) != n:
                    raise self._spec_error(t, key, f"has {len(vec)} values, {what} (set 'indices' to select "
                                                   f"{len(vec)} of them)")

    def _spec_error(self, t: TermSpec, field: str, detail: str) -> RewardConfigError:
        return RewardConfigError(f"field '{field}' {detail}", term_index=t.index, term_name=t.name, field=field,
                                 source=self.source)

    def compute(self, observation: Arrays, action: Arrays, next_observation: Arrays, env_reward: np.ndarray,
                previous_action: Arrays | None = None, *, first_step: np.ndarray | None = None) -> RewardResult:
        """The reward of `action` taken in `observation`, which led to `next_observation`, for a batch of B.

        Every mapping holds arrays with a leading batch dimension B; `env_reward` is (B,). Observation terms
        read `next_observation` (no term reads `observation` yet; it is there for terms that compare the two).
        `previous_action` None means the first step of an episode for every row (smoothness gives 0);
        `first_step`, a (B,) bool mask, says the same for some rows only.
        Raises `RewardInputError` (naming the tensor) for inputs that do not fit the config.
        """
        env = np.asarray(env_reward, dtype=np.float64)
        if env.ndim != 1:
            raise RewardInputError("env_reward", f"shape {list(env.shape)}: expected (B,)")
        if first_step is not None:
            first_step = np.asarray(first_step, dtype=bool)
            if first_step.shape != env.shape:
                raise RewardInputError("first_step", f"shape {list(first_step.shape)}, expected {list(env.shape)}")
        scratch = None
        if env.shape[0] >= SCRATCH_FROM_BATCH:
            scratch = getattr(self._local, "scratch", None)
            if scratch is None:
                scratch = self._local.scratch = Scratch()
        step = Step(observation, action, next_observation, env, previous_action, first_step, scratch)
        terminate = np.zeros(step.batch, dtype=bool)
        for c in self._conditions:
            holds = step.conditions[c.name] = c.holds(step)
            if c.name in self._terminating:
                terminate |= holds
            if c.condition_kind == "failure":
                step.failed = holds if step.failed is None else step.failed | holds
        values = [t.value(step) for t in self._compiled]
        reward = values[0].copy()
        for v in values[1:]:
            reward += v
        return RewardResult(reward, dict(zip(self.terms, values, strict=True)), terminate, step.conditions,
                            self._terminating)

    def __repr__(self) -> str:
        return f"RewardFunction({', '.join(self.terms)}; {self.version})"

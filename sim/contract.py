"""A reusable contract test suite that every `Environment` adapter passes (like dm_env's
`test_utils.EnvironmentTestMixin`). Subclass it in a test module and say how to build the env:

    class TestHopper(EnvironmentContract):
        def make_env(self, *, seed=None):
            return GymnasiumEnv("Hopper-v5", seed=seed, max_episode_steps=50)

pytest then runs every `test_*` method below against it. `make_env` should give an env whose
episodes end within `max_steps_to_last` random steps (pass a short time limit). The suite needs
no pytest import, so it also runs under unittest-style runners.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from protos.codec import Spec, TensorError
from sim.env import Environment, ResetRequired, StepType, TimeStep, bounds

__all__ = ["EnvironmentContract", "random_action"]


def random_action(specs: Sequence[Spec], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A valid action: uniform within finite bounds, standard normal where unbounded."""
    action = {}
    for spec in specs:
        if spec.dtype.kind == "b":
            action[spec.name] = np.asarray(rng.integers(0, 2, size=spec.shape)).astype(bool)
            continue
        limits = bounds(spec)
        value = rng.standard_normal(spec.shape)
        if limits is not None:
            low, high = limits
            finite = np.isfinite(low) & np.isfinite(high)
            value = np.where(finite, rng.uniform(np.where(finite, low, 0), np.where(finite, high, 1)),
                             np.clip(value, low, high))
        if spec.dtype.kind in "iu":
            value = np.round(value)
        action[spec.name] = np.asarray(value).astype(spec.dtype)
    return action


@contextlib.contextmanager
def _raises(kind: type[BaseException], *, field: str | None = None) -> Iterator[None]:
    try:
        yield
    except kind as e:
        if field is not None:
            assert getattr(e, "field", None) == field, f"{e!r} should name {field!r}"
            assert field in str(e), f"the message {str(e)!r} should name {field!r}"
    else:
        raise AssertionError(f"expected {kind.__name__}" + (f" naming {field!r}" if field else ""))


def _assert_matches(specs: Sequence[Spec], tensors: Mapping[str, np.ndarray], what: str) -> None:
    assert isinstance(tensors, dict), f"{what} should be a dict, got {type(tensors).__name__}"
    assert set(tensors) == {s.name for s in specs}, f"{what} names {sorted(tensors)} != spec"
    for spec in specs:
        value = tensors[spec.name]
        assert isinstance(value, np.ndarray), f"{what}[{spec.name!r}] is {type(value).__name__}"
        spec.check(value)  # dtype, shape, finite


def _assert_well_formed(*spec_tuples: Sequence[Spec]) -> None:
    """Each a non-empty tuple of Specs with distinct names, valid bounds, surviving the proto round trip."""
    for specs in spec_tuples:
        assert isinstance(specs, tuple) and specs, "specs must be a non-empty tuple"
        assert all(isinstance(s, Spec) for s in specs)
        names = [s.name for s in specs]
        assert len(set(names)) == len(names), f"duplicate names {names}"
        for spec in specs:
            bounds(spec)  # raises on a malformed low/high
            assert Spec.from_proto(spec.to_proto()) == spec


def _assert_within(specs: Sequence[Spec], action: Mapping[str, np.ndarray]) -> None:
    for spec in specs:
        limits = bounds(spec)
        if limits is not None:
            value = action[spec.name].astype(np.float64)
            slack = np.finfo(spec.dtype).eps * np.maximum(1.0, np.abs(value)) if spec.dtype.kind == "f" else 0
            assert (value >= limits[0] - slack).all() and (value <= limits[1] + slack).all(), \
                f"applied {spec.name} {value} outside [{limits[0]}, {limits[1]}]"


class EnvironmentContract:
    """Mixin of contract tests; subclasses override `make_env` (and may tune the limits)."""

    steps: int = 100               # random steps in the long-run test
    max_steps_to_last: int = 1000  # an episode under random actions must end within this

    def make_env(self, *, seed: int | None = None) -> Environment:
        raise NotImplementedError("a contract test class must override make_env(*, seed=None)")

    def _env(self, *, seed: int | None = None) -> contextlib.closing[Environment]:
        return contextlib.closing(self.make_env(seed=seed))

    def _check_timestep(self, env: Environment, ts: TimeStep) -> None:
        assert isinstance(ts, TimeStep), f"expected a TimeStep, got {type(ts).__name__}"
        assert isinstance(ts.step_type, StepType), f"step_type {ts.step_type!r} is not a StepType"
        _assert_matches(env.observation_spec(), ts.observation, "observation")
        assert isinstance(ts.reward, float) and np.isfinite(ts.reward), f"reward {ts.reward!r}"
        if ts.step_type is StepType.FIRST:
            assert ts.reward == 0.0 and not ts.terminated and ts.applied_action is None
        else:
            assert ts.applied_action is not None, "MID/LAST must report the applied action"
            _assert_matches(env.action_spec(), ts.applied_action, "applied_action")
            _assert_within(env.action_spec(), ts.applied_action)
        if ts.terminated:
            assert ts.step_type is StepType.LAST, "terminated is only set on LAST"

    def _run_to_last(self, env: Environment, rng: np.random.Generator) -> TimeStep:
        for _ in range(self.max_steps_to_last):
            ts = env.step(random_action(env.action_spec(), rng))
            self._check_timestep(env, ts)
            assert ts.step_type in (StepType.MID, StepType.LAST)
            if ts.step_type is StepType.LAST:
                return ts
        raise AssertionError(f"no LAST within {self.max_steps_to_last} steps: give make_env a time limit")

    def test_implements_protocol(self):
        with self._env() as env:
            assert isinstance(env, Environment)

    def test_specs_are_well_formed(self):
        with self._env() as env:
            _assert_well_formed(env.observation_spec(), env.action_spec())

    def test_reset_gives_first(self):
        with self._env(seed=0) as env:
            ts = env.reset()
            assert ts.step_type is StepType.FIRST
            self._check_timestep(env, ts)

    def test_random_actions_give_valid_timesteps(self):
        rng = np.random.default_rng(0)
        with self._env(seed=0) as env:
            self._check_timestep(env, env.reset())
            for _ in range(self.steps):
                ts = env.step(random_action(env.action_spec(), rng))
                self._check_timestep(env, ts)
                assert ts.step_type in (StepType.MID, StepType.LAST)
                if ts.step_type is StepType.LAST:
                    self._check_timestep(env, env.reset())

    def test_episode_ends_with_last_then_reset_works(self):
        rng = np.random.default_rng(1)
        with self._env(seed=1) as env:
            for _ in range(2):
                assert env.reset().step_type is StepType.FIRST
                self._run_to_last(env, rng)
            ts = env.reset()
            self._check_timestep(env, ts)
            assert env.step(random_action(env.action_spec(), rng)).step_type in (StepType.MID, StepType.LAST)

    def test_step_after_last_without_reset_raises(self):
        rng = np.random.default_rng(2)
        with self._env(seed=2) as env:
            env.reset()
            self._run_to_last(env, rng)
            with _raises(ResetRequired):
                env.step(random_action(env.action_spec(), rng))

    def test_step_before_reset_raises(self):
        with self._env() as env, _raises(ResetRequired):
            env.step(random_action(env.action_spec(), np.random.default_rng(0)))

    def test_seeded_determinism(self):
        def rollout(env: Environment, seed: int) -> list[tuple]:
            rng = np.random.default_rng(123)
            ts = env.reset(seed=seed)
            trace = [(ts.step_type, {k: v.tobytes() for k, v in ts.observation.items()}, ts.reward)]
            for _ in range(min(self.steps, 30)):
                ts = env.step(random_action(env.action_spec(), rng))
                trace.append((ts.step_type, {k: v.tobytes() for k, v in ts.observation.items()}, ts.reward))
                if ts.step_type is StepType.LAST:
                    break
            return trace

        with self._env() as a, self._env() as b:
            first = rollout(a, 7)
            assert first == rollout(b, 7), "same seed and actions must give the same trajectory"
            assert first == rollout(a, 7), "reset(seed=) must restart the same trajectory"
        with self._env(seed=11) as a, self._env(seed=11) as b:
            oa, ob = a.reset().observation, b.reset().observation  # seeded by the constructor
            assert all(np.array_equal(oa[k], ob[k]) for k in oa), "make_env(seed=) must seed reset()"

    def test_out_of_bounds_action_is_clipped_and_reported(self):
        with self._env(seed=3) as env:
            specs = [s for s in env.action_spec() if bounds(s) is not None and s.dtype.kind == "f"]
            if not specs:
                return  # nothing bounded to clip
            env.reset()
            action = random_action(env.action_spec(), np.random.default_rng(3))
            expected = dict(action)
            for spec in specs:
                low, high = bounds(spec)
                far = np.where(np.isfinite(high), high + 10 * (np.abs(high) + 1), 1e6)
                action[spec.name] = far.astype(spec.dtype)
                expected[spec.name] = np.clip(far, low, high).astype(spec.dtype)
            ts = env.step(action)
            _assert_within(env.action_spec(), ts.applied_action)
            for spec in specs:
                np.testing.assert_allclose(ts.applied_action[spec.name], expected[spec.name], rtol=1e-6)

    def test_invalid_actions_are_rejected_naming_the_tensor(self):
        rng = np.random.default_rng(4)
        with self._env(seed=4) as env:
            env.reset()
            good = random_action(env.action_spec(), rng)
            spec = env.action_spec()[0]
            other = np.float64 if spec.dtype != np.float64 else np.float32
            bad = {
                "missing": {k: v for k, v in good.items() if k != spec.name},
                "shape": {**good, spec.name: np.zeros(spec.shape + (2,), spec.dtype)},
                "dtype": {**good, spec.name: good[spec.name].astype(other)},
            }
            if spec.dtype.kind == "f":
                nan = good[spec.name].copy()
                nan.flat[0] = np.nan
                bad["nan"] = {**good, spec.name: nan}
            for why, action in bad.items():
                with _raises(TensorError, field=spec.name):
                    env.step(action)
                    raise AssertionError(f"a {why} action was accepted")
            with _raises(TensorError, field="not_an_action"):
                env.step({**good, "not_an_action": np.zeros(1, np.float32)})
            ts = env.step(good)  # a rejected action does not break the episode
            self._check_timestep(env, ts)

    def test_close_twice_is_harmless(self):
        with self._env() as env:  # closed once here, once more on the way out
            env.reset()
            env.close()

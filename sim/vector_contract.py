"""A reusable contract test suite that every `VectorEnvironment` adapter passes (like
`sim.contract.EnvironmentContract` for single envs). Subclass it and say how to build the env:

    class TestHopperVector(VectorEnvironmentContract):
        def make_env(self, *, num_envs, seed=None):
            return GymnasiumVectorEnv("Hopper-v5", num_envs=num_envs, seed=seed, max_episode_steps=30)

pytest then runs every `test_*` method against it: batch shapes and dtypes, per-env same-step
auto-reset, seeded determinism, clipping, per-env refusal of non-finite actions and whole-batch
refusal of malformed ones. `make_env` should give envs whose episodes end within
`max_steps_to_last` random steps (pass a short time limit). No pytest import is needed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import numpy as np

from protos.codec import Spec, TensorError
from sim.contract import _assert_well_formed, _raises, random_action
from sim.env import ResetRequired, StepType, bounds
from sim.vector import VectorEnvironment, VectorTimeStep, safe_action

__all__ = ["VectorEnvironmentContract", "random_actions"]


def random_actions(specs: Sequence[Spec], num_envs: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A valid batched action: `sim.contract.random_action` for each env, stacked."""
    rows = [random_action(specs, rng) for _ in range(num_envs)]
    return {s.name: np.stack([row[s.name] for row in rows]) for s in specs}


def _assert_batch(specs: Sequence[Spec], tensors: Mapping[str, np.ndarray], n: int, what: str) -> None:
    assert isinstance(tensors, dict), f"{what} should be a dict, got {type(tensors).__name__}"
    assert set(tensors) == {s.name for s in specs}, f"{what} names {sorted(tensors)} != spec"
    for spec in specs:
        value = tensors[spec.name]
        assert isinstance(value, np.ndarray), f"{what}[{spec.name!r}] is {type(value).__name__}"
        assert value.dtype == spec.dtype, f"{what}[{spec.name!r}] dtype {value.dtype} != {spec.dtype}"
        assert value.shape == (n, *spec.shape), f"{what}[{spec.name!r}] shape {value.shape} != {(n, *spec.shape)}"
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), f"{what}[{spec.name!r}] is not finite"


def _assert_within(specs: Sequence[Spec], action: Mapping[str, np.ndarray]) -> None:
    for spec in specs:
        limits = bounds(spec)
        if limits is not None:
            value = action[spec.name].astype(np.float64)
            assert (value >= limits[0]).all() and (value <= limits[1]).all(), \
                f"applied {spec.name} outside [{limits[0]}, {limits[1]}]"


def _trace(ts: VectorTimeStep) -> tuple:
    """Everything a step reports, as bytes, for exact comparisons."""
    arrays = [ts.step_type, ts.reward, ts.terminated, ts.truncated]
    for group in (ts.observation, ts.final_observation, ts.applied_action):
        arrays += [group[k] for k in sorted(group)] if group is not None else []
    return tuple(np.ascontiguousarray(a).tobytes() for a in arrays)


class VectorEnvironmentContract:
    """Mixin of contract tests; subclasses override `make_env` (and may tune the limits)."""

    num_envs: int = 4
    steps: int = 40                 # random steps in the long-run tests
    max_steps_to_last: int = 500    # every env must end an episode within this many random steps
    mixed_episode_ends: bool = True  # envs end at different steps (they have terminations)

    def make_env(self, *, num_envs: int, seed: int | None = None) -> VectorEnvironment:
        raise NotImplementedError("a contract test class must override make_env(*, num_envs, seed=None)")

    def _env(self, *, num_envs: int | None = None, seed: int | None = None) -> contextlib.closing[VectorEnvironment]:
        return contextlib.closing(self.make_env(num_envs=self.num_envs if num_envs is None else num_envs, seed=seed))

    def _check(self, env: VectorEnvironment, ts: VectorTimeStep, *, first: bool = False) -> None:
        n = env.num_envs
        assert isinstance(ts, VectorTimeStep), f"expected a VectorTimeStep, got {type(ts).__name__}"
        for name, value, dtype in (("step_type", ts.step_type, np.int8), ("reward", ts.reward, np.float64),
                                   ("terminated", ts.terminated, np.bool_), ("truncated", ts.truncated, np.bool_)):
            assert isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == (n,), \
                f"{name} should be a ({n},) {np.dtype(dtype).name} array, got {value!r}"
        assert np.isfinite(ts.reward).all(), f"reward {ts.reward}"
        _assert_batch(env.observation_spec(), ts.observation, n, "observation")
        assert isinstance(ts.refused, np.ndarray) and ts.refused.dtype == np.bool_ and ts.refused.shape == (n,)
        if first:
            assert (ts.step_type == StepType.FIRST).all() and not ts.reward.any()
            assert not ts.terminated.any() and not ts.truncated.any() and ts.applied_action is None
            assert not ts.refused.any() and not ts.errors
            return
        assert np.isin(ts.step_type, (StepType.MID, StepType.LAST)).all(), f"step_type {ts.step_type}"
        last = ts.step_type == StepType.LAST
        assert ((ts.terminated | ts.truncated) == last).all(), "LAST exactly where terminated or truncated"
        assert not (ts.terminated & ts.truncated).any(), "terminated and truncated are exclusive"
        _assert_batch(env.action_spec(), ts.applied_action, n, "applied_action")
        _assert_within(env.action_spec(), ts.applied_action)
        assert sorted(i for i, _ in ts.errors) == np.flatnonzero(ts.refused).tolist(), "one error per refused env"
        if ts.final_observation is None:
            assert not getattr(env, "provides_final_observation", True), "final_observation missing"
            return
        _assert_batch(env.observation_spec(), ts.final_observation, n, "final_observation")
        for name, obs in ts.observation.items():
            final = ts.final_observation[name]
            assert np.array_equal(final[~last], obs[~last]), "final_observation == observation where not LAST"

    def _step(self, env: VectorEnvironment, rng: np.random.Generator) -> VectorTimeStep:
        ts = env.step(random_actions(env.action_spec(), env.num_envs, rng))
        self._check(env, ts)
        assert not ts.refused.any() and not ts.errors, f"a valid action was refused: {ts.errors}"
        return ts

    def test_implements_protocol(self):
        with self._env() as env:
            assert isinstance(env, VectorEnvironment)
            assert env.num_envs == self.num_envs

    def test_specs_are_per_env_and_well_formed(self):
        with self._env() as env:
            _assert_well_formed(env.observation_spec(), env.action_spec())
            ts = env.reset(seed=0)
            for spec in env.observation_spec():  # the spec has no batch dimension
                assert ts.observation[spec.name].shape[1:] == spec.shape

    def test_reset_gives_a_first_batch(self):
        for n in (1, self.num_envs):
            with self._env(num_envs=n, seed=0) as env:
                self._check(env, env.reset(), first=True)

    def test_random_actions_give_valid_batches(self):
        rng = np.random.default_rng(0)
        with self._env(seed=0) as env:
            self._check(env, env.reset(), first=True)
            for _ in range(self.steps):
                self._step(env, rng)

    def test_every_env_auto_resets_on_its_own(self):
        rng = np.random.default_rng(1)
        with self._env(seed=1) as env:
            env.reset()
            n, ended, mixed = env.num_envs, np.zeros(env.num_envs, bool), False
            for _ in range(self.max_steps_to_last):
                ts = self._step(env, rng)
                last = ts.last()
                mixed |= bool(last.any() and not last.all())
                if ts.final_observation is not None:
                    for name, obs in ts.observation.items():  # a LAST env's observation is its new episode's
                        for i in np.flatnonzero(last):
                            assert not np.array_equal(obs[i], ts.final_observation[name][i]), \
                                f"env {i}: observation after LAST should be the reset one"
                if ended.all() and (mixed or not self.mixed_episode_ends or n == 1):
                    break
                ended |= last
            else:
                raise AssertionError(f"within {self.max_steps_to_last} steps: envs that ended {ended.tolist()}, "
                                     f"mixed ends {mixed}: give make_env a short time limit")
            assert self._step(env, rng).step_type.shape == (n,), "stepping goes on after every env's reset"

    def test_step_before_reset_raises(self):
        with self._env() as env, _raises(ResetRequired):
            env.step(random_actions(env.action_spec(), env.num_envs, np.random.default_rng(0)))

    def test_seeded_determinism(self):
        def rollout(env: VectorEnvironment, seed: int) -> list[tuple]:
            rng = np.random.default_rng(123)
            trace = [_trace(env.reset(seed=seed))]
            for _ in range(self.steps):
                trace.append(_trace(self._step(env, rng)))
            return trace

        with self._env() as a, self._env() as b:
            first = rollout(a, 7)
            assert first == rollout(b, 7), "same seed and actions must give the same batches"
            assert first == rollout(a, 7), "reset(seed=) must restart the same batches"
            assert first != rollout(b, 8), "another seed should give other batches"
        with self._env(seed=11) as a, self._env(seed=11) as b:
            oa, ob = a.reset().observation, b.reset().observation  # seeded by the constructor
            assert all(np.array_equal(oa[k], ob[k]) for k in oa), "make_env(seed=) must seed reset()"
            if a.num_envs > 1:
                rows = np.concatenate([v.reshape(a.num_envs, -1).astype(np.float64) for v in oa.values()], axis=1)
                assert len(np.unique(rows, axis=0)) == a.num_envs, "each env should start from its own state"

    def test_out_of_bounds_actions_are_clipped_and_reported(self):
        with self._env(seed=3) as env:
            specs = [s for s in env.action_spec() if bounds(s) is not None and s.dtype.kind == "f"]
            if not specs:
                return
            env.reset()
            action = random_actions(env.action_spec(), env.num_envs, np.random.default_rng(3))
            for spec in specs:
                low, high = bounds(spec)
                sign = np.where(np.arange(env.num_envs) % 2 == 0, 1.0, -1.0).reshape(-1, *[1] * len(spec.shape))
                far = np.where(sign > 0, np.where(np.isfinite(high), high + 10 * (np.abs(high) + 1), 1e6),
                               np.where(np.isfinite(low), low - 10 * (np.abs(low) + 1), -1e6))
                action[spec.name] = far.astype(spec.dtype)
            ts = env.step(action)
            self._check(env, ts)
            assert not ts.refused.any(), "out-of-bounds values are clipped, not refused"
            for spec in specs:
                expected = np.clip(action[spec.name].astype(np.float64), *bounds(spec))
                np.testing.assert_allclose(ts.applied_action[spec.name], expected, rtol=1e-6)

    def test_a_non_finite_action_refuses_that_env_only(self):
        spec_rng = np.random.default_rng(5)
        with self._env(seed=5) as a, self._env(seed=5) as b:
            specs = [s for s in a.action_spec() if s.dtype.kind == "f"]
            if not specs:
                return
            a.reset(), b.reset()
            n, k = a.num_envs, a.num_envs - 1
            for step in range(3):
                action = random_actions(a.action_spec(), n, spec_rng)
                bad = {name: v.copy() for name, v in action.items()}
                rows = bad[specs[0].name].reshape(n, -1)  # a view: the batch is a fresh copy
                rows[k, step % rows.shape[1]] = (np.nan, np.inf, -np.inf)[step]
                expected = {name: v.copy() for name, v in action.items()}
                for name, v in safe_action(a.action_spec(), n).items():
                    expected[name][k] = v[k]
                ta, tb = a.step(bad), b.step(expected)
                self._check(a, ta)
                assert ta.refused.tolist() == [i == k for i in range(n)], f"refused {ta.refused}, expected env {k}"
                ((index, message),) = ta.errors
                assert index == k and f"env {k}" in message and specs[0].name in message, ta.errors
                assert _trace(ta) == _trace(tb), "the refused env gets the safe action; the others are untouched"
            ta, tb = a.step(expected), b.step(expected)  # a refused env keeps running
            assert not ta.refused.any() and _trace(ta) == _trace(tb)

    def test_malformed_batches_are_rejected_naming_the_tensor(self):
        rng = np.random.default_rng(4)
        with self._env(seed=4) as a, self._env(seed=4) as b:
            a.reset(), b.reset()
            n = a.num_envs
            good = random_actions(a.action_spec(), n, rng)
            spec = a.action_spec()[0]
            other = np.float64 if spec.dtype != np.float64 else np.float32
            bad = {
                "missing": {k: v for k, v in good.items() if k != spec.name},
                "batch size": {**good, spec.name: np.concatenate([good[spec.name], good[spec.name][:1]])},
                "no batch dim": {**good, spec.name: good[spec.name][0]},
                "env shape": {**good, spec.name: np.zeros((n, *spec.shape, 2), spec.dtype)},
                "dtype": {**good, spec.name: good[spec.name].astype(other)},
                "list": {**good, spec.name: good[spec.name].tolist()},
            }
            for why, action in bad.items():
                with _raises(TensorError, field=spec.name):
                    a.step(action)
                    raise AssertionError(f"a {why} batch was accepted")
            with _raises(TensorError, field="not_an_action"):
                a.step({**good, "not_an_action": np.zeros((n, 1), np.float32)})
            assert _trace(a.step(good)) == _trace(b.step(good)), "a rejected batch must not step any env"

    def test_close_twice_is_harmless(self):
        with self._env() as env:  # closed once here, once more on the way out
            env.reset()
            env.close()

"""Every reward term against values computed by hand, for one row and for a batch; sums, terminate."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bridge.rewards import RewardFunction, RewardInputError, RewardResult
from bridge.rewards.function import SCRATCH_FROM_BATCH


def fn_of(*terms: dict) -> RewardFunction:
    return RewardFunction.from_dict({"reward": {"terms": list(terms)}}, source="test")


def obs(*rows, name="observation", dtype=np.float32) -> dict[str, np.ndarray]:
    return {name: np.asarray(rows, dtype=dtype)}


def compute(fn: RewardFunction, *, next_obs: dict, action: dict | None = None, env=None, prev=None,
            first_step=None) -> RewardResult:
    b = next(iter(next_obs.values())).shape[0]
    action = action if action is not None else {"action": np.zeros((b, 1), np.float32)}
    env = np.zeros(b) if env is None else np.asarray(env, dtype=np.float64)
    # the current observation is never read by these terms: pass garbage to show it
    current = {k: np.full_like(v, 99.0) for k, v in next_obs.items()}
    return fn.compute(current, action, next_obs, env, prev, first_step=first_step)


def check(result: RewardResult, name: str, expected: list[float]) -> None:
    got = result.terms[name]
    assert got.dtype == np.float64 and got.shape == (len(expected),)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_env_reward_passes_through_with_its_weight():
    fn = RewardFunction.passthrough()
    r = compute(fn, next_obs=obs([0.0], [0.0], [0.0]), env=[1.5, -2.0, 0.25])
    assert fn.terms == ("env_reward",)
    check(r, "env_reward", [1.5, -2.0, 0.25])
    np.testing.assert_array_equal(r.reward, [1.5, -2.0, 0.25])
    assert r.terminate.dtype == bool and not r.terminate.any()
    r = compute(fn_of({"type": "env_reward", "weight": 0.5}), next_obs=obs([0.0]), env=[3.0])
    check(r, "env_reward", [1.5])


def test_alive_bonus_is_the_weight_unless_a_failure_holds():
    plain = fn_of({"type": "alive_bonus", "weight": 2.0})
    check(compute(plain, next_obs=obs([0.0])), "alive_bonus", [2.0])
    check(compute(plain, next_obs=obs([0.0], [5.0], [-5.0])), "alive_bonus", [2.0, 2.0, 2.0])
    # a failure (even one that does not terminate) zeroes the bonus on its rows only
    fn = fn_of({"type": "alive_bonus"},
               {"type": "failure", "observation": "observation", "indices": [1], "above": 0.2})
    r = compute(fn, next_obs=obs([0.0, 0.1], [0.0, -0.3], [9.0, 0.2], dtype=np.float64))
    check(r, "alive_bonus", [1.0, 0.0, 1.0])  # |-0.3| > 0.2 fails; 0.2 is not above 0.2
    check(r, "failure", [0.0, 0.0, 0.0])      # bonus defaults to 0
    assert not r.terminate.any()              # terminate defaults to false


def test_goal_distance_is_the_weighted_l2_distance_on_the_selected_elements():
    fn = fn_of({"type": "goal_distance", "observation": "observation", "indices": [0, 2], "goal": [0.5, -1.0],
                "weight": -2.0})
    # row 0: (3.5-0.5, 3.0+1.0) = (3, 4) -> 5; row 1: at the goal -> 0; row 2: (0.5-0.5, -1-1)... see below
    r = compute(fn, next_obs=obs([3.5, 100.0, 3.0], [0.5, -7.0, -1.0], [-0.5, 0.0, -1.0]))
    check(r, "goal_distance", [-10.0, 0.0, -2.0])
    r1 = compute(fn, next_obs=obs([3.5, 100.0, 3.0]))
    check(r1, "goal_distance", [-10.0])
    # no indices: every element, of a multi-dimensional tensor flattened per row
    fn = fn_of({"type": "goal_distance", "observation": "grid", "goal": [1.0, 1.0, 1.0, 1.0], "weight": 1.0})
    r = compute(fn, next_obs=obs([[1.0, 2.0], [1.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]], name="grid"))
    check(r, "goal_distance", [np.sqrt(1.0 + 9.0), 0.0])


def test_action_magnitude_is_the_weighted_squared_norm():
    fn = fn_of({"type": "action_magnitude", "action": "action", "weight": -0.1})
    act = {"action": np.array([[1.0, -2.0, 2.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]], np.float32)}
    r = compute(fn, next_obs=obs([0.0], [0.0], [0.0]), action=act)
    check(r, "action_magnitude", [-0.9, 0.0, -0.025])
    fn = fn_of({"type": "action_magnitude", "action": "action", "indices": [1], "weight": 1.0})
    check(compute(fn, next_obs=obs([0.0]), action={"action": np.array([[3.0, -4.0, 9.0]])}), "action_magnitude",
          [16.0])


def test_action_smoothness_penalises_the_change_and_is_zero_at_an_episode_start():
    fn = fn_of({"type": "action_smoothness", "action": "action", "weight": -1.0})
    act = {"action": np.array([[1.0, 1.0], [0.0, 3.0]], np.float32)}
    prev = {"action": np.array([[0.0, 3.0], [0.0, 3.0]], np.float32)}
    nxt = obs([0.0], [0.0])
    check(compute(fn, next_obs=nxt, action=act, prev=prev), "action_smoothness", [-5.0, 0.0])
    check(compute(fn, next_obs=nxt, action=act, prev=None), "action_smoothness", [0.0, 0.0])
    # some rows at their first step (vectorised sims reset independently)
    check(compute(fn, next_obs=nxt, action=act, prev=prev, first_step=np.array([True, False])),
          "action_smoothness", [0.0, 0.0])
    act1, prev1 = {"action": act["action"][:1]}, {"action": prev["action"][:1]}
    check(compute(fn, next_obs=obs([0.0]), action=act1, prev=prev1), "action_smoothness", [-5.0])
    fn = fn_of({"type": "action_smoothness", "action": "action", "indices": [1], "weight": 2.0})
    check(compute(fn, next_obs=nxt, action=act, prev=prev), "action_smoothness", [8.0, 0.0])


def test_joint_limit_proximity_is_linear_inside_the_margin_band_and_beyond():
    fn = fn_of({"type": "joint_limit_proximity", "observation": "q", "low": [-1.0, 0.0], "high": [1.0, 2.0],
                "margin": 0.25, "weight": -4.0})
    # free range: [-0.75, 0.75] and [0.25, 1.75]
    q = obs([0.0, 1.0],      # both free -> 0
            [0.85, 1.0],     # 0.10 into the band of joint 0 -> 0.1
            [-1.5, 0.0],     # 0.75 past joint 0's band edge, 0.25 past joint 1's -> 1.0
            [0.75, 1.75],    # exactly at both band edges -> 0
            name="q")
    check(compute(fn, next_obs=q), "joint_limit_proximity", [0.0, -0.4, -4.0, 0.0])
    fn = fn_of({"type": "joint_limit_proximity", "observation": "q", "indices": [1], "low": [0.0], "high": [2.0],
                "weight": 1.0})  # margin 0: only beyond the limits
    check(compute(fn, next_obs=obs([5.0, 2.5], name="q")), "joint_limit_proximity", [0.5])


def test_success_gives_its_bonus_and_terminates_where_the_distance_is_below():
    fn = fn_of({"type": "env_reward"},
               {"type": "success", "observation": "observation", "indices": [0, 1], "goal": [0.5, 0.0],
                "below": 0.05, "bonus": 10.0, "terminate": True})
    r = compute(fn, next_obs=obs([0.5, 0.04, 7.0], [0.56, 0.08, 0.0], [0.5, 0.06, 0.0]), env=[1.0, 1.0, 1.0])
    # distances: 0.04 (below 0.05), 0.1, 0.06
    check(r, "success", [10.0, 0.0, 0.0])
    np.testing.assert_allclose(r.reward, [11.0, 1.0, 1.0])
    assert r.terminate.tolist() == [True, False, False]
    # no goal: the norm of the selected values; one index: its absolute value
    fn = fn_of({"type": "success", "observation": "observation", "indices": [1], "below": 0.1, "bonus": 1.0})
    r = compute(fn, next_obs=obs([5.0, -0.05], [0.0, -0.2]))
    check(r, "success", [1.0, 0.0])
    assert not r.terminate.any()


def test_failure_above_terminates_with_its_penalty():
    fn = fn_of({"type": "failure", "name": "fell", "observation": "observation", "indices": [1], "above": 0.2,
                "bonus": -5.0, "terminate": True})
    r = compute(fn, next_obs=obs([0.0, 0.21], [0.0, -0.19], [0.0, -0.25]))
    check(r, "fell", [-5.0, 0.0, -5.0])
    assert r.terminate.tolist() == [True, False, True]
    assert compute(fn, next_obs=obs([0.0, -0.25])).terminate.tolist() == [True]


def test_weighted_terms_sum_to_the_reward_in_config_order():
    fn = fn_of({"type": "env_reward", "weight": 2.0},
               {"type": "alive_bonus", "weight": 0.5},
               {"type": "goal_distance", "observation": "observation", "indices": [0, 1], "goal": [0.0, 0.0],
                "weight": -1.0},
               {"type": "action_magnitude", "action": "action", "weight": -0.5},
               {"type": "action_smoothness", "action": "action", "weight": -0.25},
               {"type": "success", "observation": "observation", "indices": [0, 1], "below": 1.0, "bonus": 3.0,
                "terminate": True})
    assert fn.terms == ("env_reward", "alive_bonus", "goal_distance", "action_magnitude", "action_smoothness",
                        "success")
    nxt = obs([3.0, 4.0], [0.3, 0.4])
    act = {"action": np.array([[1.0], [2.0]], np.float32)}
    prev = {"action": np.array([[3.0], [2.0]], np.float32)}
    r = compute(fn, next_obs=nxt, action=act, prev=prev, env=[1.0, -1.0])
    assert list(r.terms) == list(fn.terms)
    expected = {"env_reward": [2.0, -2.0], "alive_bonus": [0.5, 0.5], "goal_distance": [-5.0, -0.5],
                "action_magnitude": [-0.5, -2.0], "action_smoothness": [-1.0, 0.0], "success": [0.0, 3.0]}
    for name, values in expected.items():
        check(r, name, values)
    np.testing.assert_allclose(r.reward, [2.0 + 0.5 - 5.0 - 0.5 - 1.0, -2.0 + 0.5 - 0.5 - 2.0 + 3.0])
    assert r.reward.dtype == np.float64 and r.terminate.tolist() == [False, True]


def test_terminate_is_the_or_of_the_terminating_conditions_only():
    fn = fn_of({"type": "success", "observation": "observation", "indices": [0], "below": 0.1, "terminate": True},
               {"type": "failure", "observation": "observation", "indices": [1], "above": 1.0, "terminate": True},
               {"type": "failure", "name": "warn", "observation": "observation", "indices": [2], "above": 1.0})
    r = compute(fn, next_obs=obs([0.0, 0.0, 0.0], [5.0, 2.0, 0.0], [5.0, 0.0, 5.0], [5.0, 0.0, 0.0],
                                 [0.0, 2.0, 0.0]))
    assert r.terminate.tolist() == [True, True, False, False, True]
    assert r.terminating == ("success", "failure")
    assert {k: v.tolist() for k, v in r.conditions.items()} == {
        "success": [True, False, False, False, True], "failure": [False, True, False, False, True],
        "warn": [False, False, True, False, False]}
    assert [r.ended_by(i) for i in range(5)] == ["success", "failure", None, None, "success"]


def test_batch_rows_are_independent_and_match_single_row_calls():
    fn = fn_of({"type": "env_reward"}, {"type": "alive_bonus"},
               {"type": "goal_distance", "observation": "observation", "indices": [2, 0], "goal": [0.1, -0.2],
                "weight": -1.0},
               {"type": "action_magnitude", "action": "action", "weight": -0.01},
               {"type": "action_smoothness", "action": "action", "weight": -0.01},
               {"type": "joint_limit_proximity", "observation": "observation", "indices": [1, 3],
                "low": [-1.0, -0.5], "high": [1.0, 0.5], "margin": 0.1, "weight": -1.0},
               {"type": "failure", "observation": "observation", "indices": [3], "above": 0.45, "terminate": True})
    rng = np.random.default_rng(7)
    b = 257
    nxt = {"observation": rng.normal(size=(b, 4)).astype(np.float32)}
    act = {"action": rng.normal(size=(b, 2)).astype(np.float32)}
    prev = {"action": rng.normal(size=(b, 2)).astype(np.float32)}
    env = rng.normal(size=b)
    batched = compute(fn, next_obs=nxt, action=act, prev=prev, env=env)
    assert 0 < batched.terminate.sum() < b
    for i in (0, 1, 100, b - 1):
        one = compute(fn, next_obs={"observation": nxt["observation"][i:i + 1]},
                      action={"action": act["action"][i:i + 1]}, prev={"action": prev["action"][i:i + 1]},
                      env=env[i:i + 1])
        for name in fn.terms:
            np.testing.assert_allclose(one.terms[name], batched.terms[name][i:i + 1], rtol=1e-12)
        assert one.terminate[0] == batched.terminate[i]


def test_inputs_are_not_modified_and_results_are_fresh_arrays():
    fn = fn_of({"type": "env_reward"}, {"type": "action_magnitude", "action": "action", "weight": -1.0})
    env = np.array([1.0, 2.0])
    act = {"action": np.array([[1.0], [2.0]])}
    r = compute(fn, next_obs=obs([0.0], [0.0]), action=act, env=env)
    r.reward[:] = 0.0
    r.terms["env_reward"][:] = 7.0
    assert env.tolist() == [1.0, 2.0] and act["action"].tolist() == [[1.0], [2.0]]
    assert compute(fn, next_obs=obs([0.0], [0.0]), action=act, env=env).reward.tolist() == [0.0, -2.0]


@pytest.mark.parametrize(("kwargs", "field", "words"), [
    ({"next_obs": {"other": np.zeros((1, 3), np.float32)}}, "observation", "missing from next_observation"),
    ({"next_obs": obs([0.0, 0.0])}, "observation", "2 values per row"),              # goal needs 3
    ({"next_obs": obs([0.0, 0.0, 0.0]), "env": [0.0, 0.0]}, "observation", "batch dimension of 2"),
    ({"next_obs": obs([0.0, 0.0, 0.0]), "env": 0.0}, "env_reward", "expected (B,)"),
    ({"next_obs": obs([0.0, 0.0, 0.0]), "prev": {"action": np.zeros((1, 2), np.float32)}}, "action",
     "previous_action has 2 values per row, action has 1"),
    ({"next_obs": obs([0.0, 0.0, 0.0]), "prev": {"a": np.zeros((1, 1))}}, "action",
     "missing from previous_action"),
    ({"next_obs": obs([0.0, 0.0, 0.0]), "first_step": np.array([True, False])}, "first_step", "shape [2]"),
])
def test_inputs_that_do_not_fit_raise_naming_the_tensor(kwargs, field, words):
    fn = fn_of({"type": "goal_distance", "observation": "observation", "goal": [0.0, 0.0, 0.0], "weight": -1.0},
               {"type": "action_smoothness", "action": "action", "weight": -1.0})
    kwargs.setdefault("prev", {"action": np.zeros((1, 1), np.float32)})
    with pytest.raises(RewardInputError, match=re.escape(words)) as info:
        compute(fn, **kwargs)
    assert info.value.field == field


def test_an_empty_batch_gives_empty_results():
    fn = fn_of({"type": "env_reward"}, {"type": "alive_bonus"},
               {"type": "goal_distance", "observation": "observation", "goal": [0.0, 0.0], "weight": -1.0},
               {"type": "action_smoothness", "action": "action", "weight": -1.0},
               {"type": "success", "observation": "observation", "indices": [0], "below": 1.0, "terminate": True})
    empty = {"observation": np.zeros((0, 2), np.float32)}
    act = {"action": np.zeros((0, 1), np.float32)}
    r = compute(fn, next_obs=empty, action=act, prev=act, first_step=np.zeros(0, bool))
    assert r.reward.shape == (0,) and r.terminate.shape == (0,) and all(v.shape == (0,) for v in r.terms.values())


def test_large_batches_reuse_work_arrays_but_never_share_results():
    # from SCRATCH_FROM_BATCH rows on, temporaries live in arrays reused across calls: results must not
    fn = fn_of({"type": "goal_distance", "observation": "observation", "goal": [1.0, 2.0], "weight": -1.0},
               {"type": "action_smoothness", "action": "action", "weight": -1.0},
               {"type": "joint_limit_proximity", "observation": "observation", "low": [-1, -1], "high": [1, 1],
                "weight": -1.0},
               {"type": "success", "observation": "observation", "goal": [1.0, 2.0], "below": 0.5})
    b = SCRATCH_FROM_BATCH + 3
    rng = np.random.default_rng(1)

    def call(scale):
        nxt = {"observation": (scale * rng.normal(size=(b, 2))).astype(np.float32)}
        act = {"action": rng.normal(size=(b, 3)).astype(np.float32)}
        prev = {"action": rng.normal(size=(b, 3)).astype(np.float32)}
        small = [compute(fn, next_obs={"observation": nxt["observation"][i:i + 1]},
                         action={"action": act["action"][i:i + 1]}, prev={"action": prev["action"][i:i + 1]})
                 for i in range(0, b, 37)]
        return compute(fn, next_obs=nxt, action=act, prev=prev), small

    first, first_small = call(1.0)
    kept = {k: v.copy() for k, v in first.terms.items()}
    second, second_small = call(3.0)
    for name in fn.terms:
        np.testing.assert_array_equal(first.terms[name], kept[name])     # untouched by the second call
        assert not np.shares_memory(first.terms[name], second.terms[name])
        for result, singles in ((first, first_small), (second, second_small)):
            np.testing.assert_allclose(result.terms[name][::37], np.concatenate([s.terms[name] for s in singles]),
                                       rtol=1e-12)

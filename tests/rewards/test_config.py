"""Config loading: versions that follow the content and only the content; every kind of error names its
term (index and name) and field; check_specs against a session's specs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from bridge.rewards import RewardConfigError, RewardFunction
from protos.codec import Spec

CONFIG = """
reward:
  terms:
    - {type: env_reward, weight: 1.0}
    - {type: alive_bonus, weight: 1.0}
    - {type: goal_distance, observation: observation, indices: [0, 1], goal: [0.5, 0.0], weight: -1.0}
    - {type: action_magnitude, action: action, weight: -0.01}
    - {type: action_smoothness, action: action, weight: -0.01}
    - {type: joint_limit_proximity, observation: joint_position, low: [-1.0, -2.0], high: [1.0, 2.0],
       margin: 0.1, weight: -1.0}
    - {type: success, observation: observation, indices: [0], below: 0.05, bonus: 10.0, terminate: true}
"""

# the same content: block style, other key order, ints for floats, defaults spelled out, comments
REFORMATTED = """
# a comment
reward:
  terms:
  - type: env_reward
  - weight: 1
    type: alive_bonus
  - weight: -1
    goal: [0.5, 0]
    indices:
    - 0
    - 1
    observation: observation
    type: goal_distance
  - {action: action, weight: -0.010, type: action_magnitude, indices: null}
  - {type: action_smoothness, name: action_smoothness, action: action, weight: -1.0e-2}
  - type: joint_limit_proximity
    observation: joint_position
    low: [-1, -2]
    high: [1, 2.0]
    margin: 0.1
    weight: -1
  - {terminate: true, bonus: 10, below: 0.05, indices: [0], observation: observation, type: success, goal: null}
"""


def load(text: str) -> RewardFunction:
    return RewardFunction.from_dict(yaml.safe_load(text), source="test")


def test_from_yaml_reads_a_file(tmp_path):
    path = tmp_path / "reward.yaml"
    path.write_text(CONFIG)
    fn = RewardFunction.from_yaml(path)
    assert fn.terms == ("env_reward", "alive_bonus", "goal_distance", "action_magnitude", "action_smoothness",
                        "joint_limit_proximity", "success")
    assert fn.version == load(CONFIG).version
    assert fn.version.startswith("sha256:") and len(fn.version) == len("sha256:") + 16
    int(fn.version.removeprefix("sha256:"), 16)


def test_version_ignores_formatting_key_order_and_spelled_out_defaults():
    assert load(REFORMATTED).version == load(CONFIG).version
    fn = load(CONFIG)
    assert RewardFunction.from_dict(fn.to_dict()).version == fn.version
    assert RewardFunction.from_dict(yaml.safe_load(yaml.safe_dump(fn.to_dict()))).version == fn.version
    passthrough = RewardFunction.passthrough()
    assert passthrough.version == load("reward: {terms: [{type: env_reward, weight: 1}]}").version
    assert load("reward: {terms: [{type: env_reward, weight: -0.0}]}").version == \
        load("reward: {terms: [{type: env_reward, weight: 0}]}").version


def _variants():
    base = yaml.safe_load(CONFIG)

    def edit(change):
        d = copy.deepcopy(base)
        change(d["reward"]["terms"])
        return d

    yield "weight", edit(lambda t: t[0].update(weight=1.0000001))
    yield "goal", edit(lambda t: t[2].update(goal=[0.5, 0.001]))
    yield "indices", edit(lambda t: t[2].update(indices=[1, 0]))
    yield "tensor", edit(lambda t: t[3].update(action="torque"))
    yield "margin", edit(lambda t: t[5].update(margin=0.2))
    yield "low", edit(lambda t: t[5].update(low=[-1.0, -2.5]))
    yield "below", edit(lambda t: t[6].update(below=0.06))
    yield "bonus", edit(lambda t: t[6].update(bonus=9.0))
    yield "terminate", edit(lambda t: t[6].update(terminate=False))
    yield "name", edit(lambda t: t[1].update(name="alive"))
    yield "order", edit(lambda t: t.insert(0, t.pop(1)))
    yield "dropped term", edit(lambda t: t.pop(3))
    yield "added term", edit(lambda t: t.append({"type": "failure", "observation": "observation", "above": 9.0}))
    yield "goal null -> [0.0]", edit(lambda t: t[6].update(goal=[0.0]))


def test_version_changes_with_the_code_semantics(monkeypatch):
    from bridge.rewards import config
    before = load(CONFIG).version
    monkeypatch.setattr(config, "SEMANTICS", config.SEMANTICS + 1)
    assert load(CONFIG).version != before


def test_version_changes_with_any_value():
    versions = {"base": load(CONFIG).version}
    for what, config in _variants():
        versions[what] = RewardFunction.from_dict(config).version
    assert len(set(versions.values())) == len(versions), versions


# (config terms, term index, term name, field, words in the message)
BAD = [
    ([{"type": "env_reward"}, {"type": "goal_dist", "weight": 1.0}], 1, None, "type", "unknown type 'goal_dist'"),
    ([{"weight": 1.0}], 0, None, "type", "is required"),
    ([{"type": ["env_reward"]}], 0, None, "type", "unknown type ['env_reward']"),
    ([{"type": "env_reward", "wieght": 2.0}], 0, "env_reward", "wieght", "is not a field of env_reward"),
    ([{"type": "env_reward", "weight": "high"}], 0, "env_reward", "weight", "must be a number, got 'high'"),
    ([{"type": "env_reward", "weight": "1e-2"}], 0, "env_reward", "weight", "write 1.0e-2"),
    ([{"type": "env_reward", "weight": True}], 0, "env_reward", "weight", "must be a number"),
    ([{"type": "env_reward", "weight": float("nan")}], 0, "env_reward", "weight", "must be finite"),
    ([{"type": "action_magnitude", "action": "action"}], 0, "action_magnitude", "weight", "is required"),
    ([{"type": "action_magnitude", "weight": -1.0}], 0, "action_magnitude", "action", "is required"),
    ([{"type": "action_magnitude", "action": "", "weight": -1.0}], 0, "action_magnitude", "action",
     "must name a tensor"),
    ([{"type": "env_reward"}, {"type": "alive_bonus"},
      {"type": "goal_distance", "observation": "obs", "indices": [0, 1], "goal": [0.5, 0.0, 1.0], "weight": -1.0}],
     2, "goal_distance", "goal", "field 'goal' has 3 values, indices select 2"),
    ([{"type": "goal_distance", "observation": "obs", "indices": [0, -1], "goal": [0, 0], "weight": -1.0}],
     0, "goal_distance", "indices", "non-negative integers, got -1"),
    ([{"type": "goal_distance", "observation": "obs", "indices": [0, 0], "goal": [0, 0], "weight": -1.0}],
     0, "goal_distance", "indices", "repeats an index"),
    ([{"type": "goal_distance", "observation": "obs", "indices": 3, "goal": [0], "weight": -1.0}],
     0, "goal_distance", "indices", "non-empty list"),
    ([{"type": "goal_distance", "observation": "obs", "goal": [], "weight": -1.0}],
     0, "goal_distance", "goal", "non-empty list of numbers"),
    ([{"type": "goal_distance", "observation": "obs", "goal": [0.0, "x"], "weight": -1.0}],
     0, "goal_distance", "goal", "must be a number, got 'x'"),
    ([{"type": "joint_limit_proximity", "name": "limits", "observation": "q", "low": [0, 0], "high": [1],
       "weight": -1.0}], 0, "limits", "high", "has 1 values, 'low' has 2"),
    ([{"type": "joint_limit_proximity", "observation": "q", "low": [0, 1], "high": [1, 1], "weight": -1.0}],
     0, "joint_limit_proximity", "high", "element 1: low 1.0, high 1.0"),
    ([{"type": "joint_limit_proximity", "observation": "q", "low": [0], "high": [1], "margin": 0.5,
       "weight": -1.0}], 0, "joint_limit_proximity", "margin", "leaves no free range"),
    ([{"type": "joint_limit_proximity", "observation": "q", "low": [0], "high": [1], "margin": -0.1,
       "weight": -1.0}], 0, "joint_limit_proximity", "margin", "must be >= 0"),
    ([{"type": "success", "observation": "obs", "bonus": 1.0}], 0, "success", "below", "or 'above' is required"),
    ([{"type": "success", "observation": "obs", "below": 0.1, "above": 0.2}], 0, "success", "below",
     "exactly one"),
    ([{"type": "failure", "observation": "obs", "below": 0.0}], 0, "failure", "below", "must be > 0"),
    ([{"type": "failure", "observation": "obs", "above": 1.0, "terminate": "yes"}], 0, "failure", "terminate",
     "true or false"),
    ([{"type": "success", "observation": "obs", "below": 0.1, "weight": 2.0}], 0, "success", "weight",
     "is not a field of success"),
    ([{"type": "env_reward", "name": ""}], 0, "env_reward", "name", "non-empty string"),
    ([{"type": "env_reward"}, {"type": "alive_bonus"}, {"type": "env_reward", "weight": 0.5}],
     2, "env_reward", "name", "duplicate term name 'env_reward' (term 0"),
]


@pytest.mark.parametrize(("terms", "index", "name", "field", "words"), BAD)
def test_config_errors_name_the_term_and_field(terms, index, name, field, words):
    with pytest.raises(RewardConfigError) as info:
        RewardFunction.from_dict({"reward": {"terms": terms}}, source="robot.yaml")
    err = info.value
    message = str(err)
    assert message.startswith(f"robot.yaml: reward term {index} ({name or '?'})"), message
    assert words in message and f"field '{field}'" in message, message
    assert (err.term_index, err.term_name, err.field) == (index, name, field)


@pytest.mark.parametrize(("config", "words"), [
    (None, "expected a mapping with a 'reward' section"),
    ({"rewards": {"terms": []}}, "with a 'reward' section"),
    ({"reward": [1]}, "'reward' must be a mapping"),
    ({"reward": {"terms": []}}, "non-empty list of terms"),
    ({"reward": {"terms": "env_reward"}}, "non-empty list of terms"),
    ({"reward": {"terms": [{"type": "env_reward"}], "scale": 2}}, "unknown key(s) ['scale']"),
    ({"reward": {"terms": ["env_reward"]}}, "reward term 0 (?): a term must be a mapping"),
])
def test_structural_errors_say_what_is_wrong(config, words):
    with pytest.raises(RewardConfigError) as info:
        RewardFunction.from_dict(config)
    assert words in str(info.value)


def test_file_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RewardConfigError, match="nope.yaml: reward config: cannot read the file"):
        RewardFunction.from_yaml(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("reward:\n  terms: [{type: env_reward\n")
    with pytest.raises(RewardConfigError, match="broken.yaml: reward config: not valid YAML"):
        RewardFunction.from_yaml(broken)
    twice = tmp_path / "twice.yaml"
    twice.write_text("reward:\n  terms:\n    - {type: alive_bonus, weight: 1.0, weight: 2.0}\n")
    with pytest.raises(RewardConfigError, match="twice.yaml: reward config: not valid YAML: duplicate key 'weight'"):
        RewardFunction.from_yaml(twice)
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward:\n  terms:\n    - {type: alive_bonus, weight: x}\n")
    with pytest.raises(RewardConfigError, match=r"bad.yaml: reward term 0 \(alive_bonus\): field 'weight'"):
        RewardFunction.from_yaml(bad)


OBS = (Spec("observation", np.float32, (4,)), Spec("joint_position", np.float32, (2,)),
       Spec("image", np.uint8, (2, 3, 3)))
ACT = (Spec("action", np.float32, (2,)),)


def test_check_specs_accepts_a_config_that_fits():
    load(CONFIG).check_specs(OBS, ACT)
    RewardFunction.passthrough().check_specs((), ())
    # a multi-dimensional tensor is read flat: 18 values
    fn = RewardFunction.from_dict({"reward": {"terms": [
        {"type": "goal_distance", "observation": "image", "indices": [17], "goal": [255], "weight": -1.0}]}})
    fn.check_specs(OBS, ACT)


@pytest.mark.parametrize(("term", "field", "words"), [
    ({"type": "goal_distance", "observation": "obs", "goal": [0.0], "weight": -1.0}, "observation",
     "names tensor 'obs', which is not among the session's observation tensors ['empty', 'image', "
     "'joint_position', 'observation']"),
    ({"type": "action_magnitude", "action": "observation", "weight": -1.0}, "action",
     "names tensor 'observation', which is not among the session's action tensors ['action']"),
    ({"type": "goal_distance", "observation": "observation", "indices": [1, 4], "goal": [0, 0], "weight": -1.0},
     "indices", "index 4 is out of range for tensor 'observation' of shape [4] (4 values)"),
    ({"type": "action_smoothness", "action": "action", "indices": [2], "weight": -1.0}, "indices",
     "index 2 is out of range for tensor 'action'"),
    ({"type": "goal_distance", "observation": "observation", "goal": [0, 0], "weight": -1.0}, "goal",
     "has 2 values, tensor 'observation' of shape [4] (4 values) (set 'indices'"),
    ({"type": "joint_limit_proximity", "observation": "joint_position", "low": [0, 0, 0], "high": [1, 1, 1],
      "weight": -1.0}, "low", "has 3 values, tensor 'joint_position' of shape [2]"),
    ({"type": "success", "observation": "image", "goal": [0.0] * 17, "below": 1.0}, "goal",
     "has 17 values, tensor 'image' of shape [2, 3, 3] (18 values)"),
    ({"type": "failure", "observation": "empty", "above": 1.0}, "observation", "has no values to read"),
])
def test_check_specs_names_the_term_and_field(term, field, words):
    fn = RewardFunction.from_dict({"reward": {"terms": [{"type": "env_reward"}, term]}}, source="policy.yaml")
    with pytest.raises(RewardConfigError) as info:
        fn.check_specs((*OBS, Spec("empty", np.float32, (0,))), ACT)
    message = str(info.value)
    assert message.startswith(f"policy.yaml: reward term 1 ({term['type']}): field '{field}' "), message
    assert words in message, message
    assert (info.value.term_index, info.value.field) == (1, field)

"""The topic map: the default file, the specs it declares, and errors that name the bad key."""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest

from bridge.ros2 import messages
from bridge.ros2.topic_map import (
    DEFAULT_TOPIC_MAP,
    MissingMessageError,
    TopicMapError,
    load_topic_map,
    parse_topic_map,
)
from protos.codec import Spec, check_all, encode_all

BASE = {
    "observation": [
        {"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": ["a", "b"],
         "tensors": {"q": {"field": "position"}, "qd": {"field": "velocity", "dtype": "float64"}}},
        {"topic": "/camera/image_raw", "type": "sensor_msgs/msg/Image",
         "tensors": {"rgb": {"field": "image", "shape": [2, 3, 3]}}},
        {"topic": "/imu", "type": "sensor_msgs/msg/Imu", "tensors": {"gyro": {"field": "angular_velocity"}}},
    ],
    "action": [
        {"topic": "/cmd", "type": "std_msgs/msg/Float64MultiArray", "joints": ["a", "b"],
         "tensors": {"action": {"field": "data", "bounds": {"a": [-1, 1], "b": [-2, 2]}}}},
        {"topic": "/cmd_vel", "type": "geometry_msgs/msg/Twist",
         "tensors": {"base": {"field": "twist", "bounds": [-0.5, 0.5]}}},
    ],
    "estop": {"topic": "/tether/estop", "type": "std_msgs/msg/Bool"},
}


def edit(path: str, value=None, *, delete: bool = False) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    last = int(last) if last.isdigit() else last
    if delete:
        del node[last]
    else:
        node[last] = value
    return data


def test_default_map():
    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    assert [e.topic for e in tmap.observation] == ["/joint_states"]
    assert tmap.observation[0].reliable is False and tmap.action[0].reliable is True
    assert tmap.observation_specs() == (Spec("joint_position", np.float32, (6,)),
                                        Spec("joint_velocity", np.float32, (6,)))
    (act,) = tmap.action_specs()
    assert act == Spec("action", np.float32, (6,)) and len(act.low) == len(act.high) == 6
    assert tmap.estop.topic == "/tether/estop" and tmap.estop.type == messages.BOOL and tmap.estop.reliable
    assert tmap.estop_active(messages.bool_msg(True)) and not tmap.estop_active(messages.bool_msg(False))


def test_specs_validate_the_assembled_observation():
    tmap = parse_topic_map(BASE)
    assert [(s.name, s.dtype.name, s.shape) for s in tmap.observation_specs()] == [
        ("q", "float32", (2,)), ("qd", "float64", (2,)), ("rgb", "uint8", (2, 3, 3)),
        ("gyro", "float32", (3,))]
    base = tmap.action_specs()[1]
    assert (base.shape, base.low, base.high) == ((6,), (-0.5,), (0.5,))
    latest = {"/joint_states": messages.joint_state(names=["b", "a"], position=[2, 1], velocity=[20, 10]),
              "/camera/image_raw": messages.image(np.full((2, 3, 3), 7, np.uint8)),
              "/imu": messages.imu(angular_velocity=[1, 2, 3])}
    obs = tmap.observation_arrays(latest)
    check_all(tmap.observation_specs(), encode_all(obs))  # exactly what the gateway will accept
    assert obs["q"].tolist() == [1, 2] and obs["qd"].tolist() == [10, 20] and obs["rgb"].sum() == 7 * 18
    with pytest.raises(MissingMessageError, match="/imu"):
        tmap.observation_arrays({k: v for k, v in latest.items() if k != "/imu"})
    latest["/camera/image_raw"] = messages.image(np.zeros((4, 3, 3), np.uint8))
    with pytest.raises(messages.MessageError, match=r"/camera/image_raw: image has shape \[4, 3, 3\]"):
        tmap.observation_arrays(latest)
    latest["/joint_states"] = messages.joint_state(names=["a", "b"], position=[1, 2])
    with pytest.raises(messages.MessageError, match="JointState.velocity is empty"):
        tmap.observation_arrays(latest)


def test_commands_from_an_action():
    tmap = parse_topic_map(BASE)
    sent = tmap.commands({"action": np.array([0.5, -0.5], np.float32),
                          "base": np.arange(6, dtype=np.float32)})
    assert [(e.topic, msg.__msgtype__) for e, msg in sent] == [("/cmd", messages.FLOAT64_ARRAY),
                                                               ("/cmd_vel", messages.TWIST)]
    assert sent[0][1].data.tolist() == [0.5, -0.5] and sent[1][1].angular.z == 5.0
    with pytest.raises(messages.MessageError, match="'base' missing"):
        tmap.commands({"action": np.zeros(2)})
    with pytest.raises(messages.MessageError, match=r"'action' has shape \[3\], expected \[2\]"):
        tmap.commands({"action": np.zeros(3), "base": np.zeros(6)})
    with pytest.raises(messages.MessageError, match="'gripper' is not in the topic map"):
        tmap.commands({"action": np.zeros(2), "base": np.zeros(6), "gripper": np.zeros(1)})


DELETE = object()
BOUNDS = "action[0].tensors.action.bounds"
VLIM = "action[0].tensors.action.velocity_limit"


@pytest.mark.parametrize(("path", "value", "message"), [
    ("observation", DELETE, "observation: missing"),
    ("extra", 1, "extra: unknown key"),
    ("observation", [], "observation: expected a non-empty list"),
    ("observation.0.topic", "joint states", "observation[0].topic: .*not a valid ROS 2 topic"),
    ("observation.0.type", "sensor_msgs/msg/Temperature", "observation[0].type: .*no converter"),
    ("observation.0.type", "nope/Nope", "observation[0].type: unknown ROS 2 message type"),
    ("observation.0.joints", DELETE, "observation[0].joints: .*needs the joint names"),
    ("observation.0.joints", ["a", "a"], "observation[0].joints: duplicate"),
    ("observation.0.reliable", "yes", "observation[0].reliable: 'yes' is not true or false"),
    ("observation.0.tensors.q.field", "pos", "observation[0].tensors.q.field: 'pos' is not one of"),
    ("observation.0.tensors.q.dtype", "complex64", "observation[0].tensors.q.dtype: 'complex64'"),
    ("observation.0.tensors.q.shape", [3], "observation[0].tensors.q.shape: [3] disagrees"),
    ("observation.0.tensors.q.bounds", [0, 1], "observation[0].tensors.q.bounds: unknown key"),
    ("observation.1.tensors.rgb.shape", DELETE, "observation[1].tensors.rgb.shape: missing"),
    ("observation.1.tensors.rgb.shape", [2, 3, 4], "observation[1].tensors.rgb.shape: .*height, width"),
    ("observation.2.topic", "/joint_states", "topic: /joint_states is listed more than once"),
    ("observation.2.tensors", {"q": {"field": "orientation"}}, "observation: tensor name 'q' is used more"),
    ("action.0.tensors.action.bounds.b", [2, -2], f"{BOUNDS}.b: low 2.0 is not below high -2.0"),
    ("action.0.tensors.action.bounds.c", [0, 1], f"{BOUNDS}.c: not one of the joints"),
    ("action.0.tensors.action.bounds.a", DELETE, f"{BOUNDS}.a: missing"),
    ("action.0.tensors.action.bounds.a", [0, "1"], f"{BOUNDS}.a: expected [low, high]"),
    ("action.0.tensors.action.bounds.a", [0, float("inf")], f"{BOUNDS}.a: .*must be finite"),
    ("action.1.tensors.base.bounds", {"x": [0, 1]}, "action[1].tensors.base.bounds: per-joint bounds need"),
    ("action.0.tensors.second", {"field": "data"}, "action[0].tensors: field 'data' is set by more"),
    ("action.0.tensors.action.velocity_limit", -1, f"{VLIM}: expected a velocity limit > 0 (units/s), got -1"),
    ("action.0.tensors.action.velocity_limit", {"a": 1.0}, f"{VLIM}.b: missing"),
    ("action.0.tensors.action.velocity_limit", {"a": 1, "b": 1, "z": 1}, f"{VLIM}.z: not one of the joints"),
    ("action.1.tensors.base.velocity_limit", {"x": 1}, "action[1].tensors.base.velocity_limit: per-joint limits"),
    ("estop.type", "std_msgs/msg/Float64MultiArray", "estop.type: .*must be std_msgs/msg/Bool"),
    ("estop.tensors", {}, "estop.tensors: unknown key"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_errors_name_the_bad_key(path, value, message):
    data = edit(path, delete=True) if value is DELETE else edit(path, value)
    pattern = ".*".join(re.escape(part) for part in message.split(".*"))  # literal text, ".*" gaps
    with pytest.raises(TopicMapError, match=f"^map.yaml: {pattern}"):
        parse_topic_map(data, source="map.yaml")


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("observation: [unclosed\n")
    with pytest.raises(TopicMapError, match="bad.yaml: not valid YAML"):
        load_topic_map(bad)
    with pytest.raises(TopicMapError, match="cannot read"):
        load_topic_map(tmp_path / "missing.yaml")
    bad.write_text("- just\n- a list\n")
    with pytest.raises(TopicMapError, match="expected a mapping"):
        load_topic_map(bad)


def test_velocity_limits_and_the_measured_command():
    """Per-joint velocity limits in spec order (a default where none is set); the command that holds
    the robot where it is, from the latest JointState, in the action's joint order."""
    data = edit("action.0.tensors.action.velocity_limit", {"a": 0.5, "b": 2})
    del data["action"][1]                                       # a Twist has no joints to measure
    tmap = parse_topic_map(data)
    assert tmap.velocity_limits(9.0) == (0.5, 2.0)
    assert parse_topic_map(BASE).velocity_limits(9.0) == (9.0,) * 8
    js = messages.joint_state(names=["b", "a"], position=[2.0, 1.0], velocity=[0, 0])
    assert tmap.measured_command({}) is None
    assert tmap.measured_command({"/joint_states": js}).tolist() == [1.0, 2.0]
    short = dataclasses.replace(js, position=np.array([2.0]))          # as a peer may send it
    assert tmap.measured_command({"/joint_states": short}) is None      # a malformed state is no pose
    assert parse_topic_map(BASE).measured_command({"/joint_states": js}) is None   # the Twist part


def test_the_intervention_topic_takes_the_action_layout_and_bad_blocks_are_named():
    one = {**BASE, "action": BASE["action"][:1], "intervention": {"topic": "/teleop", "hold_s": 0.04}}
    tmap = parse_topic_map(one)
    entry = tmap.intervention.entry
    assert (entry.topic, entry.type, entry.joints, tmap.intervention.hold_s) == (
        "/teleop", "std_msgs/msg/Float64MultiArray", ("a", "b"), 0.04)
    assert tmap.intervention_vector(messages.float64_array([0.5, -3.0])).tolist() == [0.5, -3.0]  # the guard clamps
    with pytest.raises(messages.MessageError, match=r"/teleop: .*data has shape \[3\], tensor 'action' expects \[2\]"):
        tmap.intervention_vector(messages.float64_array([0.0, 0.0, 0.0]))
    assert parse_topic_map({**one, "intervention": {"topic": "/teleop"}}).intervention.hold_s is None  # node's default
    for block, message in [
            ({"topic": "/teleop", "hold_s": 0}, r"intervention.hold_s: expected seconds > 0"),
            ({"topic": "/teleop", "hold_s": True}, r"intervention.hold_s"),
            ({"topic": "/teleop", "type": "geometry_msgs/msg/Twist"}, r"intervention.type: .*carries the action's"),
            ({"topic": "/teleop", "type": "no/Such"}, r"intervention.type: unknown ROS 2 message type"),
            ({"topic": "/cmd"}, r"topic: /cmd is listed more than once"),
            ({"topic": "/teleop", "rate": 3}, r"intervention.rate: unknown key"),
            ({"hold_s": 0.1}, r"intervention.topic: missing")]:
        with pytest.raises(TopicMapError, match=message):
            parse_topic_map({**one, "intervention": block})
    with pytest.raises(TopicMapError, match=r"intervention: .*exactly one action topic"):
        parse_topic_map({**BASE, "intervention": {"topic": "/teleop"}})

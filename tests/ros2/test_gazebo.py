"""Gazebo through ros_gz_bridge: the Gazebo arm's topic map (per-joint std_msgs/Float64 position
commands), the bridge's topic list beside it, and the edge node driven end to end by a process that
publishes exactly what ros_gz_bridge would (gz_bridge_robot.py: names, types, QoS) ⇄ `tether edge`
⇄ a real gateway ⇄ a real tritonserver, on the test's own DDS domain, loopback only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bridge.ros2 import messages
from bridge.ros2.topic_map import GAZEBO_TOPIC_MAP, TopicMapError, load_topic_map, parse_topic_map
from tests.ros2.edge_support import Robot, echo_gateway, wait_until
from tests.ros2.rclpy_support import EdgeProcess
from tests.ros2.ros_env import ROOT, ROS_PYTHON, LaunchOutput, ctrl_c, kill_launch, needs_launch, needs_rclpy, ros_env

TMAP = load_topic_map(GAZEBO_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints
GZ_BRIDGE = GAZEBO_TOPIC_MAP.with_name("gz_bridge.yaml")
BRIDGE = yaml.safe_load(GZ_BRIDGE.read_text())
GZ_ROBOT = ROOT / "tests" / "ros2" / "gz_bridge_robot.py"
# ros_gz_bridge's pairs for the types the arm uses (its README's table)
GZ_TYPES = {messages.JOINT_STATE: "gz.msgs.Model", messages.FLOAT64: "gz.msgs.Double",
            "rosgraph_msgs/msg/Clock": "gz.msgs.Clock"}


def _map(action: dict) -> dict:
    return {"observation": [{"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": ["a", "b"],
                             "tensors": {"q": {"field": "position"}}}],
            "action": [{"type": "std_msgs/msg/Float64", "tensors": {"u": {"field": "data"}}, **action}]}


def test_per_joint_commands_are_one_float64_per_joint_in_joint_order():
    topics = [e.topic for e in TMAP.command_entries()]
    assert topics == [f"/model/arm/joint/{j}/cmd_pos" for j in JOINTS]
    assert all(e.type == messages.FLOAT64 and e.reliable for e in TMAP.command_entries())
    (spec,) = TMAP.action_specs()
    assert spec.shape == (6,) and TMAP.velocity_limits(0.5) == (1.0, 1.0, 1.5, 2.0, 2.0, 2.0)
    out = TMAP.commands({"action": np.arange(6.0) / 4})
    assert [(e.topic, e.joints, m.__msgtype__, m.data) for e, m in out] == [
        (t, (j,), messages.FLOAT64, k / 4) for k, (t, j) in enumerate(zip(topics, JOINTS, strict=True))]
    raw = messages.serialize(out[5][1])
    assert messages.deserialize(raw, messages.FLOAT64).data == 1.25
    js = messages.joint_state(names=JOINTS[::-1], position=np.arange(6.0), velocity=np.zeros(6))
    assert TMAP.measured_command({"/joint_states": js}).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


@pytest.mark.parametrize("action, problem", [
    ({"topic": "/cmd/{joint}"}, "action[0].joints: the per-joint topic '/cmd/{joint}' needs the joint names"),
    ({"topic": "/cmd/{joint}/0", "joints": ["a"]},
     "action[0].topic: joint 'a': topic '/cmd/a/0' is not a valid ROS 2 topic name"),
    ({"topic": "/cmd", "joints": ["a", "b"]}, "action[0].topic: '/cmd': std_msgs/msg/Float64 commands for joints "
                                              "need a per-joint topic with {joint} in it"),
    ({"topic": "/cmd/{joint}", "joints": ["a"], "type": "std_msgs/msg/Float64MultiArray"},
     "action[0].type: 'std_msgs/msg/Float64MultiArray': a per-joint topic ('/cmd/{joint}') carries "
     "std_msgs/msg/Float64"),
    ({"topic": "/joint_{joint}", "joints": ["states"]}, "topic: /joint_states is listed more than once"),
])
def test_bad_per_joint_entries_name_the_key_and_value(action, problem):
    with pytest.raises(TopicMapError) as exc:
        parse_topic_map(_map(action))
    assert problem in str(exc.value)


def test_a_float64_without_joints_is_one_scalar_command():
    tmap = parse_topic_map(_map({"topic": "/gripper/cmd_pos", "tensors": {"u": {"field": "data",
                                                                                  "bounds": [0, 1]}}}))
    assert tmap.action_specs()[0].shape == ()
    ((entry, msg),) = tmap.commands({"u": np.array(0.5)})
    assert entry.topic == "/gripper/cmd_pos" and msg.data == 0.5
    with pytest.raises(messages.MessageError, match="not finite"):
        messages.float64_msg(float("nan"))


def test_the_bridge_config_bridges_every_topic_of_the_map_in_the_right_direction():
    by_ros = {b["ros_topic_name"]: b for b in BRIDGE}
    assert set(by_ros) == {"/clock", "/joint_states", *(e.topic for e in TMAP.command_entries())}
    for b in BRIDGE:
        assert set(b) == {"ros_topic_name", "gz_topic_name", "ros_type_name", "gz_type_name", "direction"}, b
        assert GZ_TYPES[b["ros_type_name"]] == b["gz_type_name"], b
    assert by_ros["/joint_states"]["gz_topic_name"] == "/world/default/model/arm/joint_state"
    assert by_ros["/joint_states"]["ros_type_name"] == TMAP.observation[0].type
    assert by_ros["/joint_states"]["direction"] == by_ros["/clock"]["direction"] == "GZ_TO_ROS"
    for entry in TMAP.command_entries():
        b = by_ros[entry.topic]
        # Gazebo's JointPositionController listens on /model/<model>/joint/<joint>/<joint_index>/cmd_pos
        assert (b["gz_topic_name"], b["ros_type_name"], b["direction"]) == (
            f"/model/arm/joint/{entry.joints[0]}/0/cmd_pos", entry.type, "ROS_TO_GZ")
    assert TMAP.observation[0].reliable, "ros_gz_bridge publishes reliable (rclcpp's default QoS)"


# -- end to end ----------------------------------------------------------------------------------

# Gazebo lists the joints in its model's order, not the topic map's
GZ_ORDER = (JOINTS[2], JOINTS[0], JOINTS[5], JOINTS[1], JOINTS[4], JOINTS[3])
START = dict(zip(JOINTS, (0.125, -0.5, 1.0, -1.25, 1.5, -2.0), strict=True))     # exact in float32
STEP = 0.25                                    # then every joint's velocity (the echo's target) moves by this


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with echo_gateway(tmp_path_factory.mktemp("gazebo")) as gw:
        yield gw.address


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


@needs_rclpy
@pytest.mark.parametrize("transport", ["rclpy", "dds"])
def test_edge_drives_a_gazebo_arm_through_ros_gz_bridge_topics(transport, ros_domain, gateway, tmp_path):
    """With the edge on rclpy (Fast DDS, as ros_gz_bridge) or on Cyclone DDS, the echo policy commands
    each joint its own JointState velocity: first where the arm is (no motion), then STEP further,
    rate-limited by the guard; every joint's command arrives on its own Float64 topic with the value
    of that joint, whatever order Gazebo names the joints in."""
    start = [START[j] for j in GZ_ORDER]
    robot = Robot(ros_domain, JOINTS, env=ros_env(ros_domain), argv=[
        str(ROS_PYTHON), str(GZ_ROBOT), "--joints", ",".join(GZ_ORDER), "--hz", "100", "--seconds", "60",
        "--position", _csv(start), "--velocity", _csv(start)])
    target = {j: START[j] + STEP for j in JOINTS}
    try:
        robot.wait_ready(timeout=30)
        with EdgeProcess(ros_domain, gateway, tmp_path, "--policy", "echo6", "--rate", "100",
                         "--topic-map", str(GAZEBO_TOPIC_MAP), transport=transport,
                         python=ROS_PYTHON if transport == "rclpy" else Path(sys.executable)) as edge:
            robot.send("qos")
            qos = wait_until(lambda: next((r["qos"] for r in robot.commands if "qos" in r), None), timeout=30,
                             what="the robot's view of the edge's endpoints")

            def got(joint: str, value: float) -> bool:
                return any(c.get("joint") == joint and c["data"] == value for c in list(robot.commands))

            wait_until(lambda: all(got(j, START[j]) for j in JOINTS), timeout=30, what="a hold command per joint")
            robot.send("velocity " + _csv(target[j] for j in GZ_ORDER))
            wait_until(lambda: all(got(j, target[j]) for j in JOINTS), timeout=30, what="every joint at its target")
            edge.stop()
    finally:
        robot.close()
    assert ("RclpyTransport" if transport == "rclpy" else "DdsTransport") in edge.text
    assert qos is not None, "the edge's publishers/subscription were never matched"
    assert all(q == [["RELIABLE", "VOLATILE"]] for q in qos.values()), qos   # what ros_gz_bridge uses
    sent = np.array([c["sent"] for c in edge.report["commands"]])
    t = np.array([c["t"] for c in edge.report["commands"]])
    limit = np.array(TMAP.velocity_limits(0.5))
    assert (np.abs(np.diff(sent, axis=0)) <= limit * np.diff(t)[:, None] + 1e-9).all(), "faster than the guard allows"
    policy = [c for c in edge.report["commands"] if not c.get("safe")]
    assert policy and all(c["policy_version"] == 1 for c in policy)
    for k, joint in enumerate(JOINTS):
        values = [c["data"] for c in robot.commands if c.get("joint") == joint]
        # what reached the joint's topic is what the guard sent for that joint, in order, none lost
        # (reliable, keep-last 10 on loopback), and it moves from the pose to the target, never back
        it = iter(sent[:, k].tolist())
        assert all(any(v == s for s in it) for v in values), f"{joint}: a value the guard never sent"
        assert len(values) == len(sent), (joint, len(values), len(sent))
        assert values[0] == START[joint] and target[joint] in values
        assert np.all(np.diff(values) >= 0) and max(values) == target[joint], (joint, values)


@needs_launch
def test_ros2_launch_sim_starts_the_bridge_from_its_config_and_the_edge(ros_domain, gateway, tmp_path):
    """`ros2 launch tether sim.launch.py` as a Gazebo user types it, with gz_bridge_robot.py standing
    in for ros_gz_bridge's parameter_bridge (an ament package in a prefix of its own): launch_ros
    hands it the bridge config as the real one gets it (`config_file` parameter), and it bridges the
    topics listed there; each joint's hold command arrives on its own topic; Ctrl-C to launch alone
    (launch passes it on) stops all, while launch relays the bridge's line per command."""
    prefix = tmp_path / "ros_gz_bridge_prefix"
    (prefix / "share/ament_index/resource_index/packages").mkdir(parents=True)
    (prefix / "share/ament_index/resource_index/packages/ros_gz_bridge").touch()
    exe = prefix / "lib/ros_gz_bridge/parameter_bridge"
    exe.parent.mkdir(parents=True)
    start = [START[j] for j in GZ_ORDER]
    exe.write_text(f'#!/bin/sh\nexec "{ROS_PYTHON}" "{GZ_ROBOT}" --joints {",".join(GZ_ORDER)} --hz 100 '
                   f'--seconds 60 --position={_csv(start)} --velocity={_csv(start)} "$@"\n')
    exe.chmod(0o755)
    env = ros_env(ros_domain)
    env["AMENT_PREFIX_PATH"] = f"{prefix}:{env['AMENT_PREFIX_PATH']}"
    launch = subprocess.Popen(
        ["ros2", "launch", "tether", "sim.launch.py", f"gateway:={gateway}", f"domain_id:={ros_domain}",
         "transport:=rclpy", "policy:=echo6", f"topic_map:={GAZEBO_TOPIC_MAP}", f"gz_bridge_config:={GZ_BRIDGE}",
         f"latch_file:={tmp_path / 'latch.json'}"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    output = LaunchOutput(launch)

    def records() -> list[dict]:
        return [json.loads(m[1]) for line in list(output.lines)
                if (m := re.match(r"\[parameter_bridge-\d+\] (\{.*)", line))]

    try:
        wait_until(lambda: all(any(r.get("joint") == j and r["data"] == START[j] for r in records()) for j in JOINTS)
                   or launch.poll() is not None, timeout=60, what="a hold command per joint through ros2 launch")
        assert launch.poll() is None, output.text
        print(f"\nros2 launch exited {ctrl_c(launch, output, group=False):.2f} s after Ctrl-C")
    finally:
        kill_launch(launch)
    out = output.text
    assert launch.returncode == 0, out
    assert "edge node tether_edge: RclpyTransport" in out and "stopped" in out, out
    assert "E-STOPPED" not in next(line for line in out.splitlines() if "edge node tether_edge" in line), out
    assert "[edge-2]: process has finished cleanly" in out and "[parameter_bridge-1]: process has finished" in out, out
    qos = next(r["qos"] for r in records() if "qos" in r)
    assert qos is not None and all(q == [["RELIABLE", "VOLATILE"]] for q in qos.values()), qos
    for joint in JOINTS:          # held where the arm is: its own value on its own topic, nothing else
        assert {r["data"] for r in records() if r.get("joint") == joint} == {START[joint]}, joint

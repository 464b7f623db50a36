"""What ros_gz_bridge puts on ROS 2 for a Gazebo arm (launch/config/gz_bridge.yaml), as its own rclpy
process from the ROS environment (.venv/ros): the independent peer the edge node meets in Gazebo.

Like ros_gz_bridge (an rclcpp node; its queues default to 10, QoS rclcpp's default: reliable,
keep-last 10, volatile) it
- publishes rosgraph_msgs/Clock on /clock (simulated time, starting at 0, one tick per state) and
  sensor_msgs/JointState on /joint_states, converted from gz.msgs.Model: header stamp = sim time,
  names in the model's (SDF) order given by --joints, position, velocity and effort per joint
  (positions start at --position and then follow the commands, as a stiff position controller);
- subscribes std_msgs/Float64 on /model/<model>/joint/<joint>/cmd_pos for every joint (what it
  forwards as gz.msgs.Double to Gazebo's JointPositionController) and prints each command as one
  JSON line {"t": time.monotonic() at arrival, "joint": name, "data": value}.

Standing in for `parameter_bridge` under `ros2 launch` (ROS arguments after `--ros-args`, as
launch_ros passes them), it reads its node name and its `config_file` parameter the way the real
bridge does, and bridges the topics that file lists instead (each ROS_TO_GZ Float64 command names its
joint in the Gazebo topic, /model/<model>/joint/<joint>/<index>/cmd_pos); it then prints the QoS
record (below) by itself once the edge is matched, and runs until SIGINT or --seconds.

Otherwise lines on stdin steer it; events come back as {"event": ...} lines:
  velocity V1,V2,...     joint velocities (in --joints order) from now on
  qos                    once the edge's endpoints are matched: print {"qos": {topic: [[reliability,
                         durability]] of the edge's publishers or subscriptions}} (remote endpoints)
It stops when stdin closes or after --seconds.

    .venv/ros/bin/python tests/ros2/gz_bridge_robot.py --joints a,b --position 0.5,1 --velocity 0.5,1
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import threading
import time
from pathlib import Path

GZ_COMMAND = re.compile(r"/model/[^/]+/joint/(?P<joint>[^/]+)/\d+/cmd_pos")


def bridged_topics(config_file: str) -> tuple[str, str, dict[str, str]]:
    """(clock topic, joint state topic, {joint: command topic}) on the ROS side of a bridge config."""
    import yaml

    clock = states = ""
    commands: dict[str, str] = {}
    for b in yaml.safe_load(Path(config_file).read_text()):
        if b["ros_type_name"] == "rosgraph_msgs/msg/Clock":
            clock = b["ros_topic_name"]
        elif b["ros_type_name"] == "sensor_msgs/msg/JointState" and b["direction"] == "GZ_TO_ROS":
            states = b["ros_topic_name"]
        elif b["ros_type_name"] == "std_msgs/msg/Float64" and b["direction"] == "ROS_TO_GZ":
            commands[GZ_COMMAND.fullmatch(b["gz_topic_name"])["joint"]] = b["ros_topic_name"]
    return clock, states, commands


def main(argv: list[str] | None = None) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64

    argv = sys.argv[1:] if argv is None else argv
    ros_args = argv[argv.index("--ros-args"):] if "--ros-args" in argv else []
    parser = argparse.ArgumentParser()
    parser.add_argument("--joints", required=True, help="joint names in the model's order")
    parser.add_argument("--model", default="arm")
    parser.add_argument("--position", required=True, help="joint positions, --joints order")
    parser.add_argument("--velocity", required=True, help="joint velocities, --joints order")
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv[: len(argv) - len(ros_args)])
    joints = args.joints.split(",")
    position = [float(v) for v in args.position.split(",")]
    velocity = [[float(v) for v in args.velocity.split(",")]]
    if not len(position) == len(velocity[0]) == len(joints):
        parser.error("--position and --velocity need one value per joint")
    out = threading.Lock()

    def emit(record: dict) -> None:
        with out:
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()

    rclpy.init(args=["parameter_bridge", *ros_args], signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("ros_gz_bridge", automatically_declare_parameters_from_overrides=True)
    if ros_args:
        clock_topic, state_topic, command_topics = bridged_topics(node.get_parameter("config_file").value)
        if sorted(command_topics) != sorted(joints):
            parser.error(f"the bridge config commands {sorted(command_topics)}, not --joints {joints}")
    else:
        clock_topic, state_topic = "/clock", "/joint_states"
        command_topics = {j: f"/model/{args.model}/joint/{j}/cmd_pos" for j in joints}
    qos = QoSProfile(depth=10)                     # rclcpp::QoS(KeepLast(10)): reliable, volatile
    clock = node.create_publisher(Clock, clock_topic, qos)
    states = node.create_publisher(JointState, state_topic, qos)

    def on_command(k: int, msg: Float64) -> None:
        position[k] = msg.data            # a stiff JointPositionController: the joint goes there
        emit({"t": time.monotonic(), "joint": joints[k], "data": msg.data})

    for joint, topic in command_topics.items():
        node.create_subscription(Float64, topic, functools.partial(on_command, joints.index(joint)), qos)

    def remote(infos) -> list[list[str]]:
        return [[i.qos_profile.reliability.name, i.qos_profile.durability.name] for i in infos
                if i.node_name != node.get_name()]

    def edge_qos() -> dict[str, list[list[str]]] | None:
        found = {t: remote(node.get_publishers_info_by_topic(t)) for t in command_topics.values()}
        found[state_topic] = remote(node.get_subscriptions_info_by_topic(state_topic))
        return found if all(found.values()) else None

    def report_qos() -> None:
        deadline = time.monotonic() + 30
        while (found := edge_qos()) is None and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.02)
        emit({"qos": found})

    stop = threading.Event()

    def control() -> None:
        for line in sys.stdin:
            word, _, rest = line.strip().partition(" ")
            if word == "velocity":
                values = [float(v) for v in rest.split(",")]
                if len(values) == len(joints):
                    velocity[0] = values
            elif word == "qos":
                report_qos()
        stop.set()

    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spin = threading.Thread(target=lambda: _spin(executor, stop), daemon=True)
    spin.start()
    threading.Thread(target=report_qos if ros_args else control, daemon=True).start()
    try:
        emit({"event": "ready"})
        period, start = 1.0 / args.hz, time.monotonic()
        for i in range(int(args.seconds * args.hz)):
            sim = i * period
            msg = JointState()
            msg.header.stamp.sec, msg.header.stamp.nanosec = int(sim), round((sim % 1) * 1e9) % 1_000_000_000
            msg.header.frame_id = args.model
            msg.name = joints
            msg.position, msg.velocity, msg.effort = list(position), velocity[0], [0.0] * len(joints)
            clock.publish(Clock(clock=msg.header.stamp))
            states.publish(msg)
            if stop.wait(max(0.0, start + (i + 1) * period - time.monotonic())):
                break
    except KeyboardInterrupt:         # SIGINT: how ros2 launch stops its nodes
        pass
    finally:
        stop.set()
        spin.join(timeout=5)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


def _spin(executor, stop: threading.Event) -> None:
    while not stop.is_set():
        executor.spin_once(timeout_sec=0.05)


if __name__ == "__main__":
    sys.exit(main())

"""A robot node on rclpy (ROS 2 Jazzy, Fast DDS), for the edge tests: its own process, run from the
ROS environment (.venv/ros, see tests/ros2/ros_env.py). It uses rclpy's own message classes and
nothing of Tether's, so it is the independent ROS 2 peer a real robot would be.

It publishes sensor_msgs/JointState on /joint_states (best effort) at --hz, and prints every
std_msgs/Float64MultiArray it receives on /policy_controller/commands (reliable) as one JSON line,
{"t": time.monotonic() at arrival, "data": [...], "lat_ms": ...}, like tests/ros2/edge_robot.py.
The JointState velocities name the state: velocity = (i % 4000) / 2000 for the i-th message,
so an echo-velocity policy's command names the state it answers (`lat_ms`: publication of that
state -> arrival of the command). Positions are --position (or `pose V`).

--lockstep: state i+1 is published only once the command answering state i arrived (and not
before its period): the robot waits for the edge, as a real controller in lockstep does.

Lines on stdin steer it; events come back as {"event": ...} lines:
  const V | count        velocities V from now on | back to numbering
  pose V                 positions V from now on
  wrong N                the next N JointStates have a position array one short of their names
  garbage                one undecodable sample on /joint_states, /tether/estop, /tether/estop_release
  estop                  True on /tether/estop
  release TEXT           TEXT ("name: why") on /tether/estop_release
  first                  reply {"event": "first"} once a command arrived
  matched                reply {"event": "matched"} once the edge's command publisher and its
                         subscriptions to /joint_states, /tether/estop, /tether/estop_release are matched
It prints {"event": "estop_state", "data": bool} for each /tether/estop_state message, and stops
when stdin closes or after --seconds.

    .venv/ros/bin/python tests/ros2/rclpy_robot.py --joints a,b,c --hz 100 [--lockstep]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

MODULO, SCALE = 4000, 2000.0
# An encapsulation header no CDR reader knows; 8 bytes, which Fast DDS still writes for fixed-size
# types (a longer payload is refused for std_msgs/Bool on the publisher's side)
GARBAGE = b"\x07\x07\x00\x00\x01\x00\x00\x00"


def main(argv: list[str] | None = None) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Bool, Float64MultiArray, String

    parser = argparse.ArgumentParser()
    parser.add_argument("--joints", required=True)
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--position", type=float, default=0.0)
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--out", help="keep command records (and when each state went out) and write them to "
                        "this JSON file at exit (stdout then carries only events)")
    args = parser.parse_args(argv)
    joints = args.joints.split(",")
    out = threading.Lock()
    kept: list[dict] = []
    stamps: list[float] = []       # with --out: when each JointState went out (monotonic)

    def emit(record: dict) -> None:
        if args.out and "event" not in record:
            kept.append(record)
            return
        with out:
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()

    rclpy.init(signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("tether_test_robot")
    best_effort = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    states = node.create_publisher(JointState, "/joint_states", best_effort)
    estop = node.create_publisher(Bool, "/tether/estop", QoSProfile(depth=10))
    release = node.create_publisher(String, "/tether/estop_release", QoSProfile(depth=10))
    stop = threading.Event()
    answered = threading.Event()
    got_command = threading.Event()
    lock = threading.Lock()
    velocity: list[float | None] = [None]
    position = [args.position]
    wrong = [0]
    published: dict[int, float] = {}
    waiting_for: list[int | None] = [None]

    def on_command(msg: Float64MultiArray) -> None:
        now = time.monotonic()
        got_command.set()
        data = [float(x) for x in msg.data]
        with lock:
            code = round(data[0] * SCALE) if data and velocity[0] is None else None
            sent = published.get(code) if code is not None else None
            if code is not None and code == waiting_for[0]:
                waiting_for[0] = None
                answered.set()
        emit({"t": now, "data": data, "lat_ms": None if sent is None else (now - sent) * 1e3})

    node.create_subscription(Float64MultiArray, "/policy_controller/commands", on_command, reliable)
    node.create_subscription(Bool, "/tether/estop_state", lambda m: emit({"event": "estop_state", "data": m.data}),
                             QoSProfile(depth=10))

    def joint_state(i: int, n: int | None = None) -> JointState:
        msg = JointState()
        msg.header.stamp.sec, msg.header.stamp.nanosec = i // 1000, (i % 1000) * 1_000_000
        msg.name = joints
        with lock:
            v = velocity[0] if velocity[0] is not None else (i % MODULO) / SCALE
        msg.position = [position[0]] * (len(joints) if n is None else n)
        msg.velocity = [v] * len(joints)
        return msg

    def matched() -> bool:
        return (states.get_subscription_count() > 0 and estop.get_subscription_count() > 0
                and release.get_subscription_count() > 0
                and node.count_publishers("/policy_controller/commands") > 0)

    def control() -> None:
        for line in sys.stdin:
            word, _, rest = line.strip().partition(" ")
            if word == "const":
                with lock:
                    velocity[0] = float(rest)
                answered.set()
            elif word == "count":
                with lock:
                    velocity[0] = None
            elif word == "pose":
                position[0] = float(rest)
            elif word == "wrong":
                wrong[0] = int(rest)
            elif word == "garbage":
                for pub in (states, estop, release):
                    pub.publish(GARBAGE)        # rclpy publishes bytes as they are (serialized)
            elif word == "estop":
                estop.publish(Bool(data=True))
            elif word == "release":
                release.publish(String(data=rest))
            elif word == "first":
                emit({"event": "first" if got_command.wait(60) else "no command"})
            elif word == "matched":
                deadline = time.monotonic() + 20
                while not matched() and time.monotonic() < deadline:
                    time.sleep(0.01)
                emit({"event": "matched" if matched() else "not matched"})
        stop.set()
        answered.set()

    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spin = threading.Thread(target=lambda: _spin(executor, stop), daemon=True)
    spin.start()
    threading.Thread(target=control, daemon=True).start()
    try:
        emit({"event": "ready"})
        period, start = 1.0 / args.hz, time.monotonic()
        for i in range(int(args.seconds * args.hz)):
            with lock:
                if velocity[0] is None:
                    published[i % MODULO] = time.monotonic()
                    waiting_for[0] = i % MODULO
                answered.clear()
            states.publish(joint_state(i, n=len(joints) - 1 if wrong[0] > 0 else None))
            if args.out:
                stamps.append(time.monotonic())
            wrong[0] = max(wrong[0] - 1, 0)
            if args.lockstep:        # the next state only after this one's command (bounded)
                answered.wait(timeout=1.0)
            if stop.wait(max(0.0, start + (i + 1) * period - time.monotonic())):
                break
            if args.lockstep:
                start = max(start, time.monotonic() - (i + 1) * period)   # a late answer shifts the grid
    finally:
        stop.set()
        spin.join(timeout=5)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        if args.out:
            Path(args.out).write_text(json.dumps({"commands": kept, "published": stamps}))
    return 0


def _spin(executor, stop: threading.Event) -> None:
    while not stop.is_set():
        executor.spin_once(timeout_sec=0.05)


if __name__ == "__main__":
    sys.exit(main())

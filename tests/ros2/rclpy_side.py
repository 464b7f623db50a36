"""Tether's rclpy transport, exercised from the ROS environment (.venv/ros) by test_rclpy_transport.py.

    .venv/ros/bin/python tests/ros2/rclpy_side.py selftest
    .venv/ros/bin/python tests/ros2/rclpy_side.py relay --joints a,b,c

`selftest`: `open_transport("auto")` is an RclpyTransport; 20 JointStates published and taken in
order on one transport; wrong types are refused, naming the topic; prints one JSON line and exits 0.

`failsafe`: an `EdgeNode` on a `RclpyTransport` (no gateway reachable), e-stopped and holding a
zero safe action, whose e-stop state publisher rclpy then destroys: the next publish on it raises
rclpy's own error. Prints {"failure": ..., "estopped": ..., "reason": ..., "commands": [...]} with the
commands a subscription on the same transport received, once the node's loop has ended.

`teleop`: a person's command stream from rclpy: Float64MultiArray [1 + 0.001 i, 7.0 x (n-1)] on
/teleop/commands at 100 Hz for --seconds once an edge node subscribes; prints {"event": "ready"} when
matched, then {"event": "done", "sent": [monotonic time of message i, ...]}.

`relay`: a `RclpyTransport` that answers every JointState on /joint_states with a
Float64MultiArray on /policy_controller/commands holding its positions (in --joints order),
and prints each state it got as {"stamp": s, "position": [...]}. It prints {"event": "ready"} once
its command publisher is matched, and stops when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from bridge.ros2 import messages
from bridge.ros2.rclpy_transport import RclpyTransport
from bridge.ros2.transport import TransportError, wait_for_subscribers
from bridge.ros2.transports import open_transport


def selftest(domain: int) -> dict:
    transport = open_transport("auto", domain_id=domain, node_name="tether_selftest")
    auto = type(transport).__name__
    got: list = []
    with transport:
        transport.subscribe("/joint_states", messages.JOINT_STATE, got.append, reliable=True, depth=50)
        pub = transport.publisher("/joint_states", messages.JOINT_STATE, depth=50)
        assert wait_for_subscribers(pub, timeout=10), "own subscription never matched"
        for i in range(20):
            pub(messages.joint_state(names=["a", "b"], position=[i, -i], stamp=i))
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        flag = transport.publisher("/flag", messages.BOOL)
        refused = []
        for call in (lambda: flag(messages.twist(np.zeros(6))),
                     lambda: transport.subscribe("/flag", messages.TWIST, print)):
            try:
                call()
            except TransportError as exc:
                refused.append(str(exc))
    return {"auto": auto, "stamps": [messages.stamp_of(m) for m in got],
            "reordered": messages.joint_state_arrays(got[3], ["b", "a"])["position"].tolist() if len(got) > 3 else None,
            "refused": refused}


def relay(domain: int, joints: list[str]) -> None:
    stop = threading.Event()
    with RclpyTransport(domain_id=domain, node_name="tether_relay") as transport:
        command = transport.publisher("/policy_controller/commands", messages.FLOAT64_ARRAY, depth=100)

        def on_state(msg: object) -> None:
            position = messages.joint_state_arrays(msg, joints)["position"]
            command(messages.float64_array(position))
            sys.stdout.write(json.dumps({"stamp": messages.stamp_of(msg), "position": position.tolist()}) + "\n")
            sys.stdout.flush()

        transport.subscribe("/joint_states", messages.JOINT_STATE, on_state, reliable=False, depth=100)
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        matched = wait_for_subscribers(command, timeout=20)
        print(json.dumps({"event": "ready" if matched else "no subscriber"}), flush=True)
        stop.wait(60)


def failsafe(domain: int) -> dict:
    import math
    import socket

    from bridge.ros2.edge_config import EdgeConfig, guard_config
    from bridge.ros2.node import EdgeNode
    from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map

    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    commands: list = []
    with RclpyTransport(domain_id=domain, node_name="tether_failsafe") as transport:
        transport.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY,
                            lambda m: commands.append(m.data.tolist()), reliable=True)
        node = EdgeNode(config=EdgeConfig(gateway=dead, node_name="tether_failsafe"), topic_map=tmap,
                        transport=transport, guard=guard_config(tmap, deadline_s=0.05, safe_action="zero",
                                                                velocity_limit=math.inf))
        node.start()
        transport.publisher("/tether/estop", messages.BOOL)(messages.bool_msg(True))
        deadline = time.monotonic() + 20
        while not commands and time.monotonic() < deadline:          # e-stopped: zeros every period
            time.sleep(0.01)
        held = len(commands)
        transport._node.destroy_publisher(node._state_publisher._publisher)   # rclpy's own failure from now on
        while node.running and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        failure = repr(node._failure)
        reason = node.guard.estop_reason
        return {"failure": failure, "running": node.running, "estopped": node.guard.estopped, "reason": reason,
                "held": held, "commands": commands}


def teleop(domain: int, joints: int, seconds: float) -> None:
    with RclpyTransport(domain_id=domain, node_name="tether_teleop") as transport:
        publish = transport.publisher("/teleop/commands", messages.FLOAT64_ARRAY)
        if not wait_for_subscribers(publish, timeout=20):
            raise SystemExit("no edge node subscribed to /teleop/commands within 20 s")
        print(json.dumps({"event": "ready"}), flush=True)
        sent: list[float] = []
        start = time.monotonic()
        for i in range(int(seconds * 100)):
            sent.append(time.monotonic())
            publish(messages.float64_array([1.0 + 0.001 * i] + [7.0] * (joints - 1)))
            time.sleep(max(0.0, start + (i + 1) * 0.01 - time.monotonic()))
        print(json.dumps({"event": "done", "sent": sent}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("selftest", "relay", "failsafe", "teleop"))
    parser.add_argument("--domain", type=int, required=True)
    parser.add_argument("--joints", default="")
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    if args.mode == "teleop":
        teleop(args.domain, len(args.joints.split(",")), args.seconds)
    elif args.mode == "selftest":
        print(json.dumps(selftest(args.domain)), flush=True)
    elif args.mode == "failsafe":
        print(json.dumps(failsafe(args.domain)), flush=True)
    else:
        relay(args.domain, args.joints.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())

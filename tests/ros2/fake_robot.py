"""A stand-in robot on the ROS 2 wire, run as its own process by test_dds.py.

It publishes JointState on /joint_states at --hz (joint names in reverse of the given order,
position[k] = i + k / 10 for the i-th message, stamp i / hz), and echoes every
Float64MultiArray it receives on /policy_controller/commands back on /tether_test/echo.
It stops when its stdin closes or after --seconds, and exits 1 if its transport failed.

    python tests/ros2/fake_robot.py --domain 17 --joints a,b,c
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    from bridge.ros2 import messages
    from bridge.ros2.dds import DdsTransport
    from bridge.ros2.transport import wait_for_subscribers

    parser = argparse.ArgumentParser()
    parser.add_argument("--domain", type=int, required=True)
    parser.add_argument("--joints", required=True)
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    joints = args.joints.split(",")[::-1]

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    transport = DdsTransport(domain_id=args.domain, node_name="fake_robot")
    try:
        echo = transport.publisher("/tether_test/echo", messages.FLOAT64_ARRAY, depth=100)

        def on_command(msg: object) -> None:
            if not wait_for_subscribers(echo, timeout=5.0):
                raise RuntimeError("nobody subscribed to the echo topic")
            echo(msg)

        transport.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY, on_command,
                            reliable=True, depth=100)
        states = transport.publisher("/joint_states", messages.JOINT_STATE, reliable=False)
        print("ready", flush=True)
        period, start = 1.0 / args.hz, time.monotonic()
        for i in range(int(args.seconds * args.hz)):
            position = [i + k / 10 for k in range(len(joints))]
            states(messages.joint_state(names=joints, position=position, velocity=[0.0] * len(joints),
                                        stamp=i / args.hz))
            if stop.wait(max(0.0, start + (i + 1) * period - time.monotonic())):
                break
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A robot on the ROS 2 wire for the edge-node tests, run as its own process.

It publishes JointState on /joint_states at --hz (best effort, joints in the given order,
position 0) and prints every Float64MultiArray it receives on /policy_controller/commands as one
JSON line: {"t": time.monotonic() at arrival, "data": [...], "lat_ms": ...}. Monotonic time is
one clock for every process on the machine, so the test compares it with its own.

The velocities are what the tests' echo policy sends back as the action:
- "count" mode (the start): velocity = (i % 4000) / 2000 for the i-th message, so a command
  names the JointState it answers and the robot prints the latency from that JointState's
  publication to the command's arrival (`lat_ms`);
- "const V" on stdin: every velocity V from the next message on ("count" switches back).
It stops when its stdin closes or after --seconds. --lockstep: the next JointState only once the
command answering this one arrived (bounded by 1 s), and not before its period.

    python tests/ros2/edge_robot.py --domain 17 --joints a,b,c
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

MODULO, SCALE = 4000, 2000.0


def main(argv: list[str] | None = None) -> int:
    from bridge.ros2 import messages
    from bridge.ros2.dds import DdsTransport

    parser = argparse.ArgumentParser()
    parser.add_argument("--domain", type=int, required=True)
    parser.add_argument("--joints", required=True)
    parser.add_argument("--hz", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--out", help="keep command records (and when each state went out) and write them "
                        "to this JSON file at exit")
    args = parser.parse_args(argv)
    kept: list[dict] = []
    stamps: list[float] = []       # with --out: when each JointState went out (monotonic)
    answered = threading.Event()
    got_command = threading.Event()
    waiting_for: list[int | None] = [None]
    joints = args.joints.split(",")
    stop = threading.Event()
    const: list[float | None] = [None]
    published: dict[int, float] = {}
    out = threading.Lock()

    def emit(record: dict) -> None:
        if args.out and "event" not in record:
            kept.append(record)
            return
        with out:
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()

    def control() -> None:
        for line in sys.stdin:
            word, _, value = line.strip().partition(" ")
            if word == "first":              # reply once a command arrived (the benchmark's start)
                emit({"event": "first" if got_command.wait(60) else "no command"})
                continue
            const[0] = float(value) if word == "const" else None
        stop.set()

    def on_command(msg: object) -> None:
        now = time.monotonic()
        got_command.set()
        data = [float(x) for x in msg.data]
        code = round(data[0] * SCALE) if data and const[0] is None else None
        sent = published.get(code)
        if code is not None and code == waiting_for[0]:
            answered.set()
        emit({"t": now, "data": data, "lat_ms": None if sent is None else (now - sent) * 1e3})

    threading.Thread(target=control, daemon=True).start()
    transport = DdsTransport(domain_id=args.domain, node_name="edge_test_robot")
    try:
        transport.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY, on_command,
                            reliable=True, depth=100)
        states = transport.publisher("/joint_states", messages.JOINT_STATE, reliable=False)
        emit({"event": "ready"})
        period, start = 1.0 / args.hz, time.monotonic()
        for i in range(int(args.seconds * args.hz)):
            value = const[0]
            answered.clear()
            if value is None:
                value = (i % MODULO) / SCALE
                published[i % MODULO] = time.monotonic()
                waiting_for[0] = i % MODULO
            states(messages.joint_state(names=joints, position=[0.0] * len(joints),
                                        velocity=[value] * len(joints), stamp=i / args.hz))
            if args.out:
                stamps.append(time.monotonic())
            if args.lockstep:
                answered.wait(timeout=1.0)
            if stop.wait(max(0.0, start + (i + 1) * period - time.monotonic())):
                break
            if args.lockstep:                 # a late answer shifts the grid
                start = max(start, time.monotonic() - (i + 1) * period)
    finally:
        transport.close()
        if args.out:
            Path(args.out).write_text(json.dumps({"commands": kept, "published": stamps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

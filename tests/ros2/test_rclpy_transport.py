"""The rclpy transport, for real: run from the ROS environment (.venv/ros, rclpy Jazzy on Fast DDS)
against itself, against Tether's Cyclone DDS transport in this process, and against the Fast DDS
C++ peer (Debian's Fast DDS 2.9). Each test has its own domain, loopback only."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time

import numpy as np
import pytest

from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.transport import TransportError, wait_for_subscribers
from bridge.ros2.transports import open_transport, rclpy_available
from tests.ros2.ros_env import ROOT, ROS_PYTHON, needs_rclpy, ros_env

SIDE = ROOT / "tests" / "ros2" / "rclpy_side.py"
PEER = ROOT / "tests" / "peers" / "build" / "fastdds_peer"


class Lines:
    """A process whose stdout JSON lines collect in a queue."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def get(self, timeout: float) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output in {timeout} s; stderr: {self.close()}") from None

    def close(self) -> str:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stderr.read()


@pytest.mark.skipif(rclpy_available(), reason="rclpy is importable in this environment: auto picks it")
def test_without_rclpy_auto_falls_back_to_dds_and_rclpy_says_why_not(ros_domain):
    with open_transport("auto", domain_id=ros_domain) as transport:
        assert isinstance(transport, DdsTransport)
    with pytest.raises(TransportError, match="rclpy is not importable"):
        open_transport("rclpy", domain_id=ros_domain)


@needs_rclpy
def test_rclpy_auto_round_trip_in_order_and_errors(ros_domain):
    proc = subprocess.run([str(ROS_PYTHON), str(SIDE), "selftest", "--domain", str(ros_domain)],
                          env=ros_env(ros_domain), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["auto"] == "RclpyTransport"                  # auto picks rclpy where it imports
    assert result["stamps"] == list(range(20))
    assert result["reordered"] == [-3, 3]
    assert "/flag publishes std_msgs/msg/Bool" in result["refused"][0]
    assert "already carries" in result["refused"][1]


@needs_rclpy
def test_an_rclpy_publish_error_latches_the_guard_and_the_safe_action_goes_out(ros_domain):
    """rclpy itself refuses a publish (the publisher was destroyed under the node): the edge node's loop
    ends latched, and its safe action still reaches a subscriber (before this, rclpy's error was only
    counted and the loop went on)."""
    proc = subprocess.run([str(ROS_PYTHON), str(SIDE), "failsafe", "--domain", str(ros_domain)],
                          env=ros_env(ros_domain), capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "publish on /tether/estop_state failed" in result["failure"], result["failure"]
    assert not result["running"] and result["estopped"]          # the loop ended, latched (still the e-stop's)
    assert result["held"] >= 1 and len(result["commands"]) > result["held"]
    assert all(c == [0.0] * 6 for c in result["commands"])


@needs_rclpy
def test_rclpy_transport_and_cyclone_transport_talk_both_ways(ros_domain):
    """rclpy (Fast DDS 2.14) relays each JointState from Cyclone DDS back as a command."""
    relay = Lines([str(ROS_PYTHON), str(SIDE), "relay", "--domain", str(ros_domain), "--joints", "b,a"],
                  ros_env(ros_domain))
    commands: list = []
    try:
        with DdsTransport(domain_id=ros_domain, node_name="cyclone_robot") as robot:
            robot.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY, commands.append, reliable=True,
                            depth=100)
            states = robot.publisher("/joint_states", messages.JOINT_STATE, reliable=False, depth=100)
            assert relay.get(timeout=30) == {"event": "ready"}
            assert wait_for_subscribers(states, timeout=20)
            for i in range(50):
                states(messages.joint_state(names=["a", "b"], position=[i, -i], stamp=i))
                time.sleep(0.004)
            deadline = time.monotonic() + 10
            while len(commands) < 40 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        stderr = relay.close()
    got = [c.data.tolist() for c in commands]
    assert len(got) >= 40, stderr                               # best effort in: a few may drop, none here usually
    assert all(b == -a for a, b in got) and [b for _, b in got] == sorted(b for _, b in got)


@needs_rclpy
@pytest.mark.skipif(not os.access(PEER, os.X_OK), reason=f"Fast DDS peer not built ({PEER}): "
                    "bash tests/peers/setup.sh (apt packages libfastrtps-dev libfastcdr-dev g++)")
def test_rclpy_transport_and_the_fastdds_cpp_peer(ros_domain):
    """The C++ peer (Fast DDS 2.9) publishes JointStates; rclpy (Fast DDS 2.14) answers each with a
    command holding its positions; the peer prints what it got."""
    relay = Lines([str(ROS_PYTHON), str(SIDE), "relay", "--domain", str(ros_domain),
                   "--joints", "shoulder,elbow,wrist"], ros_env(ros_domain))
    peer = None
    try:
        peer = Lines([str(PEER), "--domain", str(ros_domain), "--count", "5", "--timeout", "30", "--hz", "50"],
                     ros_env(ros_domain))
        echoed = []
        while not echoed or echoed[-1].get("event") not in ("done", "error"):
            echoed.append(peer.get(timeout=40))
        assert peer.proc.wait(timeout=10) == 0, echoed[-1]
    finally:
        if peer is not None:
            peer.close()
        stderr = relay.close()
    data = [e["data"] for e in echoed if "data" in e]
    assert len(data) == 5, (echoed, stderr)
    for d in data:                                              # the peer's positions: [0.5, -1.25, 0.001 i]
        np.testing.assert_allclose(d[:2], [0.5, -1.25])

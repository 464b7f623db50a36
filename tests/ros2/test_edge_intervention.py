"""A person's command on the edge (the topic map's intervention topic), end to end over DDS: a robot process,
the edge node, a teleop publisher in this process, a real gateway logging to disk and a real tritonserver.

The robot makes the echo policy's action 0.25 on every joint; the person commands 7.0 on joints 1-5 (beyond
every bound: the guard clamps it) and 1 + 0.001 i on joint 0 (within its bounds: it names teleop message i, so
the robot's arrival times give each command's latency from its teleop message).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import numpy as np
import pytest
import yaml

from bridge.experience import read_transitions
from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge import write_report
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError, guard_config
from bridge.ros2.node import EdgeNode
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, parse_topic_map
from bridge.ros2.transport import wait_for_subscribers
from protos.codec import decode
from tests.ros2.edge_support import EchoVelocity, GatewayThread, running_edge, serving, wait_until
from tests.ros2.ros_env import ROOT, ROS_PYTHON, needs_rclpy, ros_env

TELEOP = "/teleop/commands"
HOLD_S = 0.1                # the override ends this long after the last teleop message
RATE_HZ = 50.0              # the node's control rate: one period = 20 ms
POLICY = 0.25               # the echo policy's action (the robot's published velocity)
TMAP = parse_topic_map({**yaml.safe_load(DEFAULT_TOPIC_MAP.read_text()),
                        "intervention": {"topic": TELEOP, "hold_s": HOLD_S}})
JOINTS = TMAP.observation[0].joints
LOW, HIGH = np.array(TMAP.action_specs()[0].low), np.array(TMAP.action_specs()[0].high)


def person(i: int) -> np.ndarray:
    return np.array([1.0 + 0.001 * i] + [7.0] * 5)


CLAMPED = np.minimum(person(0), HIGH)[1:]     # joints 1-5 of every person's command after the guard


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("intervention"), echo6=(EchoVelocity(), 6)) as server:
        yield server


class Teleop:
    """A person's command stream on the intervention topic at 100 Hz, from its own DDS participant."""

    def __init__(self, domain: int):
        self.transport = DdsTransport(domain_id=domain, node_name="teleop")
        self.publish = self.transport.publisher(TELEOP, messages.FLOAT64_ARRAY, reliable=True)
        assert wait_for_subscribers(self.publish, timeout=10), "the edge node never subscribed to the teleop topic"
        self.sent: list[float] = []     # monotonic time teleop message i went out

    def stream(self, seconds: float) -> None:
        start = time.monotonic()
        for i in range(int(seconds * 100)):
            self.sent.append(time.monotonic())
            self.publish(messages.float64_array(person(len(self.sent) - 1)))
            time.sleep(max(0.0, start + (i + 1) * 0.01 - time.monotonic()))

    def close(self) -> None:
        self.transport.close()


def is_person(data: np.ndarray) -> bool:
    return np.allclose(data[1:], CLAMPED)


def test_a_teleop_stream_overrides_the_policy_through_the_guard_and_is_logged(ros_domain, robot, triton, tmp_path):
    log_dir = tmp_path / "experience"
    gw = GatewayThread(triton.grpc_url, experience_dir=log_dir)
    try:
        address = gw.start()
        with running_edge(ros_domain, address, TMAP, policy="echo6", rate_hz=RATE_HZ) as node:
            robot.send(f"const {POLICY}")
            wait_until(lambda: sum(np.allclose(c["data"], POLICY) for c in robot.commands) >= 20, timeout=30,
                       what="20 policy commands")
            teleop = Teleop(ros_domain)
            try:
                streaming = threading.Thread(target=teleop.stream, args=(1.0,))
                streaming.start()
                streaming.join()
                end = teleop.sent[-1]
                back = robot.wait_for(lambda d: np.allclose(d, POLICY), after=end, timeout=10,
                                      what="the policy's command after the teleop stream stopped")
            finally:
                teleop.close()
            ours = [c for c in robot.since(teleop.sent[0]) if is_person(np.array(c["data"]))]
            interventions = node.stats.interventions
        write_report(node, tmp_path / "summary.json")   # tether edge --summary
        gw.stop()    # the log is fsynced and closed
    finally:
        gw.close()

    period = 1.0 / RATE_HZ
    # at most one person's command per control period goes out (50 in the 1 s stream), a loaded box skips some
    assert len(ours) >= 25, f"only {len(ours)} of the person's commands reached the robot"
    for c in ours:   # clamped into the bounds, joint 0 as the person sent it
        data = np.array(c["data"])
        assert (data >= LOW).all() and (data <= HIGH).all(), data
        assert np.isclose(data[0], person(round((data[0] - 1.0) / 0.001))[0])
    arrived: dict[int, float] = {}     # teleop message -> its first command (a held one is resent every period)
    for c in ours:
        arrived.setdefault(round((c["data"][0] - 1.0) / 0.001), c["t"])
    latency = np.array([t - teleop.sent[i] for i, t in arrived.items()])
    first = ours[0]["t"] - teleop.sent[0]
    during = [c for c in robot.since(ours[0]["t"]) if c["t"] <= end]
    assert all(is_person(np.array(c["data"])) for c in during), "a policy command went out while the person held"
    dead_man = back["t"] - end
    print(f"\nteleop -> robot: first override {first * 1e3:.1f} ms after the stream began (period "
          f"{period * 1e3:.0f} ms); per command p50 {np.median(latency) * 1e3:.2f} ms, "
          f"max {latency.max() * 1e3:.2f} ms over {len(arrived)}; the policy back {dead_man * 1e3:.0f} ms after "
          f"the last message (hold {HOLD_S * 1e3:.0f} ms)")
    assert first < period, f"the first override took {first * 1e3:.1f} ms, more than one control period"
    assert np.median(latency) < period
    assert HOLD_S * 0.9 <= dead_man <= HOLD_S + 2.0

    logged = [t for t in read_transitions(log_dir) if t.session.startswith("edge_under_test@")]
    marked = [t for t in logged if t.intervention]
    assert len(marked) >= 20 and len(logged) - len(marked) >= 20
    for t in marked:   # the person's guarded command applied, the policy's own action beside it
        applied, action = decode(t.applied_action[0]), decode(t.action[0])
        assert np.allclose(applied[1:], CLAMPED, atol=1e-5) and 1.0 <= applied[0] < 1.1, applied
        assert np.allclose(action, POLICY), action
    for t in logged:
        if not t.intervention:
            assert not np.allclose(decode(t.applied_action[0])[1:], CLAMPED, atol=1e-5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stats"]["person_commands"] == sum(c.get("person", False) for c in summary["commands"]) >= 25
    assert summary["stats"]["overridden"] > 0 and summary["stats"]["interventions"] == interventions
    reported = [t.guard.interventions for t in logged]
    assert reported == sorted(reported) and reported[-1] >= len(marked) and interventions >= len(marked)


def test_teleop_never_overrides_an_estop(ros_domain, robot, triton):
    gw = GatewayThread(triton.grpc_url)
    try:
        address = gw.start()
        with running_edge(ros_domain, address, TMAP, policy="echo6", rate_hz=RATE_HZ) as node, \
                DdsTransport(domain_id=ros_domain, node_name="operator") as operator:
            robot.send(f"const {POLICY}")
            wait_until(lambda: sum(np.allclose(c["data"], POLICY) for c in robot.commands) >= 10, timeout=30,
                       what="10 policy commands")
            estop = operator.publisher("/tether/estop", messages.BOOL)
            assert wait_for_subscribers(estop, timeout=10)
            estop(messages.bool_msg(True))
            wait_until(lambda: node.guard.estopped, timeout=5, what="the e-stop latch")
            teleop = Teleop(ros_domain)
            try:
                teleop.stream(0.5)
            finally:
                teleop.close()
            wait_until(lambda: robot.since(teleop.sent[-1] + HOLD_S), timeout=5, what="a command after the stream")
            assert node.guard.estopped and node.stats.person_commands == 0
    finally:
        gw.close()
    during = robot.since(teleop.sent[0])
    assert during and not any(is_person(np.array(c["data"])) for c in during)
    assert all(np.allclose(c["data"], POLICY) for c in during)   # "hold": the last command before the latch


def test_teleop_holds_two_control_periods_by_default_and_is_refused_with_action_chunks():
    default = parse_topic_map({**yaml.safe_load(DEFAULT_TOPIC_MAP.read_text()), "intervention": {"topic": TELEOP}})
    node = EdgeNode(config=EdgeConfig(gateway="127.0.0.1:50051", rate_hz=100.0), topic_map=default, transport=None,
                    guard=guard_config(default, deadline_s=0.05))
    assert node._teleop.hold_s == pytest.approx(0.02)
    with pytest.raises(EdgeConfigError, match=r"intervention: not with chunk=5 .*applied_action"):
        EdgeNode(config=EdgeConfig(gateway="127.0.0.1:50051", chunk=5), topic_map=TMAP, transport=None,
                 guard=guard_config(TMAP, deadline_s=0.05))


@needs_rclpy
def test_an_rclpy_teleop_node_overrides_the_policy(ros_domain, robot, triton):
    """The person's commands from a real rclpy node (a joystick driver's side) reach the robot clamped."""
    gw = GatewayThread(triton.grpc_url)
    try:
        address = gw.start()
        with running_edge(ros_domain, address, TMAP, policy="echo6", rate_hz=RATE_HZ):
            robot.send(f"const {POLICY}")
            wait_until(lambda: sum(np.allclose(c["data"], POLICY) for c in robot.commands) >= 10, timeout=30,
                       what="10 policy commands")
            side = subprocess.run([str(ROS_PYTHON), str(ROOT / "tests/ros2/rclpy_side.py"), "teleop", "--domain",
                                   str(ros_domain), "--joints", ",".join(JOINTS), "--seconds", "0.5"],
                                  env=ros_env(ros_domain), capture_output=True, text=True, timeout=120)
            assert side.returncode == 0, side.stderr[-2000:]
            sent = json.loads(side.stdout.splitlines()[-1])["sent"]
            robot.wait_for(lambda d: np.allclose(d, POLICY), after=sent[-1], timeout=10,
                           what="the policy's command after the rclpy teleop stream stopped")
    finally:
        gw.close()
    ours = [np.array(c["data"]) for c in robot.since(sent[0]) if is_person(np.array(c["data"]))]
    assert len(ours) >= 10 and all(((d >= LOW) & (d <= HIGH)).all() for d in ours)

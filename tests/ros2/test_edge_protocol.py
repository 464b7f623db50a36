"""The edge node's side of the gateway protocol, against a scripted Bridge servicer (so every field the
gateway sends is chosen by the test) and a robot on the real DDS wire: a gateway e-stop latches by its
id and is released only by a release naming that id; the session id is stable and steps continue from
the Welcome; the latch survives a restart of the node (latch file); a failure of the DDS receive loop
ends in the safe action on the wire; a topic map whose command has no measured pose is refused.
The real gateway and the C++ Fast DDS robot are in test_edge_restarts.py."""

from __future__ import annotations

import math
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

from bridge.ros2 import dds, messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError, guard_config
from bridge.ros2.guard import GATEWAY_ESTOP
from bridge.ros2.node import EdgeError, EdgeNode
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map, parse_topic_map
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode
from tests.ros2.edge_support import wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints
COMMANDS = "/policy_controller/commands"


class ScriptedGateway(bridge_pb2_grpc.BridgeServicer):
    """Welcomes with `next_step`; answers every observation with `value` on every joint and the e-stop
    fields the test set (`estop_id` -> estop=true, `released`); records Hellos and observations."""

    def __init__(self, *, next_step: int = 0):
        self.next_step, self.value, self.estop_id, self.released = next_step, 0.5, "", ""
        self.hellos: list[bridge_pb2.Hello] = []
        self.observations: list[bridge_pb2.Observation] = []

    def Connect(self, request_iterator, context):
        self.hellos.append(next(request_iterator).hello)
        yield bridge_pb2.ServerMessage(welcome=bridge_pb2.Welcome(
            session_id=self.hellos[-1].session_id, policy="scripted", policy_version=1, next_step=self.next_step))
        for msg in request_iterator:
            obs = msg.observation
            self.observations.append(obs)
            if obs.step_type == bridge_pb2.LAST:
                yield bridge_pb2.ServerMessage(episode_end=bridge_pb2.EpisodeEnd(step=obs.step))
                continue
            action = bridge_pb2.Action(step=obs.step, policy="scripted", policy_version=1,
                                       tensors=[encode("action", np.full(6, self.value, np.float32))],
                                       estop=bool(self.estop_id), estop_id=self.estop_id,
                                       released_estop=self.released)
            yield bridge_pb2.ServerMessage(action=action)

    def reports_after(self, n: int) -> list[bridge_pb2.GuardReport]:
        return [o.guard for o in self.observations[n:]]


@pytest.fixture
def scripted(unused_port):
    fake = ScriptedGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    bridge_pb2_grpc.add_BridgeServicer_to_server(fake, server)
    server.add_insecure_port(f"127.0.0.1:{unused_port}")
    server.start()
    yield fake, f"127.0.0.1:{unused_port}"
    server.stop(0)


class WireRobot:
    """The robot on its own DDS participant: JointStates at 100 Hz (all zeros), commands recorded."""

    def __init__(self, domain: int):
        self.transport = DdsTransport(domain_id=domain, node_name="robot")
        self.commands: list[tuple[float, list[float]]] = []
        self.transport.subscribe(COMMANDS, messages.FLOAT64_ARRAY,
                                 lambda m: self.commands.append((time.monotonic(), m.data.tolist())), reliable=True)
        self.estop = self.transport.publisher("/tether/estop", messages.BOOL)
        self.release = self.transport.publisher("/tether/estop_release", messages.STRING)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        publish = self.transport.publisher("/joint_states", messages.JOINT_STATE, reliable=False)
        while not self._stop.wait(0.01):
            publish(messages.joint_state(names=JOINTS, position=np.zeros(6), velocity=np.zeros(6)))

    def since(self, t: float) -> list[list[float]]:
        return [data for ts, data in list(self.commands) if ts >= t]

    def wait_for(self, value: float, *, after: float, timeout: float = 10.0) -> float:
        """The time of the first command after `after` with every joint at `value`."""
        def find():
            return next((ts for ts, data in list(self.commands) if ts >= after and np.allclose(data, value)), None)
        return wait_until(find, timeout=timeout, what=f"a command of {value} on the robot")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.transport.close()


@pytest.fixture
def robot(ros_domain):
    r = WireRobot(ros_domain)
    yield r
    r.close()


def make_node(domain: int, address: str, **config) -> tuple[EdgeNode, DdsTransport]:
    transport = DdsTransport(domain_id=domain, node_name="edge_protocol")
    settings = {"node_name": "edge_protocol", "backoff_s": (0.05, 0.2), **config}
    node = EdgeNode(config=EdgeConfig(gateway=address, **settings), topic_map=TMAP, transport=transport,
                    guard=guard_config(TMAP, deadline_s=0.05, safe_action="zero", velocity_limit=math.inf))
    return node, transport


def observations_after(fake: ScriptedGateway, n: int, count: int) -> None:
    wait_until(lambda: len(fake.observations) >= n + count, timeout=10, what=f"{count} more observations")


def test_a_gateway_estop_is_released_only_by_a_release_naming_its_id(ros_domain, scripted, robot):
    fake, address = scripted
    node, transport = make_node(ros_domain, address)
    node.start()
    try:
        robot.wait_for(0.5, after=0.0)
        fake.estop_id = "es-1"
        wait_until(lambda: node.guard.gateway_estop == "es-1", timeout=10, what="the gateway latch")
        n = len(fake.observations)
        observations_after(fake, n, 5)                     # the edge reports what it holds, every observation
        assert all(r.gateway_estop == "es-1" and r.estopped for r in fake.reports_after(n + 1))
        t = robot.wait_for(0.0, after=time.monotonic())
        fake.estop_id = ""                                  # an action without estop: no release
        n = len(fake.observations)
        observations_after(fake, n, 20)
        fake.released = "es-0"                              # a release of another e-stop: no release
        n = len(fake.observations)
        observations_after(fake, n, 20)
        assert node.guard.estopped and node.guard.gateway_estop == "es-1"
        assert all(data == [0.0] * 6 for data in robot.since(t))
        t = time.monotonic()
        fake.released = "es-1"
        robot.wait_for(0.5, after=t)
        assert not node.guard.estopped
        n = len(fake.observations)
        observations_after(fake, n, 3)
        assert fake.reports_after(n + 1)[-1].gateway_estop == ""

        # a local e-stop taken while the gateway's latch holds needs a local release
        fake.released, fake.estop_id = "", "es-2"
        wait_until(lambda: node.guard.gateway_estop == "es-2", timeout=10, what="the second gateway latch")
        robot.estop(messages.bool_msg(True))
        wait_until(lambda: node.guard.estop_reason != GATEWAY_ESTOP, timeout=10, what="the local latch")
        t = time.monotonic()
        fake.estop_id, fake.released = "", "es-2"
        n = len(fake.observations)
        observations_after(fake, n, 20)
        assert node.guard.estopped and node.guard.gateway_estop == ""
        assert all(data == [0.0] * 6 for data in robot.since(t))
    finally:
        node.stop()
        transport.close()


def test_the_session_id_is_stable_and_steps_continue_from_the_welcome(ros_domain, scripted, robot):
    fake, address = scripted
    fake.next_step = 1000
    for _run in range(2):
        node, transport = make_node(ros_domain, address)
        node.start()
        try:
            n = len(fake.observations)
            observations_after(fake, n, 5)
        finally:
            node.stop()
            transport.close()
        steps = [o.step for o in fake.observations[n:]]
        assert steps[0] == fake.next_step and steps == list(range(steps[0], steps[0] + len(steps))), steps[:5]
        assert fake.observations[n].step_type == bridge_pb2.FIRST
        fake.next_step = steps[-1] + 1                    # as the gateway would: its last seen step + 1
    assert len(fake.hellos) == 2 and fake.hellos[0].session_id == fake.hellos[1].session_id
    assert fake.hellos[0].session_id == EdgeConfig(gateway=address, node_name="edge_protocol").session_id
    assert fake.hellos[0].session_id.startswith("edge_protocol@")


def test_the_latch_survives_a_restart_of_the_node(ros_domain, scripted, robot, tmp_path):
    fake, address = scripted
    latch = tmp_path / "latch.json"
    node, transport = make_node(ros_domain, address, latch_file=latch)
    node.start()
    try:
        robot.wait_for(0.5, after=0.0)
        fake.estop_id = "es-9"
        wait_until(lambda: node.guard.gateway_estop == "es-9", timeout=10, what="the gateway latch")
    finally:
        node.stop()
        transport.close()
    fake.estop_id = ""                                     # the gateway no longer says estop
    t = time.monotonic()
    node, transport = make_node(ros_domain, address, latch_file=latch)
    assert node.guard.estopped and node.guard.gateway_estop == "es-9"
    node.start()
    try:
        n = len(fake.observations)
        observations_after(fake, n, 20)
        assert fake.observations[n].guard.gateway_estop == "es-9"  # the first report already says so
        assert node.guard.estopped and robot.since(t) and all(d == [0.0] * 6 for d in robot.since(t))
        t = time.monotonic()
        fake.released = "es-9"
        robot.wait_for(0.5, after=t)
    finally:
        node.stop()
        transport.close()
    fake.released = ""
    node, transport = make_node(ros_domain, address, latch_file=latch)   # stopped cleanly, unlatched: starts so
    try:
        assert not node.guard.estopped
    finally:
        transport.close()


def test_an_exception_in_the_dds_receive_loop_ends_in_the_safe_action(ros_domain, scripted, robot, monkeypatch):
    fake, address = scripted
    take = dds.ddspy_take

    def poisoned_take(reader, mask, n):
        samples = take(reader, mask, n)
        if not isinstance(samples, int) and any(info.valid_data and b"POISON" in bytes(data)
                                                for data, info in samples):
            raise RuntimeError("poisoned sample in the receive loop")
        return samples

    monkeypatch.setattr(dds, "ddspy_take", poisoned_take)
    node, transport = make_node(ros_domain, address)
    node.start()
    try:
        robot.wait_for(0.5, after=0.0)
        t = time.monotonic()
        robot.release(messages.string_msg("POISON"))
        wait_until(lambda: not node.running, timeout=10, what="the control loop to fail safe")
        last = robot.wait_for(0.0, after=t)
        assert node.guard.estopped and "poisoned sample" in node.guard.estop_reason
        time.sleep(0.2)                                     # the loop has ended: nothing but safe commands since
        assert all(data == [0.0] * 6 for ts, data in robot.commands if ts >= last)
        with pytest.raises(EdgeError, match="DDS receive loop of edge_protocol stopped"):
            node.stop()
    finally:
        with pytest.raises(Exception, match="poisoned sample"):
            transport.close()


def test_a_command_without_a_measured_pose_is_refused_at_start():
    raw = {"observation": [{"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": list(JOINTS),
                            "tensors": {"joint_position": {"field": "position"}}}],
           "action": [{"topic": COMMANDS, "type": "std_msgs/msg/Float64MultiArray", "joints": list(JOINTS),
                       "tensors": {"action": {"field": "data", "bounds": [-1.0, 1.0]}}},
                      {"topic": "/gripper/command", "type": "std_msgs/msg/Float64MultiArray",
                       "tensors": {"grip": {"field": "data", "shape": [1], "bounds": [0.0, 1.0]}}}]}
    tmap = parse_topic_map(raw)
    with pytest.raises(EdgeConfigError, match=r"action\[1\] \(/gripper/command, tensors \['grip'\]\): no joints"):
        EdgeNode(config=EdgeConfig(gateway="127.0.0.1:1"), topic_map=tmap, transport=None,
                 guard=guard_config(tmap, deadline_s=0.05))
    raw["action"][1]["joints"] = ["gripper_joint"]
    tmap = parse_topic_map(raw)
    with pytest.raises(EdgeConfigError, match=r"joints \['gripper_joint'\] are in no sensor_msgs/msg/JointState"):
        EdgeNode(config=EdgeConfig(gateway="127.0.0.1:1"), topic_map=tmap, transport=None,
                 guard=guard_config(tmap, deadline_s=0.05))


def test_a_node_that_starts_late_still_sees_a_standing_estop(ros_domain, scripted, robot):
    """The e-stop topic is also read reliable + transient-local: True written by a live durable publisher
    before the node existed latches it at start; a volatile publisher (any ROS 2 tool) still matches."""
    fake, address = scripted
    with DdsTransport(domain_id=ros_domain, node_name="estop_button") as button:
        durable = button.publisher("/tether/estop", messages.BOOL, durable=True, depth=1)
        durable(messages.bool_msg(True))                  # nobody subscribed yet
        node, transport = make_node(ros_domain, address)
        node.start()
        try:
            wait_until(lambda: node.guard.estopped, timeout=10, what="the standing e-stop at start")
            assert node.guard.estop_reason == "True on /tether/estop"
            n = len(fake.observations)
            observations_after(fake, n, 10)
            wait_until(lambda: node.stats.actions >= 10, timeout=10, what="their replies at the node")
            assert all(r.estopped for r in fake.reports_after(n))
            assert not [data for _, data in robot.commands if data != robot.commands[0][1]]   # never moved
        finally:
            node.stop()
            transport.close()
        durable(messages.bool_msg(False))                 # the button let go: what a late node sees now
        volatile = button.publisher("/tether/estop", messages.BOOL)           # volatile: the node's other reader
        node, transport = make_node(ros_domain, address)
        node.start()
        try:
            robot.wait_for(0.5, after=time.monotonic())       # not latched: the standing value is False
            wait_until(lambda: volatile.subscriber_count() >= 1, timeout=10, what="the node's volatile reader")
            volatile(messages.bool_msg(True))
            wait_until(lambda: node.guard.estopped, timeout=10, what="an e-stop from a volatile publisher")
        finally:
            node.stop()
            transport.close()


def test_a_failed_publish_latches_and_the_safe_action_goes_out(ros_domain, scripted, robot, monkeypatch):
    fake, address = scripted
    write = dds.ddspy_write
    failures = []

    def failing_write(writer, data):
        if not failures and b"\x00\x00\x00\x00\x00\x00\xe0?" in bytes(data):   # the first command of 0.5
            failures.append(True)
            raise OSError("injected: the command writer failed")
        return write(writer, data)

    fake.value = 0.5
    node, transport = make_node(ros_domain, address)
    monkeypatch.setattr(dds, "ddspy_write", failing_write)
    node.start()
    try:
        wait_until(lambda: not node.running, timeout=10, what="the control loop to fail safe")
        assert failures and node.guard.estopped and "injected" in node.guard.estop_reason
        robot.wait_for(0.0, after=0.0)                       # the safe action reached the robot
        assert all(data == [0.0] * 6 for _, data in robot.commands)   # and nothing else did
        with pytest.raises(EdgeError, match="write on /policy_controller/commands failed"):
            node.stop()
    finally:
        transport.close()

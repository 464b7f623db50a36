"""The edge node's gateway link when the gateway misbehaves: unreachable (bounded backoff), or
welcoming and then never answering (reply timeout, reset, reconnect) while the watchdog holds the
robot safe. The hung gateway here is a minimal Bridge servicer that answers exactly five observations
and then none, so the counts below are exact; test_edge.py freezes a real gateway process (SIGSTOP)."""

from __future__ import annotations

import math
import queue
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge import _node_parser
from bridge.ros2.edge import main as edge_main
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError, guard_config
from bridge.ros2.link import GatewayLink, LinkDown, LinkUp
from bridge.ros2.node import EdgeNode
from bridge.ros2.tensor_layout import TensorLayout
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map, parse_topic_map
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import TensorError, encode
from tests.ros2.edge_support import wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints


class HangingGateway(bridge_pb2_grpc.BridgeServicer):
    """Welcomes every stream; answers the first `answers` observations of the first with 0.5s,
    and nothing after that."""

    def __init__(self, answers: int):
        self.answers = answers
        self.streams: list[list[bridge_pb2.Observation]] = []

    def Connect(self, request_iterator, context):
        seen: list[bridge_pb2.Observation] = []
        self.streams.append(seen)
        next(request_iterator)
        yield bridge_pb2.ServerMessage(welcome=bridge_pb2.Welcome(session_id=f"s{len(self.streams)}",
                                                                  policy="fake", policy_version=7))
        for msg in request_iterator:
            seen.append(msg.observation)
            if len(self.streams) == 1 and len(seen) <= self.answers:
                action = bridge_pb2.Action(step=msg.observation.step, policy="fake", policy_version=7,
                                           tensors=[encode("action", np.full(6, 0.5, np.float32))])
                yield bridge_pb2.ServerMessage(action=action)


def joint_states(transport: DdsTransport, stop: threading.Event) -> None:
    publish = transport.publisher("/joint_states", messages.JOINT_STATE, reliable=False)
    while not stop.wait(0.01):
        publish(messages.joint_state(names=JOINTS, position=np.zeros(6), velocity=np.zeros(6)))


def test_unreachable_gateway_is_retried_and_closing_is_prompt(unused_port):
    events: queue.SimpleQueue = queue.SimpleQueue()
    link = GatewayLink(f"127.0.0.1:{unused_port}", bridge_pb2.Hello(), events, connect_timeout_s=0.05,
                       backoff_s=(0.02, 0.08))
    link.start()
    downs = [events.get(timeout=5) for _ in range(6)]
    t = time.monotonic()
    link.close()
    assert time.monotonic() - t < 2.0
    assert all(isinstance(d, LinkDown) and "welcomed us" in d.reason for d in downs), downs
    assert {d.generation for d in downs} == {0}                     # never up: no stream to send on
    assert not link.send(bridge_pb2.ClientMessage(observation=bridge_pb2.Observation()), generation=0)


def test_a_gateway_that_starts_during_the_backoff_is_reached_at_once(unused_port):
    """Nothing answering: the session keeps listening for the gateway (the backoff is only for a session
    that ended), so the link connects as soon as the gateway serves (gRPC retries the channel at most
    every second), not after the 4 s backoff."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    link = GatewayLink(f"127.0.0.1:{unused_port}", bridge_pb2.Hello(), events, connect_timeout_s=0.5,
                       backoff_s=(4.0, 8.0))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    bridge_pb2_grpc.add_BridgeServicer_to_server(HangingGateway(answers=0), server)
    server.add_insecure_port(f"127.0.0.1:{unused_port}")
    link.start()
    try:
        down = events.get(timeout=10)
        assert isinstance(down, LinkDown) and "not reachable" in down.reason, down
        server.start()                                    # the gateway comes (back) up during the backoff
        t = time.monotonic()
        up = events.get(timeout=10)
        waited = time.monotonic() - t
    finally:
        link.close()
        server.stop(0)
    assert isinstance(up, LinkUp) and up.welcome.policy == "fake"
    assert waited < 3.0, f"reached {waited:.2f} s after the gateway started (the backoff was 4 s)"


def test_hung_gateway_is_reset_while_the_watchdog_holds_the_robot_safe(ros_domain, unused_port):
    fake = HangingGateway(answers=5)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    bridge_pb2_grpc.add_BridgeServicer_to_server(fake, server)
    server.add_insecure_port(f"127.0.0.1:{unused_port}")
    server.start()
    stop = threading.Event()
    commands = []
    config = EdgeConfig(gateway=f"127.0.0.1:{unused_port}", node_name="edge_hung", reply_timeout_s=0.3,
                        backoff_s=(0.05, 0.1))
    try:
        with DdsTransport(domain_id=ros_domain, node_name="robot") as robot, \
                DdsTransport(domain_id=ros_domain, node_name="edge_hung") as transport:
            robot.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY,
                            lambda m: commands.append((time.monotonic(), m.data.tolist())), reliable=True)
            publisher = threading.Thread(target=joint_states, args=(robot, stop), daemon=True)
            publisher.start()
            node = EdgeNode(config=config, topic_map=TMAP, transport=transport,
                            guard=guard_config(TMAP, deadline_s=0.05, safe_action="zero", velocity_limit=math.inf))
            node.start()
            try:
                wait_until(lambda: len(fake.streams) >= 2 and len(fake.streams[1]) >= 1, timeout=10,
                           what="a second stream after the reply timeout")
                assert node.stats.errors["REPLY_TIMEOUT"] == 1 and node.stats.connects == 2
            finally:
                node.stop()
                stop.set()
                publisher.join(timeout=5)
    finally:
        stop.set()
        server.stop(0)
    first = fake.streams[0]
    assert [o.step for o in first] == list(range(6))            # one in flight: none sent after the 6th
    assert fake.streams[1][0].step_type == bridge_pb2.FIRST and fake.streams[1][0].step == 6
    assert fake.streams[1][0].guard.watchdog >= 1               # the stream learns what happened
    np.testing.assert_array_equal(np.frombuffer(fake.streams[1][0].applied_action[0].data, np.float32),
                                  np.zeros(6))
    policy = [t for t, data in commands if data == [0.5] * 6]
    safe = [t for t, data in commands if data == [0.0] * 6 and t > policy[-1]]
    assert len(policy) == 5 and safe and safe[0] - policy[-1] < 0.05 + 0.1


def test_configuration_errors_name_the_value():
    action = TMAP_DICT["action"][0]
    no_bounds = parse_topic_map({**TMAP_DICT, "action": [{**action, "tensors": {"action": {"field": "data"}}}]})
    with pytest.raises(EdgeConfigError, match="action tensor 'action' has no bounds"):
        guard_config(no_bounds, deadline_s=0.05)
    two_joints = parse_topic_map({**TMAP_DICT, "action": [{**action, "joints": ["a", "b"]}]})
    with pytest.raises(EdgeConfigError, match="guard: limits for 6 values, but the topic map's action tensors have 2"):
        EdgeNode(config=EdgeConfig(gateway="127.0.0.1:1"), topic_map=two_joints, transport=None,
                 guard=guard_config(TMAP, deadline_s=0.05))
    for kwargs, message in [({"reply_timeout_s": 0}, "reply_timeout_s: expected a finite number of seconds > 0"),
                            ({"node_name": "a b"}, "node_name: expected a ROS 2 node name, got 'a b'"),
                            ({"state_topic": "/bad topic"}, "state_topic: topic '/bad topic' is not a valid"),
                            ({"backoff_s": (1.0, 0.5)}, r"backoff_s: expected \(initial, max\)"),
                            ({"session_id": "arm 1"}, "session_id: expected up to 128 printable characters"),
                            ({"release_tokens": Path("/nonexistent/tokens.json")},
                             "release_tokens: no such file /nonexistent/tokens.json"),
                            ({"latch_file": Path(__file__).parent}, "latch_file: .* is a directory")]:
        with pytest.raises(ValueError, match=message):
            EdgeNode(config=EdgeConfig(gateway="127.0.0.1:1", **kwargs), topic_map=TMAP, transport=None,
                     guard=guard_config(TMAP, deadline_s=0.05))


def test_the_command_refuses_the_old_operators_flag_and_says_what_replaced_it(capsys):
    with pytest.raises(SystemExit):
        edge_main(["--gateway", "127.0.0.1:1", "--operators", "ada,bob"])
    assert "--operators: a name no longer releases the e-stop" in capsys.readouterr().err


def test_an_action_is_checked_against_the_spec_and_put_in_its_order():
    command = TMAP_DICT["action"][0]
    arm = {**command, "joints": list(JOINTS[:4]), "tensors": {"arm": {"field": "data", "bounds": [-1.0, 1.0]}}}
    grip = {**command, "topic": "/gripper/commands", "joints": list(JOINTS[4:]),
            "tensors": {"grip": {"field": "data", "bounds": [0.0, 1.0]}}}
    tmap = parse_topic_map({**TMAP_DICT, "action": [arm, grip]})
    layout = TensorLayout(tmap.action_specs())
    assert layout.size == guard_config(tmap, deadline_s=0.05).size == 6
    a, g = np.arange(4, dtype=np.float32) / 8, np.array([0.5, 0.25], np.float32)
    for tensors in ([encode("arm", a), encode("grip", g)], [encode("grip", g), encode("arm", a)]):
        vector = layout.vector(tensors)
        assert vector.dtype == np.float64 and vector.tolist() == [0, 0.125, 0.25, 0.375, 0.5, 0.25]
    for tensors, problem in [
            ([encode("arm", a)], "grip: missing"),
            ([encode("arm", a), encode("grip", g), encode("wrist", g)], "wrist: not in the declared spec"),
            ([encode("arm", a.astype(np.float64)), encode("grip", g)], "arm: dtype float64, expected float32"),
            ([encode("arm", a[:3]), encode("grip", g)], r"arm: shape \[3\], expected \[4\]"),
            ([encode("arm", a), encode("grip", np.array([0.5, np.inf], np.float32))], "grip: contains NaN or inf")]:
        with pytest.raises(TensorError, match=problem):
            layout.vector(tensors)


TMAP_DICT = {
    "observation": [{"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": list(JOINTS),
                     "tensors": {"joint_position": {"field": "position"}, "joint_velocity": {"field": "velocity"}}}],
    "action": [{"topic": "/policy_controller/commands", "type": "std_msgs/msg/Float64MultiArray",
                "joints": list(JOINTS), "tensors": {"action": {"field": "data", "bounds": [-1.0, 1.0]}}}],
}


def test_several_gateways_make_one_failover_list():
    """`--gateway A,B` or the flag repeated: one list, in order, each address checked."""
    a = _node_parser().parse_args(["--gateway", "127.0.0.1:1,127.0.0.1:2", "--gateway", "127.0.0.1:3"])
    config = EdgeConfig(gateway=",".join(a.gateway))
    assert config.gateways == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    with pytest.raises(EdgeConfigError, match="gateway: expected HOST:PORT, got '127.0.0.1:1,nowhere'"):
        EdgeConfig(gateway="127.0.0.1:1,nowhere")
    with pytest.raises(ValueError, match="targets"):
        GatewayLink(["127.0.0.1:1", "nowhere"], bridge_pb2.Hello(), queue.SimpleQueue())

"""The edge node end to end, observed on the wire: a robot process on DDS (loopback, a domain per
test), the edge node, a real gateway and a real tritonserver serving echo policies.

The robot chooses the policy's action through the velocities it publishes (action = velocity),
and records every command it receives with its arrival time (see edge_robot.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bridge.common.processes import stop_group
from bridge.gateway.session import session as gateway_session
from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.release_auth import make_release
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map, parse_topic_map
from bridge.ros2.transport import wait_for_subscribers
from protos import bridge_pb2
from protos.codec import decode
from tests.ros2.edge_support import (
    FASTDDS_PEER,
    ROOT,
    EchoPosition,
    EchoVelocity,
    GatewayThread,
    const,
    release_token,
    running_edge,
    serving,
    wait_until,
)
from tests.ros2.rclpy_support import EdgeProcess
from tests.ros2.ros_env import needs_rclpy
from tests.support.processes import reaped

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
HIGH = np.array(TMAP.action_specs()[0].high)
LOW = np.array(TMAP.action_specs()[0].low)
DEADLINE_S = 0.05
PEER_JOINTS = ["shoulder", "elbow", "wrist"]  # what the Fast DDS peer publishes
PEER_MAP = parse_topic_map({
    "observation": [{"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": PEER_JOINTS,
                     "tensors": {"joint_position": {"field": "position"}, "joint_velocity": {"field": "velocity"}}}],
    "action": [{"topic": "/policy_controller/commands", "type": "std_msgs/msg/Float64MultiArray",
                "joints": PEER_JOINTS, "tensors": {"action": {"field": "data", "bounds": [-2.0, 2.0]}}}]})


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("edge"), echo6=(EchoVelocity(), 6), echo3=(EchoPosition(), 3)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(triton):
    gw = GatewayThread(triton.grpc_url)
    address = gw.start()
    yield address
    gw.close()


@pytest.fixture
def gateway_log(monkeypatch):
    """Every observation the gateway's sessions handle: (session id, Observation)."""
    seen: list[tuple[str, bridge_pb2.Observation]] = []
    handle = gateway_session.Session.handle

    async def spy(self, obs):
        seen.append((f"{self.id}@{id(self):x}", obs))
        return await handle(self, obs)

    monkeypatch.setattr(gateway_session.Session, "handle", spy)
    return seen


def test_commands_arrive_in_order_with_bounded_latency(ros_domain, robot, gateway, gateway_log):
    with running_edge(ros_domain, gateway, TMAP, policy="echo6") as node:
        wait_until(lambda: sum(c["lat_ms"] is not None for c in robot.commands) >= 200, timeout=20,
                   what="200 commands answering the robot's JointStates")
    timed = [c for c in robot.commands if c["lat_ms"] is not None]
    ticks = np.array([round(c["data"][0] * 2000) for c in timed])
    assert all(np.allclose(c["data"], c["data"][0]) for c in timed)           # the echo, all joints
    assert (np.diff(ticks) >= 0).all(), "commands arrived out of order"       # best-effort sampling may repeat
    latency = np.array([c["lat_ms"] for c in timed])
    p50, p99 = np.percentile(latency, [50, 99])
    print(f"\nJointState -> command through edge+gateway+Triton at 100 Hz: p50 {p50:.2f} ms, "
          f"p99 {p99:.2f} ms, max {latency.max():.2f} ms over {latency.size}; "
          f"edge rtt {node.stats.rtt_ms()}; stats {node.stats.skipped}")
    assert p99 < 200, latency
    rtt, in_gateway, inference = node.stats.rtt_ms(), node.stats.gateway_ms(), node.stats.inference_ms()
    assert 0 < inference["p50"] <= in_gateway["p50"] <= rtt["p50"]             # nested parts, from Action.timing
    assert f"(p50 in gateway {in_gateway['p50']:.2f}, of it inference {inference['p50']:.2f})" in node.status_line()
    assert set(node.stats.errors) <= {"DEADLINE_EXCEEDED"}, node.stats.errors   # the gateway's, under load
    assert node.guard.counts.clamped == 0 and node.stats.connects == 1
    steps = [(sid, o.step, o.step_type) for sid, o in gateway_log]
    assert [s for _, s, _ in steps] == list(range(len(steps)))                # strictly increasing
    assert steps[0][2] == bridge_pb2.FIRST and {t for *_, t in steps[1:-1]} == {bridge_pb2.MID}
    assert steps[-1][2] == bridge_pb2.LAST                                    # stop() ends the episode


def test_out_of_range_actions_are_clamped_on_the_wire(ros_domain, robot, gateway, gateway_log):
    with running_edge(ros_domain, gateway, TMAP, policy="echo6") as node:
        t = time.monotonic()
        robot.send("const 10")
        high = robot.wait_for(lambda d: np.allclose(d, HIGH), after=t, timeout=10, what="clamped commands")
        robot.send("const -10")
        robot.wait_for(lambda d: np.allclose(d, LOW), after=high["t"], timeout=10, what="clamped commands")
        wait_until(lambda: node.guard.counts.clamped >= 2, timeout=5, what="clamp counts")
    assert all((np.array(c["data"]) <= HIGH).all() and (np.array(c["data"]) >= LOW).all() for c in robot.commands)
    # the gateway hears what the policy's command became: applied_action and the guard's counters
    reports = [(decode(o.applied_action[0]), o.guard) for _, o in gateway_log if o.applied_action]
    clamped = [(a, g) for a, g in reports if np.allclose(a, HIGH.astype(np.float32))]
    assert clamped and all(g.clamped >= 1 for _, g in clamped)
    counts = [g.clamped for _, g in reports]
    assert counts == sorted(counts) and counts[-1] >= 2


def test_rate_limit_ramps_commands_on_the_wire(ros_domain, robot, gateway):
    with running_edge(ros_domain, gateway, TMAP, policy="echo6", max_delta=0.05) as node:
        const(robot, 0.0)
        t = time.monotonic()
        robot.send("const 1.0")
        robot.wait_for(lambda d: np.allclose(d, 1.0), after=t, timeout=10, what="the ramp to reach 1.0")
        assert node.guard.counts.rate_limited >= 19
    ramp = np.array([c["data"][0] for c in robot.since(t)])
    ramp = ramp[: int(np.argmax(np.isclose(ramp, 1.0))) + 1]
    assert (np.diff(ramp) <= 0.05 + 1e-9).all() and (np.diff(ramp) >= 0).all(), ramp
    assert ((ramp > 0) & (ramp < 1)).sum() >= 19, ramp


def test_watchdog_on_a_dead_gateway_then_reconnect(ros_domain, robot, triton, gateway_log):
    gw = GatewayThread(triton.grpc_url)
    address = gw.start()
    try:
        with running_edge(ros_domain, address, TMAP, policy="echo6", safe_action="zero") as node:
            const(robot, 0.5)
            watchdogs = node.guard.counts.watchdog    # a slow reply under load may have fired it before
            t_stop = time.monotonic()
            gw.stop()
            first_safe = robot.wait_for(lambda d: np.allclose(d, 0.0), after=t_stop, timeout=5,
                                        what="the watchdog's safe action")
            last_policy = max(c["t"] for c in robot.commands if c["t"] < first_safe["t"] and c["data"][0] == 0.5)
            silence = first_safe["t"] - last_policy
            later = wait_until(lambda: c if len(c := robot.since(first_safe["t"])) >= 15 else None, timeout=10,
                               what="15 commands after the first safe one")  # a wait on state, not a sleep
            assert all(c["data"] == [0.0] * 6 for c in later)  # repeated every period
            assert node.guard.counts.watchdog == watchdogs + 1 and not node.connected
            t_restart = time.monotonic()
            gw.start()                                                        # same port
            resumed = robot.wait_for(lambda d: np.allclose(d, 0.5), after=t_restart, timeout=10,
                                     what="policy actions after the gateway came back")
            assert node.stats.connects == 2 and node.stats.disconnects == 1
    finally:
        gw.close()
    print(f"\nwatchdog: policy silent -> safe action on the robot {silence * 1e3:.1f} ms "
          f"(deadline {DEADLINE_S * 1e3:.0f} ms); gateway back -> policy action "
          f"{(resumed['t'] - t_restart) * 1e3:.0f} ms")
    assert silence < DEADLINE_S + 0.1, silence
    sessions = list(dict.fromkeys(sid for sid, _ in gateway_log))
    assert len(sessions) == 2
    steps = [o.step for _, o in gateway_log]
    assert steps == sorted(steps)                                             # increasing across streams
    resent = [s for s in set(steps) if steps.count(s) > 1]
    first_of_second = next(o.step for sid, o in gateway_log if sid == sessions[1])
    # only the step in flight when the gateway went away comes twice: the session resends it on the new stream
    assert resent in ([], [first_of_second]) and steps.count(first_of_second) <= 2, steps
    types = [[o.step_type for s, o in gateway_log if s == sid] for sid in sessions]
    assert types[0][0] == bridge_pb2.FIRST and bridge_pb2.FIRST not in types[0][1:]
    # the second stream resumes the session's episode (no FIRST), or starts a new one with FIRST
    assert bridge_pb2.FIRST not in types[1] or (types[1][0] == bridge_pb2.FIRST
                                                and bridge_pb2.FIRST not in types[1][1:])
    assert gateway_log[-1][1].guard.watchdog == watchdogs + 1                # reported after the fact


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_frozen_gateway_process_is_survived(ros_domain, robot, triton, unused_port, tmp_path):
    """SIGSTOP freezes a real `tether gateway` process, as a GC pause, a debugger or a swapped-out
    host would: the watchdog holds the robot safe, the link times the stream out, and the policy
    comes back once the process runs again."""
    address = f"127.0.0.1:{unused_port}"
    with open(tmp_path / "gateway.log", "w") as log:
        gw = subprocess.Popen([sys.executable, "-m", "tether", "gateway", "--triton", triton.grpc_url,
                               "--policy", "echo6", "--port", str(unused_port)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: _serving(address), timeout=60, what="the gateway process", period=0.1)
            with running_edge(ros_domain, address, TMAP, policy="echo6", safe_action="zero") as node:
                const(robot, 0.5)
                t_freeze = time.monotonic()
                os.kill(gw.pid, signal.SIGSTOP)
                robot.wait_for(lambda d: np.allclose(d, 0.0), after=t_freeze, timeout=5,
                               what="the safe action while the gateway is frozen")
                wait_until(lambda: node.stats.errors.get("REPLY_TIMEOUT", 0) >= 1, timeout=10,
                           what="the link giving up on the frozen stream")
                t_thaw = time.monotonic()
                os.kill(gw.pid, signal.SIGCONT)
                robot.wait_for(lambda d: np.allclose(d, 0.5), after=t_thaw, timeout=20,
                               what="policy actions once the gateway runs again")
                assert node.stats.connects >= 2
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(gw.pid, signal.SIGCONT)
            stop_group(gw)


def test_estop_latches_until_an_operator_releases_with_a_credential(ros_domain, robot, gateway, tmp_path):
    tokens, token = release_token(tmp_path)
    with running_edge(ros_domain, gateway, TMAP, policy="echo6", safe_action="zero",
                      config={"release_tokens": tokens}) as node, \
            DdsTransport(domain_id=ros_domain, node_name="operator") as operator:
        estop = operator.publisher("/tether/estop", messages.BOOL)
        release = operator.publisher("/tether/estop_release", messages.STRING)
        assert wait_for_subscribers(estop, timeout=10) and wait_for_subscribers(release, timeout=10)
        const(robot, 0.5)
        t_estop = time.monotonic()
        estop(messages.bool_msg(True))
        stopped = robot.wait_for(lambda d: np.allclose(d, 0.0), after=t_estop, timeout=5, what="the e-stop")
        estop(messages.bool_msg(False))                                        # does not release
        release(messages.string_msg("ada"))                                    # a name is no credential
        signed = make_release("ada", token, node="edge_under_test", why="cell clear")
        release(messages.string_msg(signed.replace("|edge_under_test|", "|another_node|")))   # not for this node
        wait_until(lambda: node.stats.errors["RELEASE_REFUSED"] >= 2, timeout=5, what="the refusals")
        wait_until(lambda: len(robot.since(stopped["t"])) >= 15, timeout=5, what="15 commands while latched")
        held = robot.since(stopped["t"])
        assert all(c["data"] == [0.0] * 6 for c in held) and node.guard.estopped
        t_release = time.monotonic()
        release(messages.string_msg(signed))
        robot.wait_for(lambda d: np.allclose(d, 0.5), after=t_release, timeout=5, what="actions after release")
        counts = node.guard.counts
        assert counts.estop == 1 and not counts.estopped
    print(f"\ne-stop published -> safe action on the robot: {(stopped['t'] - t_estop) * 1e3:.1f} ms")
    assert stopped["t"] - t_estop < 0.2


def test_tether_edge_command_runs_and_stops_on_sigterm(ros_domain, robot, gateway, tmp_path):
    cmd = [sys.executable, "-m", "tether", "edge", "--gateway", gateway, "--transport", "dds",
           "--domain-id", str(ros_domain), "--policy", "echo6", "--node-name", "edge_cli",
           "--safe-action", "zero", "--status-s", "0.3", "--deadline-ms", "50",
           "--latch-file", str(tmp_path / "latch.json")]
    with reaped(subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) as proc:
        const(robot, 0.5, timeout=20)
        time.sleep(0.4)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("edge node edge_cli: DdsTransport on domain"), out
    assert any("gateway up v1" in line for line in lines[1:-1]), out
    assert lines[-1].endswith("stopped") and "ESTOPPED" in lines[-1], out
    robot.wait_for(lambda d: np.allclose(d, 0.0), after=t_term, timeout=5, what="the safe action on shutdown")


@pytest.mark.skipif(not os.access(FASTDDS_PEER, os.X_OK),
                    reason=f"Fast DDS peer not built ({FASTDDS_PEER}): run `bash tests/peers/setup.sh`")
def test_edge_node_drives_a_fastdds_peer(ros_domain, gateway):
    """ROS 2's default DDS (Fast DDS 2.9, C++) as the robot: its JointStates in, commands out."""
    count = 30
    with running_edge(ros_domain, gateway, PEER_MAP, policy="echo3") as node:  # first: fast discovery
        with reaped(subprocess.Popen([str(FASTDDS_PEER), "--domain", str(ros_domain), "--count", str(count),
                                      "--timeout", "20", "--hz", "100"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)) as peer:
            out, err = peer.communicate(timeout=30)
        assert not node.stats.errors
    assert peer.returncode == 0, err
    data = np.array([line["data"] for line in map(json.loads, out.splitlines()) if "data" in line])
    assert data.shape == (count, 3)
    # action = joint_position = [0.5, -1.25, 0.001 * i] for the peer's i-th JointState, through float32
    assert (data[:, 0] == 0.5).all() and (data[:, 1] == -1.25).all()
    i = data[:, 2] / 0.001
    np.testing.assert_allclose(i, np.round(i), atol=1e-3)
    assert (np.diff(data[:, 2]) >= 0).all() and data[-1, 2] > data[0, 2]   # in order, and moving


@needs_rclpy
def test_rclpy_edge_drives_the_cyclone_robot(ros_domain, robot, gateway, tmp_path):
    """`tether edge --transport rclpy` (Fast DDS, from .venv/ros) and the robot on Cyclone DDS."""
    with EdgeProcess(ros_domain, gateway, tmp_path, "--policy", "echo6", "--velocity-limit", "inf") as edge:
        const(robot, 0.25, timeout=30)
        const(robot, -0.5, timeout=10)
        report = edge.stop()
    assert "RclpyTransport" in edge.text and report["stats"]["policy_version"] == 1

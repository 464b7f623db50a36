"""E-stops that hold through restarts, with every piece a real process: the C++ robot on Fast DDS 2.9
(tests/peers/fastdds_peer) on the ROS 2 wire, `tether edge --transport dds`, `tether gateway` and a real
tritonserver serving a policy that keeps the robot moving (action = sin(10 x joint position), and the robot's
third joint position advances every state). A held robot gets the same command again and again (safe action
"hold"); a moving one a different command nearly every period. Counted on the robot:

- a gateway e-stop (`tether estop --robot`) holds every command through `kill -9` of the gateway and its
  restart on the same registry and experience dir, until an operator releases it through the gateway
  (`tether release`); then the robot moves again;
- a local e-stop (`tether edge estop`) holds through `kill -9` of the edge node: restarted on the same latch
  file it starts latched and sends no policy action until an operator releases it with a credential
  (`tether edge release`).

And the experience log through a restart: the edge node keeps the transitions the gateway has not yet
acknowledged durable and, after `kill -9` of the gateway and its restart on the same experience dir, replays
them with its stable session id (bridge.client's session, under bridge.ros2.link): the log holds every step of
the edge's session exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch

from bridge.experience import read_transitions
from protos import fleet_pb2, fleet_pb2_grpc
from tests.ros2.edge_support import FASTDDS_PEER, ROOT, FastDdsRobot, release_token, serving, wait_until
from tests.support.gateways import start_gateway

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.access(FASTDDS_PEER, os.X_OK),
                                 reason=f"Fast DDS peer not built ({FASTDDS_PEER}): run `bash tests/peers/setup.sh`")]
NODE = "arm_7"
OPERATOR = [("x-tether-operator", "ada")]
TOPIC_MAP = """observation:
  - topic: /joint_states
    type: sensor_msgs/msg/JointState
    joints: &joints [shoulder, elbow, wrist]
    tensors: {joint_position: {field: position}, joint_velocity: {field: velocity}}
action:
  - topic: /policy_controller/commands
    type: std_msgs/msg/Float64MultiArray
    joints: *joints
    tensors: {action: {field: data, bounds: [-2.0, 2.0], velocity_limit: 2.0}}
"""


class SinPosition(torch.nn.Module):
    """action = sin(10 x joint_position): bounded, and moving while the robot's position advances."""

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
        return torch.sin(joint_position * 10.0)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("restart"), sin3=(SinPosition(), 3)) as server:
        yield server


class Processes:
    """The gateway and the edge node of one test, as processes; everything is killed at the end."""

    def __init__(self, tmp_path: Path, triton_url: str, port: int, domain: int):
        self.tmp, self.triton_url, self.port, self.domain = tmp_path, triton_url, port, domain
        self.address = f"127.0.0.1:{port}"
        self.topic_map = tmp_path / "topic_map.yaml"
        self.topic_map.write_text(TOPIC_MAP)
        self.tokens, self.token = release_token(tmp_path)
        self.latch = tmp_path / "state" / f"{NODE}.json"
        self.gateway: subprocess.Popen | None = None
        self.edge: subprocess.Popen | None = None
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start_gateway(self) -> None:
        self.gateway_child = start_gateway(self.triton_url, self.tmp / "gateway.log", "--experience-dir",
                                           self.tmp / "experience", "--registry", self.tmp / "registry.sqlite",
                                           policy="sin3", port=self.port)
        self.gateway = self.gateway_child.proc  # the Child stays referenced: dropping it stops the process

    def start_edge(self, *extra: str) -> None:
        log = open(self.tmp / "edge.log", "a")  # noqa: SIM115 (the process holds it)
        self.edge = subprocess.Popen(
            [sys.executable, "-m", "tether", "edge", "--gateway", self.address, "--transport", "dds",
             "--domain-id", str(self.domain), "--topic-map", str(self.topic_map), "--policy", "sin3",
             "--node-name", NODE, "--safe-action", "hold", "--deadline-ms", "300", "--status-s", "1",
             "--latch-file", str(self.latch), "--release-tokens", str(self.tokens), *extra],
            env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def tether(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tether", *args], env=self.env, cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"tether {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def edge_session(self) -> fleet_pb2.SessionStatus | None:
        """The edge node's session as the gateway reports it (None while it has none)."""
        try:
            with grpc.insecure_channel(self.address) as channel:
                status = fleet_pb2_grpc.FleetStub(channel).Status(fleet_pb2.StatusRequest(), metadata=OPERATOR,
                                                                   timeout=5)
        except grpc.RpcError:
            return None
        return next((s for s in status.sessions if s.labels.get("node") == NODE), None)

    def wait_held_session(self, *, gateway_estop: bool, since: float) -> None:
        """Until the gateway serves a session of the edge node connected after `since` (monotonic) whose
        observations report the edge's latch (and, with `gateway_estop`, the gateway holds it too)."""
        def held():
            s = self.edge_session()
            return (s is not None and s.connected_s <= time.monotonic() - since and s.edge_estopped
                    and (s.estopped or not gateway_estop))
        wait_until(held, timeout=60, what="the edge node's session, held", period=0.1)

    def edge_log(self) -> str:
        return (self.tmp / "edge.log").read_text()

    @staticmethod
    def kill_9(proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def close(self) -> None:
        for proc in (self.edge, self.gateway):
            if proc is not None and proc.poll() is None:
                self.kill_9(proc)


@pytest.fixture
def procs(tmp_path, triton, unused_port, ros_domain):
    p = Processes(tmp_path, triton.grpc_url, unused_port, ros_domain)
    yield p
    p.close()


def held_through(robot: FastDdsRobot, t_from: float, t_to: float) -> list[list[float]]:
    """The commands that arrived in [t_from, t_to); asserts they are all one and the same (none moves)."""
    held = [data for ts, data in list(robot.commands) if t_from <= ts < t_to]
    moved = [i for i, (a, b) in enumerate(zip(held, held[1:], strict=False)) if a != b]
    assert held and not moved, f"{len(moved)} of {len(held)} held commands moved the robot, first at {moved[:3]}"
    return held


def more_commands(robot: FastDdsRobot, after: float, n: int, what: str) -> None:
    wait_until(lambda: len(robot.since(after)) >= n, timeout=60, what=f"{n} commands {what}", period=0.05)


def test_a_gateway_estop_holds_the_robot_through_kill_9_of_the_gateway_until_released(procs):
    procs.start_gateway()
    procs.start_edge()                                       # before the robot: discovery is fastest that way
    robot = FastDdsRobot(procs.domain)
    try:
        robot.wait_moving(after=0.0, n=50, timeout=90)
        procs.tether("estop", "--robot", NODE, "--gateway", procs.address, "--operator", "ada",
                     "--reason", "person in the cell")
        procs.wait_held_session(gateway_estop=True, since=0.0)
        t_held = time.monotonic() + 0.5                      # what was on the wire before has landed by then
        more_commands(robot, t_held, 100, "while held")
        t_kill = time.monotonic()
        procs.kill_9(procs.gateway)
        more_commands(robot, t_kill, 100, "with the gateway dead")   # the edge's own latch holds the robot
        procs.start_gateway()                                # same registry and experience dir
        t_back = time.monotonic()
        procs.wait_held_session(gateway_estop=True, since=t_kill)    # reconnected, held from its first step
        more_commands(robot, time.monotonic(), 200, "after the gateway's restart")
        t_release = time.monotonic()
        held = held_through(robot, t_held, t_release)
        procs.tether("release", "--robot", NODE, "--gateway", procs.address, "--operator", "ada",
                     "--reason", "cell clear")
        t_moved = robot.wait_moving(after=t_release, n=1, timeout=30)
        robot.wait_moving(after=t_moved, n=100, timeout=30)
        after = robot.since(t_moved)[:101]                   # the first 100 periods after the release took effect
        moves = sum(a != b for a, b in zip(after, after[1:], strict=False))
    finally:
        robot.close()
    log = procs.edge_log()
    assert "e-stop latched: the gateway says an operator e-stopped this robot (e-stop estop-" in log, log[-3000:]
    assert "released through the gateway" in log
    assert "ESTOPPED (gateway e-stop estop-" in log                 # the status line names the e-stop it holds for
    print(f"\ngateway e-stop: {len(held)} of {len(held)} commands held (identical) over "
          f"{t_release - t_held:.1f} s, through kill -9 of the gateway ({t_back - t_kill:.1f} s down) and its "
          f"restart; released {t_moved - t_release:.2f} s after `tether release`, then {moves} of the next "
          f"{len(after) - 1} commands moved the robot")


def test_a_local_estop_holds_the_robot_through_kill_9_of_the_edge_node_until_released(procs):
    procs.start_gateway()
    procs.start_edge()
    robot = FastDdsRobot(procs.domain)
    try:
        robot.wait_moving(after=0.0, n=50, timeout=90)
        procs.tether("edge", "estop", "--operator", "ada", "--domain-id", str(procs.domain), "--transport", "dds")
        procs.wait_held_session(gateway_estop=False, since=0.0)
        t_held = time.monotonic() + 0.5
        more_commands(robot, t_held, 100, "while held")
        t_kill = time.monotonic()
        procs.kill_9(procs.edge)
        before = held_through(robot, t_held, t_kill)
        latch = json.loads(procs.latch.read_text())
        assert latch["latched"] and latch["reason"] == "True on /tether/estop", latch
        procs.start_edge()                                   # same latch file
        t_back = time.monotonic()
        wait_until(lambda: "E-STOPPED: True on /tether/estop" in procs.edge_log(), timeout=30,
                   what="the restarted node saying it starts e-stopped")
        procs.wait_held_session(gateway_estop=False, since=t_kill)   # connected again, latched
        more_commands(robot, t_back, 200, "from the restarted node")
        t_release = time.monotonic()
        after_restart = held_through(robot, t_back, t_release)
        with pytest.raises(AssertionError, match="no edge node confirmed"):  # a wrong token releases nothing
            procs.tether("edge", "release", "--operator", "ada", "--token", "ada.not-the-token", "--node", NODE,
                         "--domain-id", str(procs.domain), "--transport", "dds", "--timeout", "1")
        t_release = time.monotonic()
        procs.tether("edge", "release", "--operator", "ada", "--token", procs.token, "--node", NODE, "--reason",
                     "cell clear", "--domain-id", str(procs.domain), "--transport", "dds")
        robot.wait_moving(after=t_release, n=50, timeout=30)
    finally:
        robot.close()
    assert not [data for ts, data in list(robot.commands) if t_back <= ts < t_release and data != after_restart[0]]
    assert not json.loads(procs.latch.read_text())["latched"]
    log = procs.edge_log()                                   # the same session id, its steps where the log left off
    assert f"session {NODE}@" in log and "continues at step" in log and "OUT_OF_ORDER" not in log, log[-3000:]
    print(f"\nlocal e-stop: {len(before)} commands held before kill -9 of the edge node, {len(after_restart)} held "
          f"by the restarted node (identical, no policy action) until the release; then moving again")


def test_the_edge_replays_what_a_killed_gateway_had_not_made_durable(procs):
    """kill -9 of the gateway mid-run, restart on the same experience dir: the edge node's session (same
    id) replays what was not acknowledged durable and goes on; the log holds each of its steps once."""
    report = procs.tmp / "edge_report.json"
    procs.start_gateway()
    procs.start_edge("--session-id", "arm_7@cell", "--summary", str(report))
    robot = FastDdsRobot(procs.domain)
    try:
        robot.wait_moving(after=0.0, n=50, timeout=90)
        wait_until(lambda: (s := procs.edge_session()) is not None and s.steps >= 300, timeout=60,
                   what="300 steps of the edge's session", period=0.05)
        procs.kill_9(procs.gateway)                          # mid-run: steps in flight, some not yet durable
        procs.start_gateway()                                # same port, same experience dir
        t_back = time.monotonic()
        wait_until(lambda: (s := procs.edge_session()) is not None and s.steps >= 300, timeout=60,
                   what="300 steps of the edge's session on the restarted gateway", period=0.05)
        robot.wait_moving(after=t_back, n=50, timeout=30)
        procs.edge.send_signal(signal.SIGTERM)               # a clean stop: the episode ends, the report is written
        assert procs.edge.wait(30) == 0, procs.edge_log()[-3000:]
        procs.gateway.send_signal(signal.SIGTERM)            # the gateway flushes and closes its log
        assert procs.gateway.wait(30) == 0
    finally:
        robot.close()
    link = json.loads(report.read_text())["link"]
    steps = [t.step for t in read_transitions(procs.tmp / "experience") if t.session == "arm_7@cell"]
    duplicates = sorted({s for s in steps if steps.count(s) > 1})
    print(f"\nedge session: {len(steps)} steps logged, {link['replayed']} replayed after the restart, "
          f"{link['late_replies']} late replies dropped, duplicates {duplicates}")
    assert link["reconnects"] == 1 and link["replayed"] >= 1, link    # the replay happened
    assert not duplicates, f"steps logged twice: {duplicates}"
    assert steps == list(range(len(steps))), "a step of the edge's session is missing from the log: " + str(
        [s for s in range(max(steps) + 1) if s not in set(steps)][:20])
    assert len(steps) >= 600

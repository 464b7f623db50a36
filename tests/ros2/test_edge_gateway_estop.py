"""An operator's e-stop through the gateway (tether.v1.Fleet, as `tether estop` and the console send it)
reaches the robot: the edge node sees Action.estop, latches its guard (safe commands on the wire) and
releases that latch when the gateway releases. A robot process on DDS (loopback, its own domain), the
edge node, a real gateway and a real tritonserver serving an echo policy."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from bridge.ros2.guard import GATEWAY_ESTOP
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from protos import fleet_pb2, fleet_pb2_grpc
from tests.ros2.edge_support import const, echo_gateway, release_token, running_edge, wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with echo_gateway(tmp_path_factory.mktemp("estop")) as gw:
        yield gw.address


def test_gateway_estop_latches_the_edge_guard_until_the_gateway_releases(ros_domain, robot, gateway):
    operator = [("x-tether-operator", "ada")]
    with running_edge(ros_domain, gateway, TMAP, policy="echo6", safe_action="zero") as node, \
            grpc.insecure_channel(gateway) as channel:
        fleet = fleet_pb2_grpc.FleetStub(channel)
        const(robot, 0.5)
        t_estop = time.monotonic()
        reply = fleet.EStop(fleet_pb2.EStopRequest(robot="edge_under_test", reason="person in the cell"),
                            metadata=operator)
        assert reply.changed and len(reply.sessions) == 1 and reply.who == "operator:ada"
        # the latch, not a zero command (on a loaded machine that may be the watchdog's alone)
        wait_until(lambda: node.guard.estopped, timeout=10, what="the gateway's e-stop latched at the edge")
        t_latched = time.monotonic()
        stopped = robot.wait_for(lambda d: np.allclose(d, 0.0), after=t_latched, timeout=5, what="the e-stop")
        held = wait_until(lambda: c if len(c := robot.since(t_latched)) >= 15 else None, timeout=10,
                          what="15 commands after the latch")  # a wait on state, not a sleep
        assert all(c["data"] == [0.0] * 6 for c in held), [c for c in held if any(c["data"])][:3]
        assert node.guard.estopped and node.guard.estop_reason == GATEWAY_ESTOP
        session = wait_until(lambda: (s := fleet.Status(fleet_pb2.StatusRequest()).sessions[0]).edge_estopped and s,
                             timeout=10, what="the edge's latch reported (its next observation's GuardReport)")
        assert session.estopped and session.edge_estopped
        t_release = time.monotonic()
        assert fleet.Release(fleet_pb2.EStopRequest(robot="edge_under_test", reason="clear"), metadata=operator).changed
        robot.wait_for(lambda d: np.allclose(d, 0.5), after=t_release, timeout=5, what="actions after release")
        assert not node.guard.estopped and node.guard.counts.estop == 1
    print(f"\ngateway e-stop -> safe command on the robot: {(stopped['t'] - t_estop) * 1e3:.1f} ms")


def test_a_local_estop_outlives_the_gateways_release(ros_domain, robot, gateway, tmp_path):
    """A local e-stop (True on /tether/estop) taken while the gateway's latch holds needs a local
    release: the gateway's release must not lift it."""
    from bridge.ros2.edge import main as edge_cli

    operator = [("x-tether-operator", "ada")]
    tokens, token = release_token(tmp_path)
    with running_edge(ros_domain, gateway, TMAP, policy="echo6", safe_action="zero",
                      config={"release_tokens": tokens}) as node, \
            grpc.insecure_channel(gateway) as channel:
        fleet = fleet_pb2_grpc.FleetStub(channel)
        const(robot, 0.5)
        assert fleet.EStop(fleet_pb2.EStopRequest(robot="edge_under_test", reason="drill"), metadata=operator).changed
        wait_until(lambda: node.guard.estop_reason == GATEWAY_ESTOP, timeout=10, what="the gateway's latch at the edge")
        assert node.guard.estop_reason == GATEWAY_ESTOP
        edge_cli(["estop", "--operator", "ada", "--domain-id", str(ros_domain), "--transport", "dds"])
        assert node.guard.estopped and node.guard.estop_reason != GATEWAY_ESTOP  # the local latch took over
        assert fleet.Release(fleet_pb2.EStopRequest(robot="edge_under_test", reason="drill over"),
                             metadata=operator).changed
        t_release, actions = time.monotonic(), node.stats.actions
        # actions without estop arrive (a wait on state: 20 more reach the guard); the local latch holds through them
        wait_until(lambda: node.stats.actions >= actions + 20, timeout=10, what="20 actions after the release")
        assert node.guard.estopped
        assert all(c["data"] == [0.0] * 6 for c in robot.since(t_release))
        edge_cli(["release", "--operator", "ada", "--token", token, "--node", "edge_under_test",
                  "--domain-id", str(ros_domain), "--transport", "dds"])
        robot.wait_for(lambda d: np.allclose(d, 0.5), after=time.monotonic(), timeout=5, what="actions after the "
                       "local release")
        assert not node.guard.estopped

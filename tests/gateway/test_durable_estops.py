"""An operator's e-stop through real processes: `tether gateway` (a process) in front of a real tritonserver, a
robot's session over loopback gRPC. The e-stop holds through `kill -9` of the gateway and a restart on the same
dirs (a reconnect under a new session id, matched by its robot label, is held from its first step with the same
e-stop id); after a Release, a session whose edge reports that latch gets a policy action that releases exactly it,
also after another kill -9 (the release is the registry's, not the process's memory)."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import numpy as np
import pytest

from bridge.registry import Registry
from protos import bridge_pb2, fleet_pb2, fleet_pb2_grpc
from protos.codec import decode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import start_gateway

pytestmark = pytest.mark.slow
OPERATOR = (("x-tether-operator", "ada"),)  # open access (loopback, no tokens): the name the audit shows


def robot_hello(**labels: str) -> bridge_pb2.Hello:
    h = hello("", obs=OBS, act=ACT, policy="tiny")  # no session id: the gateway gives one, new after a restart
    h.labels.update(labels)
    return h


async def step(s: RawSession, rng, *, latched: str = "") -> tuple[bridge_pb2.Action, np.ndarray]:
    obs = rng.standard_normal(11).astype(np.float32)
    guard = bridge_pb2.GuardReport(gateway_estop=latched, estopped=bool(latched)) if latched else None
    reply = await s.step(obs, step_type=bridge_pb2.FIRST if s.step_index == 0 else bridge_pb2.MID, guard=guard)
    assert reply.WhichOneof("kind") == "action", reply
    return reply.action, obs


def assert_held(action: bridge_pb2.Action, estop_id: str) -> None:
    assert action.estop and action.estop_id == estop_id, action
    assert not decode(action.tensors[0]).any()  # the safe action: zero inside ACT's [-1, 1]


def assert_policy(action: bridge_pb2.Action, obs: np.ndarray, triton, *, released: str = "") -> None:
    assert not action.estop and action.estop_id == "" and action.released_estop == released, action
    np.testing.assert_allclose(decode(action.tensors[0]), triton.expected_action(obs), rtol=1e-5, atol=1e-5)


async def fleet_call(address: str, method: str, request=None):
    async with grpc.aio.insecure_channel(address) as channel:
        stub = fleet_pb2_grpc.FleetStub(channel)
        return await getattr(stub, method)(request or fleet_pb2.StatusRequest(), metadata=OPERATOR, timeout=30)


def kill_9(gateway) -> None:
    os.kill(gateway.pid, signal.SIGKILL)
    gateway.stop()  # reaped


@pytest.mark.parametrize("where", ["registry", "experience_dir"])
def test_an_estop_holds_through_kill_9_and_restart_until_released_on_purpose(triton, tmp_path, unused_port, where):
    """where: the e-stops live in the gateway's --registry file, or (no registry file: an in-memory one) in
    <experience-dir>/.tether/estops.sqlite."""
    registry_file = tmp_path / "registry.sqlite"
    extra = ("--registry", str(registry_file)) if where == "registry" else ()
    kept_in = registry_file if where == "registry" else tmp_path / "experience" / ".tether" / "estops.sqlite"
    address = f"127.0.0.1:{unused_port}"
    rng = np.random.default_rng(0)

    def start():
        return start_gateway(triton.url, tmp_path / "gateway.log", "--experience-dir", tmp_path / "experience", *extra,
                             port=unused_port)

    async def before_the_crash() -> tuple[str, str]:
        async with RawSession(address, robot_hello(robot="arm_7")) as arm, \
                RawSession(address, robot_hello(robot="arm_8")) as other:
            action, obs = await step(arm, rng)
            assert_policy(action, obs, triton)
            reply = await fleet_call(address, "EStop", fleet_pb2.EStopRequest(robot="arm_7",
                                                                              reason="person in the cell"))
            assert reply.changed and list(reply.sessions) == [arm.welcome.session_id] and reply.who == "operator:ada"
            (estop,) = (await fleet_call(address, "Status")).estops
            assert (estop.robot, estop.who, estop.why) == ("arm_7", "operator:ada", "person in the cell")
            assert estop.id.startswith("estop-")
            for _ in range(3):
                assert_held((await step(arm, rng))[0], estop.id)
                action, obs = await step(other, rng)  # another robot goes on
                assert_policy(action, obs, triton)
            return estop.id, arm.welcome.session_id

    async def after_the_restart(estop_id: str, old_session: str) -> None:
        (estop,) = (await fleet_call(address, "Status")).estops  # restored from the registry at start
        assert (estop.id, estop.robot) == (estop_id, "arm_7")
        async with RawSession(address, robot_hello(robot="arm_7")) as arm, \
                RawSession(address, robot_hello(node="arm_7")) as edge, \
                RawSession(address, robot_hello(robot="arm_8")) as other:
            assert arm.welcome.session_id != old_session
            assert_held((await step(arm, rng))[0], estop_id)            # from its first step
            assert_held((await step(edge, rng))[0], estop_id)           # the ROS 2 edge node's node=NAME label
            assert_held((await step(arm, rng, latched=estop_id))[0], estop_id)  # a reported latch releases nothing
            action, obs = await step(other, rng)
            assert_policy(action, obs, triton)
            reply = await fleet_call(address, "Release", fleet_pb2.EStopRequest(robot="arm_7", reason="cell clear"))
            assert reply.changed and list(reply.sessions) == [] and reply.who == "operator:ada"
            assert not (await fleet_call(address, "Status")).estops
            action, obs = await step(arm, rng, latched=estop_id)  # the edge's latch for exactly this e-stop
            assert_policy(action, obs, triton, released=estop_id)
            action, obs = await step(edge, rng)  # no latch reported: a policy action, nothing to release
            assert_policy(action, obs, triton)
            action, obs = await step(edge, rng, latched="estop-999-00000000")  # never issued: never released
            assert_policy(action, obs, triton)

    async def after_another_crash(estop_id: str) -> None:
        async with RawSession(address, robot_hello(robot="arm_7")) as arm:
            action, obs = await step(arm, rng, latched=estop_id)  # an edge that was away during the release
            assert_policy(action, obs, triton, released=estop_id)

    gateway = start()
    try:
        estop_id, old_session = asyncio.run(before_the_crash())
        kill_9(gateway)
        gateway = start()
        asyncio.run(after_the_restart(estop_id, old_session))
        kill_9(gateway)
        gateway = start()
        asyncio.run(after_another_crash(estop_id))
    finally:
        kill_9(gateway)
    with Registry(kept_in) as registry:
        (record,) = [r for r in [registry.estop_record(estop_id)] if r is not None]
        assert (record.target, record.who, record.released_by, record.released_why) == (
            "robot=arm_7", "operator:ada", "operator:ada", "cell clear")
        audited = [(e.kind, e.who, e.detail, e.to_state or e.from_state) for e in registry.events()
                   if e.kind in ("estop", "release")]
    assert audited == [("estop", "operator:ada", "robot=arm_7", estop_id),
                       ("release", "operator:ada", "robot=arm_7", estop_id)]

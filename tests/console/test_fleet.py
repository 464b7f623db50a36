"""tether.v1.Fleet end to end: a real tritonserver, a real gateway, sessions over loopback gRPC, and the
`tether status` / `tether estop` / `tether release` commands against it (in a thread: they block)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from bridge.console import cli
from bridge.console.fleet import Target
from protos import bridge_pb2, fleet_pb2, fleet_pb2_grpc
from protos.codec import decode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession
from tests.support.gateways import running_gateway


def labelled(session_id: str, **labels) -> bridge_pb2.Hello:
    return bridge_pb2.Hello(session_id=session_id, source="test", labels=labels,
                            observation_spec=[s.to_proto() for s in OBS], action_spec=[s.to_proto() for s in ACT])


async def act(s: RawSession, rng, triton, *, held: bool) -> bridge_pb2.Action:
    """One step: held -> the safe action (zeros: inside ACT's [-1, 1]) with estop; else the policy's action."""
    obs = rng.standard_normal(11).astype(np.float32)
    reply = await s.step(obs, step_type=bridge_pb2.FIRST if s.step_index == 0 else bridge_pb2.MID)
    assert reply.WhichOneof("kind") == "action", reply
    a = reply.action
    assert a.estop is held, (s.hello.session_id, a.estop)
    expected = np.zeros(3, np.float32) if held else triton.expected_action(obs)
    np.testing.assert_allclose(decode(a.tensors[0]), expected, rtol=1e-5, atol=1e-5)
    assert bool(a.estop_id) is held
    return a


async def run_cli(command: str, *args: str) -> tuple[int, str]:
    import io
    from contextlib import redirect_stdout

    def call():
        out = io.StringIO()
        with redirect_stdout(out):
            rc = cli.main(command, list(args))
        return rc, out.getvalue()

    return await asyncio.to_thread(call)


def test_status_estop_release_round_trip(triton, capsys):
    async def scenario():
        rng = np.random.default_rng(0)
        async with running_gateway(triton.url, policy="tiny") as gw:
            addr = ["--gateway", gw.address, "--operator", "ada"]
            async with RawSession(gw.address, labelled("arm-a", robot="arm_1")) as a, \
                    RawSession(gw.address, labelled("arm-b", robot="arm_2")) as b:
                for _ in range(3):
                    await act(a, rng, triton, held=False)
                    await act(b, rng, triton, held=False)
                rc, out = await run_cli("status", *addr)
                assert rc == 0 and "arm-a" in out and "robot=arm_1" in out and "tiny v1" in out, out
                rc, out = await run_cli("estop", *addr, "--robot", "arm_1", "--reason", "person in the cell")
                assert rc == 0 and "held now: arm-a" in out and "operator:ada" in out, out
                for _ in range(3):
                    held_by = (await act(a, rng, triton, held=True)).estop_id   # held: safe action, estop=true
                    await act(b, rng, triton, held=False)  # the other robot goes on
                status = gw.fleet.status()
                held = {s.session_id: s.estopped for s in status.sessions}
                assert held == {"arm-a": True, "arm-b": False}
                assert [(e.robot, e.id) for e in status.estops] == [("arm_1", held_by)]  # the durable id
                rc, out = await run_cli("status", *addr)
                assert f"E-STOP latched: robot arm_1 by operator:ada (person in the cell) [{held_by}]" in out, out
                rc, out = await run_cli("release", *addr, "--robot", "arm_1", "--reason", "clear")
                assert rc == 0 and "held now: none" in out, out
                for _ in range(3):
                    await act(a, rng, triton, held=False)
                # --all also holds a session that connects afterwards, until released
                rc, out = await run_cli("estop", *addr, "--all")
                assert rc == 0 and "held now: arm-a, arm-b" in out, out
                async with RawSession(gw.address, labelled("late")) as late:
                    await act(late, rng, triton, held=True)
                    await act(a, rng, triton, held=True)
                    rc, _ = await run_cli("release", *addr, "--all")
                    await act(late, rng, triton, held=False)
                    await act(a, rng, triton, held=False)
            kinds = [(e["kind"], e["who"], e["detail"]) for e in gw.fleet.audit_events()]
            assert kinds == [("estop", "operator:ada", "robot=arm_1"), ("release", "operator:ada", "robot=arm_1"),
                             ("estop", "operator:ada", "all"), ("release", "operator:ada", "all")]
            audited = [(e.kind, e.who, e.detail) for e in gw.registry.events() if e.kind in ("estop", "release")]
            assert audited == kinds  # in the registry's audit log too: it survives a restart
            text = gw.fleet.metrics.exposition().decode()
            assert "tether_estop_steps_total 5.0" in text, text

    asyncio.run(scenario())


def test_bad_estop_requests_are_refused_with_the_reason(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = fleet_pb2_grpc.FleetStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.EStop(fleet_pb2.EStopRequest())
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "exactly one of session_id, robot or all" in err.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.EStop(fleet_pb2.EStopRequest(robot="x" * 500))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 128" in err.value.details()
                reply = await stub.Release(fleet_pb2.EStopRequest(session_id="nobody"))
                assert not reply.changed and not gw.fleet.estops

    asyncio.run(scenario())
    with pytest.raises(SystemExit) as exit_:
        cli.main("estop", ["--gateway", "127.0.0.1:1"])
    assert exit_.value.code == 2  # argparse: one of --session/--robot/--all is required


def test_vector_session_held_rows_and_guard_reports_counted(triton):
    """A vectorised session under e-stop gets N safe rows; the edge's guard reports become counter deltas."""
    n = 4
    vector_hello = bridge_pb2.Hello(session_id="vec", source="test", num_envs=n, labels={"robot": "rack"},
                                    observation_spec=[s.to_proto() for s in OBS],
                                    action_spec=[s.to_proto() for s in ACT])

    def observation(step: int, rng, clamped: int) -> bridge_pb2.ClientMessage:
        from protos.codec import encode

        obs = bridge_pb2.Observation(step=step, tensors=[encode("observation", rng.standard_normal((n, 11))
                                                                .astype(np.float32))],
                                     env_step_types=[bridge_pb2.FIRST if step == 0 else bridge_pb2.MID] * n,
                                     guard=bridge_pb2.GuardReport(clamped=clamped, watchdog=1))
        return bridge_pb2.ClientMessage(observation=obs)

    async def scenario():
        rng = np.random.default_rng(1)
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                from protos import bridge_pb2_grpc

                call = bridge_pb2_grpc.BridgeStub(channel).Connect()
                await call.write(bridge_pb2.ClientMessage(hello=vector_hello))
                assert (await call.read()).WhichOneof("kind") == "welcome"
                held = []
                for step in range(6):
                    if step == 2:
                        await gw.fleet.estop(Target(robot="rack"), who="operator:test", why="test")
                    if step == 4:
                        await gw.fleet.release(Target(robot="rack"), who="operator:test", why="test")
                    await call.write(observation(step, rng, clamped=3 * step))
                    reply = (await call.read()).action
                    rows = decode(reply.tensors[0])
                    assert rows.shape == (n, 3)
                    held.append(reply.estop)
                    assert reply.estop_id == (gw.fleet.estops["robot=rack"].id if reply.estop else "")
                    if reply.estop:
                        assert not rows.any()
                    else:
                        assert rows.any()
                await call.done_writing()
            assert held == [False, False, True, True, False, False]
            text = gw.fleet.metrics.exposition().decode()
            assert 'tether_guard_interventions_total{kind="clamped"} 15.0' in text  # 0, 3, ..., 15: deltas
            assert 'tether_guard_interventions_total{kind="watchdog"} 1.0' in text
            assert "tether_estop_steps_total 8.0" in text  # 2 held steps x 4 envs

    asyncio.run(scenario())


def test_estop_needs_an_operator_token_when_tokens_are_configured(triton, tmp_path):
    from bridge.security.tokens import TokenStore

    store = TokenStore(tmp_path / "tokens.json")
    alice, bob = store.add("alice", role="operator"), store.add("bob", role="viewer")

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json") as gw:
            target = ["--gateway", gw.address, "--robot", "arm_1"]
            rc, _ = await run_cli("estop", *target)
            assert rc == 1 and not gw.fleet.estops
            rc, _ = await run_cli("estop", *target, "--token", bob)
            assert rc == 1 and not gw.fleet.estops
            rc, out = await run_cli("status", "--gateway", gw.address, "--token", bob)  # a viewer may look
            assert rc == 0 and "0 sessions" in out, out
            # the audit records who the token proves, never a name the client writes (x-tether-operator)
            rc, out = await run_cli("estop", *target, "--token", alice, "--operator", "mallory", "--reason", "drill")
            assert rc == 0 and "by operator:alice" in out and "robot=arm_1" in gw.fleet.estops, out
            assert gw.fleet.estops["robot=arm_1"].who == "operator:alice"
            rc, out = await run_cli("release", *target, "--token", alice, "--operator", "mallory")
            assert rc == 0 and "released by operator:alice" in out, out
            return [(e["kind"], e["who"], e["why"]) for e in gw.fleet.audit_events()]

    assert asyncio.run(scenario()) == [("estop", "operator:alice", "drill"), ("release", "operator:alice", "")]

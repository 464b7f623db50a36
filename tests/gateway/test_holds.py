"""The gateway's hold API (session.holds) through tether.v1.Fleet and Bridge.Connect on a real gateway in front
of a real tritonserver: which e-stop holds a session, releases only of the e-stop the edge reports, a registry that
cannot record (held anyway, a release only once audited), bounded reasons refused before anything changes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import grpc
import numpy as np
import pytest

from protos import bridge_pb2, fleet_pb2, fleet_pb2_grpc
from protos.codec import decode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway


def robot_hello(session_id: str, **labels: str) -> bridge_pb2.Hello:
    h = hello(session_id, obs=OBS, act=ACT, policy="tiny")
    h.labels.update(labels)
    return h


async def step(s: RawSession, *, latched: str = "") -> bridge_pb2.Action:
    guard = bridge_pb2.GuardReport(gateway_estop=latched, estopped=bool(latched)) if latched else None
    obs = np.full(11, 0.1 * s.step_index, np.float32)
    reply = await s.step(obs, step_type=bridge_pb2.FIRST if s.step_index == 0 else bridge_pb2.MID, guard=guard)
    assert reply.WhichOneof("kind") == "action", reply
    return reply.action


async def call(stub, method: str, **request) -> fleet_pb2.EStopReply:
    return await getattr(stub, method)(fleet_pb2.EStopRequest(**request), timeout=30)


@contextlib.asynccontextmanager
async def arm_1_session(triton, **config):
    """A gateway (`config`: its fields), a Fleet stub on it and a session of robot arm_1's: (gw, fleet, arm)."""
    async with running_gateway(triton.url, policy="tiny", **config) as gw, \
            grpc.aio.insecure_channel(gw.address) as channel, \
            RawSession(gw.address, robot_hello("arm", robot="arm_1")) as arm:
        yield gw, fleet_pb2_grpc.FleetStub(channel), arm


def test_a_session_held_by_another_estop_gets_that_id_and_a_release_names_only_the_reported_latch(triton):
    async def scenario():
        async with arm_1_session(triton) as (gw, fleet, arm):
            await call(fleet, "EStop", robot="arm_1", reason="first")
            first = gw.fleet.estops["robot=arm_1"].id
            assert (a := await step(arm)).estop and a.estop_id == first
            await call(fleet, "EStop", all=True, reason="second")
            second = gw.fleet.estops["all"].id
            assert (a := await step(arm)).estop and a.estop_id == second  # "all" first
            assert (await call(fleet, "Release", robot="arm_1", reason="")).changed
            a = await step(arm, latched=first)  # the edge's latch is for a released e-stop, but "all" still holds
            assert a.estop and a.estop_id == second and a.released_estop == ""
            assert (await call(fleet, "Release", all=True)).changed
            a = await step(arm, latched=first)
            assert not a.estop and a.released_estop == first and decode(a.tensors[0]).any()
            a = await step(arm, latched=second)
            assert not a.estop and a.released_estop == second
            a = await step(arm)  # nothing reported: nothing released
            assert not a.estop and a.released_estop == ""

    asyncio.run(scenario())


def test_an_estop_the_registry_cannot_record_holds_anyway_and_a_release_waits_for_its_audit(triton, tmp_path):
    path = tmp_path / "registry.sqlite"

    def refuse_audits(refuse: bool) -> None:
        with sqlite3.connect(path) as db:
            if refuse:
                db.execute("CREATE TRIGGER no_audit BEFORE INSERT ON events WHEN NEW.kind IN ('estop', 'release') "
                           "BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
            else:
                db.execute("DROP TRIGGER no_audit")

    async def scenario():
        async with arm_1_session(triton, registry=path) as (gw, fleet, arm):
            refuse_audits(True)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(fleet, "EStop", robot="arm_1", reason="person in the cell")
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "memory only" in refused.value.details() and "disk gone" in refused.value.details()
            volatile = gw.fleet.estops["robot=arm_1"].id
            assert volatile.startswith("volatile-")
            assert (a := await step(arm)).estop and a.estop_id == volatile  # it holds all the same
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(fleet, "Release", robot="arm_1", reason="cell clear")
            assert "disk gone" in refused.value.details()
            assert (a := await step(arm, latched=volatile)).estop and a.released_estop == ""  # not released
            refuse_audits(False)
            assert (await call(fleet, "Release", robot="arm_1", reason="cell clear")).changed
            a = await step(arm, latched=volatile)
            assert not a.estop and a.released_estop == volatile
            assert [(e.kind, e.why) for e in gw.registry.events() if e.kind in ("estop", "release")] == [
                ("release", "cell clear")]  # the one change that could be audited

    asyncio.run(scenario())


def test_bad_reasons_are_refused_before_anything_changes(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw, \
                grpc.aio.insecure_channel(gw.address) as channel:
            fleet = fleet_pb2_grpc.FleetStub(channel)
            await call(fleet, "EStop", robot="arm_1", reason="standing")
            before = (gw.fleet.estops, gw.registry.events())
            for method, reason in (("EStop", "x" * 513), ("Release", "x" * 513), ("Release", "two\nlines")):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(fleet, method, robot="arm_1", reason=reason)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "why (the reason)" in refused.value.details()
                assert (gw.fleet.estops, gw.registry.events()) == before

    asyncio.run(scenario())


def test_a_step_inferred_while_an_estop_is_latched_is_held_too(triton):
    async def scenario():
        async with arm_1_session(triton) as (gw, fleet, arm):
            assert not (await step(arm)).estop
            inferring, go_on, infer = asyncio.Event(), asyncio.Event(), gw.batcher.infer

            async def held_back(*args, **kwargs):  # the step's inference waits until the e-stop is latched
                inferring.set()
                await go_on.wait()
                return await infer(*args, **kwargs)

            gw.batcher.infer = held_back
            stepping = asyncio.create_task(step(arm))
            await asyncio.wait_for(inferring.wait(), 30)
            await call(fleet, "EStop", robot="arm_1", reason="during inference")
            go_on.set()
            a = await stepping
            assert a.estop and a.estop_id == gw.fleet.estops["robot=arm_1"].id and not decode(a.tensors[0]).any()

    asyncio.run(scenario())

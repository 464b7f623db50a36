"""Session ownership in one real gateway (real Triton, a registry file): every Hello claims the session id
(Welcome.owner_epoch, .gateway_id), every logged transition carries the epoch, single and vectorised sessions
are acknowledged while the claim is current; once another gateway claims the id (here: its claim written to
the shared store directly), nothing more of it is acknowledged and its stream ends ABORTED (fenced)."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from bridge.experience import read_transitions
from bridge.registry.ownership import SqliteOwnership
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.support.gateways import running_gateway
from tests.support.waiting import until


async def _open(address: str, msg: bridge_pb2.Hello):
    channel = grpc.aio.insecure_channel(address)
    call = bridge_pb2_grpc.BridgeStub(channel).Connect()
    await call.write(bridge_pb2.ClientMessage(hello=msg))
    return channel, call, (await call.read()).welcome


async def _step(call, step: int, rows: int = 0) -> bridge_pb2.ServerMessage:
    shape = (rows, 11) if rows else (11,)
    obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(),
                                 step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                                 tensors=[encode("observation", np.full(shape, 0.01 * step, np.float32))])
    if rows:
        obs.env_step_types.extend([obs.step_type] * rows)
        obs.env_rewards.extend([0.0] * rows)
        obs.env_terminated.extend([False] * rows)
        obs.env_truncated.extend([False] * rows)
    await call.write(bridge_pb2.ClientMessage(observation=obs))
    return await call.read()


def test_claims_stamp_the_log_and_a_newer_claim_fences_the_session(triton, tmp_path):
    registry, log_dir = tmp_path / "registry.sqlite", tmp_path / "experience"

    async def scenario():
        async with running_gateway(triton.url, policy=triton.policy, experience_dir=log_dir, registry=registry,
                                   gateway_id="gw-a", fsync_interval_ms=1.0) as gw:
            one = await _open(gw.address, hello("robot-1", obs=OBS, act=ACT))
            vec_hello = hello("vec-1", obs=OBS, act=ACT)
            vec_hello.num_envs, vec_hello.batched = 2, True
            vec = await _open(gw.address, vec_hello)
            assert (one[2].owner_epoch, one[2].gateway_id, vec[2].owner_epoch) == (1, "gw-a", 1)
            durable, step = [0, 0], 0
            while min(durable) < 4:  # acknowledged while the claim is current
                assert step < 500, durable
                a, v = await _step(one[1], step), await _step(vec[1], step, rows=2)
                assert (a.WhichOneof("kind"), v.WhichOneof("kind")) == ("action", "action")
                durable, step = [a.durable_through, v.durable_through], step + 1
                await asyncio.sleep(0.01)
            other = SqliteOwnership(registry)
            assert other.claim("robot-1", owner="gw-b").epoch == 2  # the client moved: gw-b holds it now
            other.close()
            vec_step, end = step, None
            while end is None and step < 200:  # the next group commit's check finds epoch 1 stale
                try:
                    reply = await _step(one[1], step)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):  # ended: its status says how
                    reply = grpc.aio.EOF
                if reply is grpc.aio.EOF:
                    end = (await one[1].code(), await one[1].details())
                else:
                    assert reply.durable_through <= step  # never past what was current
                    step += 1
                    await asyncio.sleep(0.01)
            assert end is not None and end[0] == grpc.StatusCode.ABORTED and "stale (fenced)" in end[1], end
            await until(lambda: gw.owners.fenced_sessions == 1, "gw-a fenced robot-1")
            assert vec[1].done() is False, (await vec[1].code(), await vec[1].details())
            assert (await _step(vec[1], vec_step, rows=2)).WhichOneof("kind") == "action"  # the other one goes on
            for channel, call, _ in (one, vec):
                call.cancel()
                await channel.close()
            return gw.experience.stats

    stats = asyncio.run(scenario())
    records = list(read_transitions(log_dir))
    assert {t.owner_epoch for t in records} == {1}
    assert {t.session for t in records} == {"robot-1", "vec-1/0", "vec-1/1"}
    assert stats.fenced >= 1


@pytest.mark.parametrize("flag", [["--gateway-id", "gw-7", "--drain-grace-s", "0.5"]])
def test_flags(flag):
    from bridge.gateway.cli import parse_args
    from bridge.gateway.config import from_arguments

    config = from_arguments(parse_args(["--triton", "127.0.0.1:8001", *flag]))
    assert (config.gateway_id, config.drain_grace_s) == ("gw-7", 0.5)


def test_back_on_a_gateway_after_another_owned_the_session_its_log_takes_the_replay_again(triton, tmp_path):
    """gw-a logged robot-2's steps under epoch 1; gw-b owned it since (epoch 2); back on gw-a (epoch 3) the old
    records are another epoch's: Welcome says nothing is durable here, and a Replay of an old step is logged
    again under epoch 3 (not answered as a duplicate)."""
    registry, log_dir = tmp_path / "registry.sqlite", tmp_path / "experience"

    async def scenario():
        async with running_gateway(triton.url, policy=triton.policy, experience_dir=log_dir, registry=registry,
                                   gateway_id="gw-a", fsync_interval_ms=1.0) as gw:
            channel, call, welcome = await _open(gw.address, hello("robot-2", obs=OBS, act=ACT))
            replies = [await _step(call, step) for step in range(6)]
            await call.done_writing()
            await channel.close()
            await until(lambda: gw.experience.durable_step("robot-2") == 4, "steps 0..4 durable on gw-a")
            other = SqliteOwnership(registry)
            assert other.claim("robot-2", owner="gw-b").epoch == 2
            other.close()
            channel, call, welcome = await _open(gw.address, hello("robot-2", obs=OBS, act=ACT))
            assert (welcome.owner_epoch, welcome.durable_through) == (3, 0)
            action = replies[3].action
            nxt = bridge_pb2.Observation(step=4, step_type=bridge_pb2.MID,
                                         tensors=[encode("observation", np.full(11, 0.04, np.float32))])
            obs = bridge_pb2.Observation(step=3, step_type=bridge_pb2.MID,
                                         tensors=[encode("observation", np.full(11, 0.03, np.float32))])
            await call.write(bridge_pb2.ClientMessage(replay=bridge_pb2.Replay(observation=obs, action=action,
                                                                              next=nxt)))
            replayed = (await call.read()).replayed
            assert (replayed.step, replayed.duplicate) == (3, False)
            await until(lambda: gw.experience.durable_step("robot-2") == 3, "the replayed step durable again")
            call.cancel()
            await channel.close()

    asyncio.run(scenario())
    records = [(t.step, t.owner_epoch) for t in read_transitions(log_dir) if t.session == "robot-2"]
    assert records == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (3, 3)]

"""A reconnect with a stable session id takes the session over (real gateway, real Triton, real gRPC): a robot
back from a power loss (no TCP close) says Hello with its id while the gateway still holds the old stream (gRPC
keepalive notices a dead peer only after ~30 s). From the same identity (the token's; without credentials, the
same peer host) the new stream is welcomed at once with `next_step` = the last step + 1, the old stream ends
with ABORTED "superseded by a new connection of the same session", and nothing of the old one is logged after
the takeover. Another identity is refused: PERMISSION_DENIED with credentials (before any epoch moves;
tests/fleet/test_session_identity.py), ALREADY_EXISTS without."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
import numpy as np

from bridge.client import Credentials, aio_channel
from bridge.experience import read_transitions
from bridge.gateway.session.limits import Limits
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.support.gateways import running_gateway, token_gateway
from tests.support.waiting import until

SUPERSEDED = "superseded by a new connection of the same session"


class Stream:
    """One Connect stream on `channel`: the Welcome, then one reply per step."""

    @classmethod
    async def open(cls, channel: grpc.aio.Channel, session_id: str) -> Stream:
        self = cls()
        self.call = bridge_pb2_grpc.BridgeStub(channel).Connect()
        await self.call.write(bridge_pb2.ClientMessage(hello=hello(session_id, obs=OBS, act=ACT)))
        reply = await self.call.read()
        if reply is grpc.aio.EOF:
            raise grpc.aio.AioRpcError(await self.call.code(), None, None, await self.call.details())
        self.welcome = reply.welcome
        return self

    async def step(self, step: int) -> bridge_pb2.ServerMessage:
        obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(),
                                     step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                                     tensors=[encode("observation", np.full(11, 0.01 * step, np.float32))])
        await self.call.write(bridge_pb2.ClientMessage(observation=obs))
        return await self.call.read()

    async def ended(self) -> grpc.aio.AioRpcError:
        """How the gateway ended this stream (after a step sent on it, as the old robot's link would)."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.write(bridge_pb2.ClientMessage(observation=bridge_pb2.Observation(
                step=100, tensors=[encode("observation", np.zeros(11, np.float32))])))
        try:
            reply = await asyncio.wait_for(self.call.read(), 30)
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError(f"the old stream still answers after the takeover: {reply}")


def test_the_same_identity_takes_its_session_over_and_the_old_stream_ends_fenced(triton, tmp_path, caplog):
    log_dir = tmp_path / "experience"

    async def scenario():
        # one session per source: the reconnect must not count against the slot its dead stream holds
        async with running_gateway(triton.url, policy="tiny", experience_dir=log_dir, fsync_interval_ms=0,
                                   limits=Limits(max_sessions_per_source=1)) as gw:
            old_channel, new_channel = grpc.aio.insecure_channel(gw.address), grpc.aio.insecure_channel(gw.address)
            try:
                old = await Stream.open(old_channel, "node@host")
                assert old.welcome.next_step == 0
                for step in range(5):
                    assert (await old.step(step)).WhichOneof("kind") == "action"
                # the power loss: the old stream is neither closed nor cancelled; the robot says Hello again
                taken = gw.sessions["node@host"]
                new = await Stream.open(new_channel, "node@host")
                assert taken.superseded and not taken.recorder.logging  # fenced: it appends nothing more
                assert new.welcome.session_id == "node@host" and new.welcome.next_step == 5, new.welcome
                assert new.welcome.durable_through <= 5
                ended = await old.ended()
                for step in range(5, 10):
                    assert (await new.step(step)).WhichOneof("kind") == "action"
                assert list(gw.sessions) == ["node@host"] and len(gw.admission) == 1
                await new.call.done_writing()
            finally:
                await old_channel.close()
                await new_channel.close()
            await until(lambda: not gw.sessions, "the gateway closed the new stream")
            return ended

    with caplog.at_level(logging.INFO, logger="tether.gateway"):
        ended = asyncio.run(scenario())
    assert ended.code() == grpc.StatusCode.ABORTED and SUPERSEDED in ended.details(), ended
    assert any("taken over by a new connection" in r.getMessage() for r in caplog.records), caplog.text
    steps = [t.step for t in read_transitions(log_dir) if t.session == "node@host"]
    # each step once; step 4's transition died with the old stream (its successor came to the new one) and
    # nothing the old stream sent after the takeover (step 100) is there; step 9 waits for its successor
    assert sorted(steps) == [0, 1, 2, 3, 5, 6, 7, 8], steps


def test_with_tokens_only_the_same_robot_takes_its_session_over(triton, tmp_path):
    async def scenario():
        async with token_gateway(triton.url, tmp_path, "arm_1", "arm_2") as (gw, tokens):
            async with aio_channel(gw.address, Credentials(token=tokens["arm_1"])) as first_channel, \
                    aio_channel(gw.address, Credentials(token=tokens["arm_2"])) as other_channel, \
                    aio_channel(gw.address, Credentials(token=tokens["arm_1"])) as again_channel:
                first = await Stream.open(first_channel, "X")
                for step in range(3):
                    assert (await first.step(step)).WhichOneof("kind") == "action"
                try:
                    await Stream.open(other_channel, "X")
                    raise AssertionError("another robot took session X over")
                except grpc.aio.AioRpcError as exc:
                    refused = exc
                assert (await first.step(3)).WhichOneof("kind") == "action"  # untouched by the refusal
                again = await Stream.open(again_channel, "X")
                assert again.welcome.next_step == 4, again.welcome
                ended = await first.ended()
                assert (await again.step(4)).WhichOneof("kind") == "action"
                assert gw.admission.source("X") == "robot:arm_1"
                await again.call.done_writing()
            return refused, ended

    refused, ended = asyncio.run(scenario())
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, refused
    assert "'X' is already connected under another identity: robot:arm_2 may not" in refused.details()
    assert ended.code() == grpc.StatusCode.ABORTED and SUPERSEDED in ended.details(), ended

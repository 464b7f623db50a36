"""A minimal raw client of tether.v1.Bridge for gateway tests: no sim package in between."""

from __future__ import annotations

import time

import grpc
import numpy as np

from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode


class RawSession:
    """`async with RawSession(addr, hello) as s: reply = await s.step(obs_array)`"""

    def __init__(self, address: str, hello: bridge_pb2.Hello):
        self.address, self.hello = address, hello
        self.step_index = 0

    async def __aenter__(self):
        self.channel = grpc.aio.insecure_channel(self.address)
        self.call = bridge_pb2_grpc.BridgeStub(self.channel).Connect()
        await self.call.write(bridge_pb2.ClientMessage(hello=self.hello))
        reply = await self.call.read()
        if reply is grpc.aio.EOF:
            await self.call.code()
        self.welcome = reply.welcome
        return self

    async def __aexit__(self, *exc):
        await self.call.done_writing()
        await self.channel.close()

    async def send(self, tensors, *, step_type=bridge_pb2.MID, reward=0.0, step=None,
                   guard: bridge_pb2.GuardReport | None = None) -> bridge_pb2.ServerMessage:
        step = self.step_index if step is None else step
        self.step_index = step + 1
        obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), step_type=step_type,
                                     tensors=tensors, reward=reward, guard=guard)
        await self.call.write(bridge_pb2.ClientMessage(observation=obs))
        return await self.call.read()

    async def step(self, observation: np.ndarray, **kw) -> bridge_pb2.ServerMessage:
        return await self.send([encode("observation", observation)], **kw)


def hello(session_id: str = "", *, obs, act, policy: str = "") -> bridge_pb2.Hello:
    return bridge_pb2.Hello(session_id=session_id, policy=policy, source="test",
                            observation_spec=[s.to_proto() for s in obs],
                            action_spec=[s.to_proto() for s in act])


"""The fuzzing client of tests/gateway/test_fuzz.py, in its own process (the gateway's event loop
runs only the gateway and the steady session it measures):

    python -m tests.gateway.fuzz_client 127.0.0.1:50051 --total 100000 --workers 6 --seed 0
    python -m tests.gateway.fuzz_client 127.0.0.1:50051 --total 8 --large-mb 32     # large tensors

Prints one JSON line: messages sent, reply kinds, how streams ended. Streams, several at a time:
- typed: a valid Hello, then hundreds of observations mutated at random (NaN/inf, wrong dtype codes,
  wrong and huge shapes, byte counts that do not match, missing/extra/duplicate/odd tensor names,
  out-of-order and huge steps, unknown step types, non-finite rewards, garbage replays, large
  tensors), pipelined: written while the replies are read;
- raw: a valid Hello, then mutated serialized messages (bit flips, truncations, junk, random bytes):
  garbage protobuf through a generic stream call;
- hello: one mutated Hello (specs, names, strings, num_envs, duplicate ids, the steady session's id);
- ending: a valid session whose stream goes on with something that is not an observation.
Messages are generated once into a pool and sent as bytes (the pool's observations get the stream's
next step by protobuf merge: concatenated messages merge, the last scalar wins), so the client
spends its time sending, not building messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc
import numpy as np

from protos import bridge_pb2, tensor_pb2
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello

CONNECT = "/tether.v1.Bridge/Connect"
POOL = 3000
# what grpc.aio reports on a client that kept writing after the server ended the stream (a failed
# write batch on this side; the gateway's own status is checked in its log by the test)
CLIENT_WRITE_FAILED = "Internal error from Core"


def _tensor(rng, name="observation") -> tensor_pb2.Tensor:
    return encode(name, rng.standard_normal(11).astype(np.float32))


def mutated_observation(rng, step: int, *, large: bool = False) -> bridge_pb2.ClientMessage:
    """A mostly-bad observation (about one in six is valid)."""
    obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), step_type=bridge_pb2.MID,
                                 tensors=[_tensor(rng)])
    t = obs.tensors[0]
    kind = int(rng.integers(0, 18))
    if kind == 1:
        t.data = np.full(11, np.nan if rng.random() < 0.5 else np.inf, np.float32).tobytes()
    elif kind == 2:
        t.dtype = int(rng.choice([tensor_pb2.FLOAT64, tensor_pb2.INT32, tensor_pb2.UINT8, 0, 99, -1, 2**31 - 1]))
    elif kind == 3:
        shape = rng.integers(0, 20, size=int(rng.integers(0, 5)))
        t.ClearField("shape")
        t.shape.extend(int(d) for d in shape)
        t.data = rng.bytes(int(np.prod(shape)) * 4)
    elif kind == 4:
        t.ClearField("shape")
        t.shape.extend([2**40, 2**40, -(2**62)][: int(rng.integers(1, 4))])
    elif kind == 5:
        t.data = rng.bytes(int(rng.integers(0, 200)))
    elif kind == 6:
        del obs.tensors[:]
    elif kind == 7:
        obs.tensors.append(_tensor(rng, "observation" if rng.random() < 0.5 else "camera"))
    elif kind == 8:
        t.name = rng.choice(["", "obs", "observation\x00", "é" * 300])
    elif kind == 9:
        obs.step = max(0, step - int(rng.integers(1, 6)))   # out of order (or a repeat)
    elif kind == 10 and rng.random() < 0.02:
        obs.step = 2**64 - 1 - int(rng.integers(0, 3))   # every later step of the stream is out of order
    elif kind == 11:
        obs.step_type = int(rng.choice([0, 1, 3, 7, -5]))
    elif kind == 12:
        obs.reward = float(rng.choice([np.nan, np.inf, -np.inf, 1e308]))
    elif kind == 13:
        replay = bridge_pb2.Replay(observation=obs, action=bridge_pb2.Action(step=step, tensors=[_tensor(rng, "x")]))
        if rng.random() < 0.5:
            replay.next.CopyFrom(bridge_pb2.Observation(step=step + 1, tensors=[_tensor(rng)]))
        return bridge_pb2.ClientMessage(replay=replay)
    elif kind == 14 and large:
        t.data = rng.bytes(2 << 20)                       # a large tensor that does not fit its shape
    elif kind == 15:
        obs.applied_action.append(_tensor(rng, "action"))
        obs.guard.clamped = int(rng.integers(0, 2**31))
    elif kind == 16:
        obs.step_type = bridge_pb2.LAST
        obs.terminated = bool(rng.random() < 0.5)
    return bridge_pb2.ClientMessage(observation=obs)


def mutated_hello(rng, i: int) -> bridge_pb2.Hello:
    msg = hello(f"fz-h{i}", obs=OBS, act=ACT)
    kind = int(rng.integers(0, 12))
    if kind == 0:
        msg.observation_spec[0].shape.append(int(rng.choice([2**40, 0, 7])))
    elif kind == 1:
        msg.observation_spec[0].dtype = int(rng.choice([0, 99, -3]))
    elif kind == 2:
        msg.observation_spec.add().CopyFrom(msg.observation_spec[0])    # duplicate names
    elif kind == 3:
        del msg.action_spec[:]
    elif kind == 4:
        msg.num_envs = int(rng.choice([2, 4, 2**31, 2**32 - 1]))
        msg.batched = bool(rng.random() < 0.5)
    elif kind == 5:
        msg.policy = rng.choice(["nope", "../../etc", "tiny\x00", "t" * 5000])
    elif kind == 6:
        # "fz-dup": fuzz streams take it over from each other (the same host: the old stream ends ABORTED); never
        # "steady": from this host, a Hello with its id would take the steady session over
        msg.session_id = rng.choice(["fz-dup", "", "x" * 10_000, "\x1b[2J", "fz h"])
    elif kind == 7:
        msg.labels.update({rng.choice(["", "k", "\n"]): "v" * int(rng.integers(0, 1000))})
    elif kind == 8:
        msg.source = rng.bytes(40).decode("latin-1")
    elif kind == 9:
        msg.observation_spec[0].name = ""
    elif kind == 10:
        msg.observation_spec[0].low.extend([float("nan")] * 3)
    return msg


class Fuzzer:
    def __init__(self, address: str, *, total: int, seed: int):
        self.address, self.left, self.sent = address, total, 0
        self.counts: dict[str, int] = {}
        self.codes: dict[str, int] = {}
        self.errors: dict[str, int] = {}  # step errors by code
        self.unexpected: list[str] = []   # details of streams that ended with UNKNOWN or INTERNAL
        rng = np.random.default_rng(seed)
        self.pool: list[tuple[bytes, str]] = []   # (serialized ClientMessage, how it takes the stream's step)
        for i in range(POOL):
            message = mutated_observation(rng, 1 + i, large=i < 2)
            if message.HasField("replay"):
                follows = "replay"
            elif message.observation.step < 1 + i:
                follows = f"behind:{1 + i - message.observation.step}"   # that many steps behind the stream's
            else:
                follows = "observation" if message.observation.step == 1 + i else ""  # else: its own huge step
            self.pool.append((message.SerializeToString(), follows))
        self.steps = {  # merged after a pooled message, these set its step (the last scalar wins)
            "observation": [bridge_pb2.ClientMessage(observation=bridge_pb2.Observation(step=s)).SerializeToString()
                            for s in range(1000)],
            "replay": [bridge_pb2.ClientMessage(replay=bridge_pb2.Replay(observation=bridge_pb2.Observation(
                step=s))).SerializeToString() for s in range(1000)]}
        self.valid = bridge_pb2.ClientMessage(observation=bridge_pb2.Observation(
            step=1, tensors=[_tensor(rng)])).SerializeToString()

    def take(self, n: int) -> int:
        n = max(0, min(n, self.left))
        self.left -= n
        return n

    def _ended(self, kind: str, code: str) -> None:
        key = f"{kind}:{code}"
        self.codes[key] = self.codes.get(key, 0) + 1

    async def _stream(self, channel, kind: str, frames: list[bytes]) -> None:
        call = channel.stream_stream(CONNECT, response_deserializer=bridge_pb2.ServerMessage.FromString)()
        reader = asyncio.create_task(self._drain(call))
        written, cut = 0, False
        try:
            for frame in frames:
                await call.write(frame)
                written += 1
            await call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            cut = True  # the gateway ended the stream (as it should for garbage): stop writing
        self.sent += written
        await asyncio.wait_for(reader, 120)
        code, details = await call.code(), await call.details()
        if cut and code == grpc.StatusCode.INTERNAL and details == CLIENT_WRITE_FAILED:
            self._ended(kind, "CUT")  # this client's own failed write, not a status from the gateway
            return
        self._ended(kind, code.name)
        if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
            self.unexpected.append(f"{kind}: {code.name}: {details}")

    async def _drain(self, call) -> None:
        while True:
            try:
                reply = await call.read()
            except grpc.aio.AioRpcError:
                return
            if reply is grpc.aio.EOF:
                return
            kind = reply.WhichOneof("kind")
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind == "error":
                code = bridge_pb2.StepError.Code.Name(reply.error.code)
                self.errors[code] = self.errors.get(code, 0) + 1

    def _hello(self, sid: str) -> bytes:
        return bridge_pb2.ClientMessage(hello=hello(sid, obs=OBS, act=ACT)).SerializeToString()

    async def typed(self, channel, rng, sid: str) -> None:
        n = self.take(int(rng.integers(200, 900)))
        frames = [self._hello(sid)]
        for step, i in enumerate(rng.integers(0, POOL, size=max(0, n - 1)), start=1):
            data, follows = self.pool[i]
            if follows.startswith("behind:"):
                data += self.steps["observation"][max(1, step - int(follows[7:]))]
            elif follows:
                data += self.steps[follows][step]
            frames.append(data)
        await self._stream(channel, "typed", frames)

    async def raw(self, channel, rng, sid: str) -> None:
        n = self.take(int(rng.integers(2, 40)))
        frames = [self._hello(sid)]
        for _ in range(n - 1):
            b = bytearray(self.valid)
            kind = int(rng.integers(0, 5))
            if kind == 0:
                for pos in rng.integers(0, len(b), size=int(rng.integers(1, 6))):
                    b[pos] ^= 1 << int(rng.integers(0, 8))
            elif kind == 1:
                b = b[: int(rng.integers(0, len(b)))]
            elif kind == 2:
                b += rng.bytes(int(rng.integers(1, 64)))
            elif kind == 3:
                b = bytearray(rng.bytes(int(rng.integers(0, 256))))
            frames.append(bytes(b))
        await self._stream(channel, "raw", frames)

    async def hellos(self, channel, rng, i: int) -> None:
        self.take(1)
        frames = [bridge_pb2.ClientMessage(hello=mutated_hello(rng, i)).SerializeToString()]
        if rng.random() < 0.5:
            frames.append(self.pool[int(rng.integers(0, POOL))][0])
        await self._stream(channel, "hello", frames)

    async def ending(self, channel, rng, sid: str) -> None:
        self.take(2)
        last = self._hello(sid + "x") if rng.random() < 0.5 else b""
        await self._stream(channel, "ending", [self._hello(sid), last])

    async def worker(self, seed: int) -> None:
        rng = np.random.default_rng(1000 + seed)
        options = [("grpc.max_send_message_length", 64 << 20)]
        async with grpc.aio.insecure_channel(self.address, options=options) as channel:
            i = 0
            while self.left > 0:
                i += 1
                sid, r = f"fz-{seed}-{i}", rng.random()
                if r < 0.6:
                    await self.typed(channel, rng, sid)
                elif r < 0.8:
                    await self.raw(channel, rng, sid)
                elif r < 0.95:
                    await self.hellos(channel, rng, seed * 1_000_000 + i)
                else:
                    await self.ending(channel, rng, sid)


async def fuzz(address: str, *, total: int, workers: int, seed: int) -> dict:
    fuzzer = Fuzzer(address, total=total, seed=seed)
    t0 = time.monotonic()
    await asyncio.gather(*(fuzzer.worker(seed * 100 + w) for w in range(workers)))
    return {"sent": fuzzer.sent, "seconds": time.monotonic() - t0, "replies": fuzzer.counts,
            "stream_ends": fuzzer.codes, "step_errors": fuzzer.errors, "unexpected": fuzzer.unexpected[:20]}


async def large(address: str, *, total: int, mb: int) -> dict:
    """One session sending `total` observations of `mb` MB that do not fit the spec; their replies."""
    big = encode("observation", np.zeros((mb << 20) // 4, np.float32))
    frames = [bridge_pb2.ClientMessage(observation=bridge_pb2.Observation(step=s, tensors=[big])).SerializeToString()
              for s in range(total)]
    replies, seconds = [], []
    options = [("grpc.max_send_message_length", 2 * mb << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = channel.stream_stream(CONNECT, response_deserializer=bridge_pb2.ServerMessage.FromString)()
        await call.write(bridge_pb2.ClientMessage(hello=hello("large", obs=OBS, act=ACT)).SerializeToString())
        await call.read()
        for frame in frames:
            t0 = time.perf_counter()
            await call.write(frame)
            reply = await call.read()
            seconds.append(time.perf_counter() - t0)
            replies.append(f"{bridge_pb2.StepError.Code.Name(reply.error.code)}: {reply.error.message}"
                           if reply.WhichOneof("kind") == "error" else reply.WhichOneof("kind"))
        await call.done_writing()
        code = (await call.code()).name
    return {"sent": total, "replies": replies, "seconds": seconds, "code": code}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("--total", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--large-mb", type=int, help="instead: one session of --total observations this large")
    a = p.parse_args()
    if a.large_mb:
        result = asyncio.run(large(a.address, total=a.total, mb=a.large_mb))
    else:
        result = asyncio.run(fuzz(a.address, total=a.total, workers=a.workers, seed=a.seed))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

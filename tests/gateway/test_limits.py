"""Limits against a real gateway and Triton: the session cap, the per-source cap, the idle timeout,
bounded Hello strings and a first message that is not a Hello. A steady session steps throughout and
every one of its steps must succeed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time

import grpc
import numpy as np
import pytest

from bridge.gateway.session.limits import Limits
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway

Status = grpc.StatusCode


class Steady:
    """A well-formed session stepping until stopped; every reply must be an action."""

    def __init__(self, address: str, session_id: str = "steady"):
        self.address, self.id = address, session_id
        self.kinds: list[str] = []
        self.errors: list[str] = []
        self.rtt_ms: list[float] = []
        self._stop = asyncio.Event()
        self.started = asyncio.Event()

    async def run(self) -> None:
        rng = np.random.default_rng(0)
        async with RawSession(self.address, hello(self.id, obs=OBS, act=ACT)) as s:
            self.started.set()
            while not self._stop.is_set() or len(self.kinds) < 5:
                step_type = bridge_pb2.FIRST if not self.kinds else bridge_pb2.MID
                t0 = time.perf_counter()
                reply = await s.step(rng.standard_normal(11).astype(np.float32), step_type=step_type)
                self.rtt_ms.append((time.perf_counter() - t0) * 1e3)
                self.kinds.append(reply.WhichOneof("kind"))
                if reply.WhichOneof("kind") == "error":
                    self.errors.append(bridge_pb2.StepError.Code.Name(reply.error.code) + ": " + reply.error.message)

    def stop(self) -> None:
        self._stop.set()


@contextlib.asynccontextmanager
async def steady_session(address: str):
    steady = Steady(address)
    task = asyncio.create_task(steady.run())
    await asyncio.wait_for(steady.started.wait(), 60)
    try:
        yield steady
    finally:
        steady.stop()
        await asyncio.wait_for(task, 60)
    assert steady.kinds and set(steady.kinds) == {"action"}, steady.errors[:3]


async def connect(address: str, first: bridge_pb2.ClientMessage):
    """(channel, call, first reply or the status code and details if refused)."""
    channel = grpc.aio.insecure_channel(address)
    call = bridge_pb2_grpc.BridgeStub(channel).Connect()
    try:
        await call.write(first)
        reply = await call.read()
    except grpc.aio.AioRpcError as exc:
        return channel, call, (exc.code(), exc.details())
    if reply is grpc.aio.EOF:
        return channel, call, (await call.code(), await call.details())
    return channel, call, reply


async def refused(address: str, first: bridge_pb2.ClientMessage) -> tuple[grpc.StatusCode, str]:
    channel, call, result = await connect(address, first)
    await channel.close()
    assert isinstance(result, tuple), f"expected a refusal, got {result}"
    return result


def test_session_cap_and_per_source_cap(triton):
    async def scenario():
        limits = Limits(max_sessions=3, max_sessions_per_source=0)
        async with running_gateway(triton.url, policy="tiny", limits=limits) as gw, steady_session(gw.address):
            held = [await connect(gw.address, bridge_pb2.ClientMessage(hello=hello(f"h{i}", obs=OBS, act=ACT)))
                    for i in range(2)]
            assert all(r[2].WhichOneof("kind") == "welcome" for r in held)
            code, details = await refused(gw.address, bridge_pb2.ClientMessage(hello=hello("h2", obs=OBS, act=ACT)))
            assert code == Status.RESOURCE_EXHAUSTED and "maximum of 3 sessions" in details
            channel, call, _ = held.pop()
            await call.done_writing()
            assert await call.code() == Status.OK
            await channel.close()
            for _ in range(200):  # the slot is freed once the gateway has closed the stream
                if len(gw.sessions) == 2:
                    break
                await asyncio.sleep(0.05)
            again = await connect(gw.address, bridge_pb2.ClientMessage(hello=hello("h3", obs=OBS, act=ACT)))
            assert again[2].WhichOneof("kind") == "welcome"
            for channel, call, _ in [*held, again]:
                await call.done_writing()
                await channel.close()

        limits = Limits(max_sessions=10, max_sessions_per_source=2)  # every test client is ipv4:127.0.0.1
        async with running_gateway(triton.url, policy="tiny", limits=limits) as gw, steady_session(gw.address):
            channel, call, welcome = await connect(gw.address, bridge_pb2.ClientMessage(
                hello=hello("p1", obs=OBS, act=ACT)))
            code, details = await refused(gw.address, bridge_pb2.ClientMessage(hello=hello("p2", obs=OBS, act=ACT)))
            assert code == Status.RESOURCE_EXHAUSTED and "source 'ipv4:127.0.0.1'" in details
            await call.done_writing()
            await channel.close()

    asyncio.run(scenario())


def test_a_silent_session_is_closed_after_the_idle_timeout_and_its_slot_freed(triton):
    idle = 2.0  # the steady session's gap between steps is its own loop's: far below this

    async def scenario():
        limits = Limits(max_sessions=2, idle_timeout_s=idle)
        async with running_gateway(triton.url, policy="tiny", limits=limits) as gw, steady_session(gw.address):
            t0 = time.monotonic()
            channel, call, welcome = await connect(gw.address, bridge_pb2.ClientMessage(
                hello=hello("silent", obs=OBS, act=ACT)))
            assert welcome.WhichOneof("kind") == "welcome"
            assert len(gw.sessions) == 2
            code, _ = await refused(gw.address, bridge_pb2.ClientMessage(hello=hello("x", obs=OBS, act=ACT)))
            assert code == Status.RESOURCE_EXHAUSTED           # full while the silent one holds its slot
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call.read(), idle + 60)
            closed_after = time.monotonic() - t0
            assert err.value.code() == Status.DEADLINE_EXCEEDED
            assert "no message for 2 s" in err.value.details()
            assert closed_after >= idle
            await channel.close()
            assert set(gw.sessions) == {"steady"} and len(gw.admission) == 1
            channel, call, welcome = await connect(gw.address, bridge_pb2.ClientMessage(
                hello=hello("silent", obs=OBS, act=ACT)))   # the slot (and the id) are free again
            assert welcome.WhichOneof("kind") == "welcome"
            await call.done_writing()
            await channel.close()
            # a stream that never sends its Hello is closed too
            channel = grpc.aio.insecure_channel(gw.address)
            mute = bridge_pb2_grpc.BridgeStub(channel).Connect()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(mute.read(), idle + 60)
            assert err.value.code() == Status.DEADLINE_EXCEEDED
            await channel.close()

    asyncio.run(scenario())


def test_oversized_or_unprintable_hello_strings_are_refused_naming_the_field(triton, caplog):
    def h(**kw):
        msg = hello("ok", obs=OBS, act=ACT)
        for key, value in kw.items():
            if key == "labels":
                msg.labels.update(value)
            else:
                setattr(msg, key, value)
        return bridge_pb2.ClientMessage(hello=msg)

    cases = {
        "session_id: 129 characters": h(session_id="s" * 129),
        "session_id: only printable characters without spaces": h(session_id="a b"),
        "source: 1000 characters": h(source="x" * 1000),
        "source: only printable characters": h(source="evil\x1b[31m\nINFO forged log line"),
        "policy: 200 characters": h(policy="p" * 200),
        "labels: 33 labels": h(labels={f"k{i}": "v" for i in range(33)}),
        "labels['site']: 300 characters": h(labels={"site": "v" * 300}),
        "labels key: only printable characters": h(labels={"a\tb": "v"}),
        "observation_spec: 65 tensors": bridge_pb2.ClientMessage(hello=bridge_pb2.Hello(
            session_id="many", observation_spec=[OBS[0].to_proto()] * 65, action_spec=[ACT[0].to_proto()])),
    }

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw, steady_session(gw.address):
            for expected, message in cases.items():
                code, details = await refused(gw.address, message)
                assert code == Status.INVALID_ARGUMENT, (expected, code, details)
                assert expected in details, (expected, details)
                assert "\x1b" not in details and "\n" not in details
            assert set(gw.sessions) == {"steady"}

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    assert not any("\x1b" in r.getMessage() or "forged log line" in r.getMessage() for r in caplog.records)


def test_a_first_message_that_is_not_a_hello_is_refused(triton):
    obs = bridge_pb2.Observation(step=0, tensors=[encode("observation", np.zeros(11, np.float32))])

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw, steady_session(gw.address):
            code, details = await refused(gw.address, bridge_pb2.ClientMessage(observation=obs))
            assert code == Status.INVALID_ARGUMENT
            assert details == "the first message of a Connect stream must be a Hello, got observation"
            code, details = await refused(gw.address, bridge_pb2.ClientMessage())
            assert code == Status.INVALID_ARGUMENT and details.endswith("got an empty message")
            assert set(gw.sessions) == {"steady"}

    asyncio.run(scenario())


def test_large_tensors_are_refused_without_stalling_a_steady_session(triton):
    """32 MB observations that do not fit the spec, from another process: each is refused on its step
    (no copy of its bytes: its declared shape is checked first), the stream goes on, and the steady
    session's steps all succeed within the deadline (figures printed)."""

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw, steady_session(gw.address) as steady:
            start = len(steady.rtt_ms)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.gateway.fuzz_client", gw.address, "--total", "8", "--large-mb", "32",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": os.getcwd()})
            out, err = await asyncio.wait_for(proc.communicate(), 240)
            assert proc.returncode == 0, err.decode()[-2000:]
            return json.loads(out), steady.rtt_ms[start:]

    result, during = asyncio.run(scenario())
    print(f"\n8 x 32 MB refused in {sum(result['seconds']):.2f} s (max {max(result['seconds']) * 1e3:.0f} ms each); "
          f"steady session meanwhile: {len(during)} steps, p50 {np.percentile(during, 50):.1f} ms, "
          f"max {max(during):.1f} ms")
    assert result["code"] == "OK" and len(result["replies"]) == 8
    assert all(r == "INVALID_OBSERVATION: observation: shape [8388608], expected [11]" for r in result["replies"])


def test_a_message_over_max_message_mb_ends_its_stream(triton):
    big = bridge_pb2.ClientMessage(observation=bridge_pb2.Observation(
        step=0, tensors=[encode("observation", np.zeros(600_000, np.float32))]))   # 2.4 MB

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", limits=Limits(max_message_mb=1)) as gw, \
                steady_session(gw.address):
            channel, call, welcome = await connect(gw.address, bridge_pb2.ClientMessage(
                hello=hello("large", obs=OBS, act=ACT)))
            assert welcome.WhichOneof("kind") == "welcome"
            await call.write(big)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call.read(), 60)
            assert err.value.code() == Status.RESOURCE_EXHAUSTED
            await channel.close()

    asyncio.run(scenario())

"""The gateway end to end: a real tritonserver, real gRPC over loopback, concurrent sessions."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bridge.app import GatewayApp
from bridge.gateway.config import GatewayConfig
from inference_server import TritonServer
from protos import bridge_pb2
from protos.codec import Spec, decode, encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway

Code = bridge_pb2.StepError.Code


def rng_obs(rng) -> np.ndarray:
    return rng.standard_normal(11).astype(np.float32)


async def run_steps(address, triton, session_id, steps, seed):
    rng = np.random.default_rng(seed)
    async with RawSession(address, hello(session_id, obs=OBS, act=ACT)) as s:
        assert s.welcome.policy == "tiny" and s.welcome.policy_version == 1
        for i in range(steps):
            obs = rng_obs(rng)
            reply = await s.step(obs, step_type=bridge_pb2.FIRST if i == 0 else bridge_pb2.MID)
            assert reply.WhichOneof("kind") == "action", reply
            a = reply.action
            assert a.step == i and a.policy == "tiny" and a.policy_version == 1
            np.testing.assert_allclose(decode(a.tensors[0]), triton.expected_action(obs), rtol=1e-5, atol=1e-5)
            t = a.timing
            assert t.t_sent_ns <= t.gateway_recv_ns <= t.infer_start_ns <= t.infer_end_ns <= t.gateway_send_ns
    return steps


def test_concurrent_sessions_get_their_own_actions_in_order(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            done = await asyncio.gather(*(run_steps(gw.address, triton, f"s{i}", 25, i) for i in range(6)))
            assert done == [25] * 6
            assert gw.batcher.stats.requests == 150

    asyncio.run(scenario())


def test_bad_observation_errors_that_step_only_while_others_run(triton):
    nan = np.full(11, np.nan, np.float32)
    bad = {
        "contains NaN": [encode("observation", nan)],
        "shape \\[4\\]": [encode("observation", np.zeros(4, np.float32))],
        "dtype float64": [encode("observation", np.zeros(11))],
        "not in the declared spec": [encode("observation", np.zeros(11, np.float32)),
                                     encode("camera", np.zeros(2, np.uint8))],
        "missing": [],
    }

    async def faulty(address):
        async with RawSession(address, hello("faulty", obs=OBS, act=ACT)) as s:
            assert (await s.step(np.zeros(11, np.float32))).WhichOneof("kind") == "action"
            for message, tensors in bad.items():
                reply = await s.send(tensors)
                assert reply.WhichOneof("kind") == "error", reply
                assert reply.error.code == Code.INVALID_OBSERVATION
                assert reply.error.step == s.step_index - 1
                assert reply.error.field in ("observation", "camera")
                assert __import__("re").search(message, reply.error.message), reply.error.message
            reply = await s.step(np.ones(11, np.float32))  # the stream goes on
            assert reply.WhichOneof("kind") == "action"

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            await asyncio.gather(faulty(gw.address),
                                 *(run_steps(gw.address, triton, f"ok{i}", 40, i) for i in range(3)))
            assert gw.closed_stats and sum(s.errors.get("INVALID_OBSERVATION", 0) for s in gw.closed_stats) == 5

    asyncio.run(scenario())


def test_out_of_order_step_and_episode_end(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with RawSession(gw.address, hello(obs=OBS, act=ACT)) as s:
                obs = np.zeros(11, np.float32)
                assert (await s.step(obs, step=5, step_type=bridge_pb2.FIRST)).action.step == 5
                reply = await s.step(obs, step=5)
                assert reply.error.code == Code.OUT_OF_ORDER and "step 5 after step 5" in reply.error.message
                assert (await s.step(obs, step=6, reward=1.5)).action.step == 6
                assert (await s.step(obs, step=7, reward=2.0)).action.step == 7
                end = (await s.step(obs, step=8, reward=0.5, step_type=bridge_pb2.LAST)).episode_end
                assert (end.step, end.episode, end.length, end.episode_return) == (8, 1, 3, 4.0)
                nonfinite = await s.step(obs, step=9, reward=float("inf"), step_type=bridge_pb2.FIRST)
                assert nonfinite.error.field == "reward"

    asyncio.run(scenario())


@pytest.mark.parametrize("case, code, words", [
    ("wrong action shape", grpc.StatusCode.INVALID_ARGUMENT, "action_spec 'action' is float32[4]"),
    ("missing input", grpc.StatusCode.INVALID_ARGUMENT, "lacks 'observation'"),
    ("unknown policy", grpc.StatusCode.NOT_FOUND, "'nope'"),
    # the same identity (here: the same host, no credentials) takes its session over; the old stream ends so
    # (another identity is refused ALREADY_EXISTS: tests/gateway/test_session_takeover.py)
    ("duplicate id", grpc.StatusCode.ABORTED, "'dup' is superseded by a new connection of the same session"),
])
def test_bad_hello_is_refused_with_a_status_naming_it(triton, case, code, words):
    kwargs = {"obs": OBS, "act": ACT}
    if case == "wrong action shape":
        kwargs["act"] = (Spec("action", np.float32, (4,)),)
    if case == "missing input":
        kwargs["obs"] = (Spec("joints", np.float32, (11,)),)
    policy = "nope" if case == "unknown policy" else ""

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with RawSession(gw.address, hello("dup", policy=policy, **kwargs)) as first:
                if case == "duplicate id":
                    async with RawSession(gw.address, hello("dup", obs=OBS, act=ACT)):
                        await first.call.read()  # the old stream's end
                return first

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(scenario())
    assert info.value.code() == code and words in info.value.details(), info.value.details()


def test_health_reports_serving(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                for service in ("", "tether.v1.Bridge"):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    asyncio.run(scenario())


def test_unreachable_triton_is_a_clear_error_not_a_hang(unused_port):
    gateway = GatewayApp(GatewayConfig(triton_url=f"127.0.0.1:{unused_port}", triton_timeout_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"Triton at 127.0.0.1:{unused_port} is not ready"):
        asyncio.run(gateway.start())
    assert time.monotonic() - t0 < 5


def test_triton_dying_mid_session_errors_steps_quickly(triton, tmp_path):
    server = TritonServer(triton.repo.root, models=["tiny"], log_path=tmp_path / "triton.log")
    server.start()

    async def scenario():
        async with running_gateway(server.grpc_url, policy="tiny", deadline_ms=500) as gw:
            async with RawSession(gw.address, hello(obs=OBS, act=ACT)) as s:
                assert (await s.step(np.zeros(11, np.float32))).WhichOneof("kind") == "action"
                server.stop()
                t0 = time.monotonic()
                reply = await s.step(np.zeros(11, np.float32))
                assert time.monotonic() - t0 < 2.0
                assert reply.error.code in (Code.INFERENCE_FAILED, Code.DEADLINE_EXCEEDED), reply
                assert "tiny" in reply.error.message or "deadline" in reply.error.message

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_a_client_vanishing_mid_stream_frees_its_session_and_others_run_on(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            s = await RawSession(gw.address, hello("vanishing", obs=OBS, act=ACT)).__aenter__()
            assert (await s.step(np.zeros(11, np.float32))).WhichOneof("kind") == "action"
            s.call.cancel()  # the robot's process dies: no half-close, no goodbye
            await s.channel.close()
            for _ in range(100):
                if "vanishing" not in gw.sessions:
                    break
                await asyncio.sleep(0.02)
            assert "vanishing" not in gw.sessions
            # its id is free again, and the gateway still serves everyone
            await asyncio.gather(run_steps(gw.address, triton, "vanishing", 10, 1),
                                 run_steps(gw.address, triton, "other", 10, 2))

    asyncio.run(scenario())


def test_a_camera_frame_rides_along_with_the_policy_input(triton):
    camera = Spec("camera", np.uint8, (1080, 1920, 3))  # 6.2 MB: over gRPC's default 4 MB cap
    frame = np.random.default_rng(0).integers(0, 255, camera.shape, dtype=np.uint8)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with RawSession(gw.address, hello(obs=(*OBS, camera), act=ACT)) as s:
                obs = np.ones(11, np.float32)
                reply = await s.send([encode("observation", obs), encode("camera", frame)])
                assert reply.WhichOneof("kind") == "action", reply
                np.testing.assert_allclose(decode(reply.action.tensors[0]), triton.expected_action(obs), atol=1e-5)

    asyncio.run(scenario())

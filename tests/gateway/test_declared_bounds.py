"""Hello's spec bounds are checked (finite, low <= high, the right count), and the bounds the gate judges a
candidate's actions against are the ones robots declared, whatever a flood of fresh sources declares
after them: on a real gateway (real Triton, real gRPC), judged by the gate's own action-sanity check."""

from __future__ import annotations

import asyncio
import math

import grpc
import numpy as np
import pytest

from bridge.client import Credentials, aio_channel
from bridge.gate.checks import action_sanity
from protos.codec import Spec
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.security.helpers import step_loop
from tests.support.gateways import running_gateway, token_gateway

ROBOT = (Spec("action", np.float32, (3,), low=(-1.0, -0.5, -1.0), high=(1.0, 0.5, 1.0)),)  # what arm_1 declares
WIDE = (Spec("action", np.float32, (3,), low=(-100.0,), high=(100.0,)),)                   # what the flood declares


def with_action(session_id: str, act, source: str = "test"):
    h = hello(session_id, obs=OBS, act=act)
    h.source = source
    return h


async def opened(channel, h) -> tuple[grpc.StatusCode, str]:
    try:
        await step_loop(channel, h, steps=0)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def judged(gw, actions: list[list[float]]):
    """The gate's action-sanity verdict on `actions`, against the bounds the gateway gives the gate."""
    spec = gw.rollout.action_spec("tiny", gw.catalog.current("tiny"))
    return action_sanity({"action": np.asarray(actions, np.float32)}, spec), spec


@pytest.mark.parametrize(("low", "high", "problem"), [
    ((math.nan,), (1.0,), "low bound nan is not finite"),
    ((-1.0,), (math.inf,), "high bound inf is not finite"),
    ((-1.0, -1.0), (1.0, 1.0), "2 low bounds for 3 elements"),
    ((-1.0, 2.0, -1.0), (1.0,), "element 1 has low 2.0 above high 1.0"),
])
def test_a_hello_with_bad_action_bounds_is_refused_naming_the_tensor(triton, low, high, problem):
    bad = (Spec("action", np.float32, (3,), low=low, high=high),)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                refused = await opened(channel, with_action("bad", bad))
                fine = await opened(channel, with_action("fine", ROBOT))
            return refused, fine, judged(gw, [[0.9, 0.9, 0.0]])

    (code, details), fine, (verdict, spec) = asyncio.run(scenario())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "action_spec 'action'" in details and problem in details, \
        details
    assert fine[0] == grpc.StatusCode.OK
    assert spec[0].high == (1.0, 0.5, 1.0) and not verdict.passed and "leaves its bounds" in verdict.detail


def test_observation_bounds_may_be_infinite_but_not_nan(triton):
    unbounded = (Spec("observation", np.float32, (11,), low=(-math.inf,), high=(math.inf,)),)
    nan = (Spec("observation", np.float32, (11,), low=(math.nan,), high=(1.0,)),)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                return (await opened(channel, hello("inf", obs=unbounded, act=ACT)),
                        await opened(channel, hello("nan", obs=nan, act=ACT)))

    inf, nan_reply = asyncio.run(scenario())
    assert inf[0] == grpc.StatusCode.OK
    assert nan_reply[0] == grpc.StatusCode.INVALID_ARGUMENT and "observation_spec 'observation'" in nan_reply[1]


def test_a_flood_of_fresh_sources_does_not_evict_the_robots_bounds_open_access(triton):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                assert (await opened(channel, with_action("arm-1", ROBOT, "arm_1")))[0] == grpc.StatusCode.OK
                for i in range(100):  # > 64 fresh sources, each declaring wide bounds
                    assert (await opened(channel, with_action(f"flood-{i}", WIDE, f"flood-{i}")))[0] == \
                        grpc.StatusCode.OK
            return judged(gw, [[0.0, 0.9, 0.0], [0.0, 0.1, 0.0]]), gw.rollout.bounds.ignored

    (verdict, spec), ignored = asyncio.run(scenario())
    assert spec[0].low == (-1.0, -0.5, -1.0) and spec[0].high == (1.0, 0.5, 1.0), spec
    assert not verdict.passed and verdict.figures["out_of_bounds"] == 0.5, verdict
    assert ignored >= 100 - 63   # the table keeps the first 64 keys: the rest changed nothing


def test_with_tokens_only_proven_identities_bounds_count_and_one_identity_holds_one_entry(triton, tmp_path):
    async def scenario():
        async with token_gateway(triton.url, tmp_path, "arm_1", "arm_2") as (gw, tokens):
            async with aio_channel(gw.address, Credentials(token=tokens["arm_1"])) as robot, \
                       aio_channel(gw.address, Credentials(token=tokens["arm_2"])) as other, \
                       grpc.aio.insecure_channel(gw.address) as anonymous:
                assert (await opened(robot, with_action("arm-1", ROBOT, "arm_1")))[0] == grpc.StatusCode.OK
                for i in range(100):  # one identity, 100 sources: still one entry, never arm_1's
                    assert (await opened(other, with_action(f"flood-{i}", WIDE, f"flood-{i}")))[0] == \
                        grpc.StatusCode.OK
                refused = await opened(anonymous, with_action("stranger", WIDE, "stranger"))
            return judged(gw, [[0.0, 0.9, 0.0]]), refused, gw.rollout.bounds.specs("tiny")

    (verdict, spec), refused, kept = asyncio.run(scenario())
    assert refused[0] == grpc.StatusCode.UNAUTHENTICATED
    assert len(kept) == 2  # robot:arm_1 and robot:arm_2, one declaration each
    assert spec[0].high == (1.0, 0.5, 1.0) and not verdict.passed and "leaves its bounds" in verdict.detail

"""One clock: a robot whose clock runs 50 ms ahead, reaching a real gateway (and Triton) through a link that
delays each direction differently, learns the offset within 2 ms from its replies, and its hop times (robot
clock) add up to the round trip it measured itself."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np

from bridge.client import Session
from bridge.client.clock import robot_clock
from protos import bridge_pb2
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.support.gateways import running_gateway
from tests.support.link import Link, Shape

AHEAD_NS = 50_000_000
STEPS = 200


def queueing(rng: random.Random, low: float, high: float):
    """A one-way delay with an idle queue 30% of the time and low..high s of queueing otherwise."""
    return lambda: 0.0 if rng.random() < 0.3 else rng.uniform(low, high)


def test_a_clock_50_ms_ahead_behind_an_asymmetric_link_is_estimated_within_2_ms(triton):
    rng = random.Random(7)  # drawn on the link's one thread
    up, down = Shape(delay_s=queueing(rng, 0.004, 0.030)), Shape(delay_s=queueing(rng, 0.001, 0.006))
    gaps_ms, sessions_seen = [], []

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            with Link(gw.address, up=up, down=down) as link:
                async with Session(link.address, hello("clocked", obs=OBS, act=ACT),
                                   clock=robot_clock(AHEAD_NS)) as s:
                    for step in range(STEPS):
                        obs = bridge_pb2.Observation(
                            step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                            tensors=[encode("observation", np.full(11, 0.01 * step, np.float32))])
                        started = time.monotonic_ns()
                        reply = await s.step(obs)
                        measured = time.monotonic_ns() - started
                        assert reply.WhichOneof("kind") == "action", reply
                        gaps_ms.append((s.hops.total - measured) / 1e6)
                        sessions_seen.append(s.hops)
                    rows = {r["session_id"]: r for r in gw.fleet.sessions()}
                    return s.offset.offset_ns, s.offset.count, rows["clocked"]["hop_p50_ms"]

    offset, samples, budget = asyncio.run(scenario())
    assert samples == STEPS + 1  # the Welcome and every Action
    assert abs(offset - (-AHEAD_NS)) < 2_000_000, f"offset {offset / 1e6:.3f} ms, truth {-AHEAD_NS / 1e6} ms"
    gaps = np.abs(gaps_ms)
    assert np.median(gaps) < 1.0 and np.mean(gaps < 1.0) > 0.9, f"hops vs measured round trip: {sorted(gaps)[-5:]}"
    late = sessions_seen[STEPS // 2:]  # once the estimate settled: no hop negative beyond the 2 ms it may be off
    assert min(min(h.observation_age, h.reply) for h in late) > -2_000_000
    # the gateway states the uplink in the robot's clock too: the link's median delay, not -50 ms
    assert 2.0 < budget["observation_age"] < 30.0, budget
    assert budget["reply"] < 10.0 and budget["triton"] > 0, budget

"""The edge node's chunk loop is `tether sim`'s (`bridge.client.chunks.ChunkExecutor`): the same alignment and
prefix semantics, checked on the node in this process on Cyclone DDS, against a real gateway and tritonserver
whose every step takes 30 ms more (d >= 1 tick at 200 Hz, 6-7 on an idle machine: every chunk after the first
gets a prefix, unless the queue had run dry when it was asked for).

The policy (`RampInpaint`) inpaints: rows i < d are the committed prefix, the rest continue from its last
action at VELOCITY per tick (the first chunk, with nothing committed, from the measured position, 0). So
with the prefix the executed commands are one ramp, whatever d was; without it a chunk would start over
from 0. What tick a chunk lands on is the machine's business; everything asserted holds for any d.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from bridge.gateway.session import session as gateway_session
from bridge.ros2.edge_config import EdgeConfigError
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from protos.codec import Spec
from tests.ros2.edge_support import GatewayThread, Robot, joint_specs, running_edge, wait_until
from tests.support.triton import LOAD_TIMEOUT_S

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints
H, THRESHOLD, RATE = 32, 16, 200.0     # 80 ms of actions left when the next chunk is asked for
VELOCITY = 1 / 1024                    # per tick: 0.2 rad/s at 200 Hz (exact in float32)


class RampInpaint(torch.nn.Module):
    def __init__(self, horizon: int):
        super().__init__()
        self.register_buffer("index", torch.arange(horizon, dtype=torch.float32).reshape(1, horizon, 1))

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor, action_prefix: torch.Tensor,
                action_delay: torch.Tensor) -> torch.Tensor:
        d = action_delay.reshape(-1, 1, 1).to(torch.float32)
        last = torch.gather(action_prefix, 1, torch.clamp(d - 1.0, min=0.0).to(torch.int64).expand(-1, 1, 6))
        anchor = torch.where(d > 0.0, last, joint_position.unsqueeze(1))
        after = self.index - d
        return torch.where(after < 0.0, action_prefix, anchor + (after + 1.0) * VELOCITY)


@pytest.fixture(scope="module")
def gateway(triton):
    obs, _ = joint_specs(6)
    inputs = obs + (Spec("action_prefix", np.float32, (H, 6)), Spec("action_delay", np.int32, (1,)))
    triton.repo.write_version(triton.claim("ramp_inpaint"), 1, RampInpaint(H).eval(), inputs,
                              (Spec("action", np.float32, (H, 6)),))
    triton.server.load_model("ramp_inpaint", timeout=LOAD_TIMEOUT_S)
    gw = GatewayThread(triton.url)
    yield gw.start()
    gw.close()


def test_the_edge_aligns_chunks_and_sends_the_committed_prefix(ros_domain, gateway, monkeypatch):
    handle = gateway_session.Session.handle

    async def slow(self, obs):                 # every policy round trip takes 30 ms (6 ticks) more
        await asyncio.sleep(0.03)
        return await handle(self, obs)

    monkeypatch.setattr(gateway_session.Session, "handle", slow)
    robot = Robot(ros_domain, JOINTS, hz=RATE)
    robot.wait_ready()
    try:
        config = {"chunk": H, "chunk_threshold": THRESHOLD, "chunk_prefix": True}
        with running_edge(ros_domain, gateway, TMAP, policy="ramp_inpaint", rate_hz=RATE, config=config) as node:
            wait_until(lambda: node.chunks.chunks >= 12, timeout=60, what="12 chunks")
        ex, stats, records = node.chunks, node.stats, list(node.command_log)
    finally:
        robot.close()
    arrivals = list(ex.arrivals)
    delays = [a.delay for a in arrivals]
    print(f"\nedge at {RATE:g} Hz, chunks of {H}, +30 ms: delays {sorted(stats.chunk_delays.items())}, "
          f"starved {stats.starved}, overruns {stats.overruns}")
    assert not stats.errors, stats.errors
    assert min(delays) >= 1                    # 30 ms is at least one tick
    if not stats.starved:                      # the queue never ran dry: every request had a prefix
        assert all(a.estimate >= 1 for a in arrivals[1:])
    assert any(a.estimate >= 1 for a in arrivals[1:])   # (only a queue dry at all 11 requests would fail this)
    executed = {e.tick: e for e in ex.trace}
    by_id = {a.chunk: a for a in arrivals}
    previous = None
    for e in ex.trace:
        a = by_id[e.source.chunk]
        assert a.start + e.source.index == e.tick and a.tick <= e.tick       # aligned to its own tick
        assert [b for b in arrivals if b.tick <= e.tick < b.start + H][-1] is a   # the newest chunk
        np.testing.assert_array_equal(e.action, a.actions[e.source.index])
        if previous is not None and (e.source.chunk == previous.source.chunk or a.estimate >= 1):
            # one ramp: a seam with a prefix continues the motion, whatever d was (idle ticks included)
            np.testing.assert_array_equal(e.action - previous.action, np.full(6, (e.tick - previous.tick) * VELOCITY))
        else:                                  # nothing was committed: a fresh ramp from the measured pose (0)
            np.testing.assert_array_equal(e.action, np.full(6, (e.tick - a.start + 1) * VELOCITY))
        previous = e
    for a in arrivals[1:]:                     # the prefix the policy got is what the robot executed
        rows = [t for t in range(a.start, a.start + a.estimate) if t in executed]
        assert rows or not a.estimate, a
        if rows:
            np.testing.assert_array_equal(a.actions[[t - a.start for t in rows]],
                                          np.array([executed[t].action for t in rows]))
    policy = [r for r in records if r.source is not None]
    assert policy and all(executed[r.tick].source == r.source for r in policy)  # what went out: the trace's
    if max(delays) <= THRESHOLD and not stats.overruns:   # no idle tick while d <= the threshold (and the
        assert stats.starved == 0                          # node's own loop kept its periods)


def test_a_bad_chunk_setting_is_refused_naming_it():
    from bridge.ros2.edge_config import EdgeConfig

    with pytest.raises(EdgeConfigError, match=r"chunk blend: expected an integer \[0, 8\], got 9"):
        EdgeConfig(gateway="127.0.0.1:50051", chunk=8, chunk_blend=9)
    with pytest.raises(EdgeConfigError, match=r"chunk blend: a seam window \(2\) needs merge 'newest'"):
        EdgeConfig(gateway="127.0.0.1:50051", chunk=8, chunk_blend=2, chunk_merge="ensemble")

"""`bridge.client.chunks.ChunkExecutor` on a virtual clock (ticks are integers): the prefix it sends, the delay
it measures, the seam it blends, what it tells the gateway, and its refusals. (The same loop through a real
gateway: tests/sim/test_chunk_alignment.py and tests/ros2/test_edge_chunks.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from bridge.client.chunks import ChunkConfig, ChunkExecutor
from protos import bridge_pb2
from protos.codec import decode_all

H = 8


def ramp(start: float, n: int = H) -> np.ndarray:
    return (start + np.arange(n, dtype=np.float64)).reshape(n, 1)


def test_the_prefix_is_the_queued_actions_for_the_estimated_delay_zero_padded():
    ex = ChunkExecutor(ChunkConfig(horizon=H, prefix=True), size=1, delay=3)
    ex.request(0, step=0)
    ex.arrive(ramp(100.0), now=0, policy_version=1, measured=False)         # a wait says nothing of d
    assert ex.delay == 3
    for tick in range(4):
        ex.act(tick)
    assert ex.due(4)                                                          # 4 left: <= threshold 4
    request = ex.request(4, step=1)
    assert request.delay == 3 and request.tick == 4
    np.testing.assert_array_equal(request.prefix[:, 0], [104, 105, 106, 0, 0, 0, 0, 0])
    tensors = request.tensors()
    assert tensors["action_prefix"].dtype == np.float32 and tensors["action_delay"].tolist() == [3]


def test_the_delay_is_measured_in_ticks_and_the_estimate_is_the_recent_max():
    ex = ChunkExecutor(ChunkConfig(horizon=H, delay_window=2), size=1)
    for step, (sent, arrived) in enumerate([(0, 0), (4, 9), (9, 10), (10, 11)]):
        ex.request(sent, step=step)
        assert ex.arrive(ramp(0.0), now=arrived, policy_version=1) == arrived - sent
    assert list(ex.delays) == [1, 1] and ex.delay == 1 and ex.delay_counts == {0: 1, 5: 1, 1: 2}


def test_the_estimate_is_capped_at_what_is_queued():
    ex = ChunkExecutor(ChunkConfig(horizon=H, prefix=True), size=1, delay=H)
    ex.request(0, step=0)
    ex.arrive(ramp(0.0), now=0, policy_version=1, measured=False)
    assert ex.request(5, step=1).delay == 3                                  # ticks 5, 6, 7


def test_a_late_chunk_is_aligned_to_its_tick_and_the_queue_runs_dry_only_past_the_threshold():
    ex = ChunkExecutor(ChunkConfig(horizon=H, blend=0), size=1)
    ex.request(0, step=0)
    ex.arrive(ramp(0.0), now=0, policy_version=1)
    executed = [ex.act(t)[0][0] for t in range(4)]
    ex.request(4, step=1)                                                     # due: 4 left
    executed += [ex.act(t)[0][0] for t in range(4, 8)]
    assert ex.act(8) is None and ex.idle == 1                                 # d = 5 > threshold 4: one idle tick
    ex.arrive(ramp(10.0), now=9, policy_version=1)
    action, source = ex.act(9)
    assert executed == list(range(8)) and action[0] == 15.0 and (source.chunk, source.index) == (1, 5)


def test_the_seam_is_blended_over_the_window_from_the_old_chunk_then_its_last_action():
    ex = ChunkExecutor(ChunkConfig(horizon=H, blend=3), size=1)
    ex.request(0, step=0)
    ex.arrive(np.zeros((H, 1)), now=0, policy_version=1)
    for t in range(6):
        ex.act(t)
    ex.request(6, step=1)
    ex.arrive(np.full((H, 1), 8.0), now=6, policy_version=1)                # old has ticks 6, 7 (zeros)
    got = [ex.act(t) for t in range(6, 10)]
    assert [a[0] for a, _ in got] == [2.0, 4.0, 6.0, 8.0]                     # (k+1)/4 of the jump, then the chunk
    assert [s.blend for _, s in got] == [0.25, 0.5, 0.75, 1.0]
    ex.request(10, step=2)
    ex.arrive(np.full((H, 1), 16.0), now=13, policy_version=1)              # ticks 13, 14: the old chunk's
    assert [ex.act(t)[0][0] for t in range(13, 17)] == [10.0, 12.0, 14.0, 16.0]
    ex2 = ChunkExecutor(ChunkConfig(horizon=H, blend=3), size=1)             # nothing queued: from the last action
    ex2.request(0, step=0)
    ex2.arrive(np.zeros((H, 1)), now=0, policy_version=1)
    for t in range(H):
        ex2.act(t)
    ex2.request(H, step=1)
    ex2.arrive(np.full((H, 1), 4.0), now=H + 1, policy_version=1)
    assert [ex2.act(t)[0][0] for t in range(H + 1, H + 5)] == [1.0, 2.0, 3.0, 4.0]


def test_a_request_fills_the_prefix_the_deadline_and_the_previous_chunks_hops():
    ex = ChunkExecutor(ChunkConfig(horizon=H, prefix=True), size=2, delay=2)
    obs = bridge_pb2.Observation(step=0)
    ex.fill(obs, ex.request(0, step=0), deadline_ns=ex.deadline_ns(0, now_ns=1_000, period_ns=10))
    assert obs.deadline_ns == 1_000 and not obs.HasField("client_hops")       # nothing queued: due now
    ex.arrive(np.ones((H, 2)), now=0, policy_version=1, at_ns=5_000, measured=False)
    ex.act(0, at_ns=5_300)
    obs = bridge_pb2.Observation(step=1)
    ex.fill(obs, ex.request(1, step=1), deadline_ns=ex.deadline_ns(1, now_ns=2_000, period_ns=10))
    tensors = decode_all(obs.tensors)
    assert tensors["action_prefix"].shape == (H, 2) and tensors["action_prefix"][:2].tolist() == [[1, 1], [1, 1]]
    assert tensors["action_delay"].tolist() == [2] and obs.deadline_ns == 2_000 + 7 * 10
    assert (obs.client_hops.step, obs.client_hops.delay_ticks, obs.client_hops.execution_ns) == (0, 0, 300)
    without = ChunkExecutor(ChunkConfig(horizon=H), size=2)
    obs = bridge_pb2.Observation(step=0)
    without.fill(obs, without.request(0, step=0))
    assert not obs.tensors                                                    # no prefix unless configured


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"horizon": 0}, r"chunk horizon: expected an integer \[1, 10000\], got 0"),
    ({"horizon": 8, "threshold": 8}, r"chunk threshold: expected an integer \[0, 7\], got 8"),
    ({"horizon": 8, "blend": 2, "merge": "ensemble"}, r"chunk blend: a seam window \(2\) needs merge 'newest'"),
    ({"horizon": 8, "merge": "mean"}, r"chunk merge: expected one of \['newest', 'ensemble'\], got 'mean'"),
    ({"horizon": 8, "prefix": 1}, r"chunk prefix: expected True or False, got 1"),
])
def test_a_bad_setting_is_refused_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChunkConfig(**kwargs)


def test_out_of_protocol_calls_are_refused_naming_the_step():
    ex = ChunkExecutor(ChunkConfig(horizon=H), size=1)
    with pytest.raises(RuntimeError, match="a chunk arrived with no request in flight"):
        ex.arrive(ramp(0.0), now=0, policy_version=1)
    ex.request(5, step=3)
    with pytest.raises(RuntimeError, match="step 3 is still in flight"):
        ex.request(6, step=4)
    with pytest.raises(ValueError, match=r"chunk of step 3 arrived before tick 4, earlier than its request"):
        ex.arrive(ramp(0.0), now=4, policy_version=1)
    with pytest.raises(ValueError, match=r"chunk: expected shape \(8, 1\), got \(7, 1\)"):
        ex.arrive(ramp(0.0, 7), now=5, policy_version=1)

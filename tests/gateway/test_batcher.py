"""Micro-batching and the per-step deadline, against an in-test policy server with a set delay."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.session import Session
from bridge.gateway.versions.catalog import ServedPolicy
from protos import bridge_pb2
from protos.codec import Spec, decode, encode
from tests.support.waiting import until

OBS = (Spec("obs", np.float32, (2,)),)
ACT = (Spec("act", np.float32, (2,)),)


class SlowDoubler:
    """Doubles its input after `delay` seconds; records each batch size (and counts the batches that
    finished); fails on a negative input."""

    def __init__(self, delay: float):
        self.delay, self.batches, self.finished = delay, [], 0

    async def infer(self, model, version, inputs, outputs):
        self.batches.append(len(inputs["obs"]))
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.finished += 1
        if (inputs["obs"] < 0).any():
            raise RuntimeError("negative input")
        return {"act": inputs["obs"] * 2}


def test_requests_queue_into_one_batch_while_one_is_in_flight():
    backend = SlowDoubler(0.02)
    batcher = MicroBatcher(backend, max_batch=64, max_inflight=1)

    async def scenario():
        xs = [np.full(2, i, np.float32) for i in range(10)]
        return xs, await asyncio.gather(*(batcher.infer("m", 1, {"obs": x}, outputs=("act",)) for x in xs))

    xs, results = asyncio.run(scenario())
    assert backend.batches == [1, 9]
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_array_equal(r["act"], x * 2)
    assert batcher.stats.mean_batch == 5.0


def test_max_batch_caps_a_batch():
    backend = SlowDoubler(0.01)
    batcher = MicroBatcher(backend, max_batch=4, max_inflight=1)

    async def scenario():
        await asyncio.gather(*(batcher.infer("m", 1, {"obs": np.zeros(2, np.float32)}, outputs=("act",))
                               for _ in range(10)))

    asyncio.run(scenario())
    assert backend.batches == [1, 4, 4, 1]


def test_a_failed_batch_fails_its_waiters_and_the_next_batch_runs():
    batcher = MicroBatcher(SlowDoubler(0.01), max_inflight=1)

    async def scenario():
        first = batcher.infer("m", 1, {"obs": np.ones(2, np.float32)}, outputs=("act",))
        bad = [batcher.infer("m", 1, {"obs": np.full(2, -1.0, np.float32)}, outputs=("act",)) for _ in range(3)]
        results = await asyncio.gather(first, *bad, return_exceptions=True)
        after = await batcher.infer("m", 1, {"obs": np.ones(2, np.float32)}, outputs=("act",))
        return results, after

    results, after = asyncio.run(scenario())
    assert isinstance(results[0], dict)
    assert all(isinstance(r, RuntimeError) for r in results[1:])
    np.testing.assert_array_equal(after["act"], [2, 2])


@pytest.mark.parametrize("bad", [{"max_batch": 0}, {"max_inflight": 0}])
def test_bad_config_is_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        MicroBatcher(SlowDoubler(0), **bad)


def test_a_step_past_its_deadline_is_an_error_and_the_session_goes_on():
    backend = SlowDoubler(0.2)
    session = Session(session_id="s", source="test", policy=ServedPolicy("m", 1, OBS, ACT),
                      observation_spec=OBS, action_spec=ACT,
                      batcher=MicroBatcher(backend), deadline_s=0.05)

    def obs(step):
        return bridge_pb2.Observation(step=step, step_type=bridge_pb2.MID,
                                      tensors=[encode("obs", np.ones(2, np.float32))])

    async def scenario():
        late = await session.handle(obs(0))
        backend.delay = 0.0
        await until(lambda: backend.finished == 1, "the abandoned request to finish")
        on_time = await session.handle(obs(1))
        return late, on_time

    late, on_time = asyncio.run(scenario())
    assert late.error.code == bridge_pb2.StepError.DEADLINE_EXCEEDED and "50 ms" in late.error.message
    assert on_time.action.step == 1 and decode(on_time.action.tensors[0]).tolist() == [2.0, 2.0]
    assert session.stats.errors == {"DEADLINE_EXCEEDED": 1} and session.stats.steps == 1


def test_the_session_keeps_the_edge_guard_counts_it_is_sent():
    session = Session(session_id="s", source="test", policy=ServedPolicy("m", 1, OBS, ACT),
                      observation_spec=OBS, action_spec=ACT, batcher=MicroBatcher(SlowDoubler(0)), deadline_s=1)
    report = bridge_pb2.GuardReport(clamped=3, watchdog=1, estopped=True)
    obs = bridge_pb2.Observation(step=0, step_type=bridge_pb2.FIRST, guard=report,
                                 tensors=[encode("obs", np.ones(2, np.float32))],
                                 applied_action=[encode("act", np.zeros(2, np.float32))])
    reply = asyncio.run(session.handle(obs))
    assert reply.WhichOneof("kind") == "action"
    assert session.stats.guard == report


def test_a_step_cancelled_from_outside_is_cancelled_not_a_deadline_error():
    backend = SlowDoubler(5.0)
    session = Session(session_id="s", source="test", policy=ServedPolicy("m", 1, OBS, ACT),
                      observation_spec=OBS, action_spec=ACT, batcher=MicroBatcher(backend), deadline_s=0.05)
    obs = bridge_pb2.Observation(step=0, step_type=bridge_pb2.MID, tensors=[encode("obs", np.ones(2, np.float32))])

    async def scenario():
        task = asyncio.ensure_future(session.handle(obs))
        await until(lambda: backend.batches, "the request to reach the backend")
        task.cancel()  # the stream went away: not the session's deadline
        with pytest.raises(asyncio.CancelledError):
            await task
        backend.delay = 0.0
        return await session.handle(bridge_pb2.Observation(step=1, step_type=bridge_pb2.MID,
                                                           tensors=[encode("obs", np.ones(2, np.float32))]))

    after = asyncio.run(scenario())
    assert session.stats.errors == {} and after.action.step == 1  # no DEADLINE_EXCEEDED counted; it goes on


class BatchCost:
    """A policy whose latency grows with the batch: 20 ms + 10 ms per row."""

    def __init__(self):
        self.batches: list[int] = []

    async def infer(self, model, version, inputs, outputs):
        self.batches.append(len(inputs["obs"]))
        await asyncio.sleep(0.020 + 0.010 * len(inputs["obs"]))
        return {"act": inputs["obs"] * 2}


def test_earliest_deadline_first_misses_fewer_deadlines_than_arrival_order():
    """24 requests at once, the 6 urgent ones (300 ms) arriving last behind 18 relaxed ones (10 s), batches of 4
    at 60 ms each: first come, first served answers the urgent ones after 270-380 ms, earliest deadline first
    in its first two batches (90 and 150 ms). Both orders side by side on the same load."""

    async def run(order: str) -> tuple[MicroBatcher, list[int]]:
        batcher = MicroBatcher(BatchCost(), max_batch=4, max_inflight=1, order=order)
        now = time.time_ns()
        deadlines = [now + 10_000_000_000] * 18 + [now + 300_000_000] * 6
        results = await asyncio.gather(*(batcher.infer("m", 1, {"obs": np.full(2, i, np.float32)}, outputs=("act",),
                                                       deadline_ns=d) for i, d in enumerate(deadlines)))
        for i, r in enumerate(results):  # each got its own rows back, whatever the order
            np.testing.assert_array_equal(r["act"], np.full(2, 2 * i, np.float32))
        return batcher, batcher._backend.batches

    async def both():
        return await run("arrival"), await run("deadline")

    (arrival, arrival_batches), (edf, edf_batches) = asyncio.run(both())
    assert arrival_batches == edf_batches == [1, 4, 4, 4, 4, 4, 3]  # never held back for a fuller batch
    assert arrival.stats.missed >= 5, arrival.stats
    assert edf.stats.missed == 0, edf.stats
    with pytest.raises(ValueError, match="order"):
        MicroBatcher(BatchCost(), order="random")


def test_the_batcher_stamps_when_the_batch_formed_and_triton_ran():
    timing = bridge_pb2.Timing()
    before = time.time_ns()
    asyncio.run(MicroBatcher(SlowDoubler(0.01)).infer("m", 1, {"obs": np.ones(2, np.float32)}, outputs=("act",),
                                                       timing=timing))
    assert before <= timing.batch_start_ns <= timing.triton_start_ns < timing.triton_end_ns <= time.time_ns()
    assert timing.triton_end_ns - timing.triton_start_ns >= 10_000_000

"""`MicroBatcher.infer_rows`: a vectorised session's N rows travel as one request, merge with other
sessions' observations up to max_batch, and split into chunks when N is larger."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.gateway.session.batcher import MicroBatcher
from tests.gateway.test_batcher import SlowDoubler


def test_rows_merge_with_single_observations_and_keep_their_order():
    backend = SlowDoubler(0.02)
    batcher = MicroBatcher(backend, max_batch=16, max_inflight=1)

    async def scenario():
        first = asyncio.create_task(batcher.infer("m", 1, {"obs": np.zeros(2, np.float32)}, outputs=("act",)))
        await asyncio.sleep(0)  # in flight: the rest queue
        rows = np.arange(20, dtype=np.float32).reshape(10, 2)
        single = np.full(2, 100, np.float32)
        results = await asyncio.gather(batcher.infer_rows("m", 1, {"obs": rows[:6]}, outputs=("act",)),
                                       batcher.infer("m", 1, {"obs": single}, outputs=("act",)),
                                       batcher.infer_rows("m", 1, {"obs": rows[6:]}, outputs=("act",)))
        await first
        return rows, single, results

    rows, single, (a, b, c) = asyncio.run(scenario())
    assert backend.batches == [1, 11]  # 6 rows + 1 observation + 4 rows in one request
    np.testing.assert_array_equal(a["act"], rows[:6] * 2)
    np.testing.assert_array_equal(b["act"], single * 2)
    assert a["act"].shape == (6, 2) and b["act"].shape == (2,) and c["act"].shape == (4, 2)
    np.testing.assert_array_equal(c["act"], rows[6:] * 2)
    assert batcher.stats.rows == 12 and batcher.stats.requests == 4


def test_more_rows_than_max_batch_are_split_and_reassembled():
    backend = SlowDoubler(0.001)
    batcher = MicroBatcher(backend, max_batch=8, max_inflight=1)
    rows = np.arange(2 * 21, dtype=np.float32).reshape(21, 2)
    result = asyncio.run(batcher.infer_rows("m", 1, {"obs": rows}, outputs=("act",)))
    assert backend.batches == [8, 8, 5]
    np.testing.assert_array_equal(result["act"], rows * 2)


def test_a_failing_request_fails_every_row_of_it():
    batcher = MicroBatcher(SlowDoubler(0.001), max_batch=8)
    rows = np.ones((3, 2), np.float32)
    rows[1] = -1

    async def scenario():
        try:
            await batcher.infer_rows("m", 1, {"obs": rows}, outputs=("act",))
        except RuntimeError as exc:
            return str(exc)

    assert asyncio.run(scenario()) == "negative input"

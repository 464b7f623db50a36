"""Micro-batching of observations from many sessions into one Triton request per policy version.

Opportunistic batching: a request goes out at once when nothing is in flight for its
(model, version), so batch-1 latency pays no waiting; while requests are in flight, newcomers
queue and leave together as the next batch. The cap on in-flight batches keeps Triton's own
queue short and lets batches grow under load.

    batcher = MicroBatcher(client, max_batch=64, max_inflight=1)
    actions = await batcher.infer("hopper", 1, {"observation": obs}, outputs=("action",))
    rows = await batcher.infer_rows("hopper", 1, {"observation": obs_batch}, outputs=("action",))  # (N, ...)

`infer_rows` takes a batch of N rows (a vectorised session): it travels as one request, merged with
other sessions' rows while the total stays within `max_batch`, and split into chunks of `max_batch`
rows when N is larger.

Queued requests leave earliest deadline first (`order="deadline"`, the default): a request's
`deadline_ns` (gateway clock, `time.time_ns`; 0 = none, served after those with one) is when its robot
needs the action (Observation.deadline_ns, moved into the gateway's clock). A request whose deadline has
already passed goes after every one that can still make it. Nothing is ever held back for a fuller batch:
a batch leaves as soon as a slot is free. `order="arrival"` serves the queue first come, first served
(to compare). `stats.missed` counts replies that came back after their deadline. A request's `timing`
(a tether.v1 Timing) gets the times its batch left the queue, and its Triton call started and returned.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np


class InferenceBackend(Protocol):
    """What the batcher needs from a policy server (inference_server.PolicyClient fits)."""

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]: ...


ORDERS = ("deadline", "arrival")
_arrivals = itertools.count()


@dataclass
class _Pending:
    inputs: Mapping[str, np.ndarray]
    future: asyncio.Future
    rows: int | None = None  # None: one unbatched observation; n: n rows with a leading dimension
    deadline_ns: int = 0     # gateway clock; 0: none
    timing: object = None    # a tether.v1 Timing to stamp (batch_start_ns, triton_start_ns, triton_end_ns)
    seq: int = field(default_factory=lambda: next(_arrivals))

    def urgency(self, now_ns: int) -> tuple:
        """EDF's sort key: those that can still make their deadline, earliest first; then those without one;
        then those already late."""
        if not self.deadline_ns:
            return (1, math.inf, self.seq)
        return (0 if self.deadline_ns > now_ns else 2, self.deadline_ns, self.seq)

    @property
    def size(self) -> int:
        return 1 if self.rows is None else self.rows

    def batched(self, name: str) -> np.ndarray:
        value = self.inputs[name]
        return value[None] if self.rows is None else value


@dataclass
class _Lane:
    """The queue and in-flight count for one (model, version, outputs)."""

    queue: list[_Pending] = field(default_factory=list)
    inflight: int = 0


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    rows: int = 0   # observations inferred (a vectorised session's request counts its N rows)
    missed: int = 0  # requests answered after their deadline

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


class MicroBatcher:
    def __init__(self, backend: InferenceBackend, *, max_batch: int = 64, max_inflight: int = 1,
                 order: Literal["deadline", "arrival"] = "deadline"):
        if max_batch < 1 or max_inflight < 1:
            raise ValueError(f"max_batch ({max_batch}) and max_inflight ({max_inflight}) must be >= 1")
        if order not in ORDERS:
            raise ValueError(f"order: expected one of {list(ORDERS)}, got {order!r}")
        self._backend, self._max_batch, self._max_inflight = backend, max_batch, max_inflight
        self.order = order
        self._lanes: dict[tuple, _Lane] = {}
        self.stats = BatchStats()

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    *, outputs: Sequence[str], deadline_ns: int = 0, timing=None) -> dict[str, np.ndarray]:
        """One unbatched observation in, its unbatched outputs back (exceptions propagate)."""
        return await self._submit((model, version, tuple(outputs)), _Pending(
            inputs, asyncio.get_running_loop().create_future(), deadline_ns=deadline_ns, timing=timing))

    async def infer_rows(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                         *, outputs: Sequence[str], deadline_ns: int = 0, timing=None) -> dict[str, np.ndarray]:
        """N rows in (every input with a leading N), N rows of outputs back; N > max_batch is split."""
        n = len(next(iter(inputs.values())))
        key, loop = (model, version, tuple(outputs)), asyncio.get_running_loop()
        if n <= self._max_batch:
            return await self._submit(key, _Pending(inputs, loop.create_future(), n, deadline_ns, timing))
        chunks = [_Pending({name: value[i:i + self._max_batch] for name, value in inputs.items()},
                           loop.create_future(), min(self._max_batch, n - i), deadline_ns, timing)
                  for i in range(0, n, self._max_batch)]
        parts = await asyncio.gather(*(self._submit(key, chunk) for chunk in chunks))
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    async def _submit(self, key: tuple, pending: _Pending) -> dict[str, np.ndarray]:
        lane = self._lanes.setdefault(key, _Lane())
        if not lane.queue and lane.inflight < self._max_inflight:
            lane.inflight += 1  # an idle lane: run this batch of one right here, no task hop
            await self._run(key, lane, [pending])
            return pending.future.result()
        lane.queue.append(pending)
        self._dispatch(key, lane)
        return await pending.future

    def _dispatch(self, key: tuple, lane: _Lane) -> None:
        lane.queue = [p for p in lane.queue if not p.future.done()]  # drop expired waiters
        if self.order == "deadline" and len(lane.queue) > 1:
            now = time.time_ns()
            lane.queue.sort(key=lambda p: p.urgency(now))
        while lane.queue and lane.inflight < self._max_inflight:
            taken, rows = 1, lane.queue[0].size
            while taken < len(lane.queue) and rows + lane.queue[taken].size <= self._max_batch:
                rows += lane.queue[taken].size
                taken += 1
            batch, lane.queue = lane.queue[:taken], lane.queue[taken:]
            lane.inflight += 1
            asyncio.get_running_loop().create_task(self._run(key, lane, batch))

    async def _run(self, key: tuple, lane: _Lane, batch: list[_Pending]) -> None:
        model, version, outputs = key
        formed = time.time_ns()
        try:
            names = batch[0].inputs.keys()
            if len(batch) == 1:  # a view, no copy
                stacked = {name: batch[0].batched(name) for name in names}
            elif all(p.rows is None for p in batch):
                stacked = {name: np.stack([p.inputs[name] for p in batch]) for name in names}
            else:
                stacked = {name: np.concatenate([p.batched(name) for p in batch]) for name in names}
            called = time.time_ns()
            result = await self._backend.infer(model, version, stacked, outputs)
            returned = time.time_ns()
            start = 0
            for p in batch:
                if p.timing is not None:
                    p.timing.batch_start_ns, p.timing.triton_start_ns, p.timing.triton_end_ns = formed, called, returned
                if p.deadline_ns and returned > p.deadline_ns:
                    self.stats.missed += 1
                if not p.future.done():
                    rows = slice(start, start + p.rows) if p.rows is not None else start
                    p.future.set_result({name: value[rows] for name, value in result.items()})
                start += p.size
        except Exception as exc:  # every waiter of this batch gets the same failure
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
        finally:
            self.stats.requests += len(batch)
            self.stats.rows += sum(p.size for p in batch)
            self.stats.batches += 1
            lane.inflight -= 1
            self._dispatch(key, lane)

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
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class InferenceBackend(Protocol):
    """What the batcher needs from a policy server (inference_server.PolicyClient fits)."""

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]: ...


@dataclass
class _Pending:
    inputs: Mapping[str, np.ndarray]
    future: asyncio.Future
    rows: int | None = None  # None: one unbatched observation; n: n rows with a leading dimension

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

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


class MicroBatcher:
    def __init__(self, backend: InferenceBackend, *, max_batch: int = 64, max_inflight: int = 1):
        if max_batch < 1 or max_inflight < 1:
            raise ValueError(f"max_batch ({max_batch}) and max_inflight ({max_inflight}) must be >= 1")
        self._backend, self._max_batch, self._max_inflight = backend, max_batch, max_inflight
        self._lanes: dict[tuple, _Lane] = {}
        self.stats = BatchStats()

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    *, outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """One unbatched observation in, its unbatched outputs back (exceptions propagate)."""
        return await self._submit((model, version, tuple(outputs)), _Pending(
            inputs, asyncio.get_running_loop().create_future()))

    async def infer_rows(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                         *, outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """N rows in (every input with a leading N), N rows of outputs back; N > max_batch is split."""
        n = len(next(iter(inputs.values())))
        key, loop = (model, version, tuple(outputs)), asyncio.get_running_loop()
        if n <= self._max_batch:
            return await self._submit(key, _Pending(inputs, loop.create_future(), n))
        chunks = [_Pending({name: value[i:i + self._max_batch] for name, value in inputs.items()},
                           loop.create_future(), min(self._max_batch, n - i)) for i in range(0, n, self._max_batch)]
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
        try:
            names = batch[0].inputs.keys()
            if len(batch) == 1:  # a view, no copy
                stacked = {name: batch[0].batched(name) for name in names}
            elif all(p.rows is None for p in batch):
                stacked = {name: np.stack([p.inputs[name] for p in batch]) for name in names}
            else:
                stacked = {name: np.concatenate([p.batched(name) for p in batch]) for name in names}
            result = await self._backend.infer(model, version, stacked, outputs)
            start = 0
            for p in batch:
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

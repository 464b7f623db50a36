"""Micro-batching of observations from many sessions into one Triton request per policy version.

Opportunistic batching: a request goes out at once when nothing is in flight for its
(model, version), so batch-1 latency pays no waiting; while requests are in flight, newcomers
queue and leave together as the next batch. The cap on in-flight batches keeps Triton's own
queue short and lets batches grow under load.

    batcher = MicroBatcher(client, max_batch=64, max_inflight=1)
    actions = await batcher.infer("hopper", 1, {"observation": obs}, outputs=("action",))
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


@dataclass
class _Lane:
    """The queue and in-flight count for one (model, version, outputs)."""

    queue: list[_Pending] = field(default_factory=list)
    inflight: int = 0


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0


class MicroBatcher:
    def __init__(self, backend: InferenceBackend, *, max_batch: int = 64, max_inflight: int = 1):
        if max_batch < 1 or max_inflight < 1:
            raise ValueError(f"max_batch ({max_batch}) and max_inflight ({max_inflight}) must be >= 1")
        self._backend = backend
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._lanes: dict[tuple, _Lane] = {}
        self.stats = BatchStats()

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    *, outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """One unbatched observation in, its unbatched outputs back (exceptions propagate)."""
        key = (model, version, tuple(outputs))
        lane = self._lanes.setdefault(key, _Lane())
        pending = _Pending(inputs, asyncio.get_running_loop().create_future())
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
            batch, lane.queue = lane.queue[: self._max_batch], lane.queue[self._max_batch:]
            lane.inflight += 1
            asyncio.get_running_loop().create_task(self._run(key, lane, batch))

    async def _run(self, key: tuple, lane: _Lane, batch: list[_Pending]) -> None:
        model, version, outputs = key
        try:
            names = batch[0].inputs.keys()
            if len(batch) == 1:  # a view, no copy
                stacked = {name: batch[0].inputs[name][None] for name in names}
            else:
                stacked = {name: np.stack([p.inputs[name] for p in batch]) for name in names}
            result = await self._backend.infer(model, version, stacked, outputs)
            for i, p in enumerate(batch):
                if not p.future.done():
                    p.future.set_result({name: value[i] for name, value in result.items()})
        except Exception as exc:  # every waiter of this batch gets the same failure
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
        finally:
            self.stats.requests += len(batch)
            self.stats.batches += 1
            lane.inflight -= 1
            self._dispatch(key, lane)
